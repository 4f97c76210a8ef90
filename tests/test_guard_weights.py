"""The guard chooses the picks weight (trainer/guard/weights.py, trainer/training/weighted.py): the same
picks trained once per weight from the same start, the run whose chosen point gained the most validation
taste kept."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import GuardConfig, TrainConfig, check_weights
from dynamic_treerpo.trainer.guard.choice import Choice
from dynamic_treerpo.trainer.guard.terms import spec_at
from dynamic_treerpo.trainer.guard.trail import Trail, TrailPoint
from dynamic_treerpo.trainer.guard.weights import (
    choose_weight,
    validation_gain,
)
from dynamic_treerpo.trainer.training.guarded import guard_trainer, separate_validation_pairs
from dynamic_treerpo.trainer.training.loop import Trainer
from dynamic_treerpo.trainer.training.weighted import train_at_weights, tried_weights

TINY = ["tree.steps=5", "tree.depth=2", "tree.trees_per_prompt=1", "sampling.eval_steps=3", "lora.rank=4",
        "data.prompts_per_iteration=2", "data.eval_pairs=4", "guard.pairs=6", "guard.checkpoints=2",
        "reward_weights={function: dynamic_treerpo.trainer.bench.taste.hidden_tastes:lower_objects}",
        "guard.keep=loosely", "seed=5", "iterations=2", "optim.lr=0.01"]


def test_the_taste_term_takes_the_weight_and_the_others_share_the_rest_as_written() -> None:
    assert spec_at("picks:0.3,scene:0.7", "picks", 0.5) == "picks:0.5,scene:0.5"
    assert spec_at("scene:2,picks:1,ocr:1", "picks", 0.4) == "scene:0.4,picks:0.4,ocr:0.2"
    with pytest.raises(ValueError, match="no 'picks' term"):
        spec_at("scene:1", "picks", 0.5)
    with pytest.raises(ValueError, match="no term besides 'picks'"):
        spec_at("picks:1", "picks", 0.5)


def test_weights_are_distinct_and_strictly_between_0_and_1_with_one_line_errors() -> None:
    assert check_weights([0.3, 0.5]) == (0.3, 0.5)
    assert GuardConfig().weights == (0.4,)  # one training at 0.4 since 0.6
    assert GuardConfig(weights=[]).weights == ()
    for bad in ([0.3, 1.0], [0.0], [0.3, 0.3]):
        with pytest.raises(ValueError, match=r"guard\.weights"):
            GuardConfig(weights=bad)
        with pytest.raises(ValueError, match=r"guard\.weights"):
            check_weights(bad)
    picks = ["reward=picks:0.2,scene:0.8", "data.picks=somewhere"]
    config = load_config(TrainConfig, None, [*picks, "guard.weights=[]"])
    assert tried_weights(config) == (0.2,)  # none listed: the reward's own weight, as written
    assert tried_weights(load_config(TrainConfig, None, picks)) == (0.4,)


def test_the_run_that_gained_most_validation_taste_is_kept_the_first_on_ties() -> None:
    assert choose_weight([0.3, 0.5], [0.10, 0.25]).weight == 0.5
    assert choose_weight([0.3, 0.5], [0.25, 0.10]).weight == 0.3
    assert choose_weight([0.3, 0.5], [0.0, 0.0]).weight == 0.3
    line = choose_weight([0.3, 0.5], [0.1, 0.25]).line()
    assert line == ("trained your picks at weights 0.3 and 0.5 and kept 0.5: its choice gained +0.25 of your "
                    "taste on validation pairs (0.3: +0.1)")
    assert "no run gained taste" in choose_weight([0.3, 0.5], [0.0, 0.0]).line()
    with pytest.raises(ValueError):
        choose_weight([0.3, 0.5], [0.1])
    trail = Trail(0.02, 0.2, [TrailPoint(0, 1.0, 0.4, 0.5), TrailPoint(2, 1.0, 0.7, 0.49)])
    assert validation_gain(trail, Choice(trail.points[1], "", True)) == pytest.approx(0.3)
    assert validation_gain(trail, Choice(None, "", True)) == 0.0  # the base model kept: nothing gained


def _run(trainer: Trainer, weights: tuple[float, ...]):
    pairs = separate_validation_pairs(trainer.config, trainer.eval_pairs)
    seen: list[int] = []
    lines: list[str] = []
    out = train_at_weights(trainer, weights,
                           lambda spec: guard_trainer(trainer, pairs, taste="function", log=lines.append,
                                                      reward_spec=spec),
                           0, 2, lambda done, _: seen.append(done), taste="function")
    assert sum(line.startswith("guard: base taste") for line in lines) == 1  # the base measured once
    return out, seen


def test_each_weight_trains_from_the_same_start_as_a_fresh_run_at_that_weight() -> None:
    both, seen = _run(Trainer(load_config(TrainConfig, None, [*TINY, "reward=function:0.3,scene:0.7"])),
                      (0.3, 0.5))
    fresh, _ = _run(Trainer(load_config(TrainConfig, None, [*TINY, "reward=function:0.5,scene:0.5"])), (0.5,))
    assert seen == [1, 2, 3, 4]  # the runs' iterations, counted in turn
    assert both.results[1].trail.to_json() == fresh.result.trail.to_json()
    assert all(torch.equal(both.results[1].snapshots[2][k], v) for k, v in fresh.result.snapshots[2].items())
    for result, weight in zip(both.results, (0.3, 0.5), strict=True):  # the weight path: flat at its weight
        path = [p.picks_weight for p in result.trail.points if p.iteration and p.strength == 1.0]
        assert path and path == [weight] * len(path)  # the checkpoints measured (the last one at least)
    gains = [validation_gain(r.trail, r.choice) for r in both.results]
    assert both.choice.gains == tuple(gains) and both.result is both.results[both.choice.index]


def test_the_trade_plot_shows_the_run_not_kept_in_grey(tmp_path) -> None:
    import numpy as np
    from PIL import Image

    from dynamic_treerpo.trainer.guard.choice import choose
    from dynamic_treerpo.trainer.guard.figures import trade_plot

    def trail(weight: float, slope: float) -> Trail:
        points = [TrailPoint(it, 1.0, slope * it / 24, 0.5 - 0.001 * it, 0.005, weight) for it in (6, 12, 24)]
        return Trail(0.02, 0.2, [TrailPoint(0, 1.0, 0.0, 0.5), *points])

    kept, other = trail(0.5, 0.8), trail(0.3, 0.5)
    grey = (0x9C, 0xA3, 0xAF)

    def greys(path) -> int:
        with Image.open(path) as image:
            pixels = torch.tensor(np.asarray(image.convert("RGB")), dtype=torch.int32)
        return int(((pixels - torch.tensor(grey)).abs().amax(dim=-1) < 8).sum())

    trade_plot(kept, choose(kept, 1.0), tmp_path / "one.png")
    trade_plot(kept, choose(kept, 1.0), tmp_path / "two.png", others=[other])
    assert greys(tmp_path / "two.png") > greys(tmp_path / "one.png") + 200
