"""Strategies as rollout plans: Dynamic-TreeRPO, MixGRPO (+ trunk sharing, + Flash), DanceGRPO,
Flow-GRPO (+ Fast), BranchGRPO, DiffusionNFT, AWM and DGPO.

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

from .awm import AWMConfig
from .dgpo import DGPOConfig
from .flow import NoiseSubspace, SdeKind
from .tree import RolloutPlan, StepOp

Tail = Literal["euler", "dpm2m"]
WindowSchedule = Literal["progressive", "random", "fixed"]
Strategy = Literal["dynamic_treerpo", "mixgrpo", "mixgrpo_flash", "dancegrpo", "flow_grpo",
                   "flow_grpo_fast", "branchgrpo", "diffusionnft", "awm", "dgpo"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)  # the one list: config, nodes and benchmarks read it


@dataclass(frozen=True)
class TreeConfig:
    """Dynamic-TreeRPO sampling (docs/algorithm.md, "Tree rollout").

    ``window_start`` l, ``depth`` d (paper: 4), ``branching`` b (paper: 2), ``trees_per_prompt``
    M; noise level of layer k is ``min(noise_level * (1 + noise_growth * k / (d - 1)), noise_max)``
    (linear in depth [paper], clamped [choice]). ``tail``: Euler, or DPM-Solver++(2M) with
    ``max(1, round(tail_compression * remaining))`` steps (MixGRPO-Flash style).
    ``antithetic``: siblings draw mirrored noise ``(eps, -eps)`` [choice] (see ``solvers.branch_noise``).
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
    ``noise_pool`` as in :class:`TreeConfig`. The defaults are the anchor's 4-step window of 25 steps
    (Tencent-Hunyuan/MixGRPO@e5cdd6a ``scripts/finetune/finetune_flux_grpo_MixGRPO.sh`` 54 and 58);
    the benchmark's 10 steps take a window of the tree's depth, 3 (docs/algorithm.md, "Baselines").
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
    ``timestep_fraction`` 0.99 of 10 steps). ``fast`` (Flow-GRPO-Fast, its ``geneval_sd3_fast_nocfg``
    config at 9745241, ``config/grpo.py`` 185-191): ODE everywhere but ``fast_sde_steps`` (3)
    consecutive SDE steps of its own form and noise (``fast_sde_kind`` cps at ``fast_noise_level``
    0.8, with the cps step's unnormalised log-probability), only those trained, their start drawn
    each iteration from ``[0, T // 2 - fast_sde_steps]`` (its window range ``(0, num_steps // 2)``,
    ``sd3_pipeline_with_logprob_fast.py`` 136-139; at our ``T = 10``, SD3's own, the same
    ``[0, 2]``). The anchor draws the start per sampling call (9 images of a GPU); here one plan
    serves a rollout, so one start serves the iteration's images (docs/algorithm.md, "Baselines").
    ``noise_pool`` as in :class:`TreeConfig`."""

    steps: int = 10
    group_size: int = 12
    noise_level: float = 0.7
    sde_kind: SdeKind = "flow_grpo"
    fast: bool = False
    fast_sde_steps: int = 3
    fast_noise_level: float = 0.8
    fast_sde_kind: SdeKind = "cps"
    noise_pool: int = 1

    @property
    def max_window_start(self) -> int:
        """Last start of Flow-GRPO-Fast's SDE steps: the window lies in the first half of the steps."""
        return max(0, self.steps // 2 - self.fast_sde_steps)


@dataclass(frozen=True)
class BranchGRPOConfig:
    """BranchGRPO (Fredreic1849/BranchGRPO@19fbb9f): one root per prompt, SDE (constant ``eta``,
    DanceGRPO's step) at every step but the last, a split into ``branching`` children at ``splits``
    steps spaced ``split_spacing`` of the steps apart (its script's ``0,3,6,9`` of 20: the first 45%;
    ``scripts/finetune/finetune_flux_branchgrpo_8gpus.sh`` 28), split steps drawing their noise
    ``split_noise_scale`` times larger while the drift and the density keep ``eta``
    (``train_branchgrpo_flux.py`` 271-279); every edge trained. Pruning is off in its published script
    and not modelled. ``noise_pool`` as in :class:`TreeConfig`."""

    steps: int = 20
    splits: int = 4
    branching: int = 2
    eta: float = 0.3
    split_noise_scale: float = 4.0
    split_spacing: float = 0.15
    sde_kind: SdeKind = "dance"
    noise_pool: int = 1

    @property
    def split_steps(self) -> tuple[int, ...]:
        """The steps that branch: ``round(i * split_spacing * T)`` for ``i < splits`` (0, 3, 6, 9 of
        20 steps; 0, 2, 3 of 10)."""
        return tuple(sorted({round(i * self.split_spacing * self.steps) for i in range(self.splits)}))


@dataclass(frozen=True)
class DiffusionNFTConfig:
    """DiffusionNFT (NVlabs/DiffusionNFT@24af555): ``group_size`` images per prompt from independent
    noise, sampled by the old policy with the deterministic DPM-Solver++(2M) at every step (no SDE, no
    CFG: ``config/nft.py`` 64-66); the model then trains on those clean images with
    :func:`~.nft.nft_loss` at ``train_fraction`` of the sampler's own noise levels, drawn per image.
    ``beta`` (1.0), ``adv_clip`` (5), ``kl_beta`` (1e-4, to the LoRA-free model) and the old policy's
    ``decay_schedule`` (1: ``min(0.001 step, 0.5)``) are its defaults (``config/nft.py`` 61,
    ``config/base.py`` 84 and 89, ``train_nft_sd3.py`` 169-189)."""

    steps: int = 10
    group_size: int = 24
    beta: float = 1.0
    train_fraction: float = 0.99
    adv_clip: float = 5.0
    kl_beta: float = 1e-4
    decay_schedule: int = 1

    def __post_init__(self) -> None:
        if self.steps < 2 or self.group_size < 2:
            raise ValueError("diffusionnft.steps and diffusionnft.group_size must be >= 2")
        if self.beta <= 0 or not 0.0 < self.train_fraction <= 1.0:
            raise ValueError("diffusionnft.beta must be > 0 and train_fraction in (0, 1]")


StrategyConfig = (TreeConfig | MixGRPOConfig | DanceGRPOConfig | FlowGRPOConfig
                  | BranchGRPOConfig | DiffusionNFTConfig | AWMConfig | DGPOConfig)


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
    if isinstance(config, DiffusionNFTConfig):
        return "diffusionnft"
    if isinstance(config, AWMConfig):
        return "awm"
    if isinstance(config, DGPOConfig):
        return "dgpo"
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
    """Steps of a compressed tail after ``remaining`` Euler steps would have been left, as MixGRPO-Flash
    counts them: ``int(max((remaining + 1) c, 1))`` grid points from the step after the last SDE step
    to 0 (``T - l_last = remaining + 1``), so one step fewer, at least one
    (Tencent-Hunyuan/MixGRPO@e5cdd6a ``fastvideo/utils/sampling_utils.py`` 37-54)."""
    if not 0.0 < compression <= 1.0:
        raise ValueError(f"tail_compression must be in (0, 1], got {compression}")
    if remaining <= 0:
        return 0
    points = int(max((remaining + 1) * compression, 1.0))
    return max(1, points - 1)


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
    initial noise per image. Fast: SDE (trained) only at ``fast_sde_steps`` steps of its own form and
    noise, from a start drawn from ``seed`` (one per iteration: the plan is the rollout's) in the first
    half of the steps, ODE elsewhere."""
    grid = _check_grid(sigmas, config.steps)
    if config.steps < 2:
        raise ValueError("Flow-GRPO needs steps >= 2 (the last step is deterministic)")
    kind, level, form = config.sde_kind, config.noise_level, "gaussian"
    if config.fast:
        if not 1 <= config.fast_sde_steps <= config.steps - 1:
            raise ValueError(f"flow_grpo.fast_sde_steps must be in [1, {config.steps - 1}], "
                             f"got {config.fast_sde_steps}")
        start = random.Random(seed).randint(0, config.max_window_start)
        sde = range(start, min(start + config.fast_sde_steps, config.steps - 1))
        kind, level = config.fast_sde_kind, config.fast_noise_level
        form = "unnormalised" if kind == "cps" else "gaussian"
    else:
        start, sde = 0, range(config.steps - 1)
    ops = [StepOp(grid[i], grid[i + 1], "sde", 1, level, train=True) if i in sde
           else StepOp(grid[i], grid[i + 1]) for i in range(config.steps)]
    return RolloutPlan(strategy_name(config), tuple(ops), config.group_size,
                       shared_root_noise=False, sde_kind=kind, window_start=start,
                       log_prob_reduction=log_prob_reduction, log_prob_form=form,
                       noise=NoiseSubspace(config.noise_pool))


def branchgrpo_plan(config: BranchGRPOConfig, sigmas: Tensor,
                    log_prob_reduction: Literal["mean", "sum"] = "mean") -> RolloutPlan:
    """BranchGRPO: one root, SDE and trained at steps ``0 .. T-2`` (branching at the split steps, whose
    drawn noise is ``split_noise_scale`` times larger), a deterministic last step."""
    grid = _check_grid(sigmas, config.steps)
    if config.splits < 1 or config.branching < 2:
        raise ValueError("branchgrpo.splits must be >= 1 and branchgrpo.branching >= 2")
    if not 0.0 < config.split_spacing <= 1.0:
        raise ValueError(f"branchgrpo.split_spacing must be in (0, 1], got {config.split_spacing}")
    splits = set(config.split_steps)
    if len(splits) < config.splits or max(splits) > config.steps - 2:
        raise ValueError(f"branchgrpo: {config.splits} splits {config.split_spacing:g} of the steps apart "
                         f"do not fit before the last of {config.steps} steps")
    ops = [StepOp(grid[i], grid[i + 1], "sde", config.branching if i in splits else 1, config.eta,
                  train=True, noise_scale=config.split_noise_scale if i in splits else 1.0)
           for i in range(config.steps - 1)]
    ops.append(StepOp(grid[-2], grid[-1]))
    return RolloutPlan("branchgrpo", tuple(ops), 1, shared_root_noise=True, sde_kind=config.sde_kind,
                       window_start=0, log_prob_reduction=log_prob_reduction,
                       noise=NoiseSubspace(config.noise_pool))


def diffusionnft_plan(config: DiffusionNFTConfig, sigmas: Tensor) -> RolloutPlan:
    """DiffusionNFT's sampler: DPM-Solver++(2M) on every step of the grid (the first and the last
    first order), ``group_size`` roots per prompt from independent noise; no SDE step, so the tree has
    no edges: the objective trains on the leaves alone."""
    grid = _check_grid(sigmas, config.steps)
    ops = [StepOp(grid[i], grid[i + 1], "dpm2m") for i in range(config.steps)]
    return RolloutPlan("diffusionnft", tuple(ops), config.group_size, shared_root_noise=False,
                       sde_kind="flow_grpo", window_start=0)


def awm_plan(config: AWMConfig, sigmas: Tensor) -> RolloutPlan:
    """AWM's sampler on this grid: an SDE step of ``noise_level`` where ``noise_low <= sigma <=
    noise_high`` and DPM-Solver++(2M) elsewhere, ``group_size`` roots per prompt from independent
    noise. Its SDE steps are not trained (the loss reads only the clean images), so the tree has
    edges but no trained one. The anchor's sampler is SA-Solver (predictor-corrector, order 2, with
    that noise window); this trainer has no SA-Solver, so the window's steps take the Flow-GRPO SDE
    and the others the 2nd-order multistep solver (docs/algorithm.md, "Baselines")."""
    grid = _check_grid(sigmas, config.steps)
    ops = []
    for i in range(config.steps):
        noisy = (config.noise_level > 0 and grid[i + 1] > 0
                 and config.noise_low <= grid[i] <= config.noise_high)
        ops.append(StepOp(grid[i], grid[i + 1], "sde", 1, config.noise_level) if noisy
                   else StepOp(grid[i], grid[i + 1], "dpm2m"))
    return RolloutPlan("awm", tuple(ops), config.group_size, shared_root_noise=False,
                       sde_kind="flow_grpo", window_start=0)


def dgpo_plan(config: DGPOConfig, sigmas: Tensor) -> RolloutPlan:
    """DGPO's sampler: DPM-Solver++(2M) on every step (no SDE), ``group_size`` roots per prompt from
    independent noise (its ``same_latent`` False, D:79)."""
    grid = _check_grid(sigmas, config.steps)
    ops = [StepOp(grid[i], grid[i + 1], "dpm2m") for i in range(config.steps)]
    return RolloutPlan("dgpo", tuple(ops), config.group_size, shared_root_noise=False,
                       sde_kind="flow_grpo", window_start=0)


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
    elif isinstance(config, DiffusionNFTConfig):
        plan = diffusionnft_plan(config, sigmas)
    elif isinstance(config, AWMConfig):
        plan = awm_plan(config, sigmas)
    elif isinstance(config, DGPOConfig):
        plan = dgpo_plan(config, sigmas)
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
    if isinstance(config, DiffusionNFTConfig):  # training: old, trained and reference velocity per step
        g, t = config.group_size, config.steps
        trained = max(1, int(t * config.train_fraction))
        forwards = (3 if config.kl_beta > 0 else 2) * g * trained
        return ComputeCount(g * t, forwards, 0, g)
    if isinstance(config, AWMConfig):  # training: trained, reference and slow-copy velocity per row
        g = config.group_size
        kl = config.kl_beta > 0  # the slow copy's term is added only with the KL (train_sd3_awm.py:1336-1350)
        forwards = (1 + kl + (kl and config.slow_kl_beta > 0)) * g * config.train_timesteps
        return ComputeCount(g * config.steps, forwards, 0, g)
    if isinstance(config, DGPOConfig):  # training: trained, reference and slow-copy velocity per row
        g = config.group_size
        return ComputeCount(g * config.steps, 3 * g * config.train_timesteps, 0, g)
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
