"""Statistics of the benchmark protocol: means with 95% intervals, paired t tests, exact sign-flip
tests, Holm's adjustment within a family of tests, and the verdicts.

Pure functions over per-seed values. Seeds are paired: a seed gives every arm the same prompts and
the same LoRA initialisation, so two arms are compared by the per-seed differences, which removes
the seed-to-seed variation both arms share. Each comparison gets two tests of those differences:

- the paired t test (scipy's ``ttest_rel``), which assumes the differences are normal; with 3 seeds
  it has 2 degrees of freedom and can give any p-value, however small;
- the exact sign-flip (permutation) test, which assumes only that each difference is as likely
  positive as negative when the arms do not differ; it can never go below ``2 / 2**n`` (0.25 with
  3 seeds, 0.0625 with 5).

A verdict is read from the Holm-adjusted p-values of its family, never from the raw ones, and is
"met" or "not met" only when both tests agree after the adjustment: a claim that rests on the t
test's normality alone, with a handful of seeds, is "inconclusive".

A claim against several comparators at once ("the tree beats the baselines") is one row: the
intersection-union test of its comparisons (:func:`intersection_union`), met only when it is met
against each one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

Verdict = Literal["met", "not met", "inconclusive", "descriptive"]
""""descriptive": a measurement reported with its interval and tests, which the protocol does not
read as a verdict (the reason is given beside it)."""
ALPHA = 0.05
MAX_EXACT_SEEDS = 40
"""The exact sign-flip test counts all ``2**n`` sign patterns, enumerating each half of the differences
(at most ``2**20`` sums, about a million) and pairing the halves by sorting: up to 40 paired runs."""
TIE_TOLERANCE = 1e-9
"""Relative to the sum of the absolute differences: a flipped sum this close to the observed one
counts as reaching it (float sums of the same numbers in another order differ in the last bits)."""


@dataclass(frozen=True)
class Estimate:
    """Mean over seeds with the half-width of its 95% t interval (nan with one seed)."""

    mean: float
    ci95: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.ci95:.4f}" if math.isfinite(self.ci95) else f"{self.mean:.4f}"


def _t_quantile(n: int) -> float:
    return float(scipy_stats.t.ppf(1 - ALPHA / 2, n - 1))


def mean_ci95(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` and the half-width of its two-sided 95% Student-t interval."""
    if not values:
        raise ValueError("mean_ci95 needs at least one value")
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Estimate(mean, math.nan, n)
    return Estimate(mean, _t_quantile(n) * statistics.stdev(values) / math.sqrt(n), n)


@dataclass(frozen=True)
class Comparison:
    """A paired difference over seeds: its mean, 95% t interval, the t test's two-sided p-value and
    the exact sign-flip test's (both raw). With no spread (every seed the same difference) the t test
    is undefined and ``p_value`` is the exact one (``no_spread``)."""

    difference: float
    low: float
    high: float
    p_value: float
    n: int
    p_exact: float = math.nan

    @property
    def no_spread(self) -> bool:
        return self.low == self.high


def sign_flip_test(differences: Sequence[float]) -> float:
    """The exact two-sided sign-flip (permutation) test of paired differences: under "no difference"
    each difference is as likely positive as negative, so each of the ``2**n`` ways to flip their signs
    is equally likely; ``p`` is the share of them whose mean is at least as far from 0 as the observed
    mean (the observed pattern and its mirror image included, so ``p >= 2 / 2**n``).

    Why beside the t test: with 3 seeds the t test has 2 degrees of freedom and rests on the
    differences being normal, which 3 numbers cannot show; this test assumes only symmetry, and its
    smallest p-value says plainly what 3 seeds can and cannot establish (0.25)."""
    n = len(differences)
    if n < 1:
        raise ValueError("a sign-flip test needs at least one difference")
    if n > MAX_EXACT_SEEDS:
        raise ValueError(f"the exact sign-flip test enumerates 2**n sign patterns; at most "
                         f"{MAX_EXACT_SEEDS} seeds, got {n}")
    size = np.abs(np.asarray(differences, dtype=np.float64))
    if not np.all(np.isfinite(size)):
        raise ValueError(f"a sign-flip test needs finite differences, got {list(differences)}")
    reach = abs(float(np.sum(differences))) - TIE_TOLERANCE * float(np.sum(size))
    if reach <= 0:  # a mean of 0 (up to rounding): every pattern is as far from it
        return 1.0
    # every pattern's sum is a + b, a from the first half's 2**h sums and b from the second's: count the
    # pairs with a + b >= reach or a + b <= -reach (disjoint, as reach > 0) with the second half sorted
    half = n // 2
    first, second = _signed_sums(size[:half]), np.sort(_signed_sums(size[half:]))
    above = second.size - np.searchsorted(second, reach - first, side="left")
    below = np.searchsorted(second, -reach - first, side="right")
    return float(np.sum(above) + np.sum(below)) / (first.size * second.size)


