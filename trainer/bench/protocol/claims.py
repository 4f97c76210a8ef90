"""Every comparison the results page makes, as paired tests in three families, each Holm-adjusted.

- **Primary family**: the paper's claims about the main arms, six rows. The default tree against
  *every* main baseline (the main arms that are not a tree): faster convergence per sample (images
  to target) and per second, higher final reward at equal images and at equal seconds; and "about
  50% training efficiency": each like-for-like pair's per-seed ratio of median iteration times,
  against 0.6x and against 0.5x. Each row is the intersection-union test of its comparisons
  (:func:`.stats.intersection_union`, Berger 1982): met only when it is met against each one, its
  p-value the largest raw one, with no adjustment across its comparisons; no comparator is picked
  on validation.
- **Ablation claims**: the paper's ablation claims (:data:`CLAIM_ABLATIONS`) at both budgets, when
  the ablation arms ran (``treerpo bench protocol --part ablations``).
- **Secondary family**: every other comparison (the like-for-like pairs per budget, the ablations not
  already a claim, the like-for-like pairs under the clip treatments).

A primary row's comparisons (one per baseline, or per pair) are its *components*: shown with their
raw p-values and direction, with no adjustment and no verdict of their own. The intersection-union
test needs none, and none of them is a claim; a reader who picks one out as a verdict would need a
correction over all of them.

Each comparison pairs the two arms' runs by seed and gets two tests of the per-seed differences: the
paired t test and the exact sign-flip test. Each test's p-values are adjusted with Holm within each
family, and a verdict is "met" or "not met" only when both adjusted p-values give it. Times to
target get verdicts like the rewards when every run compared was evaluated after each iteration
until it reached the target; runs measured at the checkpoints only (protocol.json files written
before) leave them "descriptive", a measurement on the checkpoint grid.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..common.stats import (
    Comparison,
    IntersectionUnion,
    Verdict,
    agreed_verdict,
    holm,
    intersection_union,
    one_sample,
    paired,
    union_verdict,
)
from .arms import BEST_FIXED_CLIP, LIKE_FOR_LIKE, TREATMENTS, TREE
from .results import PUBLISHED, ProtocolResult, Run
from .survival import capped

Family = Literal["primary", "ablation", "secondary"]
FAMILIES: tuple[Family, ...] = ("primary", "ablation", "secondary")
FAMILY_NAMES = {"primary": "primary", "ablation": "ablation-claims", "secondary": "secondary"}
EFFICIENCY_AT_MOST = 0.6  # "about 50% training efficiency", read generously: iteration time at most 0.6x
EFFICIENCY_HALF = 0.5  # ...and as stated: at most half
BUDGETS = (("images", "equal images"), ("seconds", "equal seconds"))


@dataclass(frozen=True)
class Test:
    """One comparison: what it measures, its paired test (None: not measured, ``note`` says why),
    and, once its family is adjusted, the Holm p-values (t test, exact test) and the verdict.
    ``descriptive``: why the test is reported as a measurement and read as no verdict.

    A claim against several comparators carries them as ``components`` (each naming its comparator in
    ``against``) and their intersection-union test as ``union``; its ``comparison`` is then the one
    that sets the row's t-test p-value (the weakest win, or the strongest loss)."""

    family: Family
    group: str  # the claim (primary, ablation) or the table (secondary) it belongs to
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
    components: tuple[Test, ...] = ()
    union: IntersectionUnion | None = None
    against: str = ""

    @property
    def p_value(self) -> float:
        """The t test's raw p-value (the exact one when the differences have no spread); for a row of
        several comparisons, its intersection-union p-value."""
        if self.union is not None:
            return self.union.p_value
        return math.nan if self.comparison is None else self.comparison.p_value

    @property
    def p_exact(self) -> float:
        """The exact sign-flip test's raw p-value (a row of several: its intersection-union one)."""
        if self.union is not None:
            return self.union.p_exact
        return math.nan if self.comparison is None else self.comparison.p_exact

    @property
    def seeds(self) -> int | None:
        """Paired seeds of the comparison (of every component alike), None when not measured."""
        return None if self.comparison is None else self.comparison.n

    @property
    def binding(self) -> Test | None:
        """The component that sets the row's t-test p-value (None: a single comparison)."""
        return None if self.union is None else self.components[self.union.binding]

    def value_text(self) -> str:
        """``difference (95% CI low .. high)``, or why it was not measured; a row of several
        comparisons adds the comparator its figure is against."""
        c = self.comparison
        if c is None:
            return self.note
        sign = "" if self.offset else "+"
        d, lo, hi = (v + self.offset for v in (c.difference, c.low, c.high))
        text = f"{d:{sign}.4g}{self.unit} (95% CI {lo:{sign}.4g} .. {hi:{sign}.4g})"
        binding, union = self.binding, self.union
        if binding is not None and union is not None:
            which = "the weakest for the claim" if union.for_claim else "the strongest against it"
            text += f" against {binding.against}, {which} of {union.size}"
        return text


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


