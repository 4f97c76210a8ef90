"""Node values and advantages computed by hand on a small tree (docs/algorithm.md, "Values and
advantages")."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.core.advantages import (
    best_leaf_index,
    combine_rewards,
    edge_advantages,
    node_values,
    normalise_in_groups,
    reward_mix_rule,
)
from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.core.objective import LossConfig
from dynamic_treerpo.trainer.core.strategies import DanceGRPOConfig, TreeConfig, build_plan
from dynamic_treerpo.trainer.core.tree import rollout


@pytest.fixture
def small_tree():
    """Root 0 -> nodes 1, 2 -> leaves 3, 4 (under 1) and 5, 6 (under 2)."""
    cfg = TreeConfig(steps=4, window_start=0, depth=2, branching=2)
    tree = rollout(lambda x, s, c: 0.1 * x, None, build_plan(cfg, make_sigmas("shift", 4)), [0], (2,))
    assert tree.node_parent.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    assert tree.leaf_node.tolist() == [3, 4, 5, 6]
    return tree


def test_max_and_mean_node_values(small_tree) -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, -3.0])
    assert node_values(small_tree, rewards, "max").tolist() == [3.0, 1.0, 3.0, 1.0, 0.0, 3.0, -3.0]
    assert node_values(small_tree, rewards, "mean").tolist() == [0.25, 0.5, 0.0, 1.0, 0.0, 3.0, -3.0]


def test_tree_advantages_by_hand(small_tree) -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, -3.0])
    # depth 1 (max): values [1, 3] -> [-1, 1]; (mean): [0.5, 0] -> [1, -1]
    # depth 2: rewards normalised among the four leaves (mean 0.25, std sqrt(4.6875))
    std = 4.6875**0.5
    leaves = [(r - 0.25) / std for r in (1.0, 0.0, 3.0, -3.0)]
    assert edge_advantages(small_tree, rewards, "tree", "max").tolist() == pytest.approx(
        [-1.0, 1.0, *leaves], abs=1e-6)
    assert edge_advantages(small_tree, rewards, "tree", "mean").tolist() == pytest.approx(
        [1.0, -1.0, *leaves], abs=1e-6)
    # leaf mode: shared edges get the mean advantage of their leaves
    expected = [(leaves[0] + leaves[1]) / 2, (leaves[2] + leaves[3]) / 2, *leaves]
    assert edge_advantages(small_tree, rewards, "leaf").tolist() == pytest.approx(expected, abs=1e-6)
    assert best_leaf_index(small_tree, rewards).tolist() == [2]


def test_unscaled_advantages_keep_reward_units(small_tree) -> None:
    """``advantage_scale: none`` (Dr. GRPO) centres only: a group whose rewards barely differ
    gets small advantages, where GRPO's std division would blow them up to +-1."""
    rewards = torch.tensor([1.0, 0.0, 3.0, -3.0])
    assert edge_advantages(small_tree, rewards, "tree", "max", scale="none").tolist() == pytest.approx(
        [-1.0, 1.0, 0.75, -0.25, 2.75, -3.25], abs=1e-6)
    close = torch.tensor([0.5, 0.5, 0.501, 0.499])
    assert edge_advantages(small_tree, close, scale="none").abs().max() < 0.01
    assert edge_advantages(small_tree, close, scale="std").abs().max() > 0.9


def test_groups_are_per_prompt_and_depth() -> None:
    cfg = TreeConfig(steps=4, window_start=0, depth=1, branching=2, trees_per_prompt=2)
    tree = rollout(lambda x, s, c: x, None, build_plan(cfg, make_sigmas("shift", 4)), [0, 1], (2,))
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 10.0, 10.0, 10.0, 10.0])
    adv = edge_advantages(tree, rewards)
    torch.testing.assert_close(adv[:4], (rewards[:4] - 1.5) / 1.25**0.5)
    assert adv[4:].tolist() == [0.0] * 4  # a flat group has zero advantage


