"""Each baseline's published recipe, every value pinned to the anchor's file and line.

Commits read: Flow-GRPO yifan123/flow_grpo@ac4c86e (Fast: @9745241, where it first appears),
DanceGRPO XueZeyue/DanceGRPO@15cc71d, MixGRPO Tencent-Hunyuan/MixGRPO@e5cdd6a, BranchGRPO
Fredreic1849/BranchGRPO@19fbb9f, DiffusionNFT NVlabs/DiffusionNFT@24af555. The departures that remain
are listed, with their reasons, in docs/algorithm.md ("Baselines").
"""

from __future__ import annotations

import math

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.published import published_ema, published_loss, published_updates
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.core.advantages import leaf_advantages, normalise_in_groups
from dynamic_treerpo.trainer.core.ema import ParameterEMA, ema_decay
from dynamic_treerpo.trainer.core.flow import Gaussian, gaussian_log_prob, make_sigmas
from dynamic_treerpo.trainer.core.nft import nft_loss, old_policy_decay, reward_weight, train_timesteps
from dynamic_treerpo.trainer.core.objective import LossConfig, _edge_weights
from dynamic_treerpo.trainer.core.strategies import (
    BranchGRPOConfig,
    DiffusionNFTConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    branchgrpo_plan,
    build_plan,
    compressed_tail_steps,
    flow_grpo_plan,
)
from dynamic_treerpo.trainer.core.tree import rollout


def _config(strategy: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"strategy={strategy}"])


# ---------------------------------------------------------------- 1. Flow-GRPO-Fast (flow_grpo@9745241)
def test_flow_grpo_fast_is_its_geneval_fast_config() -> None:
    fast = FlowGRPOConfig(steps=10, fast=True)
    assert fast.fast_sde_steps == 3  # config/grpo.py:189 sde_window_size 3
    assert fast.fast_noise_level == 0.8  # config/grpo.py:188 noise_level 0.8
    assert fast.fast_sde_kind == "cps"  # config/grpo.py:191 sde_type "cps"
    # config/grpo.py:190 sde_window_range (0, num_steps // 2); sd3_pipeline_with_logprob_fast.py:136-139
    # start = random.randint(r0, r1 - size): at 10 steps in [0, 2]
    assert fast.max_window_start == 10 // 2 - 3 == 2
    starts = set()
    for seed in range(200):
        plan = flow_grpo_plan(fast, make_sigmas("shift", 10), seed=seed)
        sde = [i for i, op in enumerate(plan.ops) if op.solver == "sde"]
        assert len(sde) == 3 and sde == list(range(sde[0], sde[0] + 3))
        assert all(plan.ops[i].train and plan.ops[i].noise_level == 0.8 for i in sde)
        assert plan.sde_kind == "cps" and plan.log_prob_form == "unnormalised"
        starts.add(sde[0])
    assert starts == {0, 1, 2}


def test_flow_grpo_fast_loss_has_its_clip_and_no_kl() -> None:
    loss = _config("flow_grpo_fast").effective_loss
    assert loss.clip.mode == "fixed" and loss.clip.fixed == 1e-5  # config/grpo.py:185 clip_range 1e-5
    assert loss.kl_beta == 0.0  # config/grpo.py:186 beta 0: no reference forwards
    assert loss.advantage_std == "global"  # config/grpo.py:187 global_std True


def test_cps_log_probability_is_unnormalised_as_published() -> None:
    """sd3_sde_with_logprob.py@9745241:85-89: log_prob = -(x - mean)^2, mean over elements, "remove all
    constants": no 1 / (2 std^2), no log std."""
    mean, x = torch.zeros(2, 3, 4), torch.full((2, 3, 4), 0.5)
    dist = Gaussian(mean, torch.tensor([0.1, 0.2]))
    assert torch.allclose(gaussian_log_prob(x, dist, "mean", "unnormalised"), torch.full((2,), -0.25))
    normal = gaussian_log_prob(x, dist, "mean", "gaussian")
    assert not torch.allclose(normal, torch.full((2,), -0.25))


# ---------------------------------------------------------------- 2. Flow-GRPO KL (flow_grpo@ac4c86e)
def test_flow_grpo_kl_is_its_own_form_and_beta() -> None:
    loss = _config("flow_grpo").effective_loss
    assert loss.kl_beta == 0.04  # config/grpo.py:91 (geneval_sd3) beta 0.04
    assert loss.kl_form == "flow_grpo"  # scripts/train_sd3.py:894-897: / (2 * std_dev_t**2), no dt
    assert loss.clip.fixed == 1e-4  # config/base.py:86 clip_range 1e-4


