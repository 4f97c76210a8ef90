"""Clean seconds: which test runs another process disturbed, and the claims in seconds without them.

A run's wall seconds per CPU second is steady for an arm on a quiet machine (its threads' share of the
work). Another process on the same cores raises it, and (OpenMP threads spinning while they wait) raises
the CPU seconds per iteration too, so CPU seconds are not immune. A run whose ratio is more than
``TOLERANCE`` times its arm's median is marked disturbed; the page lists those runs and gives every claim
measured in seconds with and without them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .results import PUBLISHED, ProtocolResult, Run

TOLERANCE = 1.15
"""A run is disturbed when its wall/CPU ratio exceeds its arm's median by more than this factor: set just
above the spread of one arm's runs on a quiet machine (docs/data/protocol.json), so that a quiet run is
never marked and a second job on the same cores is."""

SECONDS_GROUPS = ("faster convergence per second", "faster to a first gain, per second",
                  "higher final reward at equal seconds", "about 50% training efficiency")
"""The claims whose figures are seconds (the groups' names, as the claims module gives them)."""


@dataclass(frozen=True)
class Disturbed:
    """One disturbed run: its ratio, its arm's median ratio, its CPU seconds per iteration against its
    arm's median, and the machine's load when it started and ended (None: not recorded)."""

    arm: str
    seed: int
    ratio: float
    arm_ratio: float
    cpu_per_iteration: float
    load: tuple[float, ...] | None


def wall_per_cpu(run: Run) -> float:
    cpu = sum(run.iteration_cpu_s)
    return sum(run.iteration_wall_s) / cpu if cpu > 0 else math.nan


def _cpu_per_iteration(run: Run) -> float:
    return sum(run.iteration_cpu_s) / max(1, len(run.iteration_cpu_s))


def disturbed_runs(result: ProtocolResult, tolerance: float = TOLERANCE) -> list[Disturbed]:
    """The published runs whose wall/CPU ratio is more than ``tolerance`` times their arm's median."""
    out = []
    for arm in dict.fromkeys(r.arm for r in result.runs):
        runs = [r for r in result.runs if r.arm == arm and r.treatment == PUBLISHED.name]
        if len(runs) < 2:
            continue
        median = statistics.median(wall_per_cpu(r) for r in runs)
        cpu = statistics.median(_cpu_per_iteration(r) for r in runs)
        for r in runs:
            ratio = wall_per_cpu(r)
            if ratio > tolerance * median:
                out.append(Disturbed(arm, r.seed, ratio, median, _cpu_per_iteration(r) / cpu,
                                     tuple(r.load) if r.load else None))
    return out


def without(result: ProtocolResult, runs: Sequence[Disturbed]) -> ProtocolResult:
    """``result`` less the disturbed runs (their seeds drop out of the pairs they were in)."""
    gone = {(d.arm, d.seed) for d in runs}
    return replace(result, runs=[r for r in result.runs
                                 if (r.arm, r.seed) not in gone or r.treatment != PUBLISHED.name])
