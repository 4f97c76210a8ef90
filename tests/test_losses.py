"""Loss terms by hand, and the training pass on a tiny model (docs/algorithm.md, "Loss")."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.core.losses import (
    ClipConfig,
    clip_bounds,
    grpo_edge_loss,
    layer_weight,
    layer_weight_tanh,
    ratio_spread,
)
from dynamic_treerpo.trainer.core.objective import (
    LossConfig,
    backward_over_tree,
    microbatch_loss,
    prepare_targets,
)
from dynamic_treerpo.trainer.core.running_scales import RewardScale
from dynamic_treerpo.trainer.core.strategies import TreeConfig, build_plan
from dynamic_treerpo.trainer.core.tree import rollout

LATENT = (3, 4, 4)


def test_clipped_surrogate_by_hand() -> None:
    ratio = torch.tensor([1.5, 0.5, 1.1, 1.5])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    low, high = torch.full((4,), 0.8), torch.full((4,), 1.2)
    out = grpo_edge_loss(ratio.log(), torch.zeros(4), adv, low, high)
    # -min(rA, clip(r)A): [-1.2, 0.8, -1.1, 1.5]
    assert out.loss.tolist() == pytest.approx([-1.2, 0.8, -1.1, 1.5])
    assert out.clipped.tolist() == [True, True, False, True]
    torch.testing.assert_close(out.ratio, ratio)


def test_dynamic_clip_bound_follows_the_advantage() -> None:
    cfg = ClipConfig(eps_low=1e-4, eps_high=1e-3, eta=1.0)
    low, high = clip_bounds(torch.tensor([-50.0, 0.0, 50.0]), cfg)
    eps = (high - 1).tolist()
    assert eps[0] == pytest.approx(1e-4, rel=1e-3) and eps[2] == pytest.approx(1e-3, rel=1e-3)
    assert eps[1] == pytest.approx(5.5e-4, rel=1e-3)
    torch.testing.assert_close(1 - low, high - 1)
    low_a, high_a = clip_bounds(torch.tensor([3.0]), ClipConfig(asymmetric=True))
    assert 1 - low_a.item() == pytest.approx(1e-4, rel=1e-3) and high_a.item() > 1 + 9e-4
    low_f, high_f = clip_bounds(torch.tensor([3.0]), ClipConfig(mode="fixed", fixed=0.2, scale=0.5))
    assert (low_f.item(), high_f.item()) == pytest.approx((0.9, 1.1))
    low_n, high_n = clip_bounds(torch.tensor([3.0]), ClipConfig(mode="none"))
    assert math.isinf(low_n.item()) and math.isinf(high_n.item())


def test_layer_weight_and_ratio_spread() -> None:
    assert layer_weight(torch.tensor(2.0), torch.tensor(2.0), torch.tensor(0.0)).item() == 0.5
    assert layer_weight(torch.tensor(3.0), torch.tensor(2.0), torch.tensor(1.0)).item() == pytest.approx(
        1 / (1 + math.exp(-1)))
    assert ratio_spread(torch.tensor([1.0, 1.1, 0.8, 1.0]), 1.0).item() == pytest.approx(0.2)


def _setup(model, seeds=(0, 1), noise_pool=1, **loss_kw):
    cfg = TreeConfig(steps=8, window_start=2, depth=2, branching=2, trees_per_prompt=2,
                     noise_pool=noise_pool)
    plan = build_plan(cfg, make_sigmas("shift", 8))
    cond = torch.arange(len(seeds))
    with torch.no_grad():
        tree = rollout(model, cond, plan, list(seeds), LATENT)
    rewards = tree.leaf_latents.mean(dim=(1, 2, 3))  # any function of the images
    config = LossConfig(**loss_kw)
    return tree, cond, prepare_targets(tree, rewards, config), config


@pytest.mark.parametrize("noise_pool", [1, 2])
def test_ratio_is_exactly_one_at_theta_old_and_gradients_flow(tiny_model, noise_pool) -> None:
    tree, cond, targets, config = _setup(tiny_model, prm_lambda=0.0, noise_pool=noise_pool)
    stats = backward_over_tree(tiny_model, cond, tree, targets, config)
    assert stats.ratio_dev_max == 0.0 and stats.clip_frac == 0.0
    assert stats.train_edges == 2 * 2 * (2 + 4) and stats.train_nfe == 2 * 2 * 3
    for name, p in tiny_model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"no gradient reached {name} through log pi"


@pytest.mark.parametrize("noise_pool", [1, 2])
def test_gradients_change_the_ratio_in_the_advantage_direction(tiny_model, noise_pool) -> None:
    tree, cond, targets, config = _setup(tiny_model, prm_lambda=0.0, noise_pool=noise_pool,
                                         clip=ClipConfig(mode="none"))
    backward_over_tree(tiny_model, cond, tree, targets, config)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p -= 1e-2 * p.grad
    parts = microbatch_loss(tiny_model, cond, tree, targets, targets.train_forwards, config)
    adv = targets.edge_advantage[tree.edge_train]
    moved = (parts.ratio - 1) * adv.sign()
    assert moved.sum() > 0  # higher ratio for good edges, lower for bad ones, on balance
    assert parts.total.item() < 0.0


def test_micro_batches_sum_to_the_full_gradient(tiny_model) -> None:
    other = copy.deepcopy(tiny_model)
    tree, cond, targets, config = _setup(tiny_model, prm_lambda=0.5)
    full = backward_over_tree(tiny_model, cond, tree, targets, config)
    parts = backward_over_tree(other, cond, tree, targets, config, max_batch=3)
    assert parts.loss == pytest.approx(full.loss, rel=1e-5, abs=1e-7)
    for a, b in zip(tiny_model.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("target", ["x0", "path"])
def test_layer_tuning_step_moves_velocity_toward_its_target(tiny_model, target) -> None:
    from dynamic_treerpo.trainer.core.losses import path_target, velocity_mse, x0_target

    tree, cond, targets, config = _setup(tiny_model, prm_lambda=1.0, prm_target=target)
    targets.edge_weight.zero_()  # isolate the LayerTuning term
    weighted = targets.fwd_prm_weight > 0
    ids = weighted.nonzero().flatten()
    x, sigma = tree.fwd_x[ids], tree.fwd_sigma[ids]
    if target == "x0":
        goal = x0_target(x, targets.best_x0[tree.fwd_prompt[ids]], sigma)
    else:
        child = tree.edge_x_child[targets.fwd_path_edge[ids]]
        goal = path_target(x, child, sigma - tree.fwd_sigma_next[ids])

    def distance() -> float:
        with torch.no_grad():
            return float(velocity_mse(tiny_model(x, sigma, tree.fwd_prompt[ids]), goal).mean())

    before = distance()
    stats = backward_over_tree(tiny_model, cond, tree, targets, config)
    assert stats.grpo_loss == 0.0 and stats.prm_loss > 0
    with torch.no_grad():
        for p in tiny_model.parameters():
            p -= 0.05 * p.grad
    assert distance() < before


def test_layer_tuning_weights_by_hand() -> None:
    cfg = TreeConfig(steps=4, window_start=0, depth=2, branching=2)
    tree = rollout(lambda x, s, c: 0.1 * x, None, build_plan(cfg, make_sigmas("shift", 4)), [0], (2,))
    rewards = torch.tensor([1.0, 0.0, 3.0, -3.0])  # best leaf: node 5 under node 2
    t = prepare_targets(tree, rewards, LossConfig(prm_target="x0"))
    w1 = 1 / (1 + math.exp(-1.0))  # layer 1 values [1, 3]: (3 - 2) / 1
    assert t.layer_weight.tolist() == pytest.approx([0.5, w1, w1])
    assert t.fwd_prm_weight.tolist() == pytest.approx([0.5, w1 / 2, w1 / 2])
    torch.testing.assert_close(t.best_x0[0], tree.leaf_latents[2])
    p = prepare_targets(tree, rewards, LossConfig(prm_target="path"))
    assert p.fwd_prm_weight.tolist() == pytest.approx([0.5, 0.0, w1])
    assert tree.edge_child[p.fwd_path_edge[p.fwd_path_edge >= 0]].tolist() == [2, 5]
    # GRPO weights: mean over the two layers of the mean over each layer's edges
    assert t.edge_weight.tolist() == pytest.approx([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])


def test_tanh_layer_weight_is_zero_on_a_flat_layer_and_judges_gaps_by_the_reward_spread() -> None:
    """The corrected weight: the same tree as above, ``w_k = tanh((V* - mean_k) / s_ref)``."""
    cfg = TreeConfig(steps=4, window_start=0, depth=2, branching=2)
    tree = rollout(lambda x, s, c: 0.1 * x, None, build_plan(cfg, make_sigmas("shift", 4)), [0], (2,))
    rewards = torch.tensor([1.0, 0.0, 3.0, -3.0])
    t = prepare_targets(tree, rewards, LossConfig(prm_target="x0", prm_weight="tanh"), reward_scale=2.0)
    # layer 0 is the root alone (flat: nothing to imitate); layer 1 values [1, 3], gap 1, s_ref 2
    assert t.layer_weight.tolist() == pytest.approx([0.0, math.tanh(0.5), math.tanh(0.5)])
    assert t.fwd_prm_weight.tolist() == pytest.approx([0.0, math.tanh(0.5) / 2, math.tanh(0.5) / 2])
    wide = prepare_targets(tree, rewards, LossConfig(prm_weight="tanh"), reward_scale=0.01)
    assert wide.layer_weight[1].item() == pytest.approx(1.0)  # a gap far above the usual spread
    flat = prepare_targets(tree, torch.full((4,), 0.7), LossConfig(prm_weight="tanh"), reward_scale=0.0)
    assert flat.layer_weight.tolist() == [0.0, 0.0, 0.0]
    sigmoid = prepare_targets(tree, torch.full((4,), 0.7), LossConfig(prm_weight="sigmoid"))
    assert sigmoid.layer_weight.tolist() == [0.5, 0.5, 0.5]  # the first reading weighs a flat layer 0.5
    one = layer_weight_tanh(torch.tensor(3.0), torch.tensor(2.0), 1.0)
    assert one.item() == pytest.approx(math.tanh(1.0))


def test_reward_scale_is_a_moving_average_of_the_leaf_reward_std() -> None:
    scale = RewardScale(momentum=0.5)
    assert scale.update(torch.tensor([0.3, 0.3])) == 0.0  # no spread seen yet
    assert scale.update(torch.tensor([0.0, 2.0])) == pytest.approx(1.0)
    assert scale.update(torch.tensor([0.0, 4.0])) == pytest.approx(0.5 * 1.0 + 0.5 * 2.0)
    assert scale.update(torch.tensor([5.0, 5.0])) == pytest.approx(1.5)  # a flat batch leaves it


def test_kl_term_needs_a_reference_and_is_zero_against_itself(tiny_model) -> None:
    tree, cond, targets, config = _setup(tiny_model, kl_beta=0.1)
    with pytest.raises(ValueError, match="reference"):
        microbatch_loss(tiny_model, cond, tree, targets, targets.train_forwards, config)
    parts = microbatch_loss(tiny_model, cond, tree, targets, targets.train_forwards, config,
                            reference=tiny_model)
    assert parts.kl.item() == 0.0


def test_prm_logprob_scale_is_the_gaussian_nll_of_the_target(tiny_model) -> None:
    """In log-prob units, the LayerTuning term is the element-averaged Gaussian NLL of the target
    transition (up to its constant): ``(D dv)^2 / (2 std^2)``."""
    from dynamic_treerpo.trainer.core.flow import Gaussian, gaussian_log_prob, sde_transition
    from dynamic_treerpo.trainer.core.losses import x0_target

    tree, cond, targets, config = _setup(tiny_model, prm_lambda=1.0, prm_scale="logprob")
    targets.edge_weight.zero_()
    ids = (targets.fwd_prm_weight > 0).nonzero().flatten()
    x, sigma, nxt = tree.fwd_x[ids], tree.fwd_sigma[ids], tree.fwd_sigma_next[ids]
    with torch.no_grad():
        v = tiny_model(x, sigma, tree.fwd_prompt[ids])
        goal = x0_target(x, targets.best_x0[tree.fwd_prompt[ids]], sigma)
        here = sde_transition("flow_grpo", x, v, sigma, nxt, tree.fwd_noise_level[ids])
        there = sde_transition("flow_grpo", x, goal, sigma, nxt, tree.fwd_noise_level[ids])
        # NLL of the target mean under the model's step, minus its value at the model's own mean
        nll = -(gaussian_log_prob(there.mean, Gaussian(here.mean, here.std))
                - gaussian_log_prob(here.mean, Gaussian(here.mean, here.std)))
    expected = float((nll * targets.fwd_prm_weight[ids]).sum())
    parts = microbatch_loss(tiny_model, cond, tree, targets, ids, config)
    assert parts.prm.item() == pytest.approx(expected, rel=1e-4)
    velocity = microbatch_loss(tiny_model, cond, tree, targets, ids,
                               LossConfig(prm_lambda=1.0, prm_scale="velocity"))
    assert velocity.prm.item() > 10 * parts.prm.item()


def test_score_step_scale_divides_each_steps_terms_by_its_score_scale(tiny_model) -> None:
    from dynamic_treerpo.trainer.core.flow import score_scale

    tree, _, plain, _ = _setup(tiny_model, prm_lambda=0.5)
    config = LossConfig(prm_lambda=0.5, step_scale="score")
    scaled = prepare_targets(tree, tree.leaf_latents.mean(dim=(1, 2, 3)), config)
    kappa = score_scale("flow_grpo", tree.fwd_sigma, tree.fwd_sigma_next, tree.fwd_noise_level)
    torch.testing.assert_close(scaled.edge_weight, plain.edge_weight / kappa[tree.edge_forward])
    torch.testing.assert_close(scaled.fwd_prm_weight, plain.fwd_prm_weight / kappa)
    torch.testing.assert_close(scaled.edge_advantage, plain.edge_advantage)


def _layer_grad_norms(model, step_scale: str) -> list[float]:
    """Gradient norm of the GRPO term of each tree layer alone, for trees at two window starts."""
    norms = []
    for start in (0, 5):
        cfg = TreeConfig(steps=10, window_start=start, depth=2, branching=2, trees_per_prompt=2)
        plan = build_plan(cfg, make_sigmas("shift", 10))
        with torch.no_grad():
            tree = rollout(model, torch.arange(2), plan, [0, 1], LATENT)
        config = LossConfig(prm_lambda=0.0, step_scale=step_scale)
        targets = prepare_targets(tree, tree.leaf_latents.mean(dim=(1, 2, 3)), config)
        model.zero_grad()
        backward_over_tree(model, torch.arange(2), tree, targets, config)
        norms.append(float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()))
    return norms


def test_score_step_scale_keeps_the_gradient_scale_as_the_window_moves(tiny_model) -> None:
    """Moving the window from the first steps to the middle multiplies the plain gradient many
    times over; with ``step_scale: score`` it stays within a small factor."""
    early, late = _layer_grad_norms(tiny_model, "none")
    early_s, late_s = _layer_grad_norms(tiny_model, "score")
    assert late / early > 4.0
    assert late_s / early_s < (late / early) / 3.0


def test_renoise_layer_tuning_is_flow_matching_on_the_best_leaf(tiny_model) -> None:
    """``renoise``: one extra row per (prompt, layer), the best leaf noised afresh at the layer's
    sigma, regressed onto ``eps - x0*``; a step on it lowers that flow-matching loss."""
    from dynamic_treerpo.trainer.core.losses import renoised, velocity_mse

    tree, cond, targets, config = _setup(tiny_model, prm_lambda=1.0, prm_target="renoise",
                                         prm_scale="velocity")
    best = (targets.fwd_prm_weight > 0).nonzero().flatten()
    assert best.numel() == tree.num_prompts * 2  # one best node per prompt and trained layer
    targets.edge_weight.zero_()

    def fm_loss() -> float:
        x, goal = renoised(targets.best_x0[tree.fwd_prompt[best]], targets.renoise[best],
                           tree.fwd_sigma[best])
        with torch.no_grad():
            v = tiny_model(x, tree.fwd_sigma[best], tree.fwd_prompt[best])
        return float((velocity_mse(v, goal) * targets.fwd_prm_weight[best]).sum())

    before = fm_loss()
    stats = backward_over_tree(tiny_model, cond, tree, targets, config)
    assert stats.prm_loss == pytest.approx(before, rel=1e-5)
    assert stats.train_nfe == targets.train_forwards.numel() + best.numel()
    with torch.no_grad():
        for p in tiny_model.parameters():
            p -= 1e-2 * p.grad
    assert fm_loss() < before
