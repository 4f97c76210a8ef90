"""Node values and advantages on a tree (docs/algorithm.md, "Values and advantages"). Pure tensor functions.

Leaf value = reward (several rewards: each normalised within its prompt's group, then a weighted
sum; or, where the recipe's std is the batch's raw spread, the weighted sum of the raw rewards). A
node's value is the max [choice, default] or mean of its descendant leaves; the
advantage of the edge into node ``n`` is ``n``'s value normalised among the nodes of the same
prompt and depth, clipped to ``+-adv_clip``. ``leaf`` mode is plain GRPO on leaves, a shared
edge getting the mean advantage of its leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from .tree import Tree

NodeValue = Literal["max", "mean"]
AdvantageMode = Literal["tree", "leaf"]
AdvantageScale = Literal["std", "none"]
"""``std`` (GRPO): divide by the group's std. ``none`` (Dr. GRPO): centre only, so a group whose
rewards barely differ (late steps of the schedule) gives a small gradient instead of unit-size
advantages made of noise."""
AdvantageBaseline = Literal["depth", "parent"]
"""``depth`` (docs/algorithm.md): a node's value against every node of its prompt and depth. ``parent``:
against its siblings' mean (the value of the state it was sampled from), so differences made by
earlier branchings are not credited to this step; the result is scaled by its spread over the
prompt and depth, as ``depth`` is."""
StdScope = Literal["group", "batch", "global"]
"""Where the advantage's std comes from; the mean is always the (prompt, depth) group's own.
``group`` (the paper): each (prompt, depth) group's own std. ``batch``: the spread of the centred
values of that depth over every prompt of the iteration, on every rank of a data-parallel run (the
within-prompt spread pooled), so a prompt whose images barely differ gets small advantages instead of
unit-size ones. ``global``: the std of the raw values of that depth over the whole batch, the spread
between prompts included, as Flow-GRPO's ``global_std`` computes it (flow_grpo@ac4c86e
``flow_grpo/stat_tracking.py`` 27: ``np.std`` of every gathered reward)."""
MixRule = Literal["normalised", "raw"]
"""How several rewards become one value per image. ``normalised`` (MixGRPO's multi-reward rule): each
reward is standardised within its prompt's group, then weighted, so rewards on different scales weigh
what their weights say. ``raw``: the weighted sum of the raw rewards, as Flow-GRPO and DiffusionNFT
combine theirs (flow_grpo@ac4c86e ``flow_grpo/rewards.py`` 393-400, DiffusionNFT@24af555
``flow_grpo/rewards.py`` 295-302, ``multi_score``'s ``avg``): their ``global`` std is the spread of
that sum over the batch, between prompts included, which per-reward normalisation would remove."""
RewardMixRule = Literal["auto", "normalised", "raw"]
"""``auto``: ``raw`` with the ``global`` advantage std (the rule of the recipes that use it), else
``normalised``; or either rule by name."""
Reduce = Callable[[Tensor], Tensor]
"""Sums a tensor over the ranks of a data-parallel run (identity in one process)."""
STD_EPS = 1e-8


def group_stats(values: Tensor, groups: Tensor, ddof: int = 0) -> tuple[Tensor, Tensor]:
    """Per element, the mean and std of its group's values (``ddof`` 0: population std; 1: the
    sample std of ``torch.std``, which DanceGRPO, MixGRPO and BranchGRPO use; a group of one has std 0)."""
    groups = groups.to(values.device)
    num = int(groups.max().item()) + 1 if groups.numel() else 0
    count = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(
        0, groups, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, groups, values)
    mean = total / count.clamp(min=1)
    dev = (values - mean[groups]) ** 2
    var = torch.zeros_like(count).index_add_(0, groups, dev) / (count - ddof).clamp(min=1)
    return mean[groups], var.sqrt()[groups]


def normalise_in_groups(values: Tensor, groups: Tensor, clip: float | None = None,
                        scale: AdvantageScale = "std", std_groups: Tensor | None = None,
                        reduce: Reduce | None = None, *, ddof: int = 0, eps: float = STD_EPS,
                        flat_below: float = 0.0, raw_std: bool = False) -> Tensor:
    """``(x - mean) / (std + eps)`` within groups (``scale="none"``: ``x - mean``), optionally
    clipped to ``+-clip``. ``std_groups``: take the std over these coarser groups instead, summed over
    ranks by ``reduce``: of the centred values (the ``batch`` scope), or with ``raw_std`` of the values
    themselves (the ``global`` scope). ``flat_below``: a group whose std is below it gets advantage 0
    (BranchGRPO's rule, ``train_branchgrpo_flux.py`` 675-676)."""
    mean, std = group_stats(values, groups, ddof)
    if scale not in ("std", "none"):
        raise ValueError(f"unknown advantage scale {scale!r}; expected 'std' or 'none'")
    if std_groups is not None:
        std = pooled_std(values if raw_std else values - mean, std_groups, reduce, ddof, centre=raw_std)
    out = (values - mean) / (std + eps) if scale == "std" else values - mean
    if flat_below > 0.0:
        out = torch.where(std < flat_below, torch.zeros_like(out), out)
    return out.clamp(-clip, clip) if clip is not None else out


def pooled_std(values: Tensor, groups: Tensor, reduce: Reduce | None = None, ddof: int = 0,
               centre: bool = False) -> Tensor:
    """Per element, the std of its coarse group's values, the sums taken over every rank by
    ``reduce`` (so every rank gets the whole batch's std): ``sqrt(mean of squares)`` of already
    centred values, or with ``centre`` the std of raw values about their group's mean."""
    num = int(groups.max().item()) + 1 if groups.numel() else 0
    sums = torch.zeros(3, num, dtype=torch.float64)
    flat = values.detach().double().cpu()
    sums[0].index_add_(0, groups.cpu(), flat**2)
    sums[1].index_add_(0, groups.cpu(), torch.ones(groups.numel(), dtype=torch.float64))
    sums[2].index_add_(0, groups.cpu(), flat)
    if reduce is not None:
        sums = reduce(sums)
    square = sums[0] - (sums[2] ** 2 / sums[1].clamp(min=1) if centre else 0.0)
    std = (square.clamp(min=0.0) / (sums[1] - ddof).clamp(min=1)).sqrt().to(values.dtype)
    return std.to(values.device)[groups.to(values.device)]


def reward_mix_rule(rule: RewardMixRule, std_scope: StdScope) -> MixRule:
    """The rule ``rule`` names, ``auto`` resolved by the advantage's std scope: the ``global`` std is
    the spread of raw values, so its recipes (Flow-GRPO, DiffusionNFT) sum raw rewards."""
    if rule == "auto":
        return "raw" if std_scope == "global" else "normalised"
    if rule not in ("normalised", "raw"):
        raise ValueError(f"unknown reward_mix {rule!r}; expected 'auto', 'normalised' or 'raw'")
    return rule


def combine_rewards(rewards: Tensor, groups: Tensor, weights: Tensor | None = None,
                    rule: MixRule = "normalised") -> Tensor:
    """Leaf values from ``[L]`` or ``[L, K]`` rewards (see ``MixRule``).

    One reward is used as it is; several are summed with ``weights`` (default: equal weights summing
    to 1), each first normalised within the prompt group (``normalised``) or as scored (``raw``).
    """
    if rewards.ndim == 1:
        return rewards.float()
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [L] or [L, K], got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k == 1:
        return rewards[:, 0].float()
    w = torch.full((k,), 1.0 / k) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    if w.shape != (k,):
        raise ValueError(f"{k} rewards need {k} weights, got {tuple(w.shape)}")
    if rule == "raw":
        return rewards.float() @ w.to(rewards.device)
    if rule != "normalised":
        raise ValueError(f"unknown reward mix rule {rule!r}; expected 'normalised' or 'raw'")
    normed = torch.stack([normalise_in_groups(rewards[:, j].float(), groups) for j in range(k)], 1)
    return normed @ w.to(normed.device)


def node_values(tree: Tree, leaf_values: Tensor, mode: NodeValue = "max") -> Tensor:
    """Value of every node: max or mean over its descendant leaves (leaves: their own value)."""
    if mode not in ("max", "mean"):
        raise ValueError(f"unknown node value {mode!r}; expected 'max' or 'mean'")
    leaf_values = leaf_values.float().cpu()
    if leaf_values.shape != tree.leaf_node.shape:
        raise ValueError(f"expected {tree.leaf_node.numel()} leaf values, got {tuple(leaf_values.shape)}")
    n = tree.num_nodes
    total = torch.full((n,), float("-inf")) if mode == "max" else torch.zeros(n)
    count = torch.zeros(n)
    total[tree.leaf_node] = leaf_values
    count[tree.leaf_node] = 1.0
    for depth in range(int(tree.node_depth.max().item()), 0, -1):
        nodes = (tree.node_depth == depth).nonzero().flatten()
        parents = tree.node_parent[nodes]
        if mode == "max":
            total.scatter_reduce_(0, parents, total[nodes], reduce="amax")
        else:
            total.index_add_(0, parents, total[nodes])
        count.index_add_(0, parents, count[nodes])
    return total if mode == "max" else total / count.clamp(min=1)


def depth_groups(tree: Tree) -> Tensor:
    """Group id of every node: one group per (prompt, depth)."""
    depths = int(tree.node_depth.max().item()) + 1
    return tree.node_prompt * depths + tree.node_depth


def node_advantages(tree: Tree, values: Tensor, clip: float = 5.0,
                    scale: AdvantageScale = "std", baseline: AdvantageBaseline = "depth",
                    std_scope: StdScope = "group", reduce: Reduce | None = None, *, ddof: int = 0,
                    eps: float = STD_EPS, flat_below: float = 0.0) -> Tensor:
    """Per node: its value normalised within its (prompt, depth) group (``depth``), or centred on
    its siblings and scaled by the group's spread of those differences (``parent``), clipped."""
    std_groups = _std_groups(std_scope, tree.node_depth)
    options = dict(ddof=ddof, eps=eps, flat_below=flat_below, raw_std=std_scope == "global")
    if baseline == "depth":
        return normalise_in_groups(values, depth_groups(tree), clip, scale, std_groups, reduce, **options)
    if baseline != "parent":
        raise ValueError(f"unknown advantage baseline {baseline!r}; expected 'depth' or 'parent'")
    parent = tree.node_parent.clone()
    roots = parent < 0  # roots are no edge's child; give each its own group
    parent[roots] = tree.num_nodes + torch.arange(int(roots.sum()))
    centred = values.float() - group_stats(values.float(), parent)[0]
    # a (prompt, depth) group holds whole sibling sets, so its centred values already have mean 0
    return normalise_in_groups(centred, depth_groups(tree), clip, scale, std_groups, reduce, **options)


def _std_groups(scope: StdScope, coarse: Tensor) -> Tensor | None:
    if scope not in ("group", "batch", "global"):
        raise ValueError(f"unknown advantage_std {scope!r}; expected 'group', 'batch' or 'global'")
    return coarse if scope != "group" else None


def edge_advantages(tree: Tree, leaf_values: Tensor, mode: AdvantageMode = "tree",
                    value: NodeValue = "max", clip: float = 5.0,
                    scale: AdvantageScale = "std", baseline: AdvantageBaseline = "depth",
                    std_scope: StdScope = "group", reduce: Reduce | None = None, *, ddof: int = 0,
                    eps: float = STD_EPS, flat_below: float = 0.0) -> Tensor:
    """Advantage of every edge of ``tree`` (``[E]``), by ``tree`` or ``leaf`` mode."""
    options = dict(ddof=ddof, eps=eps, flat_below=flat_below)
    if mode == "tree":
        values = node_values(tree, leaf_values, value)
        return node_advantages(tree, values, clip, scale, baseline, std_scope, reduce,
                               **options)[tree.edge_child]
    if mode == "leaf":
        return node_values(tree, leaf_advantages(tree, leaf_values, clip, scale, std_scope, reduce,
                                                 **options), "mean")[tree.edge_child]
    raise ValueError(f"unknown advantage mode {mode!r}; expected 'tree' or 'leaf'")


def leaf_advantages(tree: Tree, leaf_values: Tensor, clip: float | None = 5.0,
                    scale: AdvantageScale = "std", std_scope: StdScope = "group",
                    reduce: Reduce | None = None, *, ddof: int = 0, eps: float = STD_EPS,
                    flat_below: float = 0.0) -> Tensor:
    """GRPO's advantage of every leaf: its value normalised among its prompt's leaves (``[L]``)."""
    std_groups = _std_groups(std_scope, torch.zeros(tree.leaf_node.numel(), dtype=torch.long))
    return normalise_in_groups(leaf_values.float().cpu(), tree.node_prompt[tree.leaf_node], clip, scale,
                               std_groups, reduce, ddof=ddof, eps=eps, flat_below=flat_below,
                               raw_std=std_scope == "global")


def best_leaf_index(tree: Tree, leaf_values: Tensor) -> Tensor:
    """Position (in ``tree.leaf_node``) of each prompt's highest-valued leaf; ties: the first."""
    per_prompt = leaf_values.float().cpu().reshape(tree.num_prompts, -1)
    return per_prompt.argmax(dim=1) + torch.arange(tree.num_prompts) * per_prompt.shape[1]
