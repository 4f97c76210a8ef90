"""The guard measures the last checkpoint first and walks back only while it must (trainer/guard/order.py),
and, replayed on the stored benchmark runs that measured every checkpoint, chooses what they chose
(trainer/bench/taste/order_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.taste.order_replay import load_runs, replay, replay_runs
from dynamic_treerpo.trainer.config.schema import GuardConfig
from dynamic_treerpo.trainer.guard.order import next_to_measure
from dynamic_treerpo.trainer.guard.trail import Trail, TrailPoint

DATA = Path(__file__).resolve().parents[1] / "docs" / "data" / "taste"


def _trail(*falls: tuple[int, float]) -> Trail:
    """A base at guard 0.5 and checkpoints measured with the given falls (standard error 0.001)."""
    points = [TrailPoint(0, 1.0, 0.0, 0.5, 0.0)]
    points += [TrailPoint(it, 1.0, it / 10, 0.5 - fall, 0.001) for it, fall in falls]
    return Trail(0.02, 0.1, points)


def _walk(falls: dict[int, float], kept: list[int], margin: float = 1.0) -> list[int]:
    """The checkpoints measured, in order, when checkpoint ``it`` falls by ``falls[it]``."""
    trail, order = _trail(), []
    while (it := next_to_measure(trail, kept, margin)) is not None:
        order.append(it)
        trail.points.append(_trail((it, falls[it])).points[1])
    return order


def test_a_last_checkpoint_within_the_limit_is_the_only_one_measured() -> None:
    assert _walk({6: 0.0, 12: 0.005, 18: 0.01, 24: 0.015}, [6, 12, 18, 24]) == [24]


def test_past_the_limit_the_guard_walks_back_until_one_is_within_it() -> None:
    assert _walk({6: 0.0, 12: 0.005, 18: 0.03, 24: 0.05}, [6, 12, 18, 24]) == [24, 18, 12]
    assert _walk({6: 0.03, 12: 0.04, 18: 0.05, 24: 0.06}, [6, 12, 18, 24]) == [24, 18, 12, 6]
    # the margin counts: a fall of 0.0195 with a standard error of 0.001 is past 0.02 at margin 1
    assert _walk({12: 0.0, 24: 0.0195}, [12, 24]) == [24, 12]
    assert _walk({12: 0.0, 24: 0.0195}, [12, 24], margin=0.0) == [24]


def test_a_last_checkpoint_that_lost_taste_is_no_reason_to_stop() -> None:
    """Within the limit but below the base model's taste: the earlier checkpoints may hold more."""
    trail, order = _trail(), []
    tastes = {12: 0.3, 24: -0.1}
    while (it := next_to_measure(trail, [12, 24], 1.0)) is not None:
        order.append(it)
        trail.points.append(TrailPoint(it, 1.0, tastes[it], 0.5, 0.001))
    assert order == [24, 12]


def test_a_continued_run_measures_its_new_checkpoints_first() -> None:
    """The first run measured 12 and 24 (24 within the limit); the continued run kept 30 and 36."""
    trail = _trail((12, 0.0), (24, 0.01))
    assert next_to_measure(trail, [12, 24, 30, 36], 1.0) == 36
    trail.points.append(_trail((36, 0.05)).points[1])
    assert next_to_measure(trail, [12, 24, 30, 36], 1.0) == 30
    trail.points.append(_trail((30, 0.03)).points[1])
    assert next_to_measure(trail, [12, 24, 30, 36], 1.0) is None  # 24 is measured and within the limit


def test_the_order_is_an_option_with_a_one_line_refusal() -> None:
    assert GuardConfig().measure == "backward" and GuardConfig(measure="every").measure == "every"
    with pytest.raises(ValueError, match=r"guard\.measure must be one of backward, every, got 'sometimes'"):
        GuardConfig(measure="sometimes")


def test_replayed_on_the_stored_tables_it_chooses_what_every_checkpoint_chose() -> None:
    """The 0.4.0 table at 0.3 and its arms at 0.5 (every point of every run stored): each replayable run
    chooses the same point, and at 0.3, where runs often end within the limit, with fewer
    measurements."""
    low = replay_runs(load_runs([DATA / "taste_table"]))
    high = replay_runs(load_runs([DATA / "taste_weight_0.5"]))
    for counts in (low, high):
        replayed = counts["runs"] - counts["not_replayable"]
        assert replayed >= counts["runs"] - 1 and counts["same"] == replayed
    assert low["backward"] < 0.9 * low["every"] and high["backward"] <= high["every"]


def test_a_replay_measures_a_subset_of_the_stored_points_and_refuses_what_it_cannot_replay() -> None:
    data = json.loads((DATA / "taste_table" / "lower_objects" / "taste.json").read_text(encoding="utf-8"))
    run = data["per_seed"][0]["reward"]["50"]
    r = replay(run, 1.0)
    assert r is not None and r["backward"] <= r["every"] == len(run["points"]) - 1
    within = {**run, "limit": 10.0}  # every checkpoint within a loose limit: the last alone is measured
    assert replay(within, 1.0) == {"same": True, "every": len(run["points"]) - 1, "backward": 1}
    gap = {**run, "points": [p for p in run["points"] if p["iteration"] != 24 or p["strength"] != 1.0]}
    assert replay({**gap, "limit": 10.0}, 1.0)["backward"] == 1  # the last stored checkpoint is 18 then


def test_the_order_changes_what_is_measured_never_what_is_trained() -> None:
    """The same tiny run under both orders: the kept checkpoints are equal bit for bit, every point the
    backward order measured has the figures the every order measured, and both choose the same point."""
    import torch
    from test_guard import ORACLE, TINY

    from dynamic_treerpo.trainer.config.files import load_config
    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.training.guarded import guard_trainer, separate_validation_pairs
    from dynamic_treerpo.trainer.training.loop import Trainer

    results = {}
    for order in ("every", "backward"):
        config = load_config(TrainConfig, None, [*TINY, *ORACLE, "seed=3", "guard.keep=loosely",
                                                 "iterations=4", f"guard.measure={order}"])
        trainer = Trainer(config)
        pairs = separate_validation_pairs(config, trainer.eval_pairs)
        results[order] = guard_trainer(trainer, pairs, taste="function", log=lambda _: None).run(0, 4)
    every, backward = results["every"], results["backward"]
    assert sorted(every.snapshots) == sorted(backward.snapshots) == [2, 4]
    for it, state in every.snapshots.items():
        assert all(torch.equal(state[k], backward.snapshots[it][k]) for k in state)
    measured = {(p.iteration, p.strength): p for p in every.trail.points}
    assert all(measured[(p.iteration, p.strength)] == p for p in backward.trail.points)
    assert len(backward.trail.points) <= len(every.trail.points)
    assert backward.choice.point == every.choice.point
