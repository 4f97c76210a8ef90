"""The guard's controller (trainer/guard/controller.py): the picks weight rises while the measured fall of
prompt-following is below the person's limit and falls past it, and it brings two tastes that pull
against the prompt with very different strength near the limit, where one fixed weight cannot."""

from __future__ import annotations

import itertools

import pytest

from dynamic_treerpo.trainer.guard.controller import (
    ControllerConfig,
    picks_weight,
    start,
    update,
)

LIMIT = 0.02


def test_the_weight_rises_while_the_fall_is_below_the_limit() -> None:
    config = ControllerConfig(limit=LIMIT)
    state, weights = start(config), []
    for fall in (0.0, 0.005, 0.01, 0.012, 0.015):
        state = update(state, fall, config)
        weights.append(picks_weight(state))
    assert all(b >= a for a, b in itertools.pairwise(weights)), weights
    assert weights[-1] > picks_weight(start(config)), weights


def test_the_weight_falls_when_the_fall_is_past_the_limit() -> None:
    config = ControllerConfig(limit=LIMIT)
    state = start(config)
    for fall in (0.0, 0.0, 0.0):  # room: the weight rises first
        state = update(state, fall, config)
    before, weights = picks_weight(state), []
    for fall in (0.03, 0.035, 0.04):
        state = update(state, fall, config)
        weights.append(picks_weight(state))
    assert weights[0] < before and all(b < a for a, b in itertools.pairwise(weights)), weights


def test_lambda_stays_within_its_bounds_and_room_is_not_banked() -> None:
    config = ControllerConfig(limit=LIMIT, most=5.0)
    state = start(config)
    for _ in range(50):  # a long time far under the limit
        state = update(state, -0.1, config)
    assert state.multiplier == 0.0 and state.integral == 0.0 and picks_weight(state) == 1.0
    state = update(state, LIMIT + 0.01, config)  # one step past it answers at once
    assert state.multiplier > 0
    for _ in range(50):
        state = update(state, 1.0, config)
    assert state.multiplier == 5.0 and picks_weight(state) == pytest.approx(1 / 6)


def _run(sensitivity: float, weight_of, steps: int = 40) -> float:
    """A toy taste: the guard's fall drifts toward ``sensitivity * w`` at the picks weight ``w`` it trains
    with (a taste that pulls harder against the prompt has a larger sensitivity); the fall at the end."""
    fall, state = 0.0, None
    for step in range(steps):
        w, state = weight_of(step, fall, state)
        fall = 0.7 * fall + 0.3 * sensitivity * w
    return fall


def test_two_tastes_end_near_the_limit_under_the_controller_but_not_at_one_fixed_weight() -> None:
    config = ControllerConfig(limit=LIMIT)

    def steered(step, fall, state):
        state = start(config) if state is None else update(state, fall, config)
        return picks_weight(state), state

    def fixed(step, fall, state):
        return 0.3, None

    for sensitivity in (0.03, 0.2):  # the limit needs a weight of 0.67 and of 0.1
        assert _run(sensitivity, steered) == pytest.approx(LIMIT, rel=0.25), sensitivity
    at_fixed = [_run(s, fixed) for s in (0.03, 0.2)]
    assert at_fixed[0] < 0.5 * LIMIT and at_fixed[1] > 1.5 * LIMIT, at_fixed  # far under, far past


@pytest.mark.parametrize(("options", "message"), [
    ({"limit": -0.01}, "the guard's limit must be >= 0"),
    ({"limit": LIMIT, "ki": -1.0}, "the controller's gains must be >= 0"),
    ({"limit": LIMIT, "start": 30.0}, "the controller's start must lie in"),
])
def test_a_bad_controller_setting_is_one_line(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ControllerConfig(**options)
