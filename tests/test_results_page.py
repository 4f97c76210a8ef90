"""docs/results.md is the short page a person reads to the end: at most 25k characters, its two verdict
blocks are what the benchmarks' commands render from the stored runs (the README's tables, linked to the
detail pages beside it), and the prose around them quotes no measured figure (figures go stale in hand
text; they live in the blocks and on the generated pages)."""

from __future__ import annotations

import re
from pathlib import Path

from dynamic_treerpo.trainer.bench.protocol.claims import all_tests
from dynamic_treerpo.trainer.bench.protocol.claims_block import README_BEGIN, README_END, readme_claims
from dynamic_treerpo.trainer.bench.protocol.results import load
from dynamic_treerpo.trainer.bench.taste.readme import BEGIN, END

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
LIMIT = 25_000
ALLOWED_NUMBERS = {"1.85M", "95%", "0.05", "3"}
"""Numbers the prose may name: the model's size, the interval and the test level the verdict rules use,
and the seed count of the archived run a link names."""


def block(text: str, begin: str, end: str) -> str:
    return text[text.index(begin):text.index(end) + len(end)]


def test_the_results_page_is_short() -> None:
    assert len(PAGE.read_text(encoding="utf-8")) <= LIMIT


def test_its_protocol_block_is_the_readmes_table_rendered_from_docs_data() -> None:
    result = load(ROOT / "docs" / "data")
    page = PAGE.read_text(encoding="utf-8")
    rendered = readme_claims(result, all_tests(result), "results-protocol.md", "--summary")
    assert block(page, README_BEGIN, README_END) == rendered, \
        "docs/results.md's verdict table is stale: `treerpo bench report ... --summary docs/results.md`"


def test_its_taste_block_is_the_readmes_block_linked_from_the_page() -> None:
    page = PAGE.read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert block(page, BEGIN, END) == block(readme, BEGIN, END).replace("docs/results-taste.md",
                                                                        "results-taste.md"), \
        "docs/results.md's taste block is stale: the taste-assemble command with --summary docs/results.md"


def test_the_prose_quotes_no_measured_figure() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for begin, end in ((README_BEGIN, README_END), (BEGIN, END)):
        page = page.replace(block(page, begin, end), "")
    page = re.sub(r"\[[^\]]*\]\([^)]*\)", "", page)  # links: page names, not figures
    numbers = set(re.findall(r"[+-]?\d[\d.,]*[%xM]?", page))
    assert numbers <= ALLOWED_NUMBERS, sorted(numbers - ALLOWED_NUMBERS)