def test_flow_grpo_kl_form_is_one_over_d_of_the_step_kl() -> None:
    from dynamic_treerpo.trainer.core.flow import gaussian_kl_same_std, sde_transition

    x, v, v_ref = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    sigma, sigma_next = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0.8, 0.5, 0.2])
    a = sde_transition("flow_grpo", x, v, sigma, sigma_next, 0.7)
    b = sde_transition("flow_grpo", x, v_ref, sigma, sigma_next, 0.7)
    step_kl = gaussian_kl_same_std(a.mean, b.mean, a.std)
    anchor = gaussian_kl_same_std(a.mean, b.mean, a.std / (sigma - sigma_next).sqrt())
    assert torch.allclose(anchor, step_kl * (sigma - sigma_next), rtol=1e-5)


# ---------------------------------------------------------------- 3. Flow-GRPO global std
def test_flow_grpo_global_std_is_over_every_raw_reward() -> None:
    """stat_tracking.py@ac4c86e:27: A = (r - mean of its prompt) / (np.std(all rewards) + 1e-4)."""
    rewards = torch.tensor([0.1, 0.3, 0.2, 0.9, 1.0, 0.8])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    loss = _config("flow_grpo").effective_loss
    assert loss.std_eps == 1e-4 and loss.std_ddof == 0
    got = normalise_in_groups(rewards, groups, None, "std", torch.zeros(6, dtype=torch.long),
                              ddof=loss.std_ddof, eps=loss.std_eps, raw_std=True)
    mean = torch.tensor([0.2, 0.2, 0.2, 0.9, 0.9, 0.9])
    expected = (rewards - mean) / (rewards.std(unbiased=False) + 1e-4)
    assert torch.allclose(got, expected, atol=1e-6)


# ---------------------------------------------------------------- 4. BranchGRPO (19fbb9f)
def test_branchgrpo_splits_noise_and_loss_are_published() -> None:
    config = BranchGRPOConfig(steps=20, splits=4)
    # scripts/finetune/finetune_flux_branchgrpo_8gpus.sh:28 --split_points "0,3,6,9" of 20 steps (:82)
    assert config.split_steps == (0, 3, 6, 9)
    assert BranchGRPOConfig(steps=10, splits=3).split_steps == (0, 2, 3)  # the same 0.15 T spacing
    assert config.split_noise_scale == 4.0 and config.eta == 0.3  # .sh:29 and :83
    plan = branchgrpo_plan(config, make_sigmas("shift", 20))
    for i, op in enumerate(plan.ops[:-1]):
        # train_branchgrpo_flux.py:271-279: only the drawn noise is scaled; drift and density keep eta
        assert op.noise_level == 0.3
        assert op.noise_scale == (4.0 if i in (0, 3, 6, 9) else 1.0)
    loss = _config("branchgrpo").effective_loss
    assert loss.node_value == "mean"  # train_branchgrpo_flux.py:642-649: mean of the leaf descendants
    assert loss.std_ddof == 1  # :672 r.std(): torch's sample std
    assert loss.flat_std == 1e-6  # :675-676 advantage 0 when std < 1e-6
    assert loss.edge_weighting == "transition"  # :1575 every transition alike
    assert loss.clip.fixed == 1e-3  # .sh:94 --clip_range 1e-3
    assert published_updates("branchgrpo") == 37  # .sh:71 accumulation 12 of 436 transitions a GPU


def test_split_noise_scales_the_sample_not_the_density() -> None:
    config = BranchGRPOConfig(steps=6, splits=1, split_noise_scale=4.0)
    plan = branchgrpo_plan(config, make_sigmas("shift", 6))

    def velocity(x, sigma, cond):
        return torch.zeros_like(x)

    tree = rollout(velocity, None, plan, [3], (2, 4, 4))
    first = tree.edge_step == 0
    spread = (tree.edge_x_child[first] - tree.fwd_x[tree.edge_forward[first]]).std()
    later = tree.edge_step == 1
    spread_later = (tree.edge_x_child[later] - tree.fwd_x[tree.edge_forward[later]]).std()
    assert spread > 2.0 * spread_later  # 4x the noise at the split, eta's elsewhere
    # the stored log-probability is under the base std: far below a 4x-std density's
    assert float(tree.edge_log_prob_old[first].mean()) < float(tree.edge_log_prob_old[later].mean()) - 1.0


