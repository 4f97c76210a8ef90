"""The page's claims: the primary family's claims with each comparison they rest on, the times to
target per seed, the runs another process disturbed, and the paper's ablation claims."""

from __future__ import annotations

from collections.abc import Sequence

from ..common.stats import claimed_side
from .arms import TREE
from .claims import BUDGETS, EFFICIENCY_AT_MOST, EFFICIENCY_HALF, Test, capped_times, clock_label, time_where
from .page_cells import TEST_HEADER, TEST_RULE, comparison_cells, p_value, short_value, verdict_word
from .page_setup import per_iteration_times
from .results import ProtocolResult


def _direction(t: Test) -> str:
    """A component's side: for the claim, against it, or none (a difference of 0)."""
    c = t.comparison
    if c is None:
        return "not measured"
    if c.difference == 0:
        return "none (0)"
    return "for the claim" if claimed_side(c, t.higher_is_better) else "against the claim"


def _components(tests: Sequence[Test]) -> list[str]:
    """Every comparison of the claims tested against several: raw p-values and side, nothing adjusted."""
    rows = [(t, c) for t in tests for c in t.components]
    if not rows:
        return []
    lines = ["### Each comparison of the claims", "",
             "The comparisons each claim above is tested on, one per baseline (or like-for-like pair): raw "
             "p-values, with no adjustment and no verdict of their own (the intersection-union test needs "
             "none; picking one out as a verdict would need a correction over all of them).", "",
             "| claim | against | difference (95% CI) | seeds | p, t test | p, exact | side |",
             "|---|---|---|---|---|---|---|"]
    for t, c in rows:
        seeds = "" if c.seeds is None else str(c.seeds)
        lines.append(f"| {t.group} | {c.against} | {c.value_text()} | {seeds} | {p_value(c.p_value)} | "
                     f"{p_value(c.p_exact)} | {_direction(c)} |")
    return [*lines, ""]


