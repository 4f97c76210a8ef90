"""Every comparison the results page makes, as paired tests in two families, Holm-adjusted.

- **Primary family**: the paper's claims, the rows of the claims table (faster convergence per
  sample and per second, higher final reward at equal images and at equal seconds, about 50%
  training efficiency against 0.6x and against 0.5x, LayerTuning-RL helps, dynamic clipping helps).
- **Secondary family**: every other comparison (the like-for-like pairs, the ablations not already
  a claim, the headline pairs under the clip treatments).

Each comparison pairs the two arms' runs by seed and gets two tests of the per-seed differences:
the paired t test and the exact sign-flip test. Each test's p-values are adjusted with Holm within
each family; all four are reported, and a verdict is "met" or "not met" only when both adjusted
p-values give it (:func:`.stats.agreed_verdict`). Times to target are reported with their tests but
read as no verdict ("descriptive"): they are resolved to the checkpoint grid and compared with one
baseline picked on validation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .arms import LIKE_FOR_LIKE, TREATMENTS, TREE
from .results import PUBLISHED, ProtocolResult, Run
from .stats import Comparison, Verdict, agreed_verdict, holm, one_sample, paired
from .survival import capped
from .sweep import chosen_rows

Family = Literal["primary", "secondary"]
EFFICIENCY_AT_MOST = 0.6  # "about 50% training efficiency", read generously: iteration time at most 0.6x
EFFICIENCY_HALF = 0.5  # ...and as stated: at most half
BUDGETS = (("images", "equal images"), ("seconds", "equal seconds"))


@dataclass(frozen=True)
class Test:
    """One comparison: what it measures, its paired test (None: not measured, ``note`` says why),
    and, once its family is adjusted, the Holm p-values (t test, exact test) and the verdict.
    ``descriptive``: why the test is reported as a measurement and read as no verdict."""

    family: Family
    group: str  # the claim (primary) or the table (secondary) it belongs to
    key: str  # a stable id: the tables look their rows up by it
    measure: str
    comparison: Comparison | None
    higher_is_better: bool = True
    unit: str = ""
    note: str = ""
    offset: float = 0.0  # added to the difference and its interval for display (a ratio tested against it)
    descriptive: str = ""
    p_adjusted: float = math.nan  # the t test's, Holm
    p_exact_adjusted: float = math.nan  # the exact sign-flip test's, Holm
    verdict: Verdict = "inconclusive"

    @property
    def p_value(self) -> float:
        """The t test's raw p-value (the exact one when the differences have no spread)."""
        return math.nan if self.comparison is None else self.comparison.p_value

    @property
    def p_exact(self) -> float:
        """The exact sign-flip test's raw p-value."""
        return math.nan if self.comparison is None else self.comparison.p_exact

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


def baseline_margin(result: ProtocolResult) -> tuple[str, float, str, float] | None:
    """The best baseline and its validation reward, and the runner-up's (None: fewer than two
    baselines were swept): how much the choice of the one comparator rests on."""
    best = result.target.get("best_baseline")
    chosen = chosen_rows(result.sweep)
    baselines = {a.name for a in result.arms if a.role == "main" and not a.is_tree}
    others = sorted(((row["validation_reward"], arm) for arm, row in chosen.items()
                     if arm != best and arm in baselines), reverse=True)
    if best is None or best not in chosen or not others:
        return None
    return best, chosen[best]["validation_reward"], others[0][1], others[0][0]


def time_caveat(result: ProtocolResult) -> str:
    """Why times to target are a measurement and not a verdict on this protocol."""
    text = (f"times are resolved to the {result.budget.checkpoints} checkpoints of each budget (a run is "
            "timed at the first checkpoint at which it has reached the target)")
    margin = baseline_margin(result)
    if margin is not None:
        best, reward, runner, runner_reward = margin
        text += (f", and the comparator {best} was chosen as the best baseline on validation by a margin of "
                 f"{reward - runner_reward:.4f} over {runner} ({reward:.4f} against {runner_reward:.4f}), "
                 f"on one sweep seed")
    return text


def capped_times(result: ProtocolResult, runs: Sequence[Run], axis: str) -> list[float]:
    """Per run, ``min(time to target, budget)`` (the budget when it never reached it)."""
    gain = result.target["gain"]
    return capped([r.time_to(gain, axis, result.clock) for r in runs], horizon(result, axis))


