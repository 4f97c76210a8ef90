"""The default method at another fixed picks weight, on the frontier of a ``treerpo bench taste`` run:
an ablation arm of the weight lever, paired per taste and seed with that run.

``bench taste --frontier-from`` refuses a run whose budget differs in anything its frontier reads, and the
picks weight is one (the guard-steered oracle starts from it). Here the frontier is taken as it was
trained, so the arm differs from the default run in the method's weight alone: the same person, the same
trees, the same seeds, the same budget and ``--set`` options (read from the run). Run it from the code
version that made the frontier (every seed records its code, and this script refuses another).

    python scripts/taste_weight_arm.py --tastes lower_objects,warm_shades,larger_objects --seeds 5 \\
        --trees 50 --weight 0.5 --frontier-from runs/taste_table --out runs/taste_weight_0.5 [--resume]

Then ``treerpo bench taste --report --out runs/taste_table --arm "picks weight 0.5=runs/taste_weight_0.5"``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from dynamic_treerpo.trainer.bench.common.provenance import check_resume, provenance
from dynamic_treerpo.trainer.bench.taste import (
    TasteBudget,
    _write,
    reload,
    run_seed,
    seed_pieces,
    seed_results,
    stored_budget,
)


def arm_budget(stored: dict, seeds: int, trees: int, weight: float) -> TasteBudget:
    """The stored run's budget with the arm's seeds, tree count and picks weight."""
    return replace(stored_budget(stored), seeds=seeds, trees=trees, at=(trees,), picks_weight=weight,
                   picks_weights=())


def run_arm(taste: str, args: argparse.Namespace, command: str) -> None:
    """Every seed of ``taste`` at the arm's weight on the frontier stored in ``--frontier-from``."""
    source, out, resume = args.frontier_from / taste, args.out / taste, args.resume
    stored = json.loads((source / "taste.json").read_text(encoding="utf-8"))
    budget = arm_budget(stored, args.seeds, args.trees, args.weight)
    extra = list(stored.get("extra", []))
    code = provenance()
    frontier = {r.seed: r for r in seed_results(stored)}
    check_resume([r.code for r in frontier.values()], code, source / "taste.json")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "taste.json"
    done = seed_results(json.loads(path.read_text(encoding="utf-8"))) if resume and path.is_file() else []
    check_resume([r.code for r in done], code, path)
    wanted = [budget.first_seed + k for k in range(budget.seeds)]
    with tempfile.TemporaryDirectory(dir=out) as work:
        for seed in wanted:
            if any(r.seed == seed for r in done):
                continue
            if seed not in frontier:
                raise ValueError(f"{source / 'taste.json'} has no seed {seed}: run the table first")
            pieces = seed_pieces(out, seed, code, resume)
            result = run_seed(budget, seed, taste, Path(work), extra, print, None, frontier[seed].frontier,
                              pieces)
            result.code = code
            done.append(result)
            _write(path, done, budget, taste, command, wanted, extra)
            shutil.rmtree(pieces, ignore_errors=True)
    print(f"{taste}: {len(done)} seeds in {path}; share at {budget.trees} trees "
          f"{reload(out)['by_trees'][str(budget.trees)]['share_of_frontier']:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tastes", required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--weight", type=float, required=True, help="the method's fixed picks weight")
    parser.add_argument("--frontier-from", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    command = "python scripts/taste_weight_arm.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    for taste in args.tastes.split(","):
        run_arm(taste.strip(), args, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
