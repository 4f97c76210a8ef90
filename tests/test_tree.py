"""The rollout engine: shared trunks, branching, determinism, batching (docs/algorithm.md, "Tree rollout")."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import make_sigmas, sde_transition
from dynamic_treerpo.trainer.core.strategies import (
    MixGRPOConfig,
    TreeConfig,
    build_plan,
    closed_form,
    tree_plan,
)
from dynamic_treerpo.trainer.core.tree import RolloutPlan, StepOp, rollout

LATENT = (3, 4, 4)


class Recorder:
    """Wraps a velocity function and records every call's inputs."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, x, sigma, cond):
        self.calls.append((x.clone(), sigma.clone(), cond.clone()))
        return self.fn(x, sigma, cond)


SMALL_TREE = TreeConfig(steps=10, window_start=4, depth=3, branching=2, trees_per_prompt=2)


def _tree(model, seeds=(0, 1), cfg=SMALL_TREE, **kw):
    plan = tree_plan(cfg, make_sigmas("shift", cfg.steps))
    cond = torch.arange(len(seeds))
    return rollout(model, cond, plan, list(seeds), LATENT, **kw), plan


def test_trunk_is_shared_and_siblings_split(tiny_model) -> None:
    rec = Recorder(tiny_model)
    with torch.no_grad():
        tree, _ = _tree(rec)
    P, M, start, b, d = 2, 2, 4, 2, 3
    # before the window: one row per tree (the trunk is computed once), then b^k per tree
    rows = [c[0].shape[0] for c in rec.calls]
    assert rows[:start] == [P * M] * start
    assert rows[start:start + d] == [P * M * b**k for k in range(d)]
    assert rows[start + d:] == [P * M * b**d] * (10 - start - d)
    # all leaves of one tree descend from one root: their pre-window states are that root's
    roots = tree.ancestor_at_depth(tree.leaf_node, 0)
    assert roots.unique().numel() == P * M
    assert bool((roots.reshape(P * M, -1) == roots.reshape(P * M, -1)[:, :1]).all())
    # siblings (same parent) differ after their split; all leaves differ from each other
    parents = tree.edge_parent
    for p in parents.unique():
        kids = tree.edge_x_child[parents == p]
        assert kids.shape[0] == b
        assert not torch.equal(kids[0], kids[1])
    flat = tree.leaf_latents.flatten(1)
    assert torch.cdist(flat, flat).add(torch.eye(flat.shape[0])).min() > 0


def test_unshared_mixgrpo_recomputes_a_bitwise_identical_trunk(tiny_model) -> None:
    rec = Recorder(tiny_model)
    cfg = MixGRPOConfig(steps=10, window_start=4, window_size=2, group_size=4)
    with torch.no_grad():
        rollout(rec, torch.arange(1), build_plan(cfg, make_sigmas("shift", 10)), [7], LATENT)
    for x, _, _ in rec.calls[:4]:
        assert all(torch.equal(x[0], x[g]) for g in range(4))
    after = rec.calls[5][0]
    assert not torch.equal(after[0], after[1])


def test_same_seed_same_tree_other_seed_other_tree(tiny_model) -> None:
    with torch.no_grad():
        a, _ = _tree(tiny_model, seeds=(3, 4))
        b, _ = _tree(tiny_model, seeds=(3, 4))
        c, _ = _tree(tiny_model, seeds=(3, 5))
    for name in ("fwd_x", "edge_x_child", "edge_log_prob_old", "leaf_latents", "node_parent"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.leaf_latents[:16], c.leaf_latents[:16])  # prompt 0 keeps its seed
    assert not torch.equal(a.leaf_latents[16:], c.leaf_latents[16:])


def test_prompts_are_independent_of_batch_composition(tiny_model) -> None:
    """Each prompt draws from its own generator: sharding prompts does not change samples."""
    with torch.no_grad():
        both, _ = _tree(tiny_model, seeds=(11, 12))
        plan = tree_plan(TreeConfig(steps=10, window_start=4, depth=3, branching=2,
                                    trees_per_prompt=2), make_sigmas("shift", 10))
        second = rollout(tiny_model, torch.tensor([1]), plan, [12], LATENT)
    torch.testing.assert_close(both.leaf_latents[16:], second.leaf_latents, rtol=0, atol=1e-6)


def test_max_batch_only_splits_calls(tiny_model) -> None:
    with torch.no_grad():
        whole, _ = _tree(tiny_model)
        split, _ = _tree(tiny_model, max_batch=5)
    assert whole.calls_per_step == [1] * len(whole.calls_per_step)
    assert split.model_calls > whole.model_calls and split.nfe == whole.nfe
    torch.testing.assert_close(split.leaf_latents, whole.leaf_latents, rtol=0, atol=1e-6)


