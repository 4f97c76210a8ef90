"""Every comparison the results page makes, as paired tests in two families, Holm-adjusted.

- **Primary family**: the paper's claims, the rows of the claims table (faster convergence per
  sample and per second, higher final reward at equal images and at equal seconds, about 50%
  training efficiency, LayerTuning-RL helps, dynamic clipping helps).
- **Secondary family**: every other comparison (the like-for-like pairs, the ablations not already
  a claim, the headline pairs under the clip treatments).

Each test pairs the two arms' runs by seed. p-values are adjusted with Holm within each family;
both are reported, and every verdict comes from the adjusted one (:func:`.stats.verdict`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .arms import LIKE_FOR_LIKE, TREATMENTS, TREE
from .results import PUBLISHED, ProtocolResult, Run
from .stats import Comparison, Verdict, holm, one_sample, paired, verdict
from .survival import capped

Family = Literal["primary", "secondary"]
EFFICIENCY_AT_MOST = 0.6  # "about 50% training efficiency": iteration time at most ~0.5-0.6x
BUDGETS = (("images", "equal images"), ("seconds", "equal seconds"))


@dataclass(frozen=True)
class Test:
    """One comparison: what it measures, its paired test (None: not measured, ``note`` says why),
    and, once its family is adjusted, the Holm p-value and the verdict."""

    family: Family
    group: str  # the claim (primary) or the table (secondary) it belongs to
    key: str  # a stable id: the tables look their rows up by it
    measure: str
    comparison: Comparison | None
    higher_is_better: bool = True
    unit: str = ""
    note: str = ""
    offset: float = 0.0  # added to the difference and its interval for display (a ratio tested against it)
    p_adjusted: float = math.nan
    verdict: Verdict = "inconclusive"

    @property
    def p_value(self) -> float:
        return math.nan if self.comparison is None else self.comparison.p_value

    def value_text(self) -> str:
        """``difference (95% CI low .. high)``, or why it was not measured."""
        c = self.comparison
        if c is None:
            return self.note
        sign = "" if self.offset else "+"
        d, lo, hi = (v + self.offset for v in (c.difference, c.low, c.high))
        return f"{d:{sign}.4g}{self.unit} (95% CI {lo:{sign}.4g} .. {hi:{sign}.4g})"


def _pairs(a: Sequence[Run], b: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """The runs of the seeds both sides have, in seed order."""
    seeds = sorted({r.seed for r in a} & {r.seed for r in b})
    by_a, by_b = {r.seed: r for r in a}, {r.seed: r for r in b}
    return [by_a[s] for s in seeds], [by_b[s] for s in seeds]


def _paired_test(family: Family, group: str, key: str, measure: str, a: Sequence[float], b: Sequence[float],
                 higher_is_better: bool = True, unit: str = "") -> Test:
    if len(a) < 2:
        return Test(family, group, key, measure, None, higher_is_better, unit,
                    "not measured: fewer than 2 seeds")
    return Test(family, group, key, measure, paired(a, b), higher_is_better, unit)


def reward_test(result: ProtocolResult, family: Family, group: str, a: str, b: str, axis: str,
                treatment: str = PUBLISHED.name, higher_is_better: bool = True) -> Test | None:
    """Held-out reward at the ``axis`` budget, ``a`` minus ``b``, paired by seed (None: an arm did not run);
    the claim is ``a > b`` (``higher_is_better``) or ``a < b``."""
    ra, rb = _pairs(result.runs_of(a, treatment), result.runs_of(b, treatment))
    if not ra:
        return None
    label = dict(BUDGETS)[axis]
    where = "" if treatment == PUBLISHED.name else f", treatment {treatment}"
    return _paired_test(family, group, f"reward:{axis}:{a}:{b}:{treatment}",
                        f"held-out reward at {label}, {a} minus {b}{where}",
                        [r.reward_at(axis) for r in ra], [r.reward_at(axis) for r in rb], higher_is_better)


def horizon(result: ProtocolResult, axis: str) -> float:
    """Where time to target is censored: the image budget (whole iterations) or the seconds budget."""
    return result.images_limit if axis == "images" else result.seconds


def capped_times(result: ProtocolResult, runs: Sequence[Run], axis: str) -> list[float]:
    """Per run, ``min(time to target, budget)`` (the budget when it never reached it)."""
    gain = result.target["gain"]
    return capped([r.time_to(gain, axis, result.clock) for r in runs], horizon(result, axis))


def time_test(result: ProtocolResult, family: Family, group: str, a: str, b: str, axis: str) -> Test | None:
    """Time to target on ``axis``, ``a`` minus ``b``: the paired test of ``min(time, budget)``."""
    ra, rb = _pairs(result.runs_of(a), result.runs_of(b))
    if not ra:
        return None
    unit = "" if axis == "images" else f" {clock_label(result.clock)} s"
    what = "scored images" if axis == "images" else f"training {clock_label(result.clock)} seconds"
    measure = (f"{what} until the test reward reaches its base + {result.target['gain']:.4f}, min(time, "
               f"{horizon(result, axis):.4g}) per seed, {a} minus {b}")
    key = f"time:{axis}:{a}:{b}"
    if not result.target["usable"]:
        return Test(family, group, key, measure, None, False, unit,
                    "not measured: the median validation gain was not positive, so there is no target")
    return _paired_test(family, group, key, measure, capped_times(result, ra, axis),
                        capped_times(result, rb, axis), higher_is_better=False, unit=unit)


def clock_label(clock: str) -> str:
    return "CPU" if clock == "cpu" else "wall"


def median_iteration_s(run: Run, clock: str) -> float:
    return statistics.median(run.iteration_s(clock))


def efficiency_test(result: ProtocolResult, tree: str, base: str) -> Test | None:
    """Per seed, the tree's median iteration time over the baseline's; tested against 0.6."""
    ra, rb = _pairs(result.runs_of(tree), result.runs_of(base))
    if not ra:
        return None
    ratios = [median_iteration_s(a, result.clock) / median_iteration_s(b, result.clock)
              for a, b in zip(ra, rb, strict=True)]
    measure = (f"median iteration time ({clock_label(result.clock)} seconds), {tree} / {base} (same tail), "
               f"tested against {EFFICIENCY_AT_MOST}x")
    key = f"efficiency:{tree}:{base}"
    if len(ratios) < 2:
        return Test("primary", "about 50% training efficiency", key, measure, None, False, "x",
                    "not measured: fewer than 2 seeds")
    return Test("primary", "about 50% training efficiency", key, measure,
                one_sample(ratios, EFFICIENCY_AT_MOST), False, "x", offset=EFFICIENCY_AT_MOST)


CLAIM_ABLATIONS = (("LayerTuning-RL helps", TREE, "no LayerTuning"),
                   ("dynamic clipping helps (dynamic vs fixed bounds that bind)", "capping dynamic clip",
                    "capping fixed clip"),
                   ("dynamic clipping helps (the default clip vs none)", TREE, "no clip"))


def primary_tests(result: ProtocolResult) -> list[Test]:
    """The claims table: the tree against the best baseline (fixed on validation), the iteration
    time of the like-for-like pairs, and the paper's parts switched off."""
    best = result.target.get("best_baseline")
    out: list[Test | None] = []
    if best is not None:
        out.append(time_test(result, "primary", "faster convergence per sample", TREE, best, "images"))
        out.append(time_test(result, "primary", "faster convergence per second", TREE, best, "seconds"))
        out += [reward_test(result, "primary", "higher final reward", TREE, best, axis)
                for axis, _ in BUDGETS]
    out += [efficiency_test(result, tree, base) for tree, base in LIKE_FOR_LIKE]
    for claim, on, off in CLAIM_ABLATIONS:
        out += [reward_test(result, "primary", claim, on, off, axis) for axis, _ in BUDGETS]
    return [t for t in out if t is not None]