def test_transition_weighting_weighs_every_edge_alike() -> None:
    config = BranchGRPOConfig(steps=6, splits=2, split_spacing=0.2)
    plan = branchgrpo_plan(config, make_sigmas("shift", 6))
    tree = rollout(lambda x, s, c: torch.zeros_like(x), None, plan, [0], (1, 2, 2))
    weights = _edge_weights(tree, "transition")
    trained = weights[tree.edge_train]
    assert torch.allclose(trained, torch.full_like(trained, 1.0 / trained.numel()))
    layer = _edge_weights(tree, "layer")[tree.edge_train]
    assert not torch.allclose(layer, trained)  # the paper's reading weighs a split layer's edges less


# ------------------------------------------------------------- 5. DanceGRPO (15cc71d), MixGRPO (e5cdd6a)
def test_dancegrpo_and_mixgrpo_losses_and_updates() -> None:
    for strategy, updates in (("dancegrpo", 3), ("mixgrpo", 4), ("mixgrpo_flash", 4)):
        loss = _config(strategy).effective_loss
        assert loss.std_ddof == 1  # DanceGRPO train_grpo_flux.py:542, MixGRPO :447-449: torch.std
        assert loss.edge_weighting == "transition"  # DanceGRPO :603 / (GA * train_timesteps)
        assert loss.clip.fixed == 1e-4 and loss.adv_clip == 5.0  # finetune_flux_grpo.sh:58-59
        # DanceGRPO finetune_flux_grpo.sh:29,34 (12 samples, accumulation 4); MixGRPO
        # finetune_flux_grpo_MixGRPO.sh:68 (accumulation 3 of 12)
        assert published_updates(strategy) == updates
        assert _config(strategy).effective_updates == updates


def test_mixgrpo_flash_tail_counts_and_history_as_published() -> None:
    # sampling_utils.py@e5cdd6a:44 num_post_steps = int(max((T - l_last) * c, 1)) grid points
    assert compressed_tail_steps(22 - 1, 0.4) == int(22 * 0.4) - 1 == 7  # T=25, window [0, 3]
    assert compressed_tail_steps(7, 0.4) == 2  # T=10, a window of 3 from 0: int(8 * 0.4) - 1
    assert compressed_tail_steps(1, 0.4) == 1  # at least one step
    config = MixGRPOConfig(steps=10, window_size=3, group_size=2, flash=True)
    plan = build_plan(config, make_sigmas("shift", 10), 0)
    assert [op.solver for op in plan.ops] == ["sde"] * 3 + ["dpm2m"] * 2


def test_the_first_tail_step_after_the_window_is_second_order() -> None:
    """sampling_utils.py@e5cdd6a:114-127: the x0 history runs through the window, so the first 2M step
    after an SDE (or Euler) step uses that step's clean-image prediction."""
    from dynamic_treerpo.trainer.core.flow import dpm2m_step, predicted_x0, sde_transition
    from dynamic_treerpo.trainer.core.tree import RolloutPlan, StepOp

    plan = RolloutPlan("probe", (StepOp(0.9, 0.6, "sde", 1, 0.7, train=True), StepOp(0.6, 0.3, "dpm2m"),
                                 StepOp(0.3, 0.0, "dpm2m")), 1)

    def velocity(x, sigma, cond):  # x0 changes with sigma: a second-order step differs from Euler
        return x * (1.0 + sigma.reshape(-1, 1, 1, 1))

    tree = rollout(velocity, None, plan, [5], (1, 2, 2))
    x_start, x_window = tree.fwd_x[:1], tree.edge_x_child[:1]
    prev_x0 = predicted_x0(x_start, velocity(x_start, torch.tensor([0.9]), None), 0.9)
    x0 = predicted_x0(x_window, velocity(x_window, torch.tensor([0.6]), None), 0.6)
    second = dpm2m_step(x_window, x0, 0.6, 0.3, prev_x0, 0.9)
    first = dpm2m_step(x_window, x0, 0.6, 0.3, None, None)
    assert not torch.allclose(second, first)
    last = predicted_x0(second, velocity(second, torch.tensor([0.3]), None), 0.3)
    assert torch.allclose(tree.leaf_latents, last, atol=1e-6)  # the rollout took the second-order step
    assert sde_transition is not None