def first_checkpoint(result: ProtocolResult, run: Run, axis: str) -> int | None:
    """Which checkpoint of ``axis`` (1 = the first) first had the run at its target (None: none did)."""
    gain = result.target["gain"]
    return next((k for k, m in enumerate(run.marks(axis), 1)
                 if run.points[m]["reward"] >= run.base + gain), None)


def paired_times(result: ProtocolResult, a: str, b: str, axis: str) -> list[tuple[int, float, int | None,
                                                                                  float, int | None]]:
    """Per seed both arms ran: the seed, then for ``a`` and for ``b`` the ``min(time to target,
    budget)`` on ``axis`` and the checkpoint that first reached the target."""
    ra, rb = _pairs(result.runs_of(a), result.runs_of(b))
    ta, tb = capped_times(result, ra, axis), capped_times(result, rb, axis)
    return [(x.seed, t, first_checkpoint(result, x, axis), u, first_checkpoint(result, y, axis))
            for x, t, y, u in zip(ra, ta, rb, tb, strict=True)]


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
    test = _paired_test(family, group, key, measure, capped_times(result, ra, axis),
                        capped_times(result, rb, axis), higher_is_better=False, unit=unit)
    return replace(test, descriptive=time_caveat(result))


def clock_label(clock: str) -> str:
    return "CPU" if clock == "cpu" else "wall"


def median_iteration_s(run: Run, clock: str) -> float:
    return statistics.median(run.iteration_s(clock))


def iteration_ratios(result: ProtocolResult, tree: str, base: str) -> list[float]:
    """Per seed, the tree's median iteration time over the baseline's (empty: an arm did not run)."""
    ra, rb = _pairs(result.runs_of(tree), result.runs_of(base))
    return [median_iteration_s(a, result.clock) / median_iteration_s(b, result.clock)
            for a, b in zip(ra, rb, strict=True)]


def efficiency_test(result: ProtocolResult, tree: str, base: str,
                    reference: float = EFFICIENCY_AT_MOST) -> Test | None:
    """Per seed, the tree's median iteration time over the baseline's; tested against ``reference``
    (the claim: the ratio is below it)."""
    ratios = iteration_ratios(result, tree, base)
    if not ratios:
        return None
    measure = (f"median iteration time ({clock_label(result.clock)} seconds), {tree} / {base} (same tail), "
               f"tested against {reference}x")
    key = f"efficiency:{tree}:{base}" + ("" if reference == EFFICIENCY_AT_MOST else f":{reference}")
    if len(ratios) < 2:
        return Test("primary", "about 50% training efficiency", key, measure, None, False, "x",
                    "not measured: fewer than 2 seeds")
    return Test("primary", "about 50% training efficiency", key, measure,
                one_sample(ratios, reference), False, "x", offset=reference)


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
    out += [efficiency_test(result, tree, base, reference) for tree, base in LIKE_FOR_LIKE
            for reference in (EFFICIENCY_AT_MOST, EFFICIENCY_HALF)]
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
    """Holm within each family, for the t tests and the exact tests apart, then each test's verdict:
    "met"/"not met" only when both adjusted p-values give it; "descriptive" for a measurement the
    protocol does not read as a verdict (it still counts in its family's adjustment, which can only
    make the others' adjusted p-values larger)."""
    out = list(tests)
    for family in ("primary", "secondary"):
        index = [i for i, t in enumerate(out) if t.family == family]
        adjusted = holm([out[i].p_value for i in index])
        exact = holm([out[i].p_exact for i in index])
        for i, p, q in zip(index, adjusted, exact, strict=True):
            t = out[i]
            v: Verdict = "inconclusive"
            if t.descriptive:
                v = "descriptive"
            elif t.comparison is not None:
                v = agreed_verdict(t.comparison, p, q, t.higher_is_better)
            out[i] = replace(t, p_adjusted=p, p_exact_adjusted=q, verdict=v)
    return out


def all_tests(result: ProtocolResult) -> list[Test]:
    """Both families, adjusted."""
    return adjust([*primary_tests(result), *secondary_tests(result)])


def family_size(tests: Sequence[Test], family: Family) -> int:
    """How many tests of ``family`` were made (the ``m`` of its Holm adjustment)."""
    return sum(1 for t in tests if t.family == family and not math.isnan(t.p_value))
