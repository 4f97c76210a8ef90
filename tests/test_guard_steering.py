"""A guard that steers (``guard.steer``): after each checkpoint the controller sets the picks weight of the
next iterations from the measured fall, the trail records the weight's path, and a continued run replays
the controller from the trail to the same state."""

from __future__ import annotations

import pytest

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.guard.controller import picks_weight
from dynamic_treerpo.trainer.guard.tracker import GuardedResult, GuardedTraining
from dynamic_treerpo.trainer.guard.trail import Trail
from dynamic_treerpo.trainer.rewards.mix import RewardMix
from dynamic_treerpo.trainer.training.guarded import guard_trainer, separate_validation_pairs
from dynamic_treerpo.trainer.training.loop import Trainer
from tests.test_guard import ORACLE, TINY


def test_set_share_moves_the_weight_between_the_taste_and_the_guard_terms() -> None:
    mix = RewardMix("scene:0.6,ocr:0.2,clip:0.2", prebuilt={"scene": None, "ocr": None, "clip": None})
    mix.set_share("scene", 0.2)
    assert [(t.name, round(t.weight, 6)) for t in mix.terms] == [("scene", 0.2), ("ocr", 0.4), ("clip", 0.4)]
    with pytest.raises(ValueError, match="must lie in"):
        mix.set_share("scene", 0.0)


def test_a_steered_run_records_the_weight_path_and_a_continued_run_replays_it() -> None:
    config = load_config(TrainConfig, None, [*TINY, *ORACLE, "seed=5", "iterations=3", "guard.checkpoints=3",
                                             "experimental.guard.steer=true", "guard.keep=strictly"])
    trainer = Trainer(config)
    pairs = separate_validation_pairs(config, trainer.eval_pairs)
    lines: list[str] = []
    tracker = guard_trainer(trainer, pairs, taste="function", log=lines.append)
    result = tracker.run(0, 3)
    trained = [p for p in result.trail.points if p.iteration > 0 and p.strength == 1.0]
    assert [p.iteration for p in trained] == [1, 2, 3]
    assert trained[0].picks_weight == pytest.approx(0.5)  # the reward's own weight until the first check
    assert [p.picks_weight for p in trained[1:]] == pytest.approx(
        [float(line.rsplit(" ", 1)[1]) for line in lines if "picks weight is now" in line], abs=1e-3)
    assert sum("picks weight is now" in line for line in lines) == 2  # none after the last checkpoint
    assert trainer.reward.weight_of("function") == pytest.approx(picks_weight(tracker.steering))
    # a run killed after checkpoint 2 and resumed replays the controller from its trail to the same state
    cut = GuardedResult(Trail(result.trail.limit, result.trail.guard_spread,
                              [p for p in result.trail.points if p.iteration <= 2]),
                        {k: v for k, v in result.snapshots.items() if k <= 2}, result.choice)
    again = GuardedTraining(tracker.trainer, tracker.config, tracker.draw, taste="function",
                            log=lambda _: None, previous=cut)
    assert again._start_steering() == tracker.steering


def test_the_trade_plot_shows_the_weight_path_beside_the_trade_when_the_trail_recorded_it(tmp_path) -> None:
    from dataclasses import replace

    from PIL import Image

    from dynamic_treerpo.trainer.guard.choice import choose
    from dynamic_treerpo.trainer.guard.figures import trade_plot, weight_path
    from dynamic_treerpo.trainer.guard.trail import TrailPoint

    points = [TrailPoint(0, 1.0, 0.0, 0.5), TrailPoint(6, 1.0, 0.1, 0.495, 0.005, 0.3),
              TrailPoint(12, 1.0, 0.2, 0.47, 0.006, 0.26), TrailPoint(12, 0.5, 0.1, 0.499, 0.004)]
    steered = Trail(0.02, 0.2, points)
    assert weight_path(steered) == [(6, 0.3), (12, 0.26)]  # lower strengths train nothing: no weight
    old = Trail(0.02, 0.2, [replace(p, picks_weight=None) for p in points])
    assert weight_path(old) == []  # a trail written before the weight was recorded
    trade_plot(steered, choose(steered), tmp_path / "steered.png")
    trade_plot(old, choose(old), tmp_path / "old.png")
    with Image.open(tmp_path / "steered.png") as a, Image.open(tmp_path / "old.png") as b:
        assert a.height == b.height and a.width > 1.5 * b.width  # a second panel: the weight's path
