"""A guard that steers: the picks weight of the next iteration from the fall measured so far.

Training from picks trades prompt-following (the guard reward) for taste. A fixed picks weight ends
each taste somewhere else: far below the person's limit on one taste, past it on another. Here the
guard is a constraint, "the guard's mean may fall by at most ``limit``", and its Lagrange multiplier
``lambda`` is updated from the measured fall by a PID controller (Stooke, Achiam and Abbeel 2020, "PID
Lagrangian"): the integral term is dual ascent, the proportional term answers at once, and the
derivative term damps the overshoot that plain dual ascent shows when the fall rises quickly.

The rewards are mixed as Safe RLHF (Dai et al. 2023) and constrained GRPO mix them, each normalised
within its group first, then ``(A_taste + lambda * A_guard) / (1 + lambda)`` (the guard is a reward to
keep, so it is added): that is ``RewardMix.training_signal``'s normalised rule with the picks weight
``1 / (1 + lambda)`` and the guard's ``lambda / (1 + lambda)``; ``lambda = 0`` trains on the taste alone.

Pure functions over a small frozen state, so the loop only asks for a weight and a resumed run
continues the same path (the state is a few floats in the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ControllerConfig:
    """``limit``: the largest fall of the guard's mean the person allows (its own units). ``kp``, ``ki``,
    ``kd``: the PID gains, per unit of fall (the limits are hundredths of the scene reward,
    ``levels.KEEP_LEVELS``, so the gains are large). ``start``: lambda before any measurement. ``most``:
    lambda's ceiling, so that the taste keeps a weight of at least ``1 / (1 + most)``."""

    limit: float
    kp: float = 20.0
    ki: float = 40.0
    kd: float = 10.0
    start: float = 1.0
    most: float = 20.0

    def __post_init__(self) -> None:
        if not self.limit >= 0:
            raise ValueError(f"the guard's limit must be >= 0, got {self.limit}")
        if min(self.kp, self.ki, self.kd) < 0:
            raise ValueError(f"the controller's gains must be >= 0, got {self.kp}, {self.ki}, {self.kd}")
        if not 0 <= self.start <= self.most:
            raise ValueError(f"the controller's start must lie in [0, most={self.most}], got {self.start}")


@dataclass(frozen=True)
class ControllerState:
    """``multiplier``: lambda now. ``integral``: the accumulated excess of the fall over the limit (never
    below 0, so a long time under the limit does not bank room). ``error``: the last excess, for the
    derivative. ``steps``: measurements taken."""

    multiplier: float
    integral: float = 0.0
    error: float | None = None
    steps: int = 0


def start(config: ControllerConfig) -> ControllerState:
    """The state before any measurement: lambda at ``config.start``, carried by the integral."""
    return ControllerState(multiplier=config.start, integral=config.start / config.ki if config.ki else 0.0)


def update(state: ControllerState, fall: float, config: ControllerConfig) -> ControllerState:
    """The state after one measurement of the guard's ``fall`` (base mean minus current mean, on the
    validation pairs; negative when the guard rose).

    The excess ``fall - limit`` is positive past the limit: lambda rises and the picks weight falls.
    Below the limit the excess is negative: lambda falls toward 0 and the picks weight rises, so a run
    that has room left spends it."""
    error = float(fall) - config.limit
    integral = max(0.0, state.integral + error)
    rising = 0.0 if state.error is None else max(0.0, error - state.error)  # damp only a rising fall
    multiplier = config.kp * error + config.ki * integral + config.kd * rising
    multiplier = min(config.most, max(0.0, multiplier))
    return replace(state, multiplier=multiplier, integral=integral, error=error, steps=state.steps + 1)


def picks_weight(state: ControllerState) -> float:
    """The weight of the taste's advantage, ``1 / (1 + lambda)``; the guard's is one minus it."""
    return 1.0 / (1.0 + state.multiplier)