def headline_pairs(result: ProtocolResult) -> list[tuple[str, str]]:
    """Tree vs MixGRPO with the same tail (both tails), and the tree vs the best baseline."""
    best = result.target.get("best_baseline")
    pairs = list(LIKE_FOR_LIKE) + ([(TREE, best)] if best is not None else [])
    return list(dict.fromkeys(pairs))


def secondary_tests(result: ProtocolResult) -> list[Test]:
    """Like for like, the ablations (those not already a claim) and the clip treatments."""
    out: list[Test | None] = []
    for tree, base in LIKE_FOR_LIKE:
        out += [reward_test(result, "secondary", "like for like", tree, base, axis) for axis, _ in BUDGETS]
    in_claims = {(on, off) for _, on, off in CLAIM_ABLATIONS}
    for arm in result.arms:
        if arm.role == "ablation" and (TREE, arm.name) not in in_claims:
            out += [reward_test(result, "secondary", "ablations", arm.name, TREE, axis,
                                higher_is_better=False)  # the claim: the default beats the variant
                    for axis, _ in BUDGETS]
    for t in TREATMENTS:
        for a, b in headline_pairs(result):
            out += [reward_test(result, "secondary", f"clip treatment {t.name}", a, b, axis, t.name)
                    for axis, _ in BUDGETS]
    return [t for t in out if t is not None]


def adjust(tests: Sequence[Test]) -> list[Test]:
    """Holm within each family, then each test's verdict from its adjusted p-value."""
    out = list(tests)
    for family in ("primary", "secondary"):
        index = [i for i, t in enumerate(out) if t.family == family]
        adjusted = holm([out[i].p_value for i in index])
        for i, p in zip(index, adjusted, strict=True):
            t = out[i]
            v = verdict(t.comparison, p, t.higher_is_better) if t.comparison is not None else "inconclusive"
            out[i] = replace(t, p_adjusted=p, verdict=v)
    return out


def all_tests(result: ProtocolResult) -> list[Test]:
    """Both families, adjusted."""
    return adjust([*primary_tests(result), *secondary_tests(result)])


def family_size(tests: Sequence[Test], family: Family) -> int:
    """How many tests of ``family`` were made (the ``m`` of its Holm adjustment)."""
    return sum(1 for t in tests if t.family == family and not math.isnan(t.p_value))