def _signed_sums(size: np.ndarray) -> np.ndarray:
    """The sums of ``size`` under every one of its ``2**len(size)`` sign patterns."""
    sums = np.zeros(1)
    for d in size:
        sums = np.concatenate((sums + d, sums - d))
    return sums


def sign_flip_one_sample(values: Sequence[float], reference: float) -> float:
    """The exact sign-flip test of ``values`` against ``reference`` (each ``value - reference`` as
    likely positive as negative when the true centre is ``reference``): a ratio against a threshold."""
    return sign_flip_test([v - reference for v in values])


def exact_floor(n: int) -> float:
    """The smallest p-value the exact sign-flip test can give with ``n`` seeds: ``2 / 2**n``."""
    return min(1.0, 2.0 / 2.0**n)


def seeds_for_exact(family: int, alpha: float = ALPHA) -> int:
    """The fewest seeds with which the exact test's smallest p-value, Holm-adjusted in a family of
    ``family`` tests (multiplied by ``family``), is below ``alpha``: ``family * 2 / 2**n < alpha``."""
    if family < 1:
        raise ValueError(f"a family has at least one test, got {family}")
    n = 1
    while family * exact_floor(n) >= alpha:
        n += 1
    return n


def sign_flip_p(n: int, difference: float) -> float:
    """The exact two-sided sign-flip test of ``n`` identical per-seed differences: of the ``2**n`` ways
    to flip their signs, only the two with every sign alike reach the observed mean, so
    ``p = 2 / 2**n`` (0.25 with 3 seeds); 1 when the difference is 0 (``sign_flip_test`` in closed
    form). A t test has no spread to use then, and reading that as certainty (p 0) would let three
    seeds "prove" anything."""
    return 1.0 if difference == 0.0 else exact_floor(n)


def _compare(differences: Sequence[float], p_value: Callable[[], float]) -> Comparison:
    """Mean of ``differences`` with ``mean ± t(0.975, n-1) * sd / sqrt(n)`` and the exact sign-flip
    p-value; ``p_value`` (the t test's) is asked only when the differences vary (with no spread the
    t test is undefined, and the exact test, ``sign_flip_p``, stands in for it)."""
    n = len(differences)
    if n < 2:
        raise ValueError(f"a t test needs at least two seeds, got {n}")
    diff = statistics.fmean(differences)
    sd = statistics.stdev(differences)
    if sd == 0.0:
        p = sign_flip_p(n, diff)
        return Comparison(diff, diff, diff, p, n, p)
    half = _t_quantile(n) * sd / math.sqrt(n)
    return Comparison(diff, diff - half, diff + half, p_value(), n, sign_flip_test(differences))


def one_sample(values: Sequence[float], reference: float = 0.0) -> Comparison:
    """The t test of ``mean(values) - reference`` (scipy's ``ttest_1samp``) with its 95% interval, and
    the exact sign-flip test of ``values - reference``."""
    return _compare([v - reference for v in values],
                    lambda: float(scipy_stats.ttest_1samp(list(values), reference).pvalue))


