"""Statistics of the benchmark protocol: means with 95% intervals, Welch tests, verdicts.

Pure functions over per-seed values, with scipy's t distribution and Welch test (the field's
standard tools) rather than hand-written ones. A verdict never goes beyond its interval: a
difference whose 95% interval holds 0 is "inconclusive".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scipy import stats as scipy_stats

Verdict = Literal["met", "not met", "inconclusive"]
ALPHA = 0.05


@dataclass(frozen=True)
class Estimate:
    """Mean over seeds with the half-width of its 95% t interval (nan with one seed)."""

    mean: float
    ci95: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.ci95:.4f}" if math.isfinite(self.ci95) else f"{self.mean:.4f}"


def mean_ci95(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` and the half-width of its two-sided 95% Student-t interval."""
    if not values:
        raise ValueError("mean_ci95 needs at least one value")
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Estimate(mean, math.nan, n)
    sem = statistics.stdev(values) / math.sqrt(n)
    return Estimate(mean, float(scipy_stats.t.ppf(1 - ALPHA / 2, n - 1)) * sem, n)


@dataclass(frozen=True)
class Comparison:
    """``a - b`` over seeds: the difference of means, its Welch 95% interval and p-value."""

    difference: float
    low: float
    high: float
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Welch's unequal-variance t test of ``mean(a) - mean(b)``, with its 95% interval."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("a Welch test needs at least two values on each side")
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:  # identical constant samples: the difference is exact
        return Comparison(diff, diff, diff, 1.0 if diff == 0.0 else 0.0)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    se = math.sqrt(va + vb)
    half = float(scipy_stats.t.ppf(1 - ALPHA / 2, dof)) * se
    p = 2.0 * float(scipy_stats.t.sf(abs(diff) / se, dof))  # scipy.stats.ttest_ind(equal_var=False)'s
    return Comparison(diff, diff - half, diff + half, p)


def verdict(comparison: Comparison, higher_is_better: bool = True) -> Verdict:
    """"met" when the interval of the difference lies on the claimed side of 0, "not met" when it
    lies on the other side, else "inconclusive"."""
    good = comparison.low > 0 if higher_is_better else comparison.high < 0
    bad = comparison.high < 0 if higher_is_better else comparison.low > 0
    return "met" if good else "not met" if bad else "inconclusive"


def ratio_verdict(ratio: Estimate, at_most: float) -> Verdict:
    """A claim "ratio <= at_most": met when the whole 95% interval is below it, not met when the
    whole interval is above it."""
    if not math.isfinite(ratio.ci95):
        return "inconclusive"
    if ratio.mean + ratio.ci95 <= at_most:
        return "met"
    return "not met" if ratio.mean - ratio.ci95 > at_most else "inconclusive"