def test_edges_record_what_the_sampler_did(tiny_model) -> None:
    with torch.no_grad():
        tree, _ = _tree(tiny_model)
    assert tree.leaf_node.numel() == 2 * 2 * 2**3
    assert tree.edge_child.numel() == 2 * 2 * (2 + 4 + 8)
    assert tree.edge_depth.tolist() == (tree.node_depth[tree.edge_parent] + 1).tolist()
    levels = sorted(set(tree.edge_noise_level.tolist()))
    assert levels == pytest.approx([0.6, 0.75, 0.9])  # a0 (1 + beta k / (d - 1)), beta = 0.5
    assert bool(torch.isfinite(tree.edge_log_prob_old).all())
    assert tree.edge_train.all()
    assert torch.equal(tree.edge_x_parent, tree.fwd_x[tree.edge_forward])


@pytest.mark.parametrize("steps,start,depth,branching,trees", [
    (t, start, d, b, m) for t in (6, 10, 25) for d in (1, 2, 4) for b in (2, 3) for m in (1, 2)
    for start in (0, t - 1 - d)])
def test_counted_forwards_equal_the_closed_form(steps, start, depth, branching, trees) -> None:
    cfg = TreeConfig(steps=steps, window_start=start, depth=depth, branching=branching,
                     trees_per_prompt=trees)
    calls = []

    def velocity(x, sigma, cond):
        calls.append(x.shape[0])
        return 0.1 * x

    tree = rollout(velocity, None, tree_plan(cfg, make_sigmas("shift", steps)), [0, 1], (2,))
    expected = closed_form(cfg)
    assert tree.nfe == 2 * expected.rollout_nfe  # two prompts
    assert tree.leaf_node.numel() == 2 * expected.scored_images
    assert len(calls) == steps  # every step, each tree layer included, is one model call
    assert tree.trained_forwards.numel() == 2 * expected.train_nfe
    assert int(tree.edge_train.sum()) == 2 * expected.train_edges


def test_plan_validation_messages() -> None:
    with pytest.raises(ValueError, match="final step"):
        RolloutPlan("x", (StepOp(1.0, 0.0, "sde", 2, 0.5),), 1)
    with pytest.raises(ValueError, match="only SDE steps can branch"):
        RolloutPlan("x", (StepOp(1.0, 0.0, "euler", 2),), 1)
    with pytest.raises(ValueError, match="end at sigma 0"):
        RolloutPlan("x", (StepOp(1.0, 0.5),), 1)
    with pytest.raises(ValueError, match="noise must have shape"):
        plan = RolloutPlan("x", (StepOp(1.0, 0.0),), 2)
        rollout(lambda x, s, c: x, None, plan, [0], (2,), noise=torch.zeros(1, 1, 2))


def test_antithetic_siblings_draw_mirrored_noise_with_exact_log_probs() -> None:
    """Mirrored siblings: ``x_child - mean`` of a pair sum to zero, both have the same log-prob
    (the Gaussian is symmetric), and the tree is still reproducible from its seeds."""
    cfg = TreeConfig(steps=6, window_start=1, depth=2, branching=3, trees_per_prompt=2, antithetic=True)
    plan = build_plan(cfg, make_sigmas("shift", 6))

    def model(x, sigma, cond):
        return 0.5 * x + 0.1

    tree = rollout(model, torch.arange(2), plan, [3, 4], LATENT)
    again = rollout(model, torch.arange(2), plan, [3, 4], LATENT)
    torch.testing.assert_close(tree.leaf_latents, again.leaf_latents, rtol=0, atol=0)
    x = tree.edge_x_parent
    dist = sde_transition("flow_grpo", x, model(x, None, None), tree.edge_sigma, tree.edge_sigma_next,
                          tree.edge_noise_level)
    offset = (tree.edge_x_child - dist.mean).reshape(-1, 3, *LATENT)  # siblings are consecutive
    torch.testing.assert_close(offset[:, 0], -offset[:, 1], rtol=0, atol=1e-5)
    assert (offset[:, 2] + offset[:, 0]).abs().max() > 0.1  # the odd child draws its own noise
    lp = tree.edge_log_prob_old.reshape(-1, 3)
    torch.testing.assert_close(lp[:, 0], lp[:, 1], rtol=1e-5, atol=1e-6)


def test_pooled_noise_moves_siblings_apart_only_in_image_blocks(tiny_model) -> None:
    """With ``noise_pool`` the children of a node differ by block-constant noise: their mean
    over each pool x pool block differs, their detail inside the blocks is the same."""
    from dataclasses import replace

    from dynamic_treerpo.trainer.core.flow import NoiseSubspace

    with torch.no_grad():
        tree, plan = _tree(tiny_model, cfg=replace(SMALL_TREE, noise_pool=2))
    assert plan.noise == NoiseSubspace(pool=2)
    first, second = tree.edge_x_child[0::2], tree.edge_x_child[1::2]  # sibling pairs
    gap = first - second
    assert float(plan.noise.project(gap).abs().min()) > 0  # every block of every pair differs
    torch.testing.assert_close(gap - plan.noise.project(gap), torch.zeros_like(gap),
                               atol=1e-5, rtol=0)