def claims_section(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """The primary family's claims, what each rests on, the times to target per seed and the clean
    seconds check."""
    lines = ["## The paper's claims on this test bed (primary family)", "",
             f"| claim | measure | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|"]
    primary = [t for t in tests if t.family == "primary"]
    for t in primary:
        lines.append(f"| {t.group} | {t.measure} | {comparison_cells(t)} |")
    lines += ["", "Each row is one claim against every comparator in its measure (an intersection-union "
              "test: above). Its difference is the comparison that sets its t-test p-value: the weakest "
              "win when every comparison lies on the claimed side, otherwise the strongest loss; its "
              "p-values are the intersection-union ones (or, against the claim, the Bonferroni ones).", "",
              f"\"about 50% training efficiency\" is tested twice on the per-seed ratios of median "
              f"iteration times: against {EFFICIENCY_AT_MOST}x (a generous reading, \"at most 0.6x\") and "
              f"against {EFFICIENCY_HALF}x (\"at most half\"), each with the one-sample t test and the exact "
              "sign-flip test of ratio minus threshold, for both like-for-like pairs; the claim is the ratio "
              "below the threshold. The ratio itself, with its 95% t interval, is a measurement whatever the "
              "verdict.", ""]
    reasons = list(dict.fromkeys(t.descriptive for t in primary if t.descriptive))
    if reasons:
        lines += [f"Time-to-target rows (\"no verdict\"): {'; '.join(reasons)}.", ""]
    lines += _components(primary)
    first = [t for t in tests if t.family == "secondary" and t.key.startswith("time:") and
             t.key.endswith(":every")]
    if first:
        lines += ["### Time to a first gain (secondary family)", "",
                  "The times to the first target (half the median gain), which most arms reach in one to "
                  "three iterations: per second they mostly measure what an iteration costs.", "",
                  f"| measure | what | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|",
                  *(f"| {t.group} | {t.measure} | {comparison_cells(t)} |" for t in first), ""]
    lines += _time_per_seed(result)
    lines += clean_seconds(result, tests)
    return lines


def _time_per_seed(result: ProtocolResult, name: str = "target") -> list[str]:
    """Per main arm and seed: min(time to target, budget) and where it was timed (the iteration, or the
    checkpoint on runs evaluated at the checkpoints only), so a reader sees what decided each time;
    followed by the same for the convergence target where there is one."""
    view = result.at_convergence() if name == "target" else None
    after = _time_per_seed(view, "the convergence target") if view is not None else []
    if not result.target["usable"] or TREE not in {a.name for a in result.arms}:
        return after
    arms = [TREE, *result.baselines]
    seeds = sorted({r.seed for name in arms for r in result.runs_of(name)})
    if not seeds:
        return []
    title = "the first gain" if view is not None else name
    lines = [f"### Time to {title} per seed", "",
             f"min(time to {title} ({result.target['gain']:+.4f}), budget) per seed, and where each run was "
             "timed: " +
             ("the first iteration at the target (every iteration was evaluated until then)."
              if per_iteration_times(result) else "the first checkpoint at the target (these runs were "
                                                   "evaluated at the checkpoints only)."), ""]
    for axis, _ in BUDGETS:
        unit = "scored images" if axis == "images" else f"{clock_label(result.clock)} seconds"
        lines += [f"| {unit} to target | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "|---|" + "---|" * len(seeds)]
        for arm in arms:
            runs = {r.seed: r for r in result.runs_of(arm)}
            cells = []
            for seed in seeds:
                run = runs.get(seed)
                if run is None:
                    cells.append("")
                    continue
                time = capped_times(result, [run], axis)[0]
                cells.append(f"{time:.4g} ({time_where(result, run, axis)})")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    return [*lines, *after]


def clean_seconds(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """The runs another process disturbed (wall/CPU ratio), and the claims in seconds without them."""
    from .claims import all_tests
    from .disturbed import SECONDS_GROUPS, TOLERANCE, disturbed_runs, without

    runs = disturbed_runs(result)
    lines = ["### Clean seconds", "",
             "A run is marked disturbed when its wall seconds per CPU second exceed its arm's median by "
             f"more than {TOLERANCE - 1:.0%} (another process on the same cores: its wall time rises, and "
             "its CPU seconds per iteration often with it, as waiting threads spin)."]
    if not runs:
        return [*lines[:-1], lines[-1] + " None was.", ""]
    load = any(d.load for d in runs)
    lines += ["", "| arm | seed | wall / CPU | its arm's median | CPU s per iteration / arm's median |"
              + (" load at start, end |" if load else ""),
              "|---|---|---|---|---|" + ("---|" if load else "")]
    for d in runs:
        cells = f"| {d.arm} | {d.seed} | {d.ratio:.2f} | {d.arm_ratio:.2f} | {d.cpu_per_iteration:.2f}x |"
        if load:
            cells += " " + (", ".join(f"{v:.1f}" for v in d.load) if d.load else "not recorded") + " |"
        lines.append(cells)
    clean = {t.key: t for t in all_tests(without(result, runs))}
    these = "this one (its seed leaves the pairs it was in)" if len(runs) == 1 else \
        f"these {len(runs)} (their seeds leave the pairs they were in)"
    lines += ["", f"The claims in seconds with every run, and without {these}:", "",
              "| claim | every run | verdict | without the disturbed runs | verdict |",
              "|---|---|---|---|---|"]
    for t in tests:
        if t.family != "primary" or not t.group.startswith(SECONDS_GROUPS) or t.key not in clean:
            continue
        c = clean[t.key]
        lines.append(f"| {t.group} | {short_value(t)} | {verdict_word(t)} | {short_value(c)} | "
                     f"{verdict_word(c)} |")
    return [*lines, ""]


def ablation_claims_section(result: ProtocolResult, tests: Sequence[Test]) -> list[str]:
    """The paper's ablation claims, or why they are not tested on this page."""
    rows = [t for t in tests if t.family == "ablation"]
    lines = ["## The paper's ablation claims (ablation-claims family)", ""]
    if not rows:
        return [*lines, "The ablation arms have not run here (`treerpo bench protocol --part ablations` with "
                "the same `--out`), so these claims are not tested on this page.", ""]
    lines += _group_table("claim", rows)
    rival = [t for t in tests if t.group == "dynamic clipping vs the best fixed clip"]
    if rival:  # the fixed clip whose bound the ablation part swept on validation, at the same rate
        lines += ["", "The dynamic clip against its best fixed clip (the bound the ablation part swept on "
                  "validation at the dynamic clip's rate; secondary family):", "",
                  *_group_table("comparison", rival)]
    return [*lines, ""]


def _group_table(first: str, tests: Sequence[Test]) -> list[str]:
    """A table of tests, one row each: its group, what it measures, and its test cells."""
    return [f"| {first} | measure | {TEST_HEADER} |", f"|---|---|{TEST_RULE}|",
            *(f"| {t.group} | {t.measure} | {comparison_cells(t)} |" for t in tests)]