def every_test(family: Family, group: str, key: str, measure: str, components: Sequence[Test],
               higher_is_better: bool = True, unit: str = "", offset: float = 0.0) -> Test | None:
    """One claim against every comparator in ``components`` (None: there is none): their
    intersection-union test; not measured when any one of them is not."""
    if not components:
        return None
    missing = [c for c in components if c.comparison is None]
    if missing:
        return Test(family, group, key, measure, None, higher_is_better, unit,
                    f"{missing[0].note} (against {', '.join(c.against for c in missing)})",
                    components=tuple(components))
    union = intersection_union([c.comparison for c in components if c.comparison is not None],
                               higher_is_better)
    return Test(family, group, key, measure, components[union.binding].comparison, higher_is_better, unit,
                offset=offset, components=tuple(components), union=union)


def reward_test(result: ProtocolResult, family: Family, group: str, a: str, b: str, axis: str,
                treatment: str = PUBLISHED.name, higher_is_better: bool = True) -> Test | None:
    """Held-out reward at the ``axis`` budget, ``a`` minus ``b``, paired by seed (None: an arm did not run);
    the claim is ``a > b`` (``higher_is_better``) or ``a < b``."""
    ra, rb = _pairs(result.runs_of(a, treatment), result.runs_of(b, treatment))
    if not ra:
        return None
    label = dict(BUDGETS)[axis]
    where = "" if treatment == PUBLISHED.name else f", treatment {treatment}"
    test = _paired_test(family, group, f"reward:{axis}:{a}:{b}:{treatment}",
                        f"held-out reward at {label}, {a} minus {b}{where}",
                        [r.reward_at(axis) for r in ra], [r.reward_at(axis) for r in rb], higher_is_better)
    return replace(test, against=b)


def horizon(result: ProtocolResult, axis: str) -> float:
    """Where time to target is censored: the image budget (whole iterations) or the seconds budget."""
    return result.images_limit if axis == "images" else result.seconds


def capped_times(result: ProtocolResult, runs: Sequence[Run], axis: str) -> list[float]:
    """Per run, ``min(time to target, budget)`` (the budget when it never reached it)."""
    gain = result.target["gain"]
    return capped([r.time_to(gain, axis, result.clock) for r in runs], horizon(result, axis))


def resolved_per_iteration(result: ProtocolResult, runs: Sequence[Run]) -> bool:
    """Whether every run was evaluated after each iteration until it reached the target."""
    return bool(runs) and all(r.per_iteration(result.target["gain"]) for r in runs)


def time_where(result: ProtocolResult, run: Run, axis: str) -> str:
    """Where the run was timed: ``iteration i`` (evaluated every iteration until the target),
    ``checkpoint k`` (of the budget's), ``not reached`` (never, in the whole run), or, for a run that
    reached it only after this budget (a seconds budget shorter than the run), where it did and that it
    is censored at the budget."""
    gain = result.target["gain"]
    time = run.time_to(gain, axis, result.clock)
    if time is None:
        return "not reached"
    key = "images" if axis == "images" else f"{result.clock}_s"
    if run.per_iteration(gain):
        point = next(p for p in run.points if p["reward"] >= run.base + gain)
        where = f"iteration {int(point['iteration'])}"
    else:
        found = [k for k, m in enumerate(run.marks(axis), 1) if run.points[m][key] == time]
        where = f"checkpoint {found[0]}" if found else "after the last checkpoint"
    if time > horizon(result, axis):
        return f"reached at {where}, after the budget: censored"
    return where


