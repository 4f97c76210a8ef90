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


def sampler_tree_config(steps: int, depth: int, branching: int, window_start: int, noise_level: float,
                        noise_growth: float = 0.5, sde_kind: str = "flow_grpo") -> TreeConfig:
    """The tree the sampling nodes grow (TreeRPO Tree Sampler, Sample Trees to Pick) from their widgets:
    an Euler tail, checked for a depth and window that fit the steps (one line naming the widget)."""
    config = TreeConfig(steps=steps, window_start=window_start, depth=depth, branching=branching,
                        noise_level=noise_level, noise_growth=noise_growth, sde_kind=sde_kind, tail="euler")
    if depth >= steps:
        raise ValueError(f"depth: {depth} splits need more than {steps} steps; use at most {steps - 1}")
    if not 0 <= window_start <= config.max_window_start:
        raise ValueError(f"window_start: {window_start} is too late; with {steps} steps and {depth} splits "
                         f"it must be between 0 and {config.max_window_start}")
    return config


def picking_plan(steps: int, depth: int, branching: int, window_start: int, noise_level: float, shift: float,
                 seed: int, image_tokens: int, noise_unshuffle: int = 1) -> RolloutPlan:
    """The plan of the trees TreeRPO Sample Trees to Pick grows for a person to pick from."""
    config = sampler_tree_config(steps, depth, branching, window_start, noise_level)
    sigmas = make_sigmas("shift", steps, shift, image_tokens=image_tokens)
    return build_plan(config, sigmas, window_start, seed=seed, noise_unshuffle=noise_unshuffle)


def picking_jobs(prompts: list[str], trees_per_prompt: int, seed: int) -> list[tuple[str, int]]:
    """``(prompt, tree seed)`` of every tree Sample Trees to Pick grows, in order: each prompt's trees in
    turn, so that another seed adds trees and never repeats one."""
    return [(p, seed + k * 1_000_003 + i) for i, p in enumerate(prompts) for k in range(trees_per_prompt)]

