"""Does the method at several picks weights (the guard choosing the weight, 0.5.0's default) give what
the stored runs at each fixed weight gave? One taste and seed of a stored ``bench taste`` table, on that
table's own frontier, at one tree count: the runs' validation gains and the kept run's test figures,
printed beside the stored ones, to compare digit for digit (on the kernels the table ran with: its
``taste.json`` records them; ``ATEN_CPU_CAPABILITY=avx2`` for 0.4.0's).

    ATEN_CPU_CAPABILITY=avx2 python scripts/taste_default_check.py --taste lower_objects --seed 0 \\
        --trees 50 --table docs/data/taste/taste_table --arm docs/data/taste/taste_weight_0.5

It does not check the code version (the point is to run other code on the same picks and frontier): it
reproduces, it does not publish.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from dynamic_treerpo.trainer.bench.taste import run_seed, seed_results, stored_budget


def stored_run(folder: Path, taste: str, seed: int, trees: int) -> dict:
    """The stored method run of ``seed`` at ``trees`` in ``folder/<taste>/taste.json``."""
    data = json.loads((folder / taste / "taste.json").read_text(encoding="utf-8"))
    row = next(r for r in data["per_seed"] if r["seed"] == seed)
    return row["reward"][str(trees)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--taste", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--weights", default="0.3,0.5")
    parser.add_argument("--table", type=Path, required=True, help="the stored run at the first weight")
    parser.add_argument("--arm", type=Path, action="append", default=[], help="stored runs at the others")
    args = parser.parse_args(argv)
    stored = json.loads((args.table / args.taste / "taste.json").read_text(encoding="utf-8"))
    weights = tuple(float(w) for w in args.weights.split(","))
    budget = replace(stored_budget(stored), seeds=1, first_seed=args.seed, trees=args.trees, at=(args.trees,),
                     picks_weights=weights)
    frontier = {r.seed: r for r in seed_results(stored)}[args.seed].frontier
    with tempfile.TemporaryDirectory() as work:
        result = run_seed(budget, args.seed, args.taste, Path(work), list(stored.get("extra", [])), print,
                          None, frontier)
    mine = result.reward[args.trees]
    tried = mine["weights"]
    print(f"now:    weights {tried['weights']}, validation gains {tried['validation_gains']}, "
          f"kept {tried['kept']:g}; test taste {mine['taste']!r}, scene {mine['scene']!r}")
    for folder in [args.table, *args.arm]:
        run = stored_run(folder, args.taste, args.seed, args.trees)
        print(f"stored: {folder}: validation gain {run['chosen']['validation_taste_gain']!r}; "
              f"test taste {run['taste']!r}, scene {run['scene']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
