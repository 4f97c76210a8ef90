"""The taste tables that docs/results-taste.md publishes are rendered, by the report command each section
names, from the runs stored under docs/data/ (the table and every ablation arm): no figure on the page is
typed by hand, and each table is whole (every taste, 5 seeds, one code version). Two sections: the shipped
default's table (one training at 0.4), whose command also writes the README's taste block and the short
results page's, and 0.4.x's table at the fixed weight 0.3, which every lever of its time was paired with."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dynamic_treerpo.trainer import cli
from dynamic_treerpo.trainer.bench.taste.budget import TASTE_SET
from dynamic_treerpo.trainer.bench.taste.commands import taste_arms, taste_command
from dynamic_treerpo.trainer.bench.taste.page import AGAINST_PROMPT, FIXED_SECTION, SECTION, marks, write_docs
from dynamic_treerpo.trainer.bench.taste.readme import EVERY_TASTE, page_link, readme_block, with_readme_block
from dynamic_treerpo.trainer.bench.taste.storage import reload

ROOT = Path(__file__).resolve().parents[1]


def report_command(page: str, key: str = FIXED_SECTION) -> list[str]:
    """The report command the table section of ``key`` names (the line that reads the stored runs)."""
    begin, end = marks(key)
    start, end = page.index(begin), page.index(end)
    lines = [line for line in page[start:end].splitlines()
             if line.startswith("treerpo bench taste ") and " --report" in line]
    assert len(lines) == 1, "the taste section names one report command"
    return shlex.split(lines[0])


def load_published(key: str) -> dict:
    """The report command of the section ``key``, its arguments and what it reads, with paths relative to
    the checkout (the caller has changed to it)."""
    page = (ROOT / "docs" / "results-taste.md").read_text(encoding="utf-8")
    argv = report_command(page, key)
    assert argv[:3] == ["treerpo", "bench", "taste"]
    args = cli.build_parser().parse_args(argv[1:])
    tastes = [t.strip() for t in args.tastes.split(",")] if args.tastes else list(TASTE_SET)  # as the CLI
    outs = [args.out / t for t in tastes]
    return {"key": key, "page": page, "args": args, "tastes": tastes, "outs": outs,
            "summaries": [reload(out) for out in outs], "arms": taste_arms(args.arms, tastes)}


@pytest.fixture(params=[SECTION, FIXED_SECTION], ids=["shipped-default", "fixed-0.3"])
def published(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(ROOT)
    return load_published(request.param)


@pytest.fixture
def fixed(monkeypatch: pytest.MonkeyPatch) -> dict:
    """0.4.x's table, the one the levers of docs/picks.md were paired with."""
    monkeypatch.chdir(ROOT)
    return load_published(FIXED_SECTION)


def test_the_taste_section_is_rendered_from_the_stored_runs(published: dict, tmp_path: Path) -> None:
    args = published["args"]
    assert args.report and args.docs == Path("docs/results-taste.md")
    assert args.section == published["key"]
    assert str(args.out).startswith("docs/data/"), "the runs the page reads are committed with it"
    docs = tmp_path / "docs" / "results-taste.md"
    docs.parent.mkdir()
    docs.write_text(published["page"], encoding="utf-8")
    write_docs(published["summaries"], published["outs"], docs, taste_command(args), published["arms"],
               key=args.section)
    assert docs.read_text(encoding="utf-8") == published["page"], \
        "docs/results-taste.md's taste section is stale: rebuild it with the report command it names"
    for image in (tmp_path / "docs" / "images").iterdir():  # the grid shown is the stored run's
        assert image.read_bytes() == (ROOT / "docs" / "images" / image.name).read_bytes(), image.name


def test_the_shipped_defaults_table_also_writes_the_readmes_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's taste block and the short results page's are the shipped default's table, written by
    the same report command; 0.4.x's table writes neither."""
    monkeypatch.chdir(ROOT)
    shipped, old = load_published(SECTION), load_published(FIXED_SECTION)
    assert old["args"].readme is None and old["args"].summary is None
    args = shipped["args"]
    assert args.readme == Path("README.md") and args.summary == Path("docs/results.md")
    for page in (args.readme, args.summary):
        text = (ROOT / page).read_text(encoding="utf-8")
        block = readme_block(shipped["summaries"], shipped["arms"], page_link(page, EVERY_TASTE, args.docs))
        assert with_readme_block(text, block) == text, f"{page}'s taste block is stale: run the report"


def test_the_published_table_is_whole_and_at_one_code_version(published: dict) -> None:
    """Every taste of the benchmark, at least two against the prompt, 5 seeds each, and every seed of the
    table and of the ablation arms run by one version of the code that trains and samples."""
    summaries = published["summaries"]
    assert sorted(published["tastes"]) == sorted(TASTE_SET)
    assert len(set(published["tastes"]) & set(AGAINST_PROMPT)) >= 2
    assert all(len(s["per_seed"]) == 5 for s in summaries)
    arms = [s for runs in published["arms"].values() for s in runs]
    versions = [v for s in [*summaries, *arms] for v in s["code"]]
    made = [{(v["code"], v["commit"], v["dirty"]) for v in s["code"]} for s in [*summaries, *arms]]
    assert all(len(m) == 1 for m in made), "a run without its code version, or of two"
    assert len({v["code"] for v in versions}) == 1 and not any(v["dirty"] for v in versions), versions


PICKS_LEVERS = {  # docs/picks.md's lever table: its row -> the published report's arm row
    "the guard also chooses the weight": "the guard also chooses the weight",
    "the first version's guard": "first version's guard",
    "a fixed weight of 0.5": "picks weight 0.5",
    "0.3.x's pooled features": "pooled features (0.3.x)",
    "error-free picks": "error-free picks",
    "two rounds": "two rounds (25 + 25 clicks)",
    "a pessimistic personal reward": "pessimism 1",
    "the guard steers the weight": "guard steers",
    "a pilot of 6 iterations at each weight": "a pilot of 6 iterations chooses the weight",
}


def test_docs_picks_lever_table_is_what_the_published_arms_give(fixed: dict) -> None:
    """docs/picks.md restates the ablation table for a person choosing options: every row of it must be
    the figures the report computes from the stored arms (rounded as shown), and every arm has a row."""
    from dynamic_treerpo.trainer.bench.taste.ablation import ablation_rows, verdict

    rows = ablation_rows(fixed["summaries"], fixed["arms"], "50", pilot=True)
    text = (ROOT / "docs" / "picks.md").read_text(encoding="utf-8")
    table = text[text.index("### What each lever gives (measured)"):text.index("## How many picks")]
    lines = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| lever")]
    assert len(lines) == len(rows) == len(PICKS_LEVERS)
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = next(v for k, v in PICKS_LEVERS.items() if cells[0].startswith(k))
        row = next(r for arm, r in rows.items() if arm.startswith(name))
        d = row["difference"]
        assert cells[1] == f"{row['runs']} ({len(row['tastes'])})", cells[0]
        assert cells[2] == f"{row['share']['mean']:.0%}" and cells[3] == f"{row['default_share']['mean']:.0%}"
        points = [f"{x:+.0%}"[:-1] for x in (d["mean"], d["mean"] - d["ci95"], d["mean"] + d["ci95"])]
        assert cells[4] == f"{points[0]} ({points[1]} to {points[2]})", cells[0]
        assert cells[5] == verdict(row), cells[0]
