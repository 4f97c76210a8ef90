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
from ..models.policy import Policy
from .factory import make_trainer
from .logs import finite_numbers

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


def _history_row(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in finite_numbers(row).items() if k == "iteration" or k in HISTORY_KEYS}


def train_steps(policy: Policy, config: TrainConfig, count: int, previous: TrainingState | None = None,
                on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> TrainingState:
    """Train ``count`` iterations on ``policy`` (trained in place: give a copy), continuing
    ``previous`` when given. ``config.iterations`` is set to the total, which is what the learning
    rate schedule sees."""
    if count < 1:
        raise ValueError(f"iterations must be >= 1, got {count}")
    start = previous.iterations_done if previous is not None else 0
    if previous is not None:
        for name in ("lora", "seed", "strategy"):
            if getattr(previous.config, name) != getattr(config, name):
                raise ValueError(f"cannot continue a run with another {name}: the previous step "
                                 f"used {getattr(previous.config, name)!r}")
    config = replace(config, iterations=start + count)
    with torch.inference_mode(False), torch.enable_grad():
        trainer = make_trainer(config, policy, evaluation=False)
        history: list[dict[str, float]] = []
        if previous is not None:
            trainer.restore(previous.weights, previous.optimizer, previous.state)
            history = list(previous.history)
        for it in range(start, start + count):
            row = trainer.step(it)
            history.append(_history_row(row))
            trainer.check_progress(it + 1)
            if on_iteration is not None:
                on_iteration(it - start + 1, row)
        trainer.policy.eval()
        return TrainingState(config, start + count, trainer.trained_state(),
                             trainer.optimizer.state_dict(), trainer.state(), history, trainer.policy)


def train_from_picks(policy: Policy, picks_dir: str | Path, config: TrainConfig, iterations: int,
                     previous: TrainingState | None = None,
                     on_iteration: Callable[[int, dict[str, Any]], None] | None = None) -> TrainingState:
    """:func:`train_steps` from the picks of ``picks_dir`` (docs/picks.md): ``config.reward`` must name
    ``picks`` (e.g. ``picks:0.5,scene:0.5``) and ``config.picks.mode`` says how they train."""
    config = replace(config, data=replace(config.data, picks=str(picks_dir)))
    if not config.uses_picks:
        raise ValueError(f"reward {config.reward!r} does not name picks: e.g. picks:0.5,scene:0.5")
    return train_steps(policy, config, iterations, previous, on_iteration)
