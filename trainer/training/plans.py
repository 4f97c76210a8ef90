"""The rollout plan and seeds of one iteration, from the config alone.

Every random choice of iteration ``i`` derives from ``(seed, i)``, so a resumed run draws what an
uninterrupted one would, and front ends can check a config's plan before any model loads.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config.schema import TrainConfig
from ..core.flow import make_sigmas
from ..core.strategies import MixGRPOConfig, TreeConfig, build_plan, window_start
from ..core.tree import RolloutPlan


def window_for(config: TrainConfig, iteration: int) -> int | None:
    """Where the tree (or MixGRPO's SDE window) starts at ``iteration``; the other strategies have
    no sliding window (Flow-GRPO-Fast draws its own position)."""
    strategy = config.strategy_config
    if not isinstance(strategy, TreeConfig | MixGRPOConfig):
        return None
    if strategy.max_window_start < 0:
        size = strategy.steps - 1 - strategy.max_window_start
        section = "tree" if config.strategy == "dynamic_treerpo" else "mixgrpo"
        raise ValueError(f"{section}.steps is {strategy.steps}: too few for a window of {size} SDE steps "
                         f"(it needs at least {size + 1} steps)")
    w = config.window
    start = strategy.window_start if w.start is None else w.start
    return window_start(iteration, w.schedule, start, strategy.max_window_start, w.every, w.stride,
                        w.roll_back, config.seed)


def iteration_plan(config: TrainConfig, sigmas: torch.Tensor, iteration: int,
                   noise_unshuffle: int = 1) -> RolloutPlan:
    """The rollout plan of ``iteration`` (its window, and Flow-GRPO-Fast's SDE steps)."""
    return build_plan(config.strategy_config, sigmas, window_for(config, iteration),
                      seed=config.seed * 1_000_003 + iteration,
                      log_prob_reduction=config.sampling.log_prob, noise_unshuffle=noise_unshuffle)


def check_plan(config: TrainConfig) -> None:
    """Build iteration 0's rollout plan without a model: bad tree, window or strategy options fail
    here in one line (front ends validate with it before anything runs)."""
    s = config.sampling
    iteration_plan(config, make_sigmas(s.schedule, config.strategy_config.steps, s.shift, image_tokens=64), 0)


def iteration_seeds(seed: int, iteration: int, count: int) -> list[int]:
    """Per-prompt rollout seeds of one iteration."""
    return [int(s) for s in np.random.default_rng([seed, iteration, 1]).integers(0, 2**31 - 1, count)]
