"""The guard trains the same picks at each of ``guard.weights`` and keeps one run (see
``trainer/guard/weights.py``): :func:`train_each_weight` is that rule, for a front end's trainer here
(:func:`train_at_weights`) and for a headless run's folder per weight (``trainer/training/run.py``).

In :func:`train_at_weights` every run starts from the same state (the LoRA as initialised or continued,
the optimizer, the random draws), so the runs differ only in the picks weight: the trainer is reset
between them instead of built again, which a front end's model (a ComfyUI MODEL) allows where loading it
twice would not.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config.schema import TrainConfig
from ..guard.terms import spec_at
from ..guard.tracker import GuardedResult, GuardedTraining
from ..guard.weights import WeightChoice, choose_weight, validation_gain
from ..rewards.registry import PICKS
from .loop import Trainer

Report = Callable[[int, dict[str, Any]], None]


def tried_weights(config: TrainConfig, taste: str = PICKS) -> tuple[float, ...]:
    """The picks weights a guarded run trains at: ``guard.weights``, or the reward's own weight when it
    is empty (the expert's fixed weight)."""
    if config.guard.weights:
        return config.guard.weights
    from ..rewards.mix import parse_reward_spec

    return (next(t.weight for t in parse_reward_spec(config.reward) if t.name == taste),)


@dataclass
class StartState:
    """What the trainer is reset to before each weight's run."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]

    @classmethod
    def of(cls, trainer: Trainer) -> StartState:
        return cls({k: v.detach().clone() for k, v in trainer.trained_state().items()},
                   copy.deepcopy(trainer.optimizer.state_dict()), copy.deepcopy(trainer.state()))

    def restore(self, trainer: Trainer) -> None:
        trainer.restore(self.weights, copy.deepcopy(self.optimizer), copy.deepcopy(self.state))


@dataclass
class WeightedResult:
    """The kept run, which weight it was and why, and each weight's run and history (a row per iteration)."""

    result: GuardedResult
    choice: WeightChoice
    results: list[GuardedResult]
    histories: list[list[dict[str, Any]]]


def train_each_weight(weights: Sequence[float], train: Callable[[int, float], GuardedResult | None]
                      ) -> tuple[WeightChoice, list[GuardedResult]] | None:
    """Train the picks once at each weight and choose the run to keep: ``train(index, weight)`` trains
    that weight's run and returns its guarded result, and the run kept is the one whose chosen checkpoint
    gained the most taste on the validation pairs (:func:`~..guard.weights.choose_weight`). The one rule
    of both callers: :func:`train_at_weights` (one trainer, reset between the weights) and the headless
    run (a run folder per weight, ``trainer/training/run.py``). ``train`` returns None in a process that
    trains without reading the runs (a distributed run's ranks other than 0): every weight still trains,
    and nothing is chosen (None)."""
    results = [train(i, weight) for i, weight in enumerate(weights)]
    measured = [r for r in results if r is not None]
    if len(measured) < len(results):
        return None
    choice = choose_weight(list(weights), [validation_gain(r.trail, r.choice) for r in measured],
                           [r.trail for r in measured])
    return choice, measured


def train_at_weights(trainer: Trainer, weights: Sequence[float],
                     tracker_for: Callable[[str], GuardedTraining], start: int, count: int,
                     on_iteration: Report | None = None, taste: str = PICKS, reward: str | None = None
                     ) -> WeightedResult:
    """Train iterations ``start .. start+count-1`` once per weight under the guard (``tracker_for(spec)``
    builds the guard for the reward spec at that weight), keep the run whose chosen point gained the most
    validation taste, and load its chosen weights into the trainer's policy (the optimizer and the
    trainer's state are the kept run's, as it stopped). ``on_iteration`` sees the
    iterations of all runs in turn, counted from 1 to ``count * len(weights)``. ``reward``: the reward
    spec as written, when the trainer's config does not name it (a benchmark builds its own reward)."""
    begin = StartState.of(trainer)
    results: list[GuardedResult] = []
    histories: list[list[dict[str, Any]]] = []
    ends: list[StartState | None] = []

    def train(i: int, weight: float) -> GuardedResult:
        if i:
            begin.restore(trainer)
        spec = spec_at(reward or trainer.config.reward, taste, weight)
        trainer.reward.set_share(taste, weight)
        history: list[dict[str, Any]] = []

        def report(done: int, row: dict[str, Any]) -> None:
            history.append(row)
            if on_iteration is not None:
                on_iteration(i * count + done, row)

        tracker = tracker_for(spec)
        if results:
            tracker.begin_from(results[0])
        results.append(tracker.run(start, count, report))
        histories.append(history)
        ends.append(StartState.of(trainer) if len(weights) > 1 else None)
        return results[-1]

    runs = train_each_weight(weights, train)
    assert runs is not None  # ``train`` measures every run here
    choice, _ = runs
    kept, end = results[choice.index], ends[choice.index]
    if end is not None:  # a later step continues from where the kept run stopped training
        end.restore(trainer)
    trainer.reward.set_share(taste, choice.weight)
    kept.apply(trainer.policy.transformer)
    return WeightedResult(kept, choice, results, histories)
