"""The protocol's statistics and the rules it fixes before any test run, without training: paired
t tests, Holm's adjustment (against hand-computed values), the intersection-union test of a claim
against every baseline (by hand, and its level by simulation), restricted mean times with censoring,
the learning-rate grid's extension, the validation-only target, and disjoint validation/test pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dynamic_treerpo.trainer.bench.common.stats import (
    Comparison,
    at_least_chance,
    holm,
    intersection_union,
    mean_ci95,
    one_sample,
    paired,
    union_verdict,
    verdict,
)
from dynamic_treerpo.trainer.bench.protocol import sweep as sweeping
from dynamic_treerpo.trainer.bench.protocol.survival import capped, kaplan_meier, reached, restricted_mean
from dynamic_treerpo.trainer.training.evaluate import eval_pairs_for, held_out_pairs, validation_pairs


# ----------------------------------------------------------------------------- paired tests
def test_paired_test_is_scipys_ttest_rel_with_the_t_interval_of_the_differences() -> None:
    a = [0.50, 0.52, 0.49, 0.51, 0.53]
    b = [0.48, 0.51, 0.46, 0.50, 0.50]  # each seed's b a little below its a
    c = paired(a, b)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    assert c.p_value == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)
    assert c.difference == pytest.approx(0.02) and c.n == 5
    half = scipy_stats.t.ppf(0.975, 4) * scipy_stats.tstd(diffs) / math.sqrt(5)
    assert (c.low, c.high) == (pytest.approx(0.02 - half), pytest.approx(0.02 + half))
    # pairing removes what the seeds share: Welch on the same numbers sees no difference
    assert c.p_value < 0.05 < scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    assert (c.low > 0) == (c.p_value < 0.05)


def test_paired_edge_cases_are_exact_or_refused() -> None:
    # every seed differs by exactly 0.5 (times on the checkpoint grid do): no spread for a t test, and
    # no certainty either. The exact sign-flip test: 2 of the 2**3 sign patterns reach the mean.
    same = paired([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert (same.difference, same.low, same.high, same.p_value) == (0.5, 0.5, 0.5, 0.25)
    assert verdict(same, holm([same.p_value])[0]) == "inconclusive"  # 3 seeds cannot prove it
    assert paired([2.0] * 6, [1.0] * 6).p_value == pytest.approx(2 / 64)
    assert one_sample([0.4, 0.4, 0.4], 0.6).p_value == 0.25
    assert paired([1.0, 2.0], [1.0, 2.0]).p_value == 1.0
    with pytest.raises(ValueError, match="same seeds on both sides"):
        paired([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least two seeds"):
        paired([1.0], [2.0])
    ratio = one_sample([0.40, 0.42, 0.44], 0.6)
    assert ratio.difference == pytest.approx(-0.18)
    assert ratio.p_value == pytest.approx(scipy_stats.ttest_1samp([0.40, 0.42, 0.44], 0.6).pvalue)


def test_mean_ci95_is_the_t_interval() -> None:
    e = mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    assert e.mean == 3.0 and e.ci95 == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-5)
    assert math.isnan(mean_ci95([1.0]).ci95)


# ----------------------------------------------------------------------------- Holm
def test_holm_against_hand_computed_values() -> None:
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # a test that was not made (nan) stays nan and does not count in m (here m = 3): 0.02 x 3 = 0.06,
    # 0.5 x 2 = 1.0, 0.6 x 1 = 0.6 -> running max 1.0 (capped at 1)
    adjusted = holm([0.6, math.nan, 0.02, 0.5])
    assert math.isnan(adjusted[1])
    assert [adjusted[0], adjusted[2], adjusted[3]] == pytest.approx([1.0, 0.06, 1.0])
    assert holm([]) == []
    assert holm([0.2]) == [0.2]


def test_verdicts_come_from_the_adjusted_p_value() -> None:
    c = paired([0.50, 0.52, 0.49, 0.51, 0.53], [0.48, 0.51, 0.46, 0.50, 0.50])
    assert c.p_value < 0.05
    assert verdict(c, c.p_value) == "met"
    assert verdict(c, 0.06) == "inconclusive"  # significant raw, not after Holm
    assert verdict(c, c.p_value, higher_is_better=False) == "not met"
    flipped = paired([0.48, 0.51, 0.46, 0.50, 0.50], [0.50, 0.52, 0.49, 0.51, 0.53])
    assert verdict(flipped, flipped.p_value) == "not met"
    assert verdict(c, math.nan) == "inconclusive"


# ----------------------------------------------------------------------------- against every baseline
def _c(difference: float, p: float, p_exact: float) -> Comparison:
    return Comparison(difference, difference - 0.1, difference + 0.1, p, 8, p_exact)


def test_a_claim_against_every_baseline_is_the_intersection_union_test() -> None:
    # every difference on the claimed side: the largest raw p-value of each test, no adjustment for 3
    u = intersection_union([_c(0.2, 0.001, 0.008), _c(0.1, 0.03, 0.004), _c(0.3, 0.01, 0.02)])
    assert (u.p_value, u.p_exact, u.for_claim, u.binding, u.binding_exact) == (0.03, 0.02, True, 1, 2)
    assert union_verdict(u, 0.04, 0.04) == "met"
    assert union_verdict(u, 0.04, 0.06) == "inconclusive"  # one test alone does not make a verdict
    # one baseline on the other side: against the claim, Bonferroni over the 3 on the smallest of those
    u = intersection_union([_c(0.2, 0.001, 0.008), _c(-0.1, 0.004, 0.008), _c(-0.3, 0.01, 0.004)])
    assert not u.for_claim and (u.p_value, u.p_exact) == pytest.approx((0.012, 0.012))
    assert (u.binding, u.binding_exact) == (1, 2)
    assert union_verdict(u, 0.03, 0.03) == "not met" and union_verdict(u, 0.06, 0.03) == "inconclusive"
    # a difference of 0 is not the claimed side; p-values are capped at 1
    u = intersection_union([_c(0.2, 0.001, 0.008), _c(0.0, 0.9, 1.0)])
    assert not u.for_claim and (u.p_value, u.p_exact) == (1.0, 1.0)
    # lower is better (times): the claimed side is below 0
    u = intersection_union([_c(-5.0, 0.01, 0.004), _c(-2.0, 0.02, 0.004)], higher_is_better=False)
    assert u.for_claim and u.p_value == 0.02
    # one comparison: the ordinary two-sided test
    one = paired([0.50, 0.52, 0.49, 0.51, 0.53], [0.48, 0.51, 0.46, 0.50, 0.50])
    u = intersection_union([one])
    assert (u.p_value, u.p_exact, u.for_claim) == (one.p_value, one.p_exact, True)
    with pytest.raises(ValueError, match="at least one comparison"):
        intersection_union([])


def test_the_intersection_union_test_keeps_its_level_without_an_adjustment() -> None:
    """The least favourable case of "the tree beats all 3": it ties one baseline and beats the others
    by far. Read at 0.05, the IUT (the largest p) says "met" at most 2.5% of the time (one-sided half of
    a two-sided test); the smallest p, which an unadjusted pick of the best comparison would use, says
    it every time."""
    rng = np.random.default_rng(7)
    runs = 4000
    differences = rng.normal([0.0, 3.0, 3.0], 1.0, (runs, 8, 3))  # 8 seeds, 3 baselines
    test = scipy_stats.ttest_1samp(differences, 0.0, axis=1)  # the t tests of one_sample, all at once
    met = smallest = 0
    for means, ps in zip(differences.mean(axis=1), test.pvalue, strict=True):
        cs = [_c(float(m), float(p), float(p)) for m, p in zip(means, ps, strict=True)]
        u = intersection_union(cs)
        met += u.for_claim and u.p_value < 0.05
        smallest += min(c.p_value for c in cs) < 0.05
    assert met / runs < 0.035  # 0.025 expected; 0.035 is 4 standard errors above it
    assert smallest / runs > 0.99


# ----------------------------------------------------------------------------- time to target
def test_restricted_mean_with_censoring_against_hand_computed_areas() -> None:
    # events at 2 and 4, a censoring at 4 and an event at 6, horizon 5:
    # S = 1 on [0, 2), 3/4 on [2, 4), 3/4 * 2/3 = 1/2 on [4, 5]: area 2 + 1.5 + 0.5 = 4
    assert kaplan_meier([2, 4, 4, 6], [True, False, True, True]) == [(2, 0.75), (4, 0.5), (6, 0.0)]
    assert restricted_mean([2, 4, 4, 6], [True, False, True, True], 5) == pytest.approx(4.0)
    # that is not the mean of min(time, 5) (3.75): the censoring at 4 is before the budget
    # censored only at the budget, it is the mean of min(time, budget)
    times, events = [2.0, 3.0, 10.0, 10.0], [True, True, False, False]
    assert restricted_mean(times, events, 10) == pytest.approx(sum(times) / 4) == pytest.approx(6.25)
    assert restricted_mean([10.0, 10.0], [False, False], 10) == 10.0  # none reached it
    assert restricted_mean([1.0, 1.0], [True, True], 10) == 1.0
    assert capped([3.0, None, 12.0], 10.0) == [3.0, 10.0, 10.0]
    # reached past the budget (a run trains on to its other budget): censored there, not an event
    assert reached([3.0, None, 12.0, 10.0], 10.0) == [True, False, False, True]
    with pytest.raises(ValueError, match="one event flag per time"):
        kaplan_meier([1.0], [])


# ----------------------------------------------------------------------------- the sweep
def _profile(peak: float):
    """A validation reward that is highest at ``peak`` and falls with the log-distance from it."""
    def run_one(lr: float) -> dict[str, float]:
        return {"validation_reward": 0.5 - abs(math.log2(lr / peak)) * 0.01, "validation_base": 0.45,
                "median_cpu_s": 2.0, "median_wall_s": 1.0}
    return run_one


def test_a_best_rate_at_the_grid_edge_extends_the_grid_until_it_is_inside() -> None:
    lrs = (4e-4, 8e-4, 1.6e-3)
    lines: list[str] = []
    low = sweeping.sweep_arm("low", lrs, _profile(1e-4), 3, lines.append)
    assert [r["lr"] for r in low] == pytest.approx([4e-4, 8e-4, 1.6e-3, 2e-4, 1e-4, 5e-5])
    assert [r["extension"] for r in low] == [0, 0, 0, 1, 2, 3]
    high = sweeping.sweep_arm("high", lrs, _profile(3.2e-3), 3, lines.append)
    assert [r["lr"] for r in high] == pytest.approx([4e-4, 8e-4, 1.6e-3, 3.2e-3, 6.4e-3])
    inside = sweeping.sweep_arm("inside", lrs, _profile(8e-4), 3, lines.append)
    assert len(inside) == 3  # nothing to extend
    grid = sweeping.grid([*low, *high, *inside])
    assert grid["low"] == {"rates": pytest.approx([5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]),
                           "chosen": pytest.approx(1e-4), "inside": True}
    assert grid["high"]["chosen"] == pytest.approx(3.2e-3) and grid["high"]["inside"]
    assert grid["inside"]["chosen"] == 8e-4 and grid["inside"]["inside"]
    assert any("is at the edge" in line for line in lines)
    # the limit reached: the chosen rate stays at the edge, and the grid says so
    short = sweeping.grid(sweeping.sweep_arm("far", lrs, _profile(1e-5), 1, lines.append))
    assert short["far"]["chosen"] == pytest.approx(2e-4) and not short["far"]["inside"]


def test_the_target_comes_from_validation_rewards_only() -> None:
    rows = []
    for arm, gain in (("dynamic_treerpo", 0.06), ("mixgrpo", 0.02), ("flow_grpo", 0.04)):
        rows += [{"arm": arm, "lr": 1e-3, "validation_reward": 0.45 + gain, "validation_base": 0.45},
                 {"arm": arm, "lr": 2e-3, "validation_reward": 0.40, "validation_base": 0.45}]
    target = sweeping.target(rows, 0.5)
    assert target["gain"] == pytest.approx(0.02)  # half the median of 0.06, 0.02, 0.04
    assert target["usable"] and "median" in target["rule"]
    assert target["validation_gains"] == pytest.approx({"dynamic_treerpo": 0.06, "mixgrpo": 0.02,
                                                         "flow_grpo": 0.04})
    assert sweeping.evaluation_seconds(rows) == 0.0  # not measured: no evaluation time in the estimate
    assert sweeping.evaluation_seconds([{**r, "eval_wall_s": 2.0 + i} for i, r in enumerate(rows)]) == 4.5
    assert sweeping.best_rates(rows) == {"dynamic_treerpo": 1e-3, "mixgrpo": 1e-3, "flow_grpo": 1e-3}
    flat = [{**r, "validation_reward": 0.44} for r in rows]
    assert not sweeping.target(flat)["usable"]


def test_a_tie_goes_to_the_smaller_rate() -> None:
    rows = [{"arm": "b", "lr": lr, "validation_reward": 0.5} for lr in (2e-3, 1e-3)]
    assert sweeping.best_rates(rows) == {"b": 1e-3}


# ----------------------------------------------------------------------------- validation vs test
def test_validation_pairs_share_no_prompt_with_the_test_pairs(tmp_path) -> None:
    test_prompts = {p.prompt for p in held_out_pairs(64, 12345)}
    # the protocol's old validation set (eval seed 777) shared prompts with the test set
    assert test_prompts & {p.prompt for p in held_out_pairs(64, 777)}
    validation, test = validation_pairs("scenes", None, 64, 777, 12345)
    assert test == held_out_pairs(64, 12345)  # the test set is unchanged
    assert len(validation) == 64 and not test_prompts & {p.prompt for p in validation}
    # without exclusions a seed's held-out set is what it always was
    assert eval_pairs_for("scenes", None, 64, 777) == held_out_pairs(64, 777)
    # a training prompt file: both drawn from it, disjoint; an evaluation file is the test set only
    train = tmp_path / "train.txt"
    train.write_text("\n".join(f"prompt {i}" for i in range(40)) + "\n")
    validation, test = validation_pairs(str(train), None, 8, 777, 12345)
    assert not {p.prompt for p in validation} & {p.prompt for p in test}
    held = tmp_path / "test.txt"
    held.write_text("prompt 1\nprompt 2\nsomething else\n")
    validation, test = validation_pairs(str(train), str(held), 8, 777, 12345)
    assert {p.prompt for p in test} == {"prompt 1", "prompt 2", "something else"}
    assert {p.prompt for p in validation} <= {f"prompt {i}" for i in range(40)} - {"prompt 1", "prompt 2"}
    with pytest.raises(ValueError, match="must differ"):
        validation_pairs("scenes", None, 8, 5, 5)


def test_at_least_chance_is_the_binomial_tail_when_every_chance_is_the_same() -> None:
    for k in range(0, 7):
        assert at_least_chance([0.125] * 6, k) == pytest.approx(scipy_stats.binom.sf(k - 1, 6, 0.125))


def test_at_least_chance_of_mixed_chances_counts_each_run() -> None:
    # two runs: one that never goes past, one that goes past half the time
    assert at_least_chance([0.0, 0.5], 1) == pytest.approx(0.5)
    assert at_least_chance([0.0, 0.5], 2) == pytest.approx(0.0)
    assert at_least_chance([0.2, 0.5], 2) == pytest.approx(0.1)
    assert at_least_chance([], 0) == 1.0
