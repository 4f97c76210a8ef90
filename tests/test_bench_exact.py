"""The exact sign-flip test beside the t test: hand-computed p-values, scipy's permutation test as a
second opinion, the verdict that needs both tests after Holm, the protocol's verdicts at 3 seeds
(none) and at 10 (where both agree, against every baseline), and docs/results-protocol.md and the
README's verdict table as rendered from docs/data/protocol.json, and the short results page's."""

from __future__ import annotations

import itertools
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dynamic_treerpo.trainer.bench.common.stats import (
    MAX_EXACT_SEEDS,
    agreed_verdict,
    exact_floor,
    holm,
    one_sample,
    paired,
    seeds_for_exact,
    sign_flip_one_sample,
    sign_flip_p,
    sign_flip_test,
)
from dynamic_treerpo.trainer.bench.protocol import report
from dynamic_treerpo.trainer.bench.protocol import run as protocol
from dynamic_treerpo.trainer.bench.protocol.arms import TREE, select_arms
from dynamic_treerpo.trainer.bench.protocol.claims import all_tests
from dynamic_treerpo.trainer.bench.protocol.claims_block import README_BEGIN, README_END, readme_claims
from dynamic_treerpo.trainer.bench.protocol.page import HAND_WRITTEN, markdown
from dynamic_treerpo.trainer.bench.protocol.results import Budget, ProtocolResult, load
from tests.test_bench import GAINS, PEAKS, SLOPES, stand_in_run

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the exact test
def test_sign_flip_p_values_computed_by_hand() -> None:
    # every difference positive: only the observed pattern and its mirror reach the mean -> 2 / 2**n
    assert sign_flip_test([0.1, 0.3, 0.2]) == 0.25  # n = 3: the floor, whatever the t test says
    assert sign_flip_test([0.02, 0.01, 0.03, 0.01, 0.03]) == 0.0625  # n = 5
    assert sign_flip_test([-5.0, -1.0]) == 0.5
    # +-1 +-2 +-4 +-1 against the observed 1 + 2 + 4 - 1 = 6: with +4 the sums are 8, 6, 4, 2, 6, 4, 2, 0,
    # so 3 of 8 reach 6, and as many with -4: 6 / 16
    assert sign_flip_test([1.0, 2.0, 4.0, -1.0]) == 0.375
    assert sign_flip_test([1.0, 2.0, -3.0]) == 1.0  # a mean of 0: every pattern is as far from it
    assert sign_flip_test([0.0, 0.0, 0.0]) == 1.0
    # identical differences: the closed form the t test falls back to
    for n in (2, 3, 5, 8):
        assert sign_flip_test([0.7] * n) == sign_flip_p(n, 0.7) == exact_floor(n) == 2 / 2**n
    assert sign_flip_p(3, 0.0) == 1.0


def test_sign_flip_agrees_with_scipys_exact_permutation_test() -> None:
    rng = np.random.default_rng(0)
    for n in range(2, 9):
        for _ in range(3):
            d = rng.normal(0.3, 1.0, n)
            theirs = scipy_stats.permutation_test((d,), np.mean, permutation_type="samples",
                                                  n_resamples=np.inf).pvalue
            assert sign_flip_test(d) == pytest.approx(theirs), d


def test_sign_flip_pairs_two_halves_as_counting_every_pattern_would() -> None:
    """The test counts the 2**n patterns through two enumerated halves; counting them one by one (here
    up to 2**22 sums) gives the same p, past the 20 runs that one enumeration allowed before."""
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 11, 21, 22):
        d = rng.normal(0.2, 1.0, n)
        sums = np.zeros(1)
        for x in np.abs(d):
            sums = np.concatenate((sums + x, sums - x))
        reach = abs(d.sum()) - 1e-9 * np.abs(d).sum()
        assert sign_flip_test(d) == np.count_nonzero(np.abs(sums) >= reach) / sums.size, n


def test_float_ties_count_as_reaching_the_observed_mean() -> None:
    # 0.45, 0.55, 0.6 against 0.5: +-0.05 +-0.05 +-0.1 against 0.1; by hand 6 of 8 patterns reach it
    # (0.2, 0.1, 0.1, -0.1, -0.1, -0.2), but in floats 0.05 + 0.05 is not 0.1 (without the tolerance: 0.5)
    assert sign_flip_one_sample([0.45, 0.55, 0.6], 0.5) == 0.75
    for order in itertools.permutations([0.1, 0.2, 0.3, -0.6]):  # a mean of 0 up to rounding, any order
        assert sign_flip_test(order) == 1.0


