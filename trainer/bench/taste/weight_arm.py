"""``treerpo bench taste-weight``: the default method at another fixed picks weight, on the frontier of a
``treerpo bench taste`` run: an ablation arm of the weight lever, paired per taste and seed with that run.

``bench taste --frontier-from`` refuses a run whose budget differs in anything its frontier reads, and the
picks weight is one (the guard-steered oracle starts from it). Here the frontier is taken as it was
trained, so the arm differs from the default run in the method's weight alone: the same person, the same
trees, the same seeds, the same budget and ``--set`` options (read from the run). Run it from the code
version that made the frontier (every seed records its code, and this refuses another).

    treerpo bench taste-weight --tastes lower_objects,warm_shades,larger_objects --seeds 5 \\
        --trees 50 --weight 0.5 --frontier-from runs/taste_table --out runs/taste_weight_0.5 [--resume]

Then ``treerpo bench taste --report --out runs/taste_table --arm "picks weight 0.5=runs/taste_weight_0.5"``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..common.provenance import check_resume, provenance
from .budget import TasteBudget
from .run import run_seed
from .storage import reload, seed_pieces, seed_results, stored_budget, write_taste_json


def arm_budget(stored: dict[str, Any], seeds: int, trees: int, weight: float) -> TasteBudget:
    """The stored run's budget with the arm's seeds, tree count and picks weight."""
    return replace(stored_budget(stored), seeds=seeds, trees=trees, at=(trees,), picks_weight=weight,
                   picks_weights=())


def run_arm(taste: str, frontier_from: Path, out: Path, seeds: int, trees: int, weight: float, resume: bool,
            command: str, log: Callable[[str], None] = print) -> str:
    """Every seed of ``taste`` at the arm's weight on the frontier stored in ``frontier_from/<taste>``, into
    ``out/<taste>/taste.json``; a line saying what was done."""
    source, out = frontier_from / taste, out / taste
    stored = json.loads((source / "taste.json").read_text(encoding="utf-8"))
    budget = arm_budget(stored, seeds, trees, weight)
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
            result = run_seed(budget, seed, taste, Path(work), extra, log, None, frontier[seed].frontier,
                              pieces)
            result.code = code
            done.append(result)
            write_taste_json(path, done, budget, taste, command, wanted, extra)
            shutil.rmtree(pieces, ignore_errors=True)
    return (f"{taste}: {len(done)} seeds in {path}; share at {budget.trees} trees "
            f"{reload(out)['by_trees'][str(budget.trees)]['share_of_frontier']:.0%}")
