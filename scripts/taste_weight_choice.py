"""The default method (the guard chooses the picks weight) assembled from ``bench taste`` runs at fixed
weights: per seed and tree count, the run the default keeps (``trainer/bench/taste_combine.py``).

The runs: a ``treerpo bench taste`` table at one weight and ``scripts/taste_weight_arm.py`` runs of the same
picks at another weight on its frontier (one per tree count, or one with all), all from one commit. The
first ``--runs`` is the weight the default tries first.

    python scripts/taste_weight_choice.py --runs runs/taste_table --runs runs/taste_weight_0.5 \\
        --runs runs/taste_weight_0.5_at25 --runs runs/taste_weight_0.5_at100 --out runs/taste_default

Then ``treerpo bench taste --report --out runs/taste_default``; ``--docs docs/results.md`` writes the
assembled table into the page between its markers, ``--readme README.md`` the README's taste block. A
taste missing from one of the runs is left out (and named).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from dynamic_treerpo.trainer.bench.common.marked import replace_marked
from dynamic_treerpo.trainer.bench.taste import _grid_count, _write, reload
from dynamic_treerpo.trainer.bench.taste_combine import combine_weights, kept_weight
from dynamic_treerpo.trainer.bench.taste_page import ASSEMBLED, assembled_block
from dynamic_treerpo.trainer.bench.taste_readme import assembled_readme_block, with_readme_block
from dynamic_treerpo.trainer.utils.atomic import atomic_write_text


def combine_taste(taste: str, runs: list[Path], out: Path, command: str) -> str:
    """One taste's combined ``taste.json`` (and the first seed's grid when it shows the kept run); a line
    saying what was kept."""
    found = [r / taste / "taste.json" for r in runs if (r / taste / "taste.json").is_file()]
    data = [json.loads(p.read_text(encoding="utf-8")) for p in found]
    budget, results = combine_weights(data)
    folder = out / taste
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "taste.json", results, budget, taste, command, [r.seed for r in results],
           data[0].get("extra", []), {"combined_from": [str(p.parent.parent) for p in found]})
    grid, n = runs[0] / taste / "before_after.png", _grid_count(budget)
    first = results[0]
    shows_kept = first.seed == budget.first_seed and kept_weight(first, n) == budget.picks_weights[0]
    if grid.is_file() and shows_kept:
        (folder / "before_after.png").write_bytes(grid.read_bytes())
    kept = {w: sum(kept_weight(r, m) == w for r in results for m in r.reward) for w in budget.picks_weights}
    return (f"{taste}: {len(results)} seeds at {', '.join(map(str, budget.at))} trees; kept "
            + ", ".join(f"{w:g} {k} times" for w, k in kept.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, action="append", required=True,
                        help="a bench taste output folder at one fixed weight (repeat; the first weight is "
                             "tried first)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tastes", help="comma-separated (default: every taste of the first --runs)")
    parser.add_argument("--docs", type=Path, help="write the assembled table into this page, between its "
                        "markers (docs/results.md)")
    parser.add_argument("--readme", type=Path, help="write the README's taste block from the assembled "
                        "default, with one line against the first --runs (README.md)")
    args = parser.parse_args(argv)
    command = "python scripts/taste_weight_choice.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    tastes = (args.tastes.split(",") if args.tastes
              else sorted(p.parent.name for p in args.runs[0].glob("*/taste.json")))
    made = []
    for taste in tastes:
        missing = [str(r) for r in args.runs if not (r / taste / "taste.json").is_file()]
        if missing:
            print(f"{taste}: left out, not in {', '.join(missing)}")
            continue
        print(combine_taste(taste, args.runs, args.out, command))
        made.append(taste)
    if not made:
        return 0
    assembled = [reload(args.out / t) for t in made]
    if args.docs:
        page = args.docs.read_text(encoding="utf-8")
        block = assembled_block(assembled, command)
        atomic_write_text(args.docs, replace_marked(page, *ASSEMBLED, block, "assembled default block"))
        print(f"written: {args.docs}")
    if args.readme:
        block = assembled_readme_block(assembled, [reload(args.runs[0] / t) for t in made])
        atomic_write_text(args.readme, with_readme_block(args.readme.read_text(encoding="utf-8"), block))
        print(f"written: {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
