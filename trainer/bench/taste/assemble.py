"""``treerpo bench taste-assemble``: the default method (the guard chooses the picks weight) assembled from
``bench taste`` runs at fixed weights: per seed and tree count, the run the default keeps (``combine.py``).

The runs: a ``treerpo bench taste`` table at one weight and ``treerpo bench taste-weight`` runs of the
same picks at another weight on its frontier (one per tree count, or one with all), all from one commit.
The first ``--runs`` is the weight the default tries first.

    treerpo bench taste-assemble --runs runs/taste_table --runs runs/taste_weight_0.5 \\
        --runs runs/taste_weight_0.5_at25 --runs runs/taste_weight_0.5_at100 --out runs/taste_default

Then ``treerpo bench taste --report --out runs/taste_default``; ``--docs docs/results-taste.md`` writes the
assembled table into the page between its markers, ``--readme README.md`` the README's taste block and
``--summary PAGE`` the same block on another page. A taste missing from one of the runs is left out (and
named).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...utils.atomic import atomic_write_text
from ..common.marked import replace_marked
from .combine import combine_weights, kept_weight
from .measure import grid_tree_count
from .page import ASSEMBLED, assembled_block
from .readme import assembled_readme_block, write_summary_block
from .storage import reload, write_taste_json


def combine_taste(taste: str, runs: Sequence[Path], out: Path, command: str) -> str:
    """One taste's combined ``taste.json`` (and the first seed's grid when it shows the kept run); a line
    saying what was kept."""
    found = [r / taste / "taste.json" for r in runs if (r / taste / "taste.json").is_file()]
    data = [json.loads(p.read_text(encoding="utf-8")) for p in found]
    budget, results = combine_weights(data)
    folder = out / taste
    folder.mkdir(parents=True, exist_ok=True)
    write_taste_json(folder / "taste.json", results, budget, taste, command, [r.seed for r in results],
                     data[0].get("extra", []), {"combined_from": [str(p.parent.parent) for p in found]})
    grid, n = runs[0] / taste / "before_after.png", grid_tree_count(budget)
    first = results[0]
    shows_kept = first.seed == budget.first_seed and kept_weight(first, n) == budget.picks_weights[0]
    if grid.is_file() and shows_kept:
        (folder / "before_after.png").write_bytes(grid.read_bytes())
    kept = {w: sum(kept_weight(r, m) == w for r in results for m in r.reward) for w in budget.picks_weights}
    return (f"{taste}: {len(results)} seeds at {', '.join(map(str, budget.at))} trees; kept "
            + ", ".join(f"{w:g} {k} times" for w, k in kept.items()))


def assemble(runs: Sequence[Path], out: Path, tastes: Sequence[str] | None, command: str,
             log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every taste the runs all hold (``tastes``, or every taste of the first run) assembled into
    ``out/<taste>/taste.json``; their summaries (none when no taste is in every run)."""
    names = list(tastes) if tastes else sorted(p.parent.name for p in runs[0].glob("*/taste.json"))
    made = []
    for taste in names:
        missing = [str(r) for r in runs if not (r / taste / "taste.json").is_file()]
        if missing:
            log(f"{taste}: left out, not in {', '.join(missing)}")
            continue
        log(combine_taste(taste, runs, out, command))
        made.append(taste)
    return [reload(out / t) for t in made]


def write_assembled(assembled: Sequence[dict[str, Any]], runs: Sequence[Path], command: str,
                    docs: Path | None, readme: Path | None, summary: Path | None,
                    log: Callable[[str], None] = print) -> None:
    """The assembled table into ``docs`` between its markers, and the short block (with one line against
    the first run's fixed weight) into ``readme`` and ``summary``, each linking to ``docs`` (or the
    published taste page)."""
    if docs:
        page = docs.read_text(encoding="utf-8")
        block = assembled_block(assembled, command)
        atomic_write_text(docs, replace_marked(page, *ASSEMBLED, block, "assembled default block"))
        log(f"written: {docs}")
    fixed = [reload(runs[0] / s["taste"]) for s in assembled] if readme or summary else []
    for target in (readme, summary):
        if target:
            write_summary_block(target, assembled_readme_block(assembled, fixed, target, docs))
            log(f"written: {target}")