def test_the_exact_test_is_refused_where_it_cannot_enumerate() -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_EXACT_SEEDS} seeds, got 41"):
        sign_flip_test([1.0] * 41)
    with pytest.raises(ValueError, match="at least one difference"):
        sign_flip_test([])
    with pytest.raises(ValueError, match="finite differences"):
        sign_flip_test([1.0, math.nan])
    with pytest.raises(ValueError, match="at most 40 seeds, got 41"):  # before anything trains
        Budget(seeds=41)
    assert sign_flip_test([1.0] * MAX_EXACT_SEEDS) == 2 / 2**MAX_EXACT_SEEDS


def test_how_many_seeds_an_exact_verdict_needs() -> None:
    assert exact_floor(3) == 0.25 and exact_floor(1) == 1.0
    assert seeds_for_exact(1) == 6  # 2/32 = 0.0625 is not below 0.05, 2/64 is
    assert seeds_for_exact(14) == 10  # 14 x 2/512 = 0.055; 14 x 2/1024 = 0.027
    assert seeds_for_exact(26) == 11
    with pytest.raises(ValueError, match="at least one test"):
        seeds_for_exact(0)


# ----------------------------------------------------------------------------- both tests, one verdict
def test_comparisons_carry_both_tests() -> None:
    a, b = [0.50, 0.52, 0.49, 0.51, 0.53], [0.48, 0.51, 0.46, 0.50, 0.50]
    c = paired(a, b)
    assert c.p_value == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue) and c.p_value < 0.05
    assert c.p_exact == 0.0625 and not c.no_spread  # 5 seeds, all one way: the exact floor
    ratio = one_sample([0.52, 0.50, 0.53], 0.6)
    assert ratio.p_value == pytest.approx(scipy_stats.ttest_1samp([0.52, 0.50, 0.53], 0.6).pvalue)
    assert ratio.p_exact == 0.25
    same = paired([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert same.no_spread and same.p_value == same.p_exact == 0.25


def test_a_verdict_needs_both_adjusted_tests() -> None:
    c = paired([0.50, 0.52, 0.49, 0.51, 0.53], [0.48, 0.51, 0.46, 0.50, 0.50])
    assert agreed_verdict(c, 0.01, 0.01) == "met"
    assert agreed_verdict(c, 0.01, 0.01, higher_is_better=False) == "not met"
    assert agreed_verdict(c, 0.01, c.p_exact) == "inconclusive"  # the t test alone: 5 seeds cannot
    assert agreed_verdict(c, 0.06, 0.01) == "inconclusive"  # the exact test alone
    assert agreed_verdict(c, 0.01, math.nan) == "inconclusive"
    ten = paired([1.0 + 0.1 * k for k in range(10)], [0.5 + 0.13 * k for k in range(10)])
    assert ten.p_exact == 2 / 1024
    p_t, p_exact = holm([ten.p_value] * 3), holm([ten.p_exact] * 3)
    assert agreed_verdict(ten, p_t[0], p_exact[0]) == "met"


# ----------------------------------------------------------------------------- the protocol's verdicts
def _stand_in_protocol(monkeypatch: pytest.MonkeyPatch, seeds: int) -> ProtocolResult:
    """The protocol on stand-in runs (tests/test_bench.py's): the tree learns fastest, every arm's
    per-seed differences vary a little."""
    def sweep_run(config, arm, budget, clock, test_seed):
        peak = PEAKS.get(arm.name, 8e-4)
        reward = 0.45 + GAINS.get(arm.name, 0.01) - 0.005 * abs(math.log2(config.optim.lr / peak))
        return {"validation_reward": reward, "validation_base": 0.45, "median_cpu_s": 2.0,
                "median_wall_s": 1.0, "test_prompts_in_validation": 0}

    def full_run(config, arm, budget, seconds, clock, treatment, target_gain=None):
        return stand_in_run(arm.name, config.seed, config.optim.lr, treatment.name, budget, seconds,
                             target_gain)

    monkeypatch.setattr(protocol, "sweep_run", sweep_run)
    monkeypatch.setattr(protocol, "full_run", full_run)
    budget = Budget(images=64, seeds=seeds, checkpoints=4, lrs=(4e-4, 8e-4, 1.6e-3), sweep_iterations=2)
    arms = select_arms(",".join([*GAINS, "no LayerTuning", "no clip"]))
    return protocol.run_protocol(budget, ["data.prompts_per_iteration=2"], None, arms, lambda _: None)


CLAIMS = (f"convergence:images:{TREE}:every", f"convergence:seconds:{TREE}:every",
          f"reward:images:{TREE}:every", f"reward:seconds:{TREE}:every", "efficiency:every:0.6",
          "efficiency:every:0.5")
"""The primary family's keys: the tree against every baseline (its times to the convergence target), and
both like-for-like pairs."""


def test_three_seeds_reach_no_verdict_that_the_t_test_alone_would_give(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tests = {t.key: t for t in all_tests(_stand_in_protocol(monkeypatch, 3))}
    assert [k for k, t in tests.items() if t.family == "primary"] == list(CLAIMS)
    for key in (f"reward:images:{TREE}:every", "efficiency:every:0.6", f"convergence:images:{TREE}:every"):
        t = tests[key]
        assert t.p_adjusted < 0.05 and t.p_exact == 0.25  # the t test alone would say "met"
        assert t.verdict == "inconclusive"
    assert not any(t.verdict in ("met", "not met", "descriptive") for t in tests.values())
    assert [c.against for c in tests["efficiency:every:0.5"].components] == [
        "dynamic_treerpo_euler / mixgrpo", "dynamic_treerpo / mixgrpo_flash"]  # "about 50%" against 0.5 too


def test_ten_seeds_give_verdicts_where_both_tests_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _stand_in_protocol(monkeypatch, 10)
    tests = all_tests(result)
    by = {t.key: t for t in tests}
    for key in CLAIMS[:5]:  # every baseline beaten on every seed: 2/1024 x 6 claims < 0.05
        assert by[key].p_exact == 2 / 1024 and by[key].p_exact_adjusted < 0.05, key
        assert by[key].verdict == "met", key
    # the ratio is 1 / (2 + 0.01 seed), 0.5 on seed 0 itself: that seed's sign cannot count
    assert by["efficiency:every:0.5"].p_exact == 4 / 1024 and by["efficiency:every:0.5"].verdict == "met"
    times = by[f"convergence:images:{TREE}:every"]  # resolved per iteration: a verdict, not a measurement
    first = by[f"time:images:{TREE}:every"]  # the first gain: secondary, resolved per iteration too
    assert first.family == "secondary" and not first.descriptive
    assert not times.descriptive and times.p_value == max(c.p_value for c in times.components)
    for t in tests:  # every verdict is one both adjusted tests give
        if t.verdict in ("met", "not met"):
            assert t.p_adjusted < 0.05 and t.p_exact_adjusted < 0.05
    reward = by[f"reward:images:{TREE}:every"]
    rows = {r["key"]: r for r in report.test_rows(tests)}
    assert rows[reward.key]["p_holm_exact"] == pytest.approx(reward.p_exact_adjusted)
    assert rows[reward.key]["seeds"] == 10 and len(rows[reward.key]["components"]) == 3
    assert rows[reward.key]["components"][0]["p_exact"] == 2 / 1024  # raw, no Holm of their own
    assert "p_holm" not in rows[reward.key]["components"][0]
    summary = report.format_summary({"arms": [], "tests": report.test_rows(tests)})
    assert "(t test)" in summary and "(exact sign-flip)" in summary
    assert "LayerTuning-RL helps, at equal images" in summary  # the ablation claims' family too


def test_a_claim_against_every_baseline_fails_on_the_one_it_does_not_beat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two baselines lose to the tree on every seed; the third learns as fast (met against two of three
    is not met) or faster (the tree is worse than one: "not met", the Bonferroni p of that one)."""
    monkeypatch.setitem(SLOPES, "flow_grpo_fast", 0.03)
    by = {t.key: t for t in all_tests(_stand_in_protocol(monkeypatch, 10))}
    reward = by[f"reward:images:{TREE}:every"]
    beaten = [c for c in reward.components if c.against != "flow_grpo_fast"]
    assert all(c.p_exact == 2 / 1024 and c.comparison.difference > 0 for c in beaten)
    assert reward.verdict == "inconclusive" and reward.p_exact_adjusted >= 0.05
    monkeypatch.setitem(SLOPES, "flow_grpo_fast", 0.05)
    by = {t.key: t for t in all_tests(_stand_in_protocol(monkeypatch, 10))}
    reward = by[f"reward:images:{TREE}:every"]
    assert not reward.union.for_claim and reward.binding.against == "flow_grpo_fast"
    assert reward.p_exact == 3 * 2 / 1024 and reward.verdict == "not met"


# ----------------------------------------------------------------------------- the committed pages
def test_docs_results_is_the_page_rendered_from_its_protocol_json() -> None:
    """docs/results-protocol.md is what `treerpo bench report` renders from docs/data/protocol.json (no
    training): the main part's full run, 8 seeds, every main arm's times resolved per iteration, each
    claim against every baseline, a verdict only where both tests give it."""
    result = load(ROOT / "docs" / "data")
    tests = all_tests(result)
    text = markdown(result, tests, report.summary_rows(result), "images").rstrip("\n")
    page = (ROOT / "docs" / "results-protocol.md").read_text(encoding="utf-8")
    assert page.startswith(text), "docs/results-protocol.md is stale: rebuild it with `treerpo bench report`"
    # the prose written by hand follows, below the marker a rebuild keeps
    assert page.index(HAND_WRITTEN) > len(text) and "## What the protocol's verdicts rest on" in page
    assert result.budget.seeds == 8 and result.parts == ["main", "ablations"] and result.stage == "done"
    assert {a.name for a in result.arms} >= {TREE, "awm", "dgpo", "diffusionnft", "mixgrpo"}
    assert "Generated by 2 commands, in order" in text and "treerpo bench protocol --part main --out " in text
    assert "treerpo bench protocol --part ablations --out " in text
    assert "the first iteration at the target (every iteration was evaluated until then)" in text
    by = {t.key: t for t in tests}
    primary = [t for t in tests if t.family == "primary"]
    assert len(primary) == 6 and all(len(t.components) in (2, 9) for t in primary)
    for t in primary:  # a verdict is printed only where both Holm-adjusted p-values give it
        both = t.p_adjusted is not None and t.p_exact_adjusted is not None and \
            max(t.p_adjusted, t.p_exact_adjusted) < 0.05
        assert (t.verdict in ("met", "not met")) == both, t.key
    assert by[f"time:images:{TREE}:every"].verdict != "descriptive"  # resolved per iteration
    assert "not tested on this page" not in text  # the ablation part ran, at the main part's code
    ablation = [t for t in tests if t.family == "ablation"]
    assert len(ablation) == 6 and all(t.comparison is not None and t.comparison.n == 8 for t in ablation)
    for t in ablation:  # a verdict is printed only where both Holm-adjusted p-values give it
        both = t.p_adjusted is not None and t.p_exact_adjusted is not None and \
            max(t.p_adjusted, t.p_exact_adjusted) < 0.05
        assert (t.verdict in ("met", "not met")) == both, t.key
    assert "| dynamic clipping vs the best fixed clip | held-out reward at equal images" in text
    # one code version, recorded: the commit, a clean checkout, the machine (issue 44)
    assert len({v["code"] for v in result.code}) == 1
    assert all(v["commit"] and not v["dirty"] for v in result.code)
    assert f"ran at one code version: `{result.code[0]['commit'][:12]}`" in text
    # the convergence target decides the speed claims; the first gain keeps its own, honest name
    assert result.convergence is not None and result.convergence["gain"] > result.target["gain"]
    assert {t.group for t in primary} >= {"faster convergence per sample", "faster convergence per second"}
    assert "faster to a first gain, per second (the cost of the first iterations)" in text
    # a run that reached a target after the seconds budget is censored there, not "not reached"
    # (DiffusionNFT reached the first gain at iteration 2 on every seed, on seed 4 past 23.8 CPU s)
    first = text[text.index("### Time to the first gain per seed"):text.index("### Time to the convergence")]
    nft = [line for line in first.splitlines() if line.startswith("| diffusionnft | ")][1]  # in seconds
    assert "not reached" not in nft and nft.count("(reached at iteration 2, after the budget: censored)") == 1


def test_the_archived_3_seed_page_is_rendered_from_its_protocol_json() -> None:
    """docs/results-3-seeds.md keeps the earlier 3-seed run (its ablations and clip treatments are the
    only ones measured): under its note, what `treerpo bench report` renders from its data, where with 3
    seeds nothing can be a verdict. Its runs were timed on the checkpoints only (a format-2 file from
    before), so its times stay measurements."""
    result = load(ROOT / "docs" / "data" / "3-seeds")
    tests = all_tests(result)
    text = markdown(result, tests, report.summary_rows(result), "images/3-seeds").rstrip("\n")
    page = (ROOT / "docs" / "results-3-seeds.md").read_text(encoding="utf-8")
    assert page.startswith("> **Archived") and page.rstrip("\n").endswith(text), \
        "docs/results-3-seeds.md is stale: python scripts/rebuild_archived_page.py"
    assert all((ROOT / "docs" / "images" / "3-seeds" / f"protocol_reward_vs_{axis}.png").is_file()
               for axis in ("images", "seconds"))
    assert result.budget.seeds == 3 and result.parts == ["all"]
    assert "| **met** |" not in text and "| **not met** |" not in text  # no verdict cell says either
    assert text.count("| **inconclusive** |") >= 30
    assert "| seeds | p, t test | p, exact | Holm p, t test | Holm p, exact | verdict |" in text
    assert "smallest p-value is 2/2^3 = 0.25, so no comparison on this page can be met" in text
    assert "in the primary family (6 tests) its smallest Holm-adjusted p-value is 1: no verdict" in text
    assert "tested against 0.5x" in text and "tested against 0.6x" in text
    assert "192 (checkpoint 1)" in text and "best baseline" not in text.lower()
    by = {t.key: t for t in tests}
    assert by[f"time:images:{TREE}:every"].verdict == "descriptive"
    assert len(by[f"reward:images:{TREE}:every"].components) == 7  # every baseline of that run


def test_the_readmes_verdict_table_is_the_one_rendered_from_docs_data() -> None:
    """README.md's short verdict table is what `treerpo bench report --readme` renders from
    docs/data/protocol.json: per claim the figure with its 95% interval, both Holm-adjusted p-values and
    the verdict, the seeds in its header, a link to the page with every p-value, and a line saying that
    the ablation claims are untested there."""
    result = load(ROOT / "docs" / "data")
    tests = all_tests(result)
    table = readme_claims(result, tests)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = readme.index(README_BEGIN), readme.index(README_END) + len(README_END)
    assert readme[start:end] == table, "README's verdict table is stale: `treerpo bench report --readme`"
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 12  # the 6 primary claims and the 6 ablation claims
    assert "8 paired seeds" in table.splitlines()[1]
    verdicts = {t.group: t.verdict for t in tests if t.family in ("primary", "ablation")}
    for row in rows:
        group = row.split(" | ")[0].removeprefix("| ")
        shown = verdicts[group] if verdicts[group] in ("met", "not met") else "inconclusive"
        assert row.endswith(f"| {shown} |"), row
        assert re.search(r"\(\S+ \.\. \S+\)", row), row  # every figure has its interval
        t = next(t for t in tests if t.group == group and t.family in ("primary", "ablation"))
        assert f"| {t.p_adjusted:.2g}, {t.p_exact_adjusted:.2g} |" in row  # both Holm p-values
    assert "[docs/results-protocol.md](docs/results-protocol.md)" in table and "no ablation part" not in table
    assert "| LayerTuning-RL helps, at equal images |" in table


def test_summary_writes_the_verdict_table_into_a_short_page_and_refuses_one_without_markers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench report --summary PAGE` writes the README's verdict table between the markers of a short
    results page, its link relative to that page (the protocol's page beside it), and keeps the page's
    other text; a page without the markers is refused in one line before any file is written, by `bench
    report` and by `bench protocol` (before it trains)."""
    import shutil

    from dynamic_treerpo.trainer.cli import main

    out, docs = tmp_path / "data", tmp_path / "docs"
    out.mkdir()
    docs.mkdir()
    shutil.copy(ROOT / "docs" / "data" / "protocol.json", out / "protocol.json")
    plain = docs / "plain.md"
    plain.write_text("# Results\n\nno markers here\n")
    for command in (["bench", "report", "--out", str(out)],
                    ["bench", "protocol", "--quick", "--out", str(out)]):
        assert main([*command, "--docs", str(docs / "results-protocol.md"), "--summary", str(plain)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and str(plain) in err and README_BEGIN in err, err
        assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["plain.md", "protocol.json"]
    assert plain.read_text() == "# Results\n\nno markers here\n"

    short = docs / "results.md"
    short.write_text(f"# Results\n\nThe paper's claims:\n\n{README_BEGIN}\nold\n{README_END}\n\nmore text\n")
    assert main(["bench", "report", "--out", str(out), "--docs", str(docs / "results-protocol.md"),
                 "--summary", str(short)]) == 0
    result = load(out)
    block = readme_claims(result, all_tests(result), "results-protocol.md", "--summary")
    assert short.read_text() == f"# Results\n\nThe paper's claims:\n\n{block}\n\nmore text\n"
    assert "[results-protocol.md](results-protocol.md)" in block and "bench report --summary" in block
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    committed = readme[readme.index(README_BEGIN):readme.index(README_END) + len(README_END)]
    assert block == committed.replace("docs/results-protocol.md", "results-protocol.md").replace(
        "--readme", "--summary")  # the README's table, linked from the short page
    assert (docs / "results-protocol.md").read_text().startswith("# Results: the paper's claims")


def test_the_efficiency_ratio_compares_the_same_iterations_of_both_runs() -> None:
    """A run with more iterations (the cheaper one, in equal seconds) adds later, dearer iterations to its
    median alone: the ratio takes the first iterations both ran."""
    from types import SimpleNamespace

    from dynamic_treerpo.trainer.bench.protocol.claims import same_iterations_ratio

    tree = SimpleNamespace(iteration_s=lambda clock: [1.0, 1.0, 3.0, 3.0, 3.0])
    base = SimpleNamespace(iteration_s=lambda clock: [2.0, 2.0])
    assert same_iterations_ratio(tree, base, "cpu") == 0.5  # medians over all iterations: 3 / 2
    assert same_iterations_ratio(base, tree, "cpu") == 2.0


def test_runs_another_process_disturbed_are_listed_and_the_claims_in_seconds_given_without_them() -> None:
    """The published run ran alone on the cores: no run's wall/CPU ratio is past its arm's median by 15%,
    and the page says so. A run made to look disturbed (its wall seconds raised by half, as a second job
    on the same cores did to DGPO seed 1 in the run before) is found, listed, and left out of the claims in
    seconds with its seed's pairs."""
    from dataclasses import replace

    from dynamic_treerpo.trainer.bench.protocol.disturbed import disturbed_runs, wall_per_cpu, without
    from dynamic_treerpo.trainer.bench.protocol.page_claims import clean_seconds

    result = load(ROOT / "docs" / "data")
    assert disturbed_runs(result) == []
    page = (ROOT / "docs" / "results-protocol.md").read_text(encoding="utf-8")
    assert "### Clean seconds" in page and "than 15% (another process" in page and " None was." in page
    slow = [replace(r, iteration_wall_s=[1.5 * s for s in r.iteration_wall_s])
            if (r.arm, r.seed) == ("dgpo", 1) else r for r in result.runs]
    loaded = replace(result, runs=slow)
    runs = disturbed_runs(loaded)
    assert [(d.arm, d.seed) for d in runs] == [("dgpo", 1)] and runs[0].ratio > 1.15 * runs[0].arm_ratio
    quiet = [r for r in loaded.runs if r.arm == "dgpo" and r.seed != 1]
    assert all(wall_per_cpu(r) <= 1.15 * statistics.median(map(wall_per_cpu, quiet)) for r in quiet)
    kept = without(loaded, runs)
    assert len(kept.runs) == len(result.runs) - 1
    assert not any((r.arm, r.seed) == ("dgpo", 1) for r in kept.runs)
    listed = "\n".join(clean_seconds(loaded, all_tests(loaded)))
    assert "| dgpo | 1 |" in listed and "None was" not in listed
