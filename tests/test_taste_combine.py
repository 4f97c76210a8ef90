"""The default that chooses the picks weight, assembled from stored fixed-weight runs
(trainer/bench/taste/combine.py, treerpo bench taste-assemble): each seed keeps the run whose chosen
point gained more personal reward on validation pairs, as the guard does; runs of other code, budgets or
frontiers are refused."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.taste import ablation as ab
from dynamic_treerpo.trainer.bench.taste.combine import combine_weights, kept_weight
from dynamic_treerpo.trainer.bench.taste.storage import reload
from dynamic_treerpo.trainer.bench.taste.summary import summarise

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data" / "taste"
TASTE = "lower_objects"


def _load(arm: str) -> dict:
    return json.loads((DATA / arm / TASTE / "taste.json").read_text(encoding="utf-8"))


@pytest.fixture
def runs() -> list[dict]:
    """The published table (weight 0.3, 25/50/100 trees) and its weight arm (0.5, 50 trees)."""
    return [_load("taste_table"), _load("taste_weight_0.5")]


def test_each_seed_keeps_the_weight_that_gained_more_on_validation(runs: list[dict]) -> None:
    budget, results = combine_weights(runs)
    assert budget.picks_weights == (0.3, 0.5) and budget.at == (50,) and budget.seeds == 5
    low, high = ({r["seed"]: r["reward"]["50"] for r in data["per_seed"]} for data in runs)
    kept = []
    for result in results:
        gains = [low[result.seed]["chosen"]["validation_taste_gain"],
                 high[result.seed]["chosen"]["validation_taste_gain"]]
        weight = 0.5 if gains[1] > gains[0] else 0.3
        kept.append(weight)
        assert kept_weight(result, 50) == weight
        assert result.reward[50]["taste"] == (high if weight == 0.5 else low)[result.seed]["taste"]
        assert result.reward[50]["weights"]["validation_gains"] == gains
        assert result.frontier == next(r for r in runs[0]["per_seed"] if r["seed"] == result.seed)["frontier"]
    assert set(kept) == {0.3, 0.5}  # this taste's seeds keep both weights: the choice is exercised


def test_the_combined_table_is_what_the_ablations_guard_choice_row_derives(runs: list[dict]) -> None:
    """Two implementations of one rule (the report's row and the combined runs) agree run by run."""
    budget, results = combine_weights(runs)
    combined = summarise(results, budget, TASTE)
    row = ab.guard_choice_row([runs[0]], [[runs[1]]], "50")
    shares = ab.run_shares(combined, "50")
    assert row["runs"] == len(shares) == 5
    assert row["share"]["mean"] == pytest.approx(sum(s["share"] for s in shares.values()) / 5, abs=1e-12)


def test_runs_that_cannot_be_combined_are_refused_in_one_line(runs: list[dict]) -> None:
    with pytest.raises(ValueError, match="one weight only"):
        combine_weights([runs[0]])
    other_code = copy.deepcopy(runs[1])
    for seed in other_code["per_seed"]:
        seed["code"] = {**seed["code"], "code": "0" * 16}
    with pytest.raises(ValueError, match="more than one code version"):
        combine_weights([runs[0], other_code])
    other_budget = copy.deepcopy(runs[1])
    other_budget["budget"]["margin"] = 0.5
    with pytest.raises(ValueError, match=r"other budgets \(margin\)"):
        combine_weights([runs[0], other_budget])
    other_frontier = copy.deepcopy(runs[1])
    other_frontier["per_seed"][0]["frontier"]["0.3"]["gain"] += 0.01
    with pytest.raises(ValueError, match="another frontier"):
        combine_weights([runs[0], other_frontier])
    chose_already = copy.deepcopy(runs[1])
    chose_already["budget"]["picks_weights"] = [0.3, 0.5]
    with pytest.raises(ValueError, match="already chose"):
        combine_weights([runs[0], chose_already])
    options = copy.deepcopy(runs[1])
    options["extra"] = ["guard.margin=0"]
    with pytest.raises(ValueError, match="other --set options"):
        combine_weights([runs[0], options])


def test_the_script_writes_a_table_the_report_reads(tmp_path: Path) -> None:
    out, arm = tmp_path / "default", tmp_path / "arm"
    shutil.copytree(DATA / "taste_weight_0.5" / TASTE, arm / TASTE)  # one taste of the arm only
    done = subprocess.run([sys.executable, "-m", "dynamic_treerpo.trainer", "bench", "taste-assemble",
                           "--runs", str(DATA / "taste_table"), "--runs", str(arm), "--tastes",
                           f"{TASTE},warm_shades", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{TASTE}: 5 seeds at 50 trees; kept 0.3" in done.stdout
    assert f"warm_shades: left out, not in {arm}" in done.stdout and not (out / "warm_shades").exists()
    summary = reload(out / TASTE)
    assert list(summary["budget"]["picks_weights"]) == [0.3, 0.5] and list(summary["by_trees"]) == ["50"]
    assert summary["combined_from"] == [str(DATA / "taste_table"), str(arm)]
    assert summary["command"].startswith("treerpo bench taste-assemble --runs")
    # the first seed kept 0.3 at 50 trees, so the table's grid shows the default's run and is copied
    grid = DATA / "taste_table" / TASTE / "before_after.png"
    assert (out / TASTE / "before_after.png").read_bytes() == grid.read_bytes()


def test_the_assembled_default_on_the_results_page_is_what_the_stored_runs_give(tmp_path: Path) -> None:
    """docs/data/taste/taste_default (0.5.0's default) is what assembling the published table and weight arm
    gives now, and the block of docs/results-taste.md is what the script renders from it (no figure typed by
    hand). The README's taste block is the shipped default's table since (tests/test_taste_published.py)."""
    from dynamic_treerpo.trainer.bench.common.marked import replace_marked
    from dynamic_treerpo.trainer.bench.taste.page import ASSEMBLED, assembled_block

    stored = sorted((DATA / "taste_default").glob("*/taste.json"))
    assert stored, "the assembled default is published"
    summaries = [reload(p.parent) for p in stored]
    for summary in summaries:
        sources = summary["combined_from"]
        assert sources[0] == "docs/data/taste/taste_table" and "docs/data/taste/taste_weight_0.5" in sources
        assert all(source.startswith("docs/data/taste/") for source in sources), "committed with the page"
        runs = [json.loads((ROOT / source / summary["taste"] / "taste.json").read_text(encoding="utf-8"))
                for source in sources]
        budget, results = combine_weights(runs)
        fresh = summarise(results, budget, summary["taste"])
        assert fresh["by_trees"] == summary["by_trees"], f"{summary['taste']}: stale, assemble it again"
    page = (ROOT / "docs" / "results-taste.md").read_text(encoding="utf-8")
    block = assembled_block(summaries, summaries[0]["command"])
    assert replace_marked(page, *ASSEMBLED, block, "assembled default block") == page, \
        "docs/results-taste.md's assembled default is stale: run the command it names"


def test_the_summary_block_goes_on_another_page_with_links_relative_to_it(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    """``--summary PAGE`` writes the README's taste block between PAGE's markers, its link relative to PAGE
    (the short results page in docs/ links to results-taste.md beside it); a page without the markers is
    refused in one line before anything is written."""
    from dynamic_treerpo.trainer import cli
    from dynamic_treerpo.trainer.bench.taste.readme import ASSEMBLED_DEFAULT, BEGIN, END

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "results.md"
    page.write_text(f"# Results\n\nbefore\n\n{BEGIN}\nold\n{END}\n\nafter\n", encoding="utf-8")
    runs = [str(DATA / name) for name in ("taste_table", "taste_weight_0.5", "taste_weight_0.5_at25",
                                          "taste_weight_0.5_at100")]
    assemble = ["bench", "taste-assemble", *(x for run in runs for x in ("--runs", run))]
    assert cli.main([*assemble, "--out", str(tmp_path / "default"), "--summary", "docs/results.md"]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# Results\n\nbefore\n\n{BEGIN}\n") and text.endswith(f"\n{END}\n\nafter\n")
    assert f"[results-taste.md](results-taste.md#{ASSEMBLED_DEFAULT})" in text
    # the shipped default's table (bench taste --report) writes the README's block, linked from PAGE
    table = ["bench", "taste", "--report", "--out", str(DATA / "taste_named_09"),
             "--summary", "docs/results.md"]
    assert cli.main(table) == 0
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    published = readme[readme.index(BEGIN):readme.index(END) + len(END)]
    linked_here = published.replace("docs/results-taste.md", "results-taste.md")
    assert page.read_text(encoding="utf-8") == f"# Results\n\nbefore\n\n{linked_here}\n\nafter\n"
    assert "(results-taste.md#every-taste-learning-from-picks-under-the-guard)" in page.read_text("utf-8")
    bare = tmp_path / "docs" / "bare.md"
    bare.write_text("# no markers\n", encoding="utf-8")
    capsys.readouterr()
    assert cli.main([*assemble, "--out", str(tmp_path / "again"), "--summary", "docs/bare.md"]) == 2
    error = capsys.readouterr().err
    assert "--summary docs/bare.md" in error and "no taste block" in error and error.count("\n") == 1
    assert bare.read_text(encoding="utf-8") == "# no markers\n" and not (tmp_path / "again").exists()