def test_chains_reduce_to_plain_grpo() -> None:
    cfg = DanceGRPOConfig(steps=5, group_size=4)
    tree = rollout(lambda x, s, c: x, None, build_plan(cfg, make_sigmas("shift", 5)), [0], (2,))
    rewards = torch.tensor([0.2, 0.4, 0.6, 0.8])
    grpo = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-8)
    adv = edge_advantages(tree, rewards)
    leaf_of_edge = tree.edge_child.clone()
    for _ in range(5):  # walk each edge's child down its chain to its leaf
        nxt = {int(p): int(c) for p, c in zip(tree.edge_parent, tree.edge_child, strict=True)}
        leaf_of_edge = torch.tensor([nxt.get(int(n), int(n)) for n in leaf_of_edge])
    position = {int(n): i for i, n in enumerate(tree.leaf_node)}
    torch.testing.assert_close(adv, grpo[[position[int(n)] for n in leaf_of_edge]])


def test_multi_reward_normalises_each_then_weights() -> None:
    rewards = torch.tensor([[1.0, 10.0], [0.0, 20.0], [3.0, 30.0], [2.0, 40.0]])
    groups = torch.zeros(4, dtype=torch.long)
    a = [(r - 1.5) / 1.25**0.5 for r in (1.0, 0.0, 3.0, 2.0)]
    b = [(r - 25.0) / 125**0.5 for r in (10.0, 20.0, 30.0, 40.0)]
    out = combine_rewards(rewards, groups, torch.tensor([0.25, 0.75]))
    assert out.tolist() == pytest.approx([0.25 * x + 0.75 * y for x, y in zip(a, b, strict=True)])
    single = torch.tensor([0.3, 0.9])
    assert combine_rewards(single, torch.zeros(2, dtype=torch.long)).tolist() == pytest.approx([0.3, 0.9])
    with pytest.raises(ValueError, match="2 rewards need 2 weights"):
        combine_rewards(rewards, groups, torch.tensor([1.0]))


def test_raw_mix_is_the_weighted_sum_of_the_scores() -> None:
    """Flow-GRPO's and DiffusionNFT's rule: the weights as given on the raw scores, no normalisation."""
    rewards = torch.tensor([[1.0, 10.0], [0.0, 20.0], [3.0, 30.0], [2.0, 40.0]])
    groups = torch.tensor([0, 0, 1, 1])
    out = combine_rewards(rewards, groups, torch.tensor([0.5, 2.0]), "raw")
    assert out.tolist() == pytest.approx([20.5, 40.0, 61.5, 81.0])
    assert combine_rewards(rewards, groups, rule="raw").tolist() == pytest.approx([5.5, 10.0, 16.5, 21.0])
    with pytest.raises(ValueError, match="unknown reward mix rule"):
        combine_rewards(rewards, groups, rule="sum")  # type: ignore[arg-type]


def test_the_mix_rule_follows_the_std_scope_unless_named() -> None:
    assert reward_mix_rule("auto", "global") == "raw"
    assert reward_mix_rule("auto", "group") == reward_mix_rule("auto", "batch") == "normalised"
    assert reward_mix_rule("normalised", "global") == "normalised"
    assert reward_mix_rule("raw", "group") == "raw"
    assert LossConfig().mix_rule == "normalised"  # the tree's default: MixGRPO's rule
    assert LossConfig(advantage_std="global").mix_rule == "raw"
    with pytest.raises(ValueError, match="unknown reward_mix"):
        LossConfig(reward_mix="sum")  # type: ignore[arg-type]


def test_advantages_are_clipped() -> None:
    values = torch.tensor([0.0] * 36 + [1.0])  # the outlier's z-score is 6
    out = normalise_in_groups(values, torch.zeros(37, dtype=torch.long), clip=5.0)
    assert out.max().item() == 5.0


def test_parent_baseline_credits_a_step_only_with_what_it_changed(small_tree) -> None:
    """Leaves 3, 4 share parent 1 and leaves 5, 6 parent 2: with the ``depth`` baseline leaf 5
    (the better of its pair) is penalised for its parent's bad branch; ``parent`` credits it."""
    rewards = torch.tensor([1.0, 0.8, 0.2, 0.0])
    depth = edge_advantages(small_tree, rewards, "tree", "max", scale="none", baseline="depth")
    parent = edge_advantages(small_tree, rewards, "tree", "max", scale="none", baseline="parent")
    assert depth[4] < 0  # leaf 5
    assert parent.tolist() == pytest.approx([0.4, -0.4, 0.1, -0.1, 0.1, -0.1], abs=1e-6)
    scaled = edge_advantages(small_tree, rewards, "tree", "max", baseline="parent")
    assert scaled.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], abs=1e-5)
    with pytest.raises(ValueError, match="unknown advantage baseline"):
        edge_advantages(small_tree, rewards, baseline="grandparent")