def time_caveat(result: ProtocolResult) -> str:
    """Why times to target measured at the checkpoints only are a measurement and not a verdict."""
    return (f"times are resolved to the {result.budget.checkpoints} checkpoints of each budget (these runs "
            "were evaluated at the checkpoints only, so a run is timed at the first checkpoint at which it "
            "had reached the target, and the grid can decide a comparison)")


def time_unit(result: ProtocolResult, axis: str) -> str:
    return "" if axis == "images" else f" {clock_label(result.clock)} s"


def time_measure(result: ProtocolResult, axis: str, a: str, b: str) -> str:
    """What a time-to-target test measures, ``a`` minus ``b``."""
    what = "scored images" if axis == "images" else f"training {clock_label(result.clock)} seconds"
    return (f"{what} until the test reward reaches its base + {result.target['gain']:.4f}, min(time, "
            f"{horizon(result, axis):.4g}) per seed, {a} minus {b}")


def time_test(result: ProtocolResult, family: Family, group: str, a: str, b: str, axis: str,
              prefix: str = "time") -> Test | None:
    """Time to target on ``axis``, ``a`` minus ``b``: the paired test of ``min(time, budget)``
    (``prefix``: the key's first word, ``convergence`` for the convergence target)."""
    ra, rb = _pairs(result.runs_of(a), result.runs_of(b))
    if not ra:
        return None
    unit, measure, key = time_unit(result, axis), time_measure(result, axis, a, b), f"{prefix}:{axis}:{a}:{b}"
    if not result.target["usable"]:
        return Test(family, group, key, measure, None, False, unit,
                    "not measured: the median validation gain was not positive, so there is no target",
                    against=b)
    test = _paired_test(family, group, key, measure, capped_times(result, ra, axis),
                        capped_times(result, rb, axis), higher_is_better=False, unit=unit)
    return replace(test, against=b)


def clock_label(clock: str) -> str:
    return "CPU" if clock == "cpu" else "wall"


def median_iteration_s(run: Run, clock: str) -> float:
    return statistics.median(run.iteration_s(clock))


def same_iterations_ratio(a: Run, b: Run, clock: str) -> float:
    """``a``'s median iteration time over ``b``'s, both over the first iterations that both ran: a run
    with more iterations (a cheaper one, in equal seconds) would otherwise add later iterations, whose
    cost differs (caches warm, evaluations spread), to its median alone."""
    ta, tb = a.iteration_s(clock), b.iteration_s(clock)
    k = min(len(ta), len(tb))
    return statistics.median(ta[:k]) / statistics.median(tb[:k])


def iteration_ratios(result: ProtocolResult, tree: str, base: str) -> list[float]:
    """Per seed, the tree's median iteration time over the baseline's, over the iterations both ran
    (empty: an arm did not run)."""
    ra, rb = _pairs(result.runs_of(tree), result.runs_of(base))
    return [same_iterations_ratio(a, b, result.clock) for a, b in zip(ra, rb, strict=True)]


def efficiency_group(reference: float) -> str:
    return f"about 50% training efficiency, against {reference:g}x"


def efficiency_test(result: ProtocolResult, tree: str, base: str,
                    reference: float = EFFICIENCY_AT_MOST) -> Test | None:
    """Per seed, the tree's median iteration time over the baseline's; tested against ``reference``
    (the claim: the ratio is below it)."""
    ratios = iteration_ratios(result, tree, base)
    if not ratios:
        return None
    measure = (f"median iteration time ({clock_label(result.clock)} seconds) over the iterations both ran, "
               f"{tree} / {base} (same tail), tested against {reference}x")
    key = f"efficiency:{tree}:{base}" + ("" if reference == EFFICIENCY_AT_MOST else f":{reference}")
    group, against = efficiency_group(reference), f"{tree} / {base}"
    if len(ratios) < 2:
        return Test("primary", group, key, measure, None, False, "x", "not measured: fewer than 2 seeds",
                    against=against)
    return Test("primary", group, key, measure, one_sample(ratios, reference), False, "x", offset=reference,
                against=against)


