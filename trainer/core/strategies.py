"""Strategies as rollout plans: Dynamic-TreeRPO, MixGRPO (+ trunk sharing, + Flash), DanceGRPO,
Flow-GRPO (+ Fast) and BranchGRPO.

Each strategy has a typed config with the defaults of docs/algorithm.md and a ``plan`` function that
turns it, a sigma grid and a window start into a :class:`RolloutPlan`. The closed-form forward
counts of docs/algorithm.md, "Compute accounting" live here too, so tests can check the sampler against them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np
from torch import Tensor

from .flow import NoiseSubspace, SdeKind
from .tree import RolloutPlan, StepOp

Tail = Literal["euler", "dpm2m"]
WindowSchedule = Literal["progressive", "random", "fixed"]
Strategy = Literal["dynamic_treerpo", "mixgrpo", "mixgrpo_flash", "dancegrpo", "flow_grpo",
                   "flow_grpo_fast", "branchgrpo"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)  # the one list: config, nodes and benchmarks read it


@dataclass(frozen=True)
class TreeConfig:
    """Dynamic-TreeRPO sampling (docs/algorithm.md, "Tree rollout").

    ``window_start`` l, ``depth`` d (paper: 4), ``branching`` b (paper: 2), ``trees_per_prompt``
    M; noise level of layer k is ``min(noise_level * (1 + noise_growth * k / (d - 1)), noise_max)``
    (linear in depth [paper], clamped [choice]). ``tail``: Euler, or DPM-Solver++(2M) with
    ``max(1, round(tail_compression * remaining))`` steps (MixGRPO-Flash style).
    ``antithetic``: siblings draw mirrored noise ``(eps, -eps)`` [choice] (see ``tree._branch_noise``).
    ``noise_pool``: SDE noise constant over ``pool x pool`` image blocks, 1 = isotropic [choice]
    (see ``flow.NoiseSubspace``).
    """

    steps: int = 25
    window_start: int = 10
    depth: int = 4
    branching: int = 2
    trees_per_prompt: int = 1
    noise_level: float = 0.6
    noise_growth: float = 0.5
    noise_max: float = 1.0
    sde_kind: SdeKind = "flow_grpo"
    tail: Tail = "euler"
    tail_compression: float = 0.4
    antithetic: bool = False
    noise_pool: int = 1

    @property
    def leaves_per_tree(self) -> int:
        return self.branching**self.depth

    @property
    def max_window_start(self) -> int:
        """Last start whose window avoids the final step: ``T - 1 - d``."""
        return self.steps - 1 - self.depth


@dataclass(frozen=True)
class MixGRPOConfig:
    """MixGRPO: ``group_size`` trajectories, SDE inside ``[l, l + window_size)``, ODE outside.

    ``share_trunk`` computes the identical pre-window ODE trunk once per prompt instead of
    ``group_size`` times (the published code recomputes it). ``flash`` replaces the post-window
    Euler tail by DPM-Solver++(2M) with ``round(tail_compression * remaining)`` steps.
    ``noise_pool`` as in :class:`TreeConfig`.
    """

    steps: int = 25
    window_start: int = 0
    window_size: int = 4
    group_size: int = 12
    noise_level: float = 0.7
    sde_kind: SdeKind = "flow_grpo"
    share_trunk: bool = False
    flash: bool = False
    tail_compression: float = 0.4
    noise_pool: int = 1

    @property
    def max_window_start(self) -> int:
        return self.steps - 1 - self.window_size


@dataclass(frozen=True)
class DanceGRPOConfig:
    """DanceGRPO: ``group_size`` trajectories from one shared noise, SDE (constant ``eta``) at
    every step but the last, a random ``train_fraction`` of the first ``T - 1`` steps trained.
    ``noise_pool`` as in :class:`TreeConfig`."""

    steps: int = 16
    group_size: int = 12
    eta: float = 0.3
    train_fraction: float = 0.6
    share_initial_noise: bool = True
    sde_kind: SdeKind = "dance"
    noise_pool: int = 1


@dataclass(frozen=True)
class FlowGRPOConfig:
    """Flow-GRPO (yifan123/flow_grpo): ``group_size`` trajectories from independent initial noise,
    SDE (``noise_level`` a) at every step but the last, every SDE step trained (its
    ``timestep_fraction`` 0.99 of 10 steps). ``fast`` (Flow-GRPO-Fast): ODE everywhere but
    ``fast_sde_steps`` consecutive SDE steps at a position drawn each iteration, and only those
    trained. ``noise_pool`` as in :class:`TreeConfig`."""

    steps: int = 10
    group_size: int = 12
    noise_level: float = 0.7
    sde_kind: SdeKind = "flow_grpo"
    fast: bool = False
    fast_sde_steps: int = 2
    noise_pool: int = 1

    @property
    def max_window_start(self) -> int:
        """Last start of Flow-GRPO-Fast's SDE steps that avoids the final step."""
        return self.steps - 1 - self.fast_sde_steps


