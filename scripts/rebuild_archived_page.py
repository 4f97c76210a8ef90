"""Rebuild docs/results-3-seeds.md from docs/data/3-seeds/protocol.json under its archive note.

The page of an older run, rendered by this version's report code, as `treerpo bench report` renders
the current one.
"""

from __future__ import annotations

from pathlib import Path

from dynamic_treerpo.trainer.bench.protocol import report
from dynamic_treerpo.trainer.bench.protocol.claims import all_tests
from dynamic_treerpo.trainer.bench.protocol.page import markdown
from dynamic_treerpo.trainer.bench.protocol.results import load

ROOT = Path(__file__).resolve().parents[1]
HEADING = "# Results: the paper's claims"


def main() -> None:
    result = load(ROOT / "docs" / "data" / "3-seeds")
    text = markdown(result, all_tests(result), report.summary_rows(result), "images/3-seeds").rstrip("\n")
    page = ROOT / "docs" / "results-3-seeds.md"
    old = page.read_text(encoding="utf-8")
    page.write_text(old[: old.index(HEADING)] + text + "\n", encoding="utf-8")
    print(f"written: {page}")


if __name__ == "__main__":
    main()
