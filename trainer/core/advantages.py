"""Node values and advantages on a tree (docs/algorithm.md, "Values and advantages"). Pure tensor functions.

Leaf value = reward (several rewards: each normalised within its prompt's group, then a weighted
sum). A node's value is the max [choice, default] or mean of its descendant leaves; the
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
StdScope = Literal["group", "batch"]
"""Where the advantage's std comes from. ``group`` (the paper): each (prompt, depth) group's own.
``batch``: the nodes of that depth over every prompt of the iteration, on every rank of a
data-parallel run (Flow-GRPO's global std), so a prompt whose images barely differ gets small
advantages instead of unit-size ones; the mean stays the group's own."""
Reduce = Callable[[Tensor], Tensor]
"""Sums a tensor over the ranks of a data-parallel run (identity in one process)."""
STD_EPS = 1e-8


def group_stats(values: Tensor, groups: Tensor) -> tuple[Tensor, Tensor]:
    """Per element, the mean and population std of its group's values."""
    groups = groups.to(values.device)
    num = int(groups.max().item()) + 1 if groups.numel() else 0
    count = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(
        0, groups, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, groups, values)
    mean = total / count.clamp(min=1)
    dev = (values - mean[groups]) ** 2
    var = torch.zeros_like(count).index_add_(0, groups, dev) / count.clamp(min=1)
    return mean[groups], var.sqrt()[groups]


def normalise_in_groups(values: Tensor, groups: Tensor, clip: float | None = None,
                        scale: AdvantageScale = "std", std_groups: Tensor | None = None,
                        reduce: Reduce | None = None) -> Tensor:
    """``(x - mean) / (std + 1e-8)`` within groups (``scale="none"``: ``x - mean``), optionally
    clipped to ``+-clip``. ``std_groups``: take the std of the centred values over these coarser
    groups instead, summed over ranks by ``reduce`` (the ``batch`` scope)."""
    mean, std = group_stats(values, groups)
    if scale not in ("std", "none"):
        raise ValueError(f"unknown advantage scale {scale!r}; expected 'std' or 'none'")
    if std_groups is not None:
        std = pooled_std(values - mean, std_groups, reduce)
    out = (values - mean) / (std + STD_EPS) if scale == "std" else values - mean
    return out.clamp(-clip, clip) if clip is not None else out


def pooled_std(centred: Tensor, groups: Tensor, reduce: Reduce | None = None) -> Tensor:
    """Per element, ``sqrt(mean of squares)`` of the centred values of its group, the sums taken
    over every rank by ``reduce`` (so every rank gets the whole batch's std)."""
    num = int(groups.max().item()) + 1 if groups.numel() else 0
    sums = torch.zeros(2, num, dtype=torch.float64)
    sums[0].index_add_(0, groups.cpu(), centred.detach().double().cpu() ** 2)
    sums[1].index_add_(0, groups.cpu(), torch.ones(groups.numel(), dtype=torch.float64))
    if reduce is not None:
        sums = reduce(sums)
    std = (sums[0] / sums[1].clamp(min=1)).sqrt().to(centred.dtype)
    return std.to(centred.device)[groups.to(centred.device)]


def combine_rewards(rewards: Tensor, groups: Tensor, weights: Tensor | None = None) -> Tensor:
    """Leaf values from ``[L]`` or ``[L, K]`` rewards (MixGRPO's multi-reward rule).

    One reward is used as it is; several are each normalised within the prompt group and summed
    with ``weights`` (default: equal weights summing to 1).
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
                    std_scope: StdScope = "group", reduce: Reduce | None = None) -> Tensor:
    """Per node: its value normalised within its (prompt, depth) group (``depth``), or centred on
    its siblings and scaled by the group's spread of those differences (``parent``), clipped."""
    std_groups = _std_groups(std_scope, tree.node_depth)
    if baseline == "depth":
        return normalise_in_groups(values, depth_groups(tree), clip, scale, std_groups, reduce)
    if baseline != "parent":
        raise ValueError(f"unknown advantage baseline {baseline!r}; expected 'depth' or 'parent'")
    parent = tree.node_parent.clone()
    roots = parent < 0  # roots are no edge's child; give each its own group
    parent[roots] = tree.num_nodes + torch.arange(int(roots.sum()))
    centred = values.float() - group_stats(values.float(), parent)[0]
    # a (prompt, depth) group holds whole sibling sets, so its centred values already have mean 0
    return normalise_in_groups(centred, depth_groups(tree), clip, scale, std_groups, reduce)


def _std_groups(scope: StdScope, coarse: Tensor) -> Tensor | None:
    if scope not in ("group", "batch"):
        raise ValueError(f"unknown advantage_std {scope!r}; expected 'group' or 'batch'")
    return coarse if scope == "batch" else None


def edge_advantages(tree: Tree, leaf_values: Tensor, mode: AdvantageMode = "tree",
                    value: NodeValue = "max", clip: float = 5.0,
                    scale: AdvantageScale = "std", baseline: AdvantageBaseline = "depth",
                    std_scope: StdScope = "group", reduce: Reduce | None = None) -> Tensor:
    """Advantage of every edge of ``tree`` (``[E]``), by ``tree`` or ``leaf`` mode."""
    if mode == "tree":
        values = node_values(tree, leaf_values, value)
        return node_advantages(tree, values, clip, scale, baseline, std_scope, reduce)[tree.edge_child]
    if mode == "leaf":
        std_groups = _std_groups(std_scope, torch.zeros(tree.leaf_node.numel(), dtype=torch.long))
        leaf_adv = normalise_in_groups(leaf_values.float().cpu(), tree.node_prompt[tree.leaf_node],
                                       clip, scale, std_groups, reduce)
        return node_values(tree, leaf_adv, "mean")[tree.edge_child]
    raise ValueError(f"unknown advantage mode {mode!r}; expected 'tree' or 'leaf'")


def best_leaf_index(tree: Tree, leaf_values: Tensor) -> Tensor:
    """Position (in ``tree.leaf_node``) of each prompt's highest-valued leaf; ties: the first."""
    per_prompt = leaf_values.float().cpu().reshape(tree.num_prompts, -1)
    return per_prompt.argmax(dim=1) + torch.arange(tree.num_prompts) * per_prompt.shape[1]
