"""Statistics of the benchmark protocol: means with 95% intervals, paired t tests, Holm's
adjustment within a family of tests, and the verdicts.

Pure functions over per-seed values. Seeds are paired: a seed gives every arm the same prompts and
the same LoRA initialisation, so two arms are compared by the per-seed differences (a paired t
test, scipy's ``ttest_rel``), which removes the seed-to-seed variation both arms share; when every
seed gives the same difference, the exact sign-flip test stands in for it. A verdict
is read from the Holm-adjusted p-value of its family, never from the raw one, and never goes
beyond its interval: a difference that does not survive the adjustment is "inconclusive".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
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
    """A paired difference over seeds: its mean, 95% t interval and two-sided p-value (raw)."""

    difference: float
    low: float
    high: float
    p_value: float
    n: int


def sign_flip_p(n: int, difference: float) -> float:
    """The exact two-sided sign-flip test of ``n`` identical per-seed differences: of the ``2**n`` ways
    to flip their signs (each as likely when the arms do not differ), only the two with every sign
    alike reach the observed mean, so ``p = 2 / 2**n`` (0.25 with 3 seeds); 1 when the difference is 0.

    Why: a t test has no spread to use when every seed gives the same difference (times to target are
    resolved to the checkpoints, so this happens), and reading that as certainty (p 0) would let three
    seeds "prove" anything."""
    return 1.0 if difference == 0.0 else min(1.0, 2.0 / 2.0**n)


def _compare(differences: Sequence[float], p_value: Callable[[], float]) -> Comparison:
    """Mean of ``differences`` with ``mean ± t(0.975, n-1) * sd / sqrt(n)``; ``p_value`` is asked only
    when the differences vary (identical differences get the exact sign-flip test, ``sign_flip_p``)."""
    n = len(differences)
    if n < 2:
        raise ValueError(f"a t test needs at least two seeds, got {n}")
    diff = statistics.fmean(differences)
    sd = statistics.stdev(differences)
    if sd == 0.0:
        return Comparison(diff, diff, diff, sign_flip_p(n, diff), n)
    half = _t_quantile(n) * sd / math.sqrt(n)
    return Comparison(diff, diff - half, diff + half, p_value(), n)


def one_sample(values: Sequence[float], reference: float = 0.0) -> Comparison:
    """The t test of ``mean(values) - reference`` (scipy's ``ttest_1samp``) with its 95% interval."""
    return _compare([v - reference for v in values],
                    lambda: float(scipy_stats.ttest_1samp(list(values), reference).pvalue))


def paired(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """The paired t test of ``a - b`` (``a[i]`` and ``b[i]`` from the same seed): scipy's
    ``ttest_rel``, with the t interval of the per-seed differences."""
    if len(a) != len(b):
        raise ValueError(f"a paired test needs the same seeds on both sides, got {len(a)} and {len(b)}")
    return _compare([x - y for x, y in zip(a, b, strict=True)],
                    lambda: float(scipy_stats.ttest_rel(list(a), list(b)).pvalue))


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


def verdict(comparison: Comparison, p_adjusted: float, higher_is_better: bool = True) -> Verdict:
    """"met" when the adjusted p-value is below 0.05 and the difference lies on the claimed side of
    0 (its raw 95% interval then excludes 0, as the adjusted p-value is at least the raw one); "not
    met" when it is below 0.05 on the other side; otherwise "inconclusive"."""
    if math.isnan(p_adjusted) or p_adjusted >= ALPHA:
        return "inconclusive"
    good = comparison.low > 0 if higher_is_better else comparison.high < 0
    bad = comparison.high < 0 if higher_is_better else comparison.low > 0
    return "met" if good else "not met" if bad else "inconclusive"