@dataclass(frozen=True)
class BranchGRPOConfig:
    """BranchGRPO (Fredreic1849/BranchGRPO): one root per prompt, SDE (constant ``eta``, DanceGRPO's
    step) at every step but the last, a binary split at ``splits`` evenly spaced steps
    ``0, T // splits, 2 T // splits, ...`` (its ``tree_split_rounds``), split steps drawing their
    noise ``split_noise_scale`` times larger; every edge trained. Pruning is off in its published
    script and not modelled. ``noise_pool`` as in :class:`TreeConfig`."""

    steps: int = 20
    splits: int = 4
    branching: int = 2
    eta: float = 0.3
    split_noise_scale: float = 4.0
    sde_kind: SdeKind = "dance"
    noise_pool: int = 1

    @property
    def split_steps(self) -> tuple[int, ...]:
        """The steps that branch: ``i * (T // splits)`` for ``i < splits``."""
        interval = self.steps // self.splits if self.splits else 0
        return tuple(i * interval for i in range(self.splits))


StrategyConfig = (TreeConfig | MixGRPOConfig | DanceGRPOConfig | FlowGRPOConfig
                  | BranchGRPOConfig)


def strategy_name(config: StrategyConfig) -> str:
    """The public name of a config's strategy."""
    if isinstance(config, TreeConfig):
        return "dynamic_treerpo"
    if isinstance(config, MixGRPOConfig):
        return "mixgrpo_flash" if config.flash else "mixgrpo"
    if isinstance(config, FlowGRPOConfig):
        return "flow_grpo_fast" if config.fast else "flow_grpo"
    if isinstance(config, BranchGRPOConfig):
        return "branchgrpo"
    return "dancegrpo"


# ------------------------------------------------------------------------------ helpers
def _check_grid(sigmas: Tensor, steps: int) -> list[float]:
    values = [float(s) for s in sigmas]
    if len(values) != steps + 1:
        raise ValueError(f"sigma grid has {len(values)} values; steps={steps} needs {steps + 1}")
    return values


def _check_window(start: int, max_start: int, what: str) -> None:
    if not 0 <= start <= max_start:
        raise ValueError(f"window_start={start} out of range for {what}: must be in [0, {max_start}]")


def tree_noise_levels(config: TreeConfig) -> list[float]:
    """Depth-wise noise ``a_k`` for ``k = 0 .. d-1``: linear growth, clamped to ``noise_max``."""
    d = config.depth
    return [min(config.noise_level * (1.0 + config.noise_growth * (k / (d - 1) if d > 1 else 0.0)),
                config.noise_max) for k in range(d)]


def compressed_tail_steps(remaining: int, compression: float) -> int:
    """Steps of a compressed tail: ``max(1, round(c * remaining))``."""
    if not 0.0 < compression <= 1.0:
        raise ValueError(f"tail_compression must be in (0, 1], got {compression}")
    return max(1, round(compression * remaining)) if remaining > 0 else 0


