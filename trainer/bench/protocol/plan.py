"""What a part of the protocol will run, before it trains, and how long it is expected to take, from the
sweep's iteration and evaluation times: a long part announces itself instead of surprising."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Sequence

from ..common.stats import ALPHA, exact_floor, seeds_for_exact
from . import sweep as sweeping
from .arms import LIKE_FOR_LIKE, TREE, Arm
from .results import PRIMARY_CLAIMS, Budget, ProtocolResult

MAIN_PART_MINUTES = 150.0
"""The wall time the main part (sweep and main arms) is sized for on the CPU test bed's 2 cores; the
estimate printed after the sweep warns above it and refuses nothing."""


def like_for_like_arms() -> list[str]:
    """The arms of the like-for-like pairs: the ones the clip treatments run."""
    return list(dict.fromkeys(name for pair in LIKE_FOR_LIKE for name in pair))


def seeds_text(seeds: int) -> str | None:
    """A note when ``seeds`` are too few for the exact test to reach the primary family's Holm
    threshold (None: enough)."""
    needed = seeds_for_exact(PRIMARY_CLAIMS)
    if seeds >= needed:
        return None
    return (f"note: with {seeds} seeds the exact test's smallest p-value, {exact_floor(seeds):.3g}, times "
            f"the primary family's {PRIMARY_CLAIMS} claims is not below {ALPHA}: no primary claim can be met "
            f"or not met (that needs at least {needed} seeds)")


def plan_text(budget: Budget, arms: Sequence[Arm], per_iteration: int, treated: int = 0) -> str:
    """Before anything trains: how many runs and iterations this part will do (``arms``: its arms; a
    sweep when some are main arms; ``treated``: the arms the clip treatments may train)."""
    main = [a for a in arms if a.role == "main"]
    swept, extra = len(main) * len(budget.lrs), len(main) * budget.max_extensions
    images_its = math.ceil(budget.images / per_iteration)
    sweep = (f"sweep {len(main)} arms x {len(budget.lrs)} rates (+ up to {extra} runs extending the grid) x "
             f"{budget.sweep_iterations} iterations = {swept * budget.sweep_iterations} to "
             f"{(swept + extra) * budget.sweep_iterations} iterations; " if main else "")
    tail = f" (+ up to {budget.seeds * treated} runs of the clip treatments)" if treated else ""
    return (f"plan: {sweep}test {budget.seeds} seeds x {len(arms)} arms = {budget.seeds * len(arms)} runs"
            f"{tail}, each {images_its} iterations of {per_iteration} images (up to "
            f"{images_its * budget.max_iterations_factor} for an arm that trains on to the equal-seconds "
            f"budget) and at most {2 * budget.checkpoints + 1} evaluations at the checkpoints"
            + (" (a main arm's also after every iteration until it reaches the target)" if main else ""))


def iterations_to_target(result: ProtocolResult, arm: str, limit: int) -> int:
    """Iterations a run of ``arm`` is expected to need to reach the target, if its reward rises as in
    its sweep run (linearly to its validation gain after ``sweep_iterations``); ``limit`` when it is
    not expected to."""
    gains = result.target.get("validation_gains", {})
    gain = gains.get(arm, gains.get(TREE, 0.0))
    watched = result.watched_gain()
    if watched is None or gain <= 0:
        return limit
    return min(limit, math.ceil(result.budget.sweep_iterations * watched / gain))


def estimate_s(result: ProtocolResult, runs: dict[str, int], watched: Collection[str]) -> tuple[float, float]:
    """Wall seconds of training and of evaluation that ``runs`` (test runs per arm) are expected to
    take, from the sweep: each arm's median iteration time (the tree's for an arm not swept) for as many
    iterations as both budgets need, an evaluation at every checkpoint and, for the ``watched`` arms,
    after every iteration until the target."""
    per_arm = sweeping.iteration_seconds(result.sweep, result.clock)
    tree = per_arm.get(TREE, statistics.median(per_arm.values()))
    wall_per_clock = sweeping.wall_per_clock(result.sweep, result.clock)
    evaluation = sweeping.evaluation_seconds(result.sweep)
    images_its = math.ceil(result.budget.images / result.images_per_iteration)
    cap = images_its * result.budget.max_iterations_factor
    training = evaluating = 0.0
    for arm, count in runs.items():
        t = per_arm.get(arm, tree)
        its = max(images_its, min(cap, math.ceil(result.seconds / t) if t > 0 else cap))
        evaluations = 1 + 2 * result.budget.checkpoints
        if arm in watched:
            evaluations += iterations_to_target(result, arm, its)
        training += count * its * t * wall_per_clock
        evaluating += count * evaluations * evaluation
    return training, evaluating


def expected_text(result: ProtocolResult, runs: dict[str, int], watched: Collection[str],
                  done_s: float = 0.0, main: bool = True) -> list[str]:
    """After the sweep: the test runs' expected wall time (``done_s``: what this part has taken so
    far, the sweep), and for the main part a warning when it is expected past
    :data:`MAIN_PART_MINUTES`."""
    training, evaluating = estimate_s(result, runs, watched)
    minutes = (done_s + training + evaluating) / 60
    what = "main part (sweep and main arms)" if main else "ablation part (ablation arms and clip treatments)"
    lines = [f"expected: the {what} about {minutes:.0f} min of wall time: {done_s / 60:.0f} min so far, "
             f"{training / 60:.0f} min of training in {sum(runs.values())} test runs and about "
             f"{evaluating / 60:.0f} min of evaluation (from the sweep's iteration and evaluation times)"]
    if main and minutes > MAIN_PART_MINUTES:
        lines.append(f"warning: the main part is expected to take about {minutes:.0f} min, more than the "
                     f"{MAIN_PART_MINUTES:.0f} min it is sized for on the CPU test bed; fewer --images, "
                     "--checkpoints, --lrs or --sweep-iterations shorten it (nothing is refused)")
    return lines


def log_expected(result: ProtocolResult, extra: dict[str, int], part: str, done_s: float,
                 log: Callable[[str], None]) -> None:
    """The estimate of each part this command runs (``extra``: the clip treatments' runs per arm)."""
    seeds = result.budget.seeds
    main = {a.name: seeds for a in result.arms if a.role == "main"}
    watched = set(main)
    if part in ("main", "all"):
        for line in expected_text(result, main, watched, done_s, main=True):
            log(line)
    if part in ("ablations", "all"):
        rest = {a.name: seeds for a in result.arms if a.role == "ablation"}
        for name, count in extra.items():
            rest[name] = rest.get(name, 0) + count
        for line in expected_text(result, rest, (), done_s if part == "ablations" else 0.0, main=False):
            log(line)
