"""Training in steps for front ends (ComfyUI nodes): K iterations on a model already loaded, with
the state to continue in a later step, and the history of the metrics.

Why not ``run_training``: a node owns no run folder. It trains a copy of the model it is given,
returns the trained model and a :class:`TrainingState`, and a later node continues from that
state, so that two steps of K iterations equal one of 2K (the randomness of iteration ``i``
derives from ``(seed, i)``, the LoRA and optimizer state carry over).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..config.schema import TrainConfig
from ..guard.weights import WeightChoice
from ..models.policy import Policy
from .evaluate import read_prompt_file
from .factory import make_trainer
from .guarded import folder_validation_pairs, guard_trainer, guarded, separate_validation_pairs
from .logs import finite_numbers
from .loop import Trainer
from .weighted import train_at_weights, tried_weights

HISTORY_KEYS = ("reward_mean", "reward_max", "exact_mean", "loss", "grpo_loss", "prm_loss", "kl",
                "clip_frac", "grad_norm", "iteration_s")


@dataclass
class TrainingState:
    """What a later step needs: the config, the iterations done, the trained weights (the LoRA, or
    every weight when ``lora.enabled`` is false), optimizer and trainer state, the
    history (one dict per iteration) and the trained policy itself (for sampling and export)."""

    config: TrainConfig
    iterations_done: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    policy: Policy | None = None
    guard: Any = None  # a guarded run's checkpoints and choice (trainer.guard.run.GuardedResult)
    picks_weights: WeightChoice | None = None  # a guarded run: the picks weights it tried, the one kept


def _history_row(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in finite_numbers(row).items() if k == "iteration" or k in HISTORY_KEYS}


def start_steps(policy: Policy, config: TrainConfig, count: int, previous: TrainingState | None = None
                ) -> tuple[Trainer, TrainConfig, int, list[dict[str, float]]]:
    """The trainer of a step of ``count`` iterations (``previous`` restored): ``(trainer, config with
    the total iterations, first iteration, history so far)``. Call inside ``torch.inference_mode(False)``."""
    if count < 1:
        raise ValueError(f"iterations must be >= 1, got {count}")
    start = previous.iterations_done if previous is not None else 0
    if previous is not None:
        for name in ("lora", "seed", "strategy"):
            if getattr(previous.config, name) != getattr(config, name):
                raise ValueError(f"cannot continue a run with another {name}: the previous step "
                                 f"used {getattr(previous.config, name)!r}")
    config = replace(config, iterations=start + count)
    trainer = make_trainer(config, policy, evaluation=False)
    history: list[dict[str, float]] = []
    if previous is not None:
        trainer.restore(continued_weights(previous), previous.optimizer, previous.state)
        history = list(previous.history)
    return trainer, config, start, history


def continued_weights(previous: TrainingState) -> dict[str, torch.Tensor]:
    """The weights a later step trains on: the last iteration's (a guarded run hands on the checkpoint
    it chose, but continues training from where training stopped)."""
    guard = previous.guard
    if guard is not None and guard.snapshots:
        return dict(guard.snapshots[max(guard.snapshots)])
    return previous.weights


def history_reporter(history: list[dict[str, float]], start: int,
                     on_iteration: Callable[[int, dict[str, Any]], None] | None
                     ) -> Callable[[int, dict[str, Any]], None]:
    """``on_iteration(done, row)`` that also appends the row to ``history``."""
    def report(done: int, row: dict[str, Any]) -> None:
        history.append(_history_row(row))
        if on_iteration is not None:
            on_iteration(done, row)

    return report


def finish_steps(trainer: Trainer, config: TrainConfig, history: list[dict[str, float]],
                 guard: Any = None, weights: WeightChoice | None = None) -> TrainingState:
    """The state to continue from after a step (the trainer's current weights)."""
    trainer.policy.eval()
    return TrainingState(config, config.iterations, trainer.trained_state(), trainer.optimizer.state_dict(),
                         trainer.state(), history, trainer.policy, guard, weights)


def train_steps(policy: Policy, config: TrainConfig, count: int, previous: TrainingState | None = None,
                on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> TrainingState:
    """Train ``count`` iterations on ``policy`` (trained in place: give a copy), continuing
    ``previous`` when given. ``config.iterations`` is set to the total, which is what the learning
    rate schedule sees."""
    with torch.inference_mode(False), torch.enable_grad():
        trainer, config, start, history = start_steps(policy, config, count, previous)
        report = history_reporter(history, start, on_iteration)
        for it in range(start, config.iterations):
            row = trainer.step(it)
            trainer.check_progress(it + 1)
            report(it - start + 1, row)
        return finish_steps(trainer, config, history)


def picks_iterations(config: TrainConfig, iterations: int, previous: TrainingState | None = None) -> int:
    """How many iterations :func:`train_from_picks` will report: ``iterations`` per picks weight the
    guard tries (a front end's progress bar)."""
    if not (config.uses_picks and guarded(config)) or (previous is not None and previous.picks_weights):
        return iterations
    return iterations * len(tried_weights(config))


def train_from_picks(policy: Policy, picks_dir: str | Path, config: TrainConfig, iterations: int,
                     previous: TrainingState | None = None,
                     on_iteration: Callable[[int, dict[str, Any]], None] | None = None,
                     log: Callable[[str], None] = print) -> TrainingState:
    """:func:`train_steps` from the picks of ``picks_dir`` (docs/picks.md): ``config.reward`` must name
    ``picks`` (e.g. ``picks:0.5,scene:0.5``) and ``config.picks.mode`` says how they train. Under the
    guard (``guard.keep`` not ``off``) the picks train once at each of ``guard.weights`` and the guard
    keeps one run (``state.picks_weights`` says which and why); the state's weights and policy are the
    checkpoint it chose, and ``state.guard`` holds every checkpoint of that run (another one is taken
    without training). ``on_iteration`` counts the iterations of every weight's run in turn."""
    config = replace(config, data=replace(config.data, picks=str(picks_dir)))
    if not config.uses_picks:
        raise ValueError(f"reward {config.reward!r} does not name picks: e.g. picks:0.5,scene:0.5")
    if not guarded(config):
        return train_steps(policy, config, iterations, previous, on_iteration)
    with torch.inference_mode(False), torch.enable_grad():
        trainer, config, start, history = start_steps(policy, config, iterations, previous)
        own_prompts = config.data.prompts != "scenes"
        apart = own_prompts and config.guard.validation != "own"  # validation prompts training never draws
        # a continued guarded run measures on the pairs its trail began with (later picks may add prompts)
        measured = previous.config if previous is not None and previous.guard is not None else config
        pairs = (folder_validation_pairs(read_prompt_file(measured.data.prompts), config) if own_prompts
                 else separate_validation_pairs(config, trainer.eval_pairs))
        before = previous.guard if previous is not None else None
        # a continued run goes on at the weight its first step kept (its trail carries on)
        weights = ((previous.picks_weights.weight,) if previous is not None and previous.picks_weights
                   else tried_weights(config))

        def tracker_for(spec: str) -> Any:
            return guard_trainer(trainer, pairs, log=log, exclude_pairs=not own_prompts or apart,
                                 previous=before, reward_spec=spec, by_prompt=apart)

        tracked = train_at_weights(trainer, weights, tracker_for, start, iterations, on_iteration)
        if len(weights) > 1:
            log(f"guard: {tracked.choice.line()}")
        history += [_history_row(row) for row in tracked.histories[tracked.choice.index]]
        return finish_steps(trainer, config, history, tracked.result, tracked.choice)