def _tail_ops(sigmas: list[float], start: int, solver: Tail, compression: float) -> list[StepOp]:
    """Deterministic steps from ``sigmas[start]`` to 0, Euler on the grid or a compressed 2M."""
    steps = len(sigmas) - 1
    if solver == "euler":
        return [StepOp(sigmas[i], sigmas[i + 1]) for i in range(start, steps)]
    if solver != "dpm2m":
        raise ValueError(f"unknown tail solver {solver!r}; expected 'euler' or 'dpm2m'")
    n = compressed_tail_steps(steps - start, compression)
    # resample the remaining grid at n + 1 evenly spaced fractional indices (keeps its shape)
    positions = np.linspace(start, steps, n + 1)
    grid = np.interp(positions, np.arange(steps + 1), np.asarray(sigmas, dtype=np.float64))
    grid[-1] = 0.0
    return [StepOp(float(grid[i]), float(grid[i + 1]), "dpm2m") for i in range(n)]


# ------------------------------------------------------------------------------ plans
def tree_plan(config: TreeConfig, sigmas: Tensor, window_start: int | None = None,
              log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """Trunk ODE to ``l``, ``d`` branching SDE layers, then the tail, for ``M`` trees."""
    grid = _check_grid(sigmas, config.steps)
    if config.depth < 1 or config.branching < 1 or config.trees_per_prompt < 1:
        raise ValueError("depth, branching and trees_per_prompt must be >= 1")
    start = config.window_start if window_start is None else window_start
    _check_window(start, config.max_window_start, f"steps={config.steps}, depth={config.depth}")
    ops = [StepOp(grid[i], grid[i + 1]) for i in range(start)]
    for k, level in enumerate(tree_noise_levels(config)):
        i = start + k
        ops.append(StepOp(grid[i], grid[i + 1], "sde", config.branching, level, train=True))
    ops += _tail_ops(grid, start + config.depth, config.tail, config.tail_compression)
    return RolloutPlan("dynamic_treerpo", tuple(ops), config.trees_per_prompt,
                       shared_root_noise=False, antithetic=config.antithetic,
                       sde_kind=config.sde_kind,
                       window_start=start, log_prob_reduction=log_prob_reduction,
                       noise=NoiseSubspace(config.noise_pool))


def mixgrpo_plan(config: MixGRPOConfig, sigmas: Tensor, window_start: int | None = None,
                 log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """ODE trunk, an SDE window of ``window_size`` trained steps, an ODE (or 2M) tail."""
    grid = _check_grid(sigmas, config.steps)
    start = config.window_start if window_start is None else window_start
    _check_window(start, config.max_window_start,
                  f"steps={config.steps}, window_size={config.window_size}")
    g = config.group_size
    ops = [StepOp(grid[i], grid[i + 1]) for i in range(start)]
    for k in range(config.window_size):
        i = start + k
        branch = g if (config.share_trunk and k == 0) else 1
        ops.append(StepOp(grid[i], grid[i + 1], "sde", branch, config.noise_level, train=True))
    tail: Tail = "dpm2m" if config.flash else "euler"
    ops += _tail_ops(grid, start + config.window_size, tail, config.tail_compression)
    return RolloutPlan(strategy_name(config), tuple(ops), 1 if config.share_trunk else g,
                       shared_root_noise=True, sde_kind=config.sde_kind, window_start=start,
                       log_prob_reduction=log_prob_reduction,
                       noise=NoiseSubspace(config.noise_pool))


def dancegrpo_train_count(config: DanceGRPOConfig) -> int:
    """Trained steps of each trajectory: ``floor(f (T - 1))``."""
    return math.floor(config.train_fraction * (config.steps - 1))


def dancegrpo_plan(config: DanceGRPOConfig, sigmas: Tensor,
                   log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """SDE with constant noise at steps ``0 .. T-2``, a deterministic last step. Every SDE step is
    marked trained; ``trained_per_row`` makes the trainer keep a random ``floor(f (T - 1))`` of them
    for each trajectory, drawn per trajectory as DanceGRPO's code does."""
    grid = _check_grid(sigmas, config.steps)
    if config.steps < 2:
        raise ValueError("DanceGRPO needs steps >= 2 (the last step is deterministic)")
    if not 0.0 < config.train_fraction <= 1.0:
        raise ValueError(f"dancegrpo.train_fraction must be in (0, 1], got {config.train_fraction}")
    ops = [StepOp(grid[i], grid[i + 1], "sde", 1, config.eta, train=True)
           for i in range(config.steps - 1)]
    ops.append(StepOp(grid[-2], grid[-1]))
    return RolloutPlan("dancegrpo", tuple(ops), config.group_size,
                       shared_root_noise=config.share_initial_noise, sde_kind=config.sde_kind,
                       window_start=0, log_prob_reduction=log_prob_reduction,
                       noise=NoiseSubspace(config.noise_pool),
                       trained_per_row=max(1, dancegrpo_train_count(config)))


def flow_grpo_plan(config: FlowGRPOConfig, sigmas: Tensor, seed: int = 0,
                   log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """Flow-GRPO: SDE and trained at steps ``0 .. T-2``, a deterministic last step, independent
    initial noise per image. Fast: SDE (trained) only at ``fast_sde_steps`` steps from a start drawn
    from ``seed``, ODE elsewhere."""
    grid = _check_grid(sigmas, config.steps)
    if config.steps < 2:
        raise ValueError("Flow-GRPO needs steps >= 2 (the last step is deterministic)")
    if config.fast:
        if not 1 <= config.fast_sde_steps <= config.steps - 1:
            raise ValueError(f"flow_grpo.fast_sde_steps must be in [1, {config.steps - 1}], "
                             f"got {config.fast_sde_steps}")
        start = random.Random(seed).randint(0, config.max_window_start)
        sde = range(start, start + config.fast_sde_steps)
    else:
        start, sde = 0, range(config.steps - 1)
    ops = [StepOp(grid[i], grid[i + 1], "sde", 1, config.noise_level, train=True) if i in sde
           else StepOp(grid[i], grid[i + 1]) for i in range(config.steps)]
    return RolloutPlan(strategy_name(config), tuple(ops), config.group_size,
                       shared_root_noise=False, sde_kind=config.sde_kind, window_start=start,
                       log_prob_reduction=log_prob_reduction, noise=NoiseSubspace(config.noise_pool))


def branchgrpo_plan(config: BranchGRPOConfig, sigmas: Tensor,
                    log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """BranchGRPO: one root, SDE and trained at steps ``0 .. T-2`` (branching at the split steps,
    with the split noise scale on their noise level), a deterministic last step."""
    grid = _check_grid(sigmas, config.steps)
    if config.splits < 1 or config.branching < 2:
        raise ValueError("branchgrpo.splits must be >= 1 and branchgrpo.branching >= 2")
    if config.steps // config.splits < 1 or config.split_steps[-1] > config.steps - 2:
        raise ValueError(f"branchgrpo: {config.splits} splits do not fit before the last of "
                         f"{config.steps} steps")
    splits = set(config.split_steps)
    ops = [StepOp(grid[i], grid[i + 1], "sde", config.branching if i in splits else 1,
                  config.eta * (config.split_noise_scale if i in splits else 1.0), train=True)
           for i in range(config.steps - 1)]
    ops.append(StepOp(grid[-2], grid[-1]))
    return RolloutPlan("branchgrpo", tuple(ops), 1, shared_root_noise=True, sde_kind=config.sde_kind,
                       window_start=0, log_prob_reduction=log_prob_reduction,
                       noise=NoiseSubspace(config.noise_pool))


def build_plan(config: StrategyConfig, sigmas: Tensor, window_start: int | None = None,
               seed: int = 0, log_prob_reduction: Literal["mean", "sum"] = "mean",
               noise_unshuffle: int = 1) -> RolloutPlan:
    """Dispatch to the plan of ``config``'s strategy (``seed`` draws Flow-GRPO-Fast's SDE steps).
    ``noise_unshuffle``: the policy's
    ``latent_unshuffle`` (pixel-space latents), so that pooled noise pools image pixels."""
    if isinstance(config, TreeConfig):
        plan = tree_plan(config, sigmas, window_start, log_prob_reduction)
    elif isinstance(config, MixGRPOConfig):
        plan = mixgrpo_plan(config, sigmas, window_start, log_prob_reduction)
    elif isinstance(config, DanceGRPOConfig):
        plan = dancegrpo_plan(config, sigmas, log_prob_reduction)
    elif isinstance(config, FlowGRPOConfig):
        plan = flow_grpo_plan(config, sigmas, seed, log_prob_reduction)
    elif isinstance(config, BranchGRPOConfig):
        plan = branchgrpo_plan(config, sigmas, log_prob_reduction)
    else:
        raise TypeError(f"not a strategy config: {type(config).__name__}")
    if noise_unshuffle == plan.noise.unshuffle:
        return plan
    return replace(plan, noise=replace(plan.noise, unshuffle=noise_unshuffle))


# ------------------------------------------------------------------------------ window
def window_start(iteration: int, schedule: WindowSchedule, start: int, max_start: int,
                 every: int = 25, stride: int = 1, roll_back: bool = True, seed: int = 0) -> int:
    """Where the SDE window starts at ``iteration`` (MixGRPO's sliding window).

    ``progressive``: ``min(start + floor(iteration / every) * stride, max_start)``, or with
    ``roll_back`` cycling back to ``start`` once past ``max_start``; ``random``: uniform in
    ``[start, max_start]`` (seeded by ``seed`` and ``iteration``); ``fixed``: ``start``.
    """
    if not 0 <= start <= max_start:
        raise ValueError(f"window start {start} out of range [0, {max_start}]")
    if every < 1 or stride < 1:
        raise ValueError("window 'every' and 'stride' must be >= 1")
    if schedule == "fixed":
        return start
    if schedule == "random":
        return random.Random(seed * 1_000_003 + iteration).randint(start, max_start)
    if schedule != "progressive":
        raise ValueError(f"unknown window schedule {schedule!r}; expected progressive, random, fixed")
    moves = iteration // every
    if roll_back:
        positions = (max_start - start) // stride + 1
        return start + (moves % positions) * stride
    return min(start + moves * stride, max_start)


# ------------------------------------------------------------------------------ closed forms
@dataclass(frozen=True)
class ComputeCount:
    """Forwards of one iteration for one prompt, in closed form (docs/algorithm.md, "Compute accounting")."""

    rollout_nfe: int
    train_nfe: int
    train_edges: int
    scored_images: int


def closed_form(config: StrategyConfig, window_start: int | None = None) -> ComputeCount:
    """Rollout and training forwards per prompt, from the formulas, not from the sampler.

    Training forwards count one evaluation per trained parent state: siblings share it, since
    ``log pi(child | parent)`` needs only ``v(parent)``.
    """
    if isinstance(config, TreeConfig):
        m, b, d, t = config.trees_per_prompt, config.branching, config.depth, config.steps
        l_ = config.window_start if window_start is None else window_start
        n = b**d
        internal = d if b == 1 else (n - 1) // (b - 1)
        remaining = t - l_ - d
        tail = (compressed_tail_steps(remaining, config.tail_compression)
                if config.tail == "dpm2m" else remaining)
        return ComputeCount(m * (l_ + internal + n * tail), m * internal, m * b * internal, m * n)
    if isinstance(config, MixGRPOConfig):
        g, w, t = config.group_size, config.window_size, config.steps
        l_ = config.window_start if window_start is None else window_start
        remaining = t - l_ - w
        tail = (compressed_tail_steps(remaining, config.tail_compression)
                if config.flash else remaining)
        trunk = l_ if config.share_trunk else g * l_
        first = 1 if config.share_trunk else g
        return ComputeCount(trunk + first + g * (w - 1) + g * tail, first + g * (w - 1),
                            g * w, g)
    if isinstance(config, FlowGRPOConfig):
        g, t = config.group_size, config.steps
        trained = config.fast_sde_steps if config.fast else t - 1
        return ComputeCount(g * t, g * trained, g * trained, g)
    if isinstance(config, BranchGRPOConfig):
        splits, nodes, rollout_nfe, edges = set(config.split_steps), 1, 0, 0
        for i in range(config.steps - 1):
            rollout_nfe += nodes
            nodes *= config.branching if i in splits else 1
            edges += nodes
        return ComputeCount(rollout_nfe + nodes, rollout_nfe, edges, nodes)
    g, t = config.group_size, config.steps
    trained = max(1, dancegrpo_train_count(config))
    return ComputeCount(g * t, g * trained, g * trained, g)
