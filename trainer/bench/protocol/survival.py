"""Time to a target reward when some seeds never reach it: the restricted mean time.

A seed that has not reached the target by the end of its budget is *censored* there: its time is
only known to exceed the budget. Counting it as the budget and averaging (or testing) as if it
were a measured time mixes two kinds of number; the standard summary is the restricted mean time
to the event, the area under the Kaplan-Meier survival curve up to the budget. With censoring only
at the budget, as in the protocol, that area equals the mean of ``min(time, budget)``, and the
paired comparison of two arms is the paired t test of those per-seed values (the exact sign-flip
test when they differ by the same amount on every seed: ``stats.sign_flip_p``).

A main arm's run is evaluated after every iteration until it has reached the target (then at the
fixed checkpoints only), so its time is that of the first iteration at the target, not of the
first checkpoint: the checkpoint grid does not decide a comparison. A time reached past the budget
(a run trains on to its other budget) is censored at the budget like a time never reached.

scipy has Kaplan-Meier from 1.11 (``scipy.stats.ecdf`` with ``CensoredData``); the floor is 1.10,
so the estimator is written here (a few lines, tested against hand-computed areas).
"""

from __future__ import annotations

from collections.abc import Sequence


def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[tuple[float, float]]:
    """The Kaplan-Meier survival curve as ``(time, survival just after it)`` at each event time.
    ``events[i]`` False: seed ``i`` was censored at ``times[i]`` (still at risk at that time)."""
    if len(times) != len(events) or not times:
        raise ValueError(f"kaplan_meier needs one event flag per time, got {len(times)} and {len(events)}")
    survival, curve = 1.0, []
    for t in sorted({t for t, e in zip(times, events, strict=True) if e}):
        at_risk = sum(1 for u in times if u >= t)
        died = sum(1 for u, e in zip(times, events, strict=True) if e and u == t)
        survival *= 1.0 - died / at_risk
        curve.append((t, survival))
    return curve


def restricted_mean(times: Sequence[float], events: Sequence[bool], horizon: float) -> float:
    """The area under the Kaplan-Meier curve from 0 to ``horizon``: the mean time to the event
    within ``horizon`` (an event after ``horizon`` counts as ``horizon``)."""
    if horizon <= 0:
        raise ValueError(f"the horizon must be > 0, got {horizon}")
    area, previous, survival = 0.0, 0.0, 1.0
    for t, after in kaplan_meier(times, events):
        if t >= horizon:
            break
        area += survival * (t - previous)
        previous, survival = t, after
    return area + survival * (horizon - previous)


def capped(times: Sequence[float | None], horizon: float) -> list[float]:
    """``min(time, horizon)`` per seed, a seed that never reached the target (None) at ``horizon``:
    the per-seed values the paired test of two arms' times is on."""
    return [horizon if t is None else min(t, horizon) for t in times]


def reached(times: Sequence[float | None], horizon: float) -> list[bool]:
    """Per seed, whether the target was reached within ``horizon`` (the event flags of
    :func:`restricted_mean`): a time past it is censored there."""
    return [t is not None and t <= horizon for t in times]