def paired(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """The paired t test of ``a - b`` (``a[i]`` and ``b[i]`` from the same seed): scipy's
    ``ttest_rel``, with the t interval of the per-seed differences, and the exact sign-flip test of
    the same differences."""
    if len(a) != len(b):
        raise ValueError(f"a paired test needs the same seeds on both sides, got {len(a)} and {len(b)}")
    return _compare([x - y for x, y in zip(a, b, strict=True)],
                    lambda: float(scipy_stats.ttest_rel(list(a), list(b)).pvalue))


def at_least_chance(chances: Sequence[float], k: int) -> float:
    """The chance that at least ``k`` of independent events happen, each with its own chance (the
    Poisson-binomial tail, exact by convolution): whether more runs went past a limit than their stated
    risks expect, when every run states its own."""
    counts = np.array([1.0])
    for c in chances:
        counts = np.convolve(counts, [1.0 - c, c])
    return float(min(1.0, counts[max(k, 0):].sum()))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of one family of p-values, in their order. The ``i``-th smallest
    of ``m`` (from 0) is multiplied by ``m - i``, the running maximum taken, capped at 1. A nan
    p-value (a test that was not made) stays nan and does not count in ``m``."""
    order = sorted((i for i, p in enumerate(p_values) if not math.isnan(p)), key=lambda i: p_values[i])
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def claimed_side(comparison: Comparison, higher_is_better: bool = True) -> bool:
    """Whether the mean difference lies on the claimed side of 0 (0 itself does not)."""
    d = comparison.difference
    return d > 0 if higher_is_better else d < 0


@dataclass(frozen=True)
class IntersectionUnion:
    """One claim against every comparator: the p-value of each test (t, exact) for the row, whether
    they are the claim's (``for_claim``: every comparison lies on the claimed side) or against it, and
    which comparison sets each (its index: the one to show beside the row)."""

    p_value: float
    p_exact: float
    for_claim: bool
    binding: int
    binding_exact: int
    size: int


def intersection_union(comparisons: Sequence[Comparison], higher_is_better: bool = True) -> IntersectionUnion:
    """The claim "better than each of ``comparisons``" as one test, for the t test and the exact test
    alike.

    - **For the claim** (every mean difference on the claimed side): the intersection-union test
      (Berger, 1982, "Multiparameter hypothesis testing and acceptance sampling", Technometrics 24,
      295-300). Its null hypothesis is the union "not better than at least one comparator"; it is
      rejected at level alpha when each comparison's own level-alpha test rejects, so its p-value is
      the largest of the raw p-values, with no adjustment for the number of comparators. Why: the
      claim needs every one of them, and the weakest win is what it rests on.
    - **Against the claim** (some difference on the other side, or 0): "worse than at least one
      comparator" is a union-intersection claim, which does need the adjustment: Bonferroni over the
      ``k`` comparisons, ``k`` times the smallest raw p-value among those against the claim.

    Each side uses two-sided raw p-values, so each spends at most alpha / 2 when no comparator
    differs: the row's p-value is a valid one for Holm's adjustment within its family."""
    if not comparisons:
        raise ValueError("an intersection-union test needs at least one comparison")
    k = len(comparisons)
    sides = [claimed_side(c, higher_is_better) for c in comparisons]
    if all(sides):
        t = max(range(k), key=lambda i: comparisons[i].p_value)
        e = max(range(k), key=lambda i: comparisons[i].p_exact)
        return IntersectionUnion(comparisons[t].p_value, comparisons[e].p_exact, True, t, e, k)
    against = [i for i in range(k) if not sides[i]]
    t = min(against, key=lambda i: comparisons[i].p_value)
    e = min(against, key=lambda i: comparisons[i].p_exact)
    return IntersectionUnion(min(1.0, k * comparisons[t].p_value), min(1.0, k * comparisons[e].p_exact),
                             False, t, e, k)


def union_verdict(union: IntersectionUnion, p_adjusted: float, p_exact_adjusted: float) -> Verdict:
    """"met" when the row is for the claim and both its adjusted p-values are below 0.05; "not met"
    when it is against the claim (worse than some comparator) and both are; otherwise
    "inconclusive" (the rule of :func:`agreed_verdict`, for a row of several comparisons)."""
    if any(math.isnan(p) or p >= ALPHA for p in (p_adjusted, p_exact_adjusted)):
        return "inconclusive"
    return "met" if union.for_claim else "not met"


def verdict(comparison: Comparison, p_adjusted: float, higher_is_better: bool = True) -> Verdict:
    """"met" when the adjusted p-value is below 0.05 and the difference lies on the claimed side of
    0 (its raw 95% interval then excludes 0, as the adjusted p-value is at least the raw one); "not
    met" when it is below 0.05 on the other side; otherwise "inconclusive"."""
    if math.isnan(p_adjusted) or p_adjusted >= ALPHA:
        return "inconclusive"
    good = comparison.low > 0 if higher_is_better else comparison.high < 0
    bad = comparison.high < 0 if higher_is_better else comparison.low > 0
    return "met" if good else "not met" if bad else "inconclusive"


def agreed_verdict(comparison: Comparison, p_adjusted: float, p_exact_adjusted: float,
                   higher_is_better: bool = True) -> Verdict:
    """"met" or "not met" only when the t test and the exact sign-flip test both give it after the
    adjustment (both adjusted p-values below 0.05, on the same side of 0); otherwise "inconclusive".
    Why: which test is "right" for a handful of seeds is a matter of assumptions (normality against
    symmetry), and a verdict that holds under one and not the other is not one to print."""
    by_t = verdict(comparison, p_adjusted, higher_is_better)
    if math.isnan(p_exact_adjusted) or p_exact_adjusted >= ALPHA:
        return "inconclusive"
    side = comparison.difference > 0 if higher_is_better else comparison.difference < 0
    by_exact: Verdict = "met" if side else "not met" if comparison.difference != 0 else "inconclusive"
    return by_t if by_t == by_exact else "inconclusive"
