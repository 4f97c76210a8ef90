"""Which checkpoint the person's limit allows: the most taste whose guard fall stays within it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .trail import Trail, TrailPoint


def change_words(fall: float) -> str:
    """'fell by 0.012' or 'rose by 0.05': a guard's change in words."""
    return f"fell by {fall:.3g}" if fall > 0 else f"rose by {-fall:.3g}" if fall < 0 else "did not change"


def past_limit_chance(fall: float, se: float, limit: float) -> float:
    """The chance that a checkpoint's true fall is past ``limit``, given its measured ``fall`` and that
    measurement's standard error (normal, flat prior). It is for the one checkpoint measured: taking the
    tastiest of several raises it a little (the benchmark counts the runs that went past)."""
    if se <= 0 or not math.isfinite(se):
        return 1.0 if fall > limit else 0.0
    return 0.5 * math.erfc((limit - fall) / (se * math.sqrt(2.0)))


def risk_words(chance: float) -> str:
    """'about 1 run in 6', 'under 1 run in 100', 'about even': a chance in words a person reads."""
    if chance < 0.01:
        return "under 1 run in 100"
    if chance >= 0.4:
        return "about even" if chance < 0.6 else "likely"
    return f"about 1 run in {round(1 / chance)}"


@dataclass(frozen=True)
class Choice:
    """The point taken (None: the base model, unchanged) and why, in one line a person reads."""

    point: TrailPoint | None
    reason: str
    within_limit: bool


def allowed(trail: Trail, point: TrailPoint, margin: float = 0.0) -> bool:
    """Whether ``point``'s guard fall, plus ``margin`` standard errors of it, is within the limit."""
    return trail.fall(point) + margin * point.guard_se <= trail.limit + 1e-12


def tastiest_past_limit(trail: Trail, margin: float = 0.0) -> TrailPoint | None:
    """The checkpoint (full strength) past the limit with the most taste: the one the strength search
    works on (None: every measured checkpoint is within the limit)."""
    over = [p for p in trail.points
            if p.iteration > 0 and p.strength == 1.0 and not allowed(trail, p, margin)]
    return max(over, key=lambda p: p.taste) if over else None


def choose(trail: Trail, margin: float = 0.0) -> Choice:
    """The trained point with the highest taste among those within the limit. None when no trained
    point is within it, or none of those raised the taste above the base model's."""
    base = trail.base
    trained = [p for p in trail.points if p.iteration > 0]
    inside = [p for p in trained if allowed(trail, p, margin)]
    if not trained:
        return Choice(None, "nothing was trained yet: the base model is returned unchanged", False)
    if not inside:
        least = min(trained, key=trail.fall)
        return Choice(None, f"no checkpoint kept prompt-following within the limit (a fall of at most "
                            f"{trail.limit:.3g}; the smallest fall was {trail.fall(least):.3g} at "
                            f"{least.label}): the base model is returned unchanged; allow more (loosely), "
                            "or pick more consistently", False)
    best = max(inside, key=lambda p: (p.taste, -p.iteration, p.strength))
    if best.taste <= base.taste:
        return Choice(None, "no checkpoint within the limit raised your taste's score above the base "
                            "model's: the base model is returned unchanged", True)
    chance = past_limit_chance(trail.fall(best), best.guard_se, trail.limit)
    return Choice(best, f"{best.label}: the most taste (+{best.taste - base.taste:.3g}) whose "
                        f"prompt-following {change_words(trail.fall(best))}, within the limit of a fall of "
                        f"{trail.limit:.3g} (its true fall is past the limit in {risk_words(chance)})", True)


def checkpoints(trail: Trail, kept: Iterable[int] = ()) -> list[int]:
    """The iterations the run kept a checkpoint at (0: the base model): those it measured and ``kept``
    (the LoRA snapshots it holds, measured or not)."""
    return sorted({p.iteration for p in trail.points} | set(kept))


def take(trail: Trail, iteration: int, strength: float, kept: Iterable[int] = ()) -> Choice:
    """The checkpoint and strength a person asked for instead of the guard's choice; one line when the
    run kept no checkpoint at that iteration (``kept``: the checkpoints it holds besides those on the
    trail). A checkpoint or strength the run did not measure is taken all the same (it needs no
    training), and the reason says it was not measured."""
    if not 0.0 <= strength <= 2.0:
        raise ValueError(f"strength must be between 0 and 2, got {strength:g}")
    if iteration == 0 or strength == 0.0:
        return Choice(None, "the base model, as asked", True)
    kept = checkpoints(trail, kept)
    if iteration not in kept:
        raise ValueError(f"no checkpoint at iteration {iteration}: this run kept "
                         + ", ".join(str(i) for i in kept if i))
    point = trail.find(iteration, strength)
    if point is None:
        label = TrailPoint(iteration, strength, 0.0, 0.0).label
        return Choice(TrailPoint(iteration, strength, float("nan"), float("nan")),
                      f"{label}, as asked (not measured on the validation pairs)", False)
    return Choice(point, f"{point.label}, as asked (prompt-following {change_words(trail.fall(point))}; the "
                         f"limit is a fall of {trail.limit:.3g})", allowed(trail, point))
