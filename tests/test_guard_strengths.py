"""Lower LoRA strengths by bisection (``guard.search: bisect``): the strongest strength of a checkpoint whose
fall fits the limit, found in a few measurements, and a guarded run that measures them."""

from __future__ import annotations

import itertools

import pytest

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import GuardConfig, TrainConfig
from dynamic_treerpo.trainer.guard.strengths import bisect_strength
from dynamic_treerpo.trainer.training.guarded import guard_trainer, separate_validation_pairs
from dynamic_treerpo.trainer.training.loop import Trainer
from tests.test_guard import ORACLE, TINY


def _convex_fall(strength: float) -> float:
    """A fall that stays small up to about half strength, then climbs: 0.03 at full strength."""
    return 0.03 * strength**3


def test_bisection_finds_the_strongest_strength_within_the_limit_to_one_part_in_two_to_the_tries() -> None:
    measured: list[float] = []

    def fits(s: float) -> bool:
        measured.append(s)
        return _convex_fall(s) <= 0.02

    best = bisect_strength([(1.0, False)], 4, fits)
    exact = (0.02 / 0.03) ** (1 / 3)  # 0.874
    assert measured == [0.5, 0.75, 0.875, 0.812]
    assert best <= exact < best + 1 / 2**4
    # a straight line from the base, the line search's guess, lands far lower: 0.02 / 0.03 = 0.67
    assert best > 0.02 / 0.03 + 0.1


def test_bisection_starts_from_what_is_known_and_stops_when_it_cannot_halve() -> None:
    assert bisect_strength([(1.0, False), (0.5, True), (0.6, False)], 1, lambda s: s <= 0.56) == 0.55
    calls: list[float] = []
    assert bisect_strength([(0.5, True), (0.501, False)], 5, lambda s: calls.append(s) or True) == 0.5
    assert calls == []  # 0.5005 rounds to 0.5 or 0.501 at 3 digits: nothing left to measure
    assert bisect_strength([(1.0, False)], 0, lambda s: True) == 0.0


def test_the_search_is_a_word_the_config_checks() -> None:
    assert GuardConfig().search == "bisect"
    with pytest.raises(ValueError, match=r"guard\.search must be one of line, bisect, got 'halve'"):
        GuardConfig(search="halve")


def test_a_guarded_run_with_bisect_measures_its_tastiest_checkpoint_past_the_limit_at_halving_strengths(
) -> None:
    config = load_config(TrainConfig, None, [*TINY, *ORACLE, "seed=4", "iterations=2", "optim.lr=0.05",
                                             "guard.limit=0.0", "guard.margin=0", "guard.search=bisect",
                                             "guard.strength_tries=3"])
    trainer = Trainer(config)
    lines: list[str] = []
    tracker = guard_trainer(trainer, separate_validation_pairs(config, trainer.eval_pairs), taste="function",
                            log=lines.append)
    result = tracker.run(0, 2)
    trail = result.trail
    full = [p for p in trail.points if p.iteration and p.strength == 1.0]
    over = [p for p in full if trail.fall(p) > trail.limit]
    weaker = [p for p in trail.points if p.strength != 1.0]
    assert over, "with a limit of 0 and no margin this seed's checkpoints fall past the limit"
    tastiest = max(over, key=lambda p: p.taste).iteration
    assert {p.iteration for p in weaker} == {tastiest}
    strengths = [p.strength for p in weaker]
    assert strengths[0] == 0.5 and 1 <= len(strengths) <= 3
    for k, (before, after) in enumerate(itertools.pairwise(strengths)):  # each halves the interval left
        assert abs(after - before) == pytest.approx(0.5 ** (k + 2), abs=1e-3)
    measured = [line for line in lines if line.startswith("guard: iteration") and "at strength" in line]
    assert len(measured) == len(strengths)