# ---------------------------------------------------------------- EMA evaluation (Flow-GRPO, DiffusionNFT)
def test_evaluation_averages_as_published() -> None:
    flow = published_ema("flow_grpo")
    assert flow.every == 8 and flow.decay == 0.9  # train_sd3.py:445
    assert published_ema("diffusionnft").every == 1  # train_nft_sd3.py:565-567
    assert not published_ema("mixgrpo").enabled and not published_ema("dancegrpo").enabled
    assert ema_decay(0, 0.9) == pytest.approx(0.1) and ema_decay(1000, 0.9) == 0.9  # ema.py:33-49
    p = torch.nn.Parameter(torch.zeros(3))
    ema = ParameterEMA([p], 0.9, interval=8)
    with torch.no_grad():
        p.fill_(1.0)
    for step in range(7):
        ema.step(step)
    assert float(ema.shadow[0].sum()) == 0.0  # nothing before the 8th step
    ema.step(7)
    d = ema_decay(7, 0.9)
    assert torch.allclose(ema.shadow[0], torch.full((3,), 1.0 - d))
    with ema.applied():
        assert torch.allclose(p.data, torch.full((3,), 1.0 - d))
    assert torch.allclose(p.data, torch.ones(3))


# ---------------------------------------------------------------- DiffusionNFT (NVlabs/DiffusionNFT@24af555)
def test_diffusionnft_values_and_loss() -> None:
    config = DiffusionNFTConfig()
    assert config.beta == 1.0  # config/nft.py:61
    assert config.steps == 10 and config.group_size == 24  # config/nft.py:20, :28-29
    assert config.kl_beta == 1e-4 and config.adv_clip == 5.0  # config/base.py:89 and :84
    assert published_updates("diffusionnft") == 1  # config/nft.py:39-45
    assert old_policy_decay(0) == 0.0 and old_policy_decay(100) == pytest.approx(0.1)
    assert old_policy_decay(10_000) == 0.5  # train_nft_sd3.py:169-189, decay type 1
    assert old_policy_decay(80, 2) == pytest.approx(0.0375)
    # train_nft_sd3.py:928-929: r = clamp(clip(A, -5, 5) / 5 / 2 + 0.5, 0, 1)
    weights = reward_weight(torch.tensor([-9.0, 0.0, 2.5, 9.0]))
    assert torch.allclose(weights, torch.tensor([0.0, 0.5, 0.75, 1.0]))
    steps = train_timesteps(10, 0.99, torch.Generator().manual_seed(0))
    assert steps.numel() == 9 and len(set(steps.tolist())) == 9  # :569 int(10 * 0.99)
    plan = build_plan(_config("diffusionnft").strategy_config, make_sigmas("shift", 10))
    assert all(op.solver == "dpm2m" for op in plan.ops) and not plan.shared_root_noise  # config/nft.py:65-66


def test_nft_loss_matches_its_formula() -> None:
    """train_nft_sd3.py:934-962 written out for one sample: v+ = b v + (1 - b) v_old, v- = (1 + b) v_old
    - b v, x0+- = x_t - t v+-, each error over its own mean |x0+- - x0|, c (r L+ + (1 - r) L-) / b."""
    gen = torch.Generator().manual_seed(1)
    v, v_old, x_t, x0 = (torch.randn(1, 2, 3, 3, generator=gen) for _ in range(4))
    t, r, b = torch.tensor([0.6]), torch.tensor([0.8]), 0.5
    v_plus, v_minus = b * v + (1 - b) * v_old, (1 + b) * v_old - b * v
    x_plus, x_minus = x_t - 0.6 * v_plus, x_t - 0.6 * v_minus
    l_plus = ((x_plus - x0) ** 2).mean() / (x_plus - x0).abs().mean()
    l_minus = ((x_minus - x0) ** 2).mean() / (x_minus - x0).abs().mean()
    expected = 5.0 * (0.8 * l_plus / b + 0.2 * l_minus / b)
    assert float(nft_loss(v, v_old, x_t, x0, t, r, b)) == pytest.approx(float(expected), rel=1e-5)


def test_nft_advantages_use_the_global_std() -> None:
    loss = _config("diffusionnft").effective_loss
    assert loss.advantage_std == "global" and loss.std_eps == 1e-4  # config/base.py:57, stat_tracking.py:27
    assert math.isclose(loss.adv_clip, 5.0)
    assert callable(leaf_advantages)


def test_the_shared_loss_still_gives_the_papers_reading() -> None:
    loss = LossConfig()
    assert loss.edge_weighting == "layer" and loss.kl_form == "step" and loss.std_ddof == 0
    assert published_loss("mixgrpo", loss).prm_lambda == 0.0
