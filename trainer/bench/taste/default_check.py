"""``treerpo bench taste-check``: does the method at several picks weights (the guard choosing the weight,
0.5.0's default), or at one (0.6's), give what the stored runs at each fixed weight gave? One taste and
seed of a stored ``bench taste`` table, on that table's own frontier, at one tree count: the runs'
validation gains and the kept run's test figures, printed beside the stored ones, to compare digit for
digit (on the kernels the table ran with: its ``taste.json`` records them; ``ATEN_CPU_CAPABILITY=avx2``
for 0.4.0's).

    ATEN_CPU_CAPABILITY=avx2 treerpo bench taste-check --taste lower_objects --seed 0 \\
        --trees 50 --table docs/data/taste/taste_table --arm docs/data/taste/taste_weight_0.5

It does not check the code version (the point is to run other code on the same picks and frontier): it
reproduces, it does not publish. Why it exists: the assembled default (``combine.py``) stands for a run of
the default only if the default, run afresh, repeats the stored runs it is assembled from.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .run import run_seed
from .storage import seed_results, stored_budget


def stored_run(folder: Path, taste: str, seed: int, trees: int) -> dict[str, Any]:
    """The stored method run of ``seed`` at ``trees`` in ``folder/<taste>/taste.json``."""
    data = json.loads((folder / taste / "taste.json").read_text(encoding="utf-8"))
    row = next(r for r in data["per_seed"] if r["seed"] == seed)
    return row["reward"][str(trees)]


def check_default(taste: str, seed: int, trees: int, weights: Sequence[float], table: Path,
                  arms: Sequence[Path], log: Callable[[str], None] = print) -> None:
    """Run ``seed`` of ``taste`` at ``trees`` trees with the guard choosing among ``weights`` on the
    frontier stored in ``table``, and print its figures beside those ``table`` and ``arms`` stored."""
    stored = json.loads((table / taste / "taste.json").read_text(encoding="utf-8"))
    budget = replace(stored_budget(stored), seeds=1, first_seed=seed, trees=trees, at=(trees,),
                     picks_weights=tuple(weights))
    frontier = {r.seed: r for r in seed_results(stored)}[seed].frontier
    with tempfile.TemporaryDirectory() as work:
        result = run_seed(budget, seed, taste, Path(work), list(stored.get("extra", [])), log, None, frontier)
    mine = result.reward[trees]
    tried = mine["weights"]  # one weight too: the node's run records the weights it trained at
    log(f"now:    weights {tried['weights']}, validation gains {tried['validation_gains']}, "
        f"kept {tried['kept']:g}; test taste {mine['taste']!r}, scene {mine['scene']!r}")
    for folder in [table, *arms]:
        run = stored_run(folder, taste, seed, trees)
        log(f"stored: {folder}: validation gain {run['chosen']['validation_taste_gain']!r}; "
            f"test taste {run['taste']!r}, scene {run['scene']!r}")