CLAIM_ABLATIONS = (("LayerTuning-RL helps", TREE, "no LayerTuning"),
                   ("dynamic clipping helps (dynamic vs fixed bounds that bind)", "capping dynamic clip",
                    "capping fixed clip"),
                   ("dynamic clipping helps (the default clip vs none)", TREE, "no clip"))
FIRST_GAIN_GROUPS = {"images": "faster to a first gain, per sample",
                     "seconds": "faster to a first gain, per second (the cost of the first iterations)"}
"""Time to the first target (half the median arm's validation gain): most arms reach it in one to three
iterations, so per second it mostly measures what an iteration costs. The paper's convergence claims are
tested at the convergence target (:data:`CONVERGENCE_GROUPS`) where the protocol fixed one."""
CONVERGENCE_GROUPS = {"images": "faster convergence per sample", "seconds": "faster convergence per second"}
PRIMARY_GROUPS = {"time:images": "faster convergence per sample",
                  "time:seconds": "faster convergence per second",
                  "reward:images": "higher final reward at equal images",
                  "reward:seconds": "higher final reward at equal seconds"}


def _against_every(names: Sequence[str]) -> str:
    return f"each of {len(names)} baselines ({', '.join(names)})"


def time_claim(result: ProtocolResult, axis: str, family: Family = "primary", convergence: bool = False
               ) -> Test | None:
    """The tree's time to target (per sample or per second) against every baseline's, one
    intersection-union row: to the first gain, or (``convergence``) to the convergence target;
    "descriptive" when any run was timed on the checkpoints."""
    if convergence:
        view = result.at_convergence()
        if view is None:
            return None
        result, group, prefix = view, CONVERGENCE_GROUPS[axis], "convergence"
    else:
        group, prefix = FIRST_GAIN_GROUPS[axis], "time"
    parts = [time_test(result, family, group, TREE, b, axis, prefix) for b in result.baselines]
    components = [t for t in parts if t is not None]
    names = [c.against for c in components]
    measure = time_measure(result, axis, TREE, _against_every(names))
    row = every_test(family, group, f"{prefix}:{axis}:{TREE}:every", measure, components, False,
                     time_unit(result, axis))
    if row is None or row.comparison is None:
        return row
    runs = [r for name in (TREE, *names) for r in result.runs_of(name)]
    return row if resolved_per_iteration(result, runs) else replace(row, descriptive=time_caveat(result))


def reward_claim(result: ProtocolResult, axis: str) -> Test | None:
    """Higher final reward at the ``axis`` budget than every baseline: one intersection-union row."""
    group = PRIMARY_GROUPS[f"reward:{axis}"]
    parts = [reward_test(result, "primary", group, TREE, b, axis) for b in result.baselines]
    components = [t for t in parts if t is not None]
    names = [c.against for c in components]
    measure = f"held-out reward at {dict(BUDGETS)[axis]}, {TREE} minus {_against_every(names)}"
    return every_test("primary", group, f"reward:{axis}:{TREE}:every", measure, components)


def efficiency_claim(result: ProtocolResult, reference: float) -> Test | None:
    """About 50% training efficiency against ``reference``: both like-for-like pairs' ratios below it."""
    parts = [efficiency_test(result, tree, base, reference) for tree, base in LIKE_FOR_LIKE]
    components = [t for t in parts if t is not None]
    measure = (f"median iteration time ({clock_label(result.clock)} seconds) over the iterations both ran, "
               f"tree / baseline with the same tail, per seed, for each of "
               f"{' and '.join(c.against for c in components)}, tested against {reference}x")
    return every_test("primary", efficiency_group(reference), f"efficiency:every:{reference:g}", measure,
                      components, False, "x", reference)


