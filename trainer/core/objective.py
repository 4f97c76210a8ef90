"""From a rollout and its rewards to gradients: targets once per tree, loss per micro-batch.

``prepare_targets`` turns rewards into per-edge advantages, clip bounds and loss weights, and
per-forward LayerTuning targets. The weights are global normalisers, so the loss of a micro-batch
of forwards is its exact share of the full loss: summing micro-batch gradients equals the full
gradient, and memory depends on the micro-batch size, not on the number of leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from .advantages import (
    AdvantageBaseline,
    AdvantageMode,
    AdvantageScale,
    MixRule,
    NodeValue,
    Reduce,
    RewardMixRule,
    StdScope,
    best_leaf_index,
    combine_rewards,
    edge_advantages,
    group_stats,
    node_values,
    reward_mix_rule,
)
from .cond import Cond, select_rows
from .flow import Gaussian, gaussian_kl_same_std, gaussian_log_prob, score_scale, sde_transition
from .losses import (
    ClipConfig,
    clip_bounds,
    grpo_edge_loss,
    layer_weight,
    layer_weight_tanh,
    path_target,
    renoised,
    velocity_mse,
    x0_target,
)
from .tree import Tree, VelocityFn

PrmTarget = Literal["x0", "path", "renoise"]
"""``x0``: every node of a layer regresses toward the best leaf's clean latent; ``path``: the
best node toward the step its path actually took (noise included); ``renoise``: per layer, the
best leaf re-noised afresh at the layer's sigma, with the flow-matching target (an SFT step on the
best sample that keeps the model a denoiser; one extra forward per prompt and layer)."""
StepScale = Literal["none", "score"]
"""``none``: each step's log-density terms as they are (the anchors). ``score``: divided by the
step's score scale ``|d mean / d v| / std`` (``flow.score_scale``), so a unit advantage pulls on the
velocity equally at every step; without it the gradient grows many times over from the first steps
of a 10-step schedule to the middle ones (measured: docs/algorithm.md, "What moved the previous
embedded default"), and a sliding window hands Adam (whose second moment lags by ~1/(1 - beta2)
updates) a step size many times the configured one."""
PrmScale = Literal["logprob", "velocity"]
"""``logprob``: the LayerTuning term in the GRPO term's units, the element-averaged Gaussian
negative log-likelihood (a KL between equal-std Gaussians) of the step the target velocity would
take under the step the model takes. Without it the velocity MSE's gradient dwarfs the policy
gradient's and, with Adam, drowns it (measured: docs/algorithm.md, "Loss"). ``velocity``: the raw MSE
of docs/algorithm.md."""
EdgeWeighting = Literal["layer", "transition"]
"""How the GRPO term averages its edges. ``layer`` (the paper's reading, docs/algorithm.md): a mean over
tree layers of the mean over each layer's edges. ``transition``: every trained (sample, step) edge
weighs the same, as DanceGRPO (15cc71d ``fastvideo/train_grpo_flux.py`` 603) and BranchGRPO
(19fbb9f ``fastvideo/train_branchgrpo_flux.py`` 1575) average their loss."""
KlForm = Literal["step", "flow_grpo"]
"""The KL term to the reference model. ``step``: the KL between the two steps' Gaussians (mean
difference squared over twice the step variance ``g^2 D``). ``flow_grpo``: Flow-GRPO's, over twice
``g^2`` without the step size ``D`` (flow_grpo@ac4c86e ``scripts/train_sd3.py`` 894-897), ``1 / D``
times weaker (7 to 14 times on a 10-step, shift-3 grid)."""
PrmWeight = Literal["sigmoid", "tanh"]
"""How the LayerTuning weight ``w_k`` of a layer is set. ``sigmoid``: ``sigmoid(eta (V(n*) - mean_k) /
std_k)``, the first reading, always >= 0.5 (0.5 on a flat layer); ``tanh``: ``tanh(eta (V(n*) -
mean_k) / s_ref)`` with ``s_ref`` the running std of leaf rewards, ~0 on a flat layer (the corrected
reading of docs/algorithm.md). The protocol measured both (docs/results.md): inconclusive, so the
default stays ``sigmoid``."""


@dataclass(frozen=True)
class LossConfig:
    """Every option of the loss, with the defaults of docs/algorithm.md (sections 3 and 4).

    ``reward_mix``: how a reward mix becomes one value per image (``advantages.MixRule``); ``auto``
    sums the raw rewards with the ``global`` std (Flow-GRPO's and DiffusionNFT's rule) and normalises
    each within its group otherwise (MixGRPO's)."""

    advantage: AdvantageMode = "tree"
    advantage_scale: AdvantageScale = "std"
    advantage_baseline: AdvantageBaseline = "depth"
    advantage_std: StdScope = "group"
    node_value: NodeValue = "max"
    adv_clip: float = 5.0
    clip: ClipConfig = field(default_factory=ClipConfig)
    prm_lambda: float = 0.01
    prm_target: PrmTarget = "x0"
    prm_eta: float = 1.0
    prm_weight: PrmWeight = "sigmoid"
    prm_scale: PrmScale = "logprob"
    kl_beta: float = 0.0
    step_scale: StepScale = "none"
    edge_weighting: EdgeWeighting = "layer"
    kl_form: KlForm = "step"
    std_ddof: int = 0
    std_eps: float = 1e-8
    flat_std: float = 0.0
    reward_mix: RewardMixRule = "auto"

    def __post_init__(self) -> None:
        reward_mix_rule(self.reward_mix, self.advantage_std)  # an unknown rule fails here
        if self.std_ddof not in (0, 1):
            raise ValueError(f"loss.std_ddof must be 0 (population std) or 1 (sample std), "
                             f"got {self.std_ddof}")
        if self.std_eps <= 0 or self.flat_std < 0:
            raise ValueError("loss.std_eps must be > 0 and loss.flat_std >= 0")

    @property
    def mix_rule(self) -> MixRule:
        """The reward-mix rule in force (``auto`` resolved by ``advantage_std``)."""
        return reward_mix_rule(self.reward_mix, self.advantage_std)


@dataclass
class TrainTargets:
    """What the loss needs besides the model: all detached, computed once per rollout."""

    leaf_value: Tensor  # [L]
    node_value: Tensor  # [nodes]
    edge_advantage: Tensor  # [E]
    edge_weight: Tensor  # [E], 0 for untrained edges
    edge_low: Tensor  # [E]
    edge_high: Tensor  # [E]
    fwd_prm_weight: Tensor  # [F], 0 where no LayerTuning term
    fwd_path_edge: Tensor  # [F] long, the best child's edge for best nodes, else -1
    best_x0: Tensor  # [P, *latent]
    layer_weight: Tensor  # [F] the layer weight w_k of each forward's (prompt, layer)
    train_forwards: Tensor  # ids of forwards with trained edges
    fwd_scale: Tensor  # [F] factor on every log-density term of the forward's step (step_scale)
    renoise: Tensor | None = None  # [F, *latent] fresh noise of ``renoise`` rows (best forwards)


def layer_groups(tree: Tree, forwards: Tensor) -> Tensor:
    """The (prompt, tree layer) group of each of ``forwards``, as one integer."""
    steps = len(tree.plan.ops)
    return tree.fwd_prompt[forwards] * steps + tree.fwd_step[forwards]


def edge_weights(tree: Tree, weighting: EdgeWeighting = "layer") -> Tensor:
    """Per trained edge: ``1 / (layers * edges in the layer)`` (a mean over layers of edge means) or,
    ``transition``, ``1 / trained edges`` (every edge alike); 0 for untrained edges."""
    weight = torch.zeros(tree.edge_train.shape)
    trained = tree.edge_train.nonzero().flatten()
    if trained.numel() == 0:
        return weight
    if weighting == "transition":
        weight[trained] = 1.0 / trained.numel()
        return weight
    if weighting != "layer":
        raise ValueError(f"unknown edge_weighting {weighting!r}; expected 'layer' or 'transition'")
    steps = tree.edge_step[trained]
    layers, per_layer = torch.unique(steps, return_counts=True)
    count = dict(zip(layers.tolist(), per_layer.tolist(), strict=True))
    weight[trained] = torch.tensor([1.0 / (len(layers) * count[s]) for s in steps.tolist()])
    return weight


def step_factors(tree: Tree, mode: StepScale) -> Tensor:
    """Per forward, the factor on its step's log-density terms (see ``StepScale``)."""
    if mode == "none":
        return torch.ones(tree.fwd_node.numel())
    if mode == "score":
        scale = score_scale(tree.plan.sde_kind, tree.fwd_sigma.cpu(), tree.fwd_sigma_next.cpu(),
                            tree.fwd_noise_level.cpu())
        return torch.where(scale > 0, 1.0 / scale.clamp(min=1e-12), torch.zeros_like(scale))
    raise ValueError(f"unknown step_scale {mode!r}; expected 'none' or 'score'")


def prepare_targets(tree: Tree, rewards: Tensor, config: LossConfig,
                    reward_weights: Tensor | None = None, seed: int = 0,
                    reduce: Reduce | None = None, first_prompt: int = 0,
                    reward_scale: float = 0.0) -> TrainTargets:
    """Advantages, clip bounds, loss weights and LayerTuning targets for one rollout.

    ``rewards``: ``[L]`` or ``[L, K]`` per leaf, in ``tree.leaf_node`` order (prompt-major); several
    columns are combined by ``config.mix_rule`` with ``reward_weights``.
    ``seed`` draws the fresh noise of the ``renoise`` target, per prompt (``first_prompt``: the
    index of this tree's first prompt in the whole batch). ``reduce`` sums over the ranks of a
    data-parallel run (the ``batch`` advantage std). ``reward_scale``: ``s_ref`` of the ``tanh``
    LayerTuning weight (:class:`~.running_scales.RewardScale`).
    """
    rewards = rewards.detach().float().cpu()
    leaf_prompt = tree.node_prompt[tree.leaf_node]
    leaf_value = combine_rewards(rewards, leaf_prompt, reward_weights, config.mix_rule)
    values = node_values(tree, leaf_value, config.node_value)
    adv = edge_advantages(tree, leaf_value, config.advantage, config.node_value, config.adv_clip,
                          config.advantage_scale, config.advantage_baseline, config.advantage_std, reduce,
                          ddof=config.std_ddof, eps=config.std_eps, flat_below=config.flat_std)
    low, high = clip_bounds(adv, config.clip)

    forwards = tree.trained_forwards
    num_fwd = tree.fwd_node.numel()
    prm_weight = torch.zeros(num_fwd)
    layer_w = torch.zeros(num_fwd)
    path_edge = torch.full((num_fwd,), -1, dtype=torch.long)
    best_pos = best_leaf_index(tree, leaf_value)
    best = tree.leaf_node[best_pos]
    best_x0 = tree.leaf_latents[best_pos.to(tree.leaf_latents.device)]
    if forwards.numel():
        groups = layer_groups(tree, forwards)
        fwd_values = values[tree.fwd_node[forwards]]
        mean, std = group_stats(fwd_values, groups)
        depth = tree.fwd_depth[forwards]
        prompt = tree.fwd_prompt[forwards]
        best_node = tree.ancestor_at_depth(best[prompt], depth)
        is_best = tree.fwd_node[forwards] == best_node
        # w_k uses the best node's value against its layer: broadcast it to the whole layer
        best_value = torch.zeros(int(groups.max()) + 1)
        best_value[groups[is_best]] = fwd_values[is_best]
        if config.prm_weight == "tanh":
            w = layer_weight_tanh(best_value[groups], mean, reward_scale, config.prm_eta)
        else:
            w = layer_weight(best_value[groups], mean, std, config.prm_eta)
        layer_w[forwards] = w
        if config.prm_target == "x0":
            per_layer = torch.bincount(groups)[groups].float()
            prm_weight[forwards] = w / (tree.num_prompts * per_layer)
        elif config.prm_target == "renoise":
            prm_weight[forwards] = torch.where(is_best, w / tree.num_prompts, 0.0)
        elif config.prm_target == "path":
            prm_weight[forwards] = torch.where(is_best, w / tree.num_prompts, 0.0)
            # the best child's edge: the edge out of each best forward toward the best leaf
            on_path = tree.ancestor_at_depth(best[tree.edge_prompt], tree.edge_depth)
            best_fwd = torch.zeros(num_fwd, dtype=torch.bool)
            best_fwd[forwards[is_best]] = True
            edge_ids = ((tree.edge_child == on_path) & best_fwd[tree.edge_forward]).nonzero()
            path_edge[tree.edge_forward[edge_ids.flatten()]] = edge_ids.flatten()
        else:
            raise ValueError(f"unknown prm_target {config.prm_target!r}; "
                             "expected 'x0', 'path' or 'renoise'")
    factor = step_factors(tree, config.step_scale)
    edge_weight = edge_weights(tree, config.edge_weighting) * factor[tree.edge_forward]
    noise = None
    if config.prm_target == "renoise" and config.prm_lambda != 0.0:
        # one generator per prompt (its index in the whole batch): the same noise however the
        # prompts are sharded across ranks
        noise = torch.zeros((num_fwd, *tree.leaf_latents.shape[1:]))
        for p in range(tree.num_prompts):
            rows = (tree.fwd_prompt == p).nonzero().flatten()
            gen = torch.Generator().manual_seed(int(seed) * 100_003 + first_prompt + p)
            noise[rows] = torch.randn((rows.numel(), *noise.shape[1:]), generator=gen)
    return TrainTargets(leaf_value, values, adv, edge_weight, low, high, prm_weight * factor,
                        path_edge, best_x0, layer_w, forwards, factor, noise)


@dataclass
class LossParts:
    """One micro-batch's share of the loss (``total`` carries the gradient) and its statistics."""

    total: Tensor
    grpo: Tensor
    prm: Tensor
    kl: Tensor
    ratio: Tensor  # [edges of the micro-batch], detached
    clipped: Tensor  # [edges of the micro-batch] bool


def microbatch_loss(velocity: VelocityFn, cond: Cond, tree: Tree, targets: TrainTargets,
                    forwards: Tensor, config: LossConfig,
                    reference: VelocityFn | None = None) -> LossParts:
    """Loss share of the trained edges below ``forwards`` (one model call, with grad).

    The LayerTuning term reuses the same forward (no extra model call). ``reference`` (e.g. the
    model with its LoRA disabled) enables the optional KL term when ``kl_beta > 0``.
    """
    x = tree.fwd_x[forwards]
    sigma = tree.fwd_sigma[forwards].to(x.device)
    rows = select_rows(cond, tree.fwd_prompt[forwards])
    v = velocity(x, sigma, rows).float()
    dist = sde_transition(tree.plan.sde_kind, x, v, sigma, tree.fwd_sigma_next[forwards],
                          tree.fwd_noise_level[forwards], tree.plan.noise)

    local = torch.full((tree.fwd_node.numel(),), -1, dtype=torch.long)
    local[forwards] = torch.arange(forwards.numel())
    edges = ((local[tree.edge_forward] >= 0) & tree.edge_train).nonzero().flatten()
    pos = local[tree.edge_forward[edges]].to(x.device)
    edge_dist = dist.rows(pos)
    log_prob = gaussian_log_prob(tree.edge_x_child[edges], edge_dist, tree.plan.log_prob_reduction,
                                 tree.plan.log_prob_form)
    dev = x.device
    parts = grpo_edge_loss(log_prob, tree.edge_log_prob_old[edges].to(dev),
                           targets.edge_advantage[edges].to(dev), targets.edge_low[edges].to(dev),
                           targets.edge_high[edges].to(dev))
    grpo = (parts.loss * targets.edge_weight[edges].to(dev)).sum()

    prm = torch.zeros((), device=dev)
    weights = targets.fwd_prm_weight[forwards].to(dev)
    if config.prm_lambda != 0.0 and bool((weights > 0).any()):
        keep = (weights > 0).cpu()
        if config.prm_target == "renoise":
            prm = _renoise_loss(velocity, tree, targets, forwards[keep], rows, keep, config)
        else:
            if config.prm_target == "x0":
                target = x0_target(x, targets.best_x0[tree.fwd_prompt[forwards]].to(dev), sigma)
            else:
                child_edge = targets.fwd_path_edge[forwards]
                has = child_edge >= 0
                child_x = x.clone()
                child_x[has.to(dev)] = tree.edge_x_child[child_edge[has]]
                target = path_target(x, child_x, sigma - tree.fwd_sigma_next[forwards].to(dev))
            prm = (_step_regression(tree, x, v, dist, target, forwards, config) * weights).sum()

    kl = torch.zeros((), device=dev)
    if config.kl_beta > 0.0:
        if reference is None:
            raise ValueError("kl_beta > 0 needs a reference velocity function")
        with torch.no_grad():
            v_ref = reference(x, sigma, rows).float()
        ref = sde_transition(tree.plan.sde_kind, x, v_ref, sigma, tree.fwd_sigma_next[forwards],
                             tree.fwd_noise_level[forwards], tree.plan.noise)
        share = targets.fwd_scale[forwards].to(dev) / max(1, targets.train_forwards.numel())
        std = dist.std
        if config.kl_form == "flow_grpo":  # g, not g sqrt(D): Flow-GRPO's std_dev_t
            std = std / (sigma - tree.fwd_sigma_next[forwards].to(dev)).clamp(min=1e-12).sqrt()
        kl = (gaussian_kl_same_std(dist.mean, ref.mean, std) * share).sum()

    total = grpo + config.prm_lambda * prm + config.kl_beta * kl
    return LossParts(total, grpo.detach(), prm.detach(), kl.detach(), parts.ratio.detach(),
                     parts.clipped)


def _step_regression(tree: Tree, x: Tensor, v: Tensor, dist: Gaussian, target: Tensor,
                     forwards: Tensor, config: LossConfig) -> Tensor:
    """Per row, how far ``v`` is from ``target``: as the Gaussian NLL of the step the target would
    take under the model's step (``logprob``), or as the raw velocity MSE."""
    if config.prm_scale == "logprob":
        aim = sde_transition(tree.plan.sde_kind, x, target, tree.fwd_sigma[forwards].to(x.device),
                             tree.fwd_sigma_next[forwards], tree.fwd_noise_level[forwards],
                             tree.plan.noise).mean
        return gaussian_kl_same_std(dist.mean, aim.detach(), dist.std)
    return velocity_mse(v, target)


def _renoise_loss(velocity: VelocityFn, tree: Tree, targets: TrainTargets, best: Tensor,
                  rows: Cond, keep: Tensor, config: LossConfig) -> Tensor:
    """The ``renoise`` LayerTuning term of the best forwards ``best`` (one extra model call)."""
    if targets.renoise is None:
        raise ValueError("the renoise target needs prepare_targets with prm_target='renoise'")
    prompt = tree.fwd_prompt[best]
    dev = tree.fwd_x.device
    sigma = tree.fwd_sigma[best].to(dev)
    x, target = renoised(targets.best_x0[prompt].to(dev), targets.renoise[best].to(dev), sigma)
    v = velocity(x, sigma, select_rows(rows, keep.nonzero().flatten().to(dev))).float()
    dist = sde_transition(tree.plan.sde_kind, x, v, sigma, tree.fwd_sigma_next[best],
                          tree.fwd_noise_level[best], tree.plan.noise)
    per_node = _step_regression(tree, x, v, dist, target, best, config)
    return (per_node * targets.fwd_prm_weight[best].to(dev)).sum()


def extra_forwards(targets: TrainTargets, forwards: Tensor, config: LossConfig) -> int:
    """Model rows a micro-batch runs beyond its forwards: the ``renoise`` rows."""
    if config.prm_target != "renoise" or config.prm_lambda == 0.0:
        return 0
    return int((targets.fwd_prm_weight[forwards] > 0).sum())


def forward_batches(tree: Tree, forwards: Tensor, max_batch: int | None) -> list[Tensor]:
    """Micro-batches of forward ids: one per tree layer (step), split by ``max_batch``.

    Grouping by layer reproduces the rollout's batches, so a deterministic model gives bitwise
    the rollout's velocities and a ratio of exactly 1 before the first update.
    """
    batches: list[Tensor] = []
    steps = tree.fwd_step[forwards]
    for step in steps.unique().tolist():
        layer = forwards[steps == step]
        size = layer.numel() if not max_batch else max(1, max_batch)
        batches.extend(torch.split(layer, size))
    return batches


@dataclass
class LossStats:
    """Totals of one pass over a tree, for logging."""

    loss: float
    grpo_loss: float
    prm_loss: float
    kl: float
    clip_frac: float
    ratio_dev_max: float
    train_nfe: int
    train_edges: int
    ratios: Tensor = field(default_factory=lambda: torch.ones(0))


def backward_over_tree(velocity: VelocityFn, cond: Cond, tree: Tree, targets: TrainTargets,
                       config: LossConfig, max_batch: int | None = None,
                       reference: VelocityFn | None = None,
                       on_batch: Callable[[LossParts], None] | None = None,
                       forwards: Tensor | None = None, scale: float = 1.0,
                       grad_sync: Callable[[bool], AbstractContextManager] | None = None) -> LossStats:
    """Accumulate the loss's gradient micro-batch by micro-batch; return its statistics.

    ``forwards`` restricts the pass to a subset of the trained forwards (one of several
    optimizer updates per rollout); ``scale`` multiplies its loss (e.g. by the number of subsets,
    so each update has the magnitude of the full loss). ``grad_sync(last)`` wraps each micro-batch
    (data-parallel runs: gradients are reduced over ranks with the last one only).
    """
    totals = torch.zeros(4)
    ratios, clipped = [], []
    nfe = 0
    chosen = targets.train_forwards if forwards is None else forwards
    batches = forward_batches(tree, chosen, max_batch)
    for i, batch in enumerate(batches):
        with grad_sync(i == len(batches) - 1) if grad_sync is not None else nullcontext():
            parts = microbatch_loss(velocity, cond, tree, targets, batch, config, reference)
            (parts.total * scale).backward()
        nfe += batch.numel() + extra_forwards(targets, batch, config)
        totals += torch.stack([parts.total.detach(), parts.grpo, parts.prm, parts.kl]).cpu()
        ratios.append(parts.ratio.cpu())
        clipped.append(parts.clipped.cpu())
        if on_batch is not None:
            on_batch(parts)
    ratio = torch.cat(ratios) if ratios else torch.ones(0)
    clip = torch.cat(clipped) if clipped else torch.zeros(0, dtype=torch.bool)
    return LossStats(
        loss=float(totals[0]), grpo_loss=float(totals[1]), prm_loss=float(totals[2]),
        kl=float(totals[3]), clip_frac=float(clip.float().mean()) if clip.numel() else 0.0,
        ratio_dev_max=float((ratio - 1).abs().max()) if ratio.numel() else 0.0,
        train_nfe=nfe, train_edges=int(ratio.numel()), ratios=ratio)