def primary_tests(result: ProtocolResult) -> list[Test]:
    """The primary family: the tree against every baseline on four measures, and the like-for-like
    pairs' iteration time against 0.6x and 0.5x (six rows, ``results.PRIMARY_CLAIMS``). The times are
    to the convergence target where the protocol fixed one (the first gain's are then secondary), else
    to the first gain, under that name."""
    converged = result.convergence is not None
    out = [time_claim(result, axis, convergence=converged) for axis, _ in BUDGETS]
    out += [reward_claim(result, axis) for axis, _ in BUDGETS]
    out += [efficiency_claim(result, reference) for reference in (EFFICIENCY_AT_MOST, EFFICIENCY_HALF)]
    return [t for t in out if t is not None]


def ablation_tests(result: ProtocolResult) -> list[Test]:
    """The ablation-claims family: each of the paper's ablation claims at both budgets (empty when the
    ablation arms did not run)."""
    out = [reward_test(result, "ablation", f"{claim}, at {label}", on, off, axis)
           for claim, on, off in CLAIM_ABLATIONS for axis, label in BUDGETS]
    return [t for t in out if t is not None]


def secondary_tests(result: ProtocolResult) -> list[Test]:
    """Like for like, the ablations (those not already a claim) and the like-for-like pairs under
    each clip treatment."""
    out: list[Test | None] = []
    if result.convergence is not None:  # the first gain, under its own name
        out += [time_claim(result, axis, "secondary") for axis, _ in BUDGETS]
    for tree, base in LIKE_FOR_LIKE:
        out += [reward_test(result, "secondary", "like for like", tree, base, axis) for axis, _ in BUDGETS]
    in_claims = {(on, off) for _, on, off in CLAIM_ABLATIONS}
    present = {a.name for a in result.arms}
    if {"capping dynamic clip", BEST_FIXED_CLIP} <= present:  # the dynamic clip against its best fixed rival
        out += [reward_test(result, "secondary", "dynamic clipping vs the best fixed clip",
                            "capping dynamic clip", BEST_FIXED_CLIP, axis) for axis, _ in BUDGETS]
    for arm in result.arms:
        if arm.role == "ablation" and arm.name != BEST_FIXED_CLIP and (TREE, arm.name) not in in_claims:
            out += [reward_test(result, "secondary", "ablations", arm.name, TREE, axis,
                                higher_is_better=False)  # the claim: the default beats the variant
                    for axis, _ in BUDGETS]
    for t in TREATMENTS:
        for a, b in LIKE_FOR_LIKE:
            out += [reward_test(result, "secondary", f"clip treatment {t.name}", a, b, axis, t.name)
                    for axis, _ in BUDGETS]
    return [t for t in out if t is not None]


def _verdict(t: Test, p: float, q: float) -> Verdict:
    if t.descriptive:
        return "descriptive"
    if t.union is not None:
        return union_verdict(t.union, p, q)
    return "inconclusive" if t.comparison is None else agreed_verdict(t.comparison, p, q, t.higher_is_better)


def adjust(tests: Sequence[Test]) -> list[Test]:
    """Holm within each family, for the t tests and the exact tests apart, then each test's verdict:
    "met"/"not met" only when both adjusted p-values give it; "descriptive" for a measurement the
    protocol does not read as a verdict (it still counts in its family's adjustment, which can only
    make the others' adjusted p-values larger). A row's components are not adjusted."""
    out = list(tests)
    for family in FAMILIES:
        index = [i for i, t in enumerate(out) if t.family == family]
        adjusted = holm([out[i].p_value for i in index])
        exact = holm([out[i].p_exact for i in index])
        for i, p, q in zip(index, adjusted, exact, strict=True):
            out[i] = replace(out[i], p_adjusted=p, p_exact_adjusted=q, verdict=_verdict(out[i], p, q))
    return out


def all_tests(result: ProtocolResult) -> list[Test]:
    """The three families, adjusted."""
    return adjust([*primary_tests(result), *ablation_tests(result), *secondary_tests(result)])


def family_size(tests: Sequence[Test], family: Family) -> int:
    """How many tests of ``family`` were made (the ``m`` of its Holm adjustment)."""
    return sum(1 for t in tests if t.family == family and not math.isnan(t.p_value))
