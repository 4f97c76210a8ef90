"""Each baseline's published recipe, every value pinned to the anchor's file and line.

Commits read: Flow-GRPO yifan123/flow_grpo@ac4c86e (Fast: @9745241, where it first appears),
DanceGRPO XueZeyue/DanceGRPO@15cc71d, MixGRPO Tencent-Hunyuan/MixGRPO@e5cdd6a, BranchGRPO
Fredreic1849/BranchGRPO@19fbb9f, DiffusionNFT NVlabs/DiffusionNFT@24af555, AWM
scxue/advantage_weighted_matching@be51372, DGPO Luo-Yihong/DGPO@01ceb4b. The departures that remain
are listed, with their reasons, in docs/algorithm.md ("Baselines").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dynamic_treerpo.trainer.bench.protocol.bed import TASKS, bed_overrides
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.published import published_ema, published_loss, published_updates
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.core.advantages import leaf_advantages, normalise_in_groups
from dynamic_treerpo.trainer.core.awm import (
    AWMConfig,
    awm_policy_loss,
    ghuber_log_likelihood,
    matching_error,
    scaled_advantage,
    slow_copy_decay,
    timestep_buckets,
)
from dynamic_treerpo.trainer.core.dgpo import DGPOConfig, dgpo_loss, outside_trust_region
from dynamic_treerpo.trainer.core.dgpo import draw_timesteps as dgpo_timesteps
from dynamic_treerpo.trainer.core.ema import ParameterEMA, ema_decay
from dynamic_treerpo.trainer.core.flow import Gaussian, gaussian_log_prob, make_sigmas
from dynamic_treerpo.trainer.core.nft import nft_loss, old_policy_decay, reward_weight, train_timesteps
from dynamic_treerpo.trainer.core.objective import LossConfig, edge_weights, prepare_targets
from dynamic_treerpo.trainer.core.strategies import (
    BranchGRPOConfig,
    DiffusionNFTConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    branchgrpo_plan,
    build_plan,
    closed_form,
    compressed_tail_steps,
    flow_grpo_plan,
)
from dynamic_treerpo.trainer.core.tree import rollout
from dynamic_treerpo.trainer.rewards.mix import RewardMix
from dynamic_treerpo.trainer.training.awm import awm_backward, awm_rows
from dynamic_treerpo.trainer.training.dgpo import dgpo_backward, dgpo_noise, group_blocks
from dynamic_treerpo.trainer.training.distributed import Dist
from dynamic_treerpo.trainer.training.loop import Trainer
from dynamic_treerpo.trainer.training.nft import OldPolicy, nft_noise
from dynamic_treerpo.trainer.training.plans import iteration_plan

DEFAULT_YAML = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def _config(strategy: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"strategy={strategy}"])


def _zero_velocity(x: torch.Tensor, sigma: torch.Tensor, cond: object) -> torch.Tensor:
    return torch.zeros_like(x)


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


def test_flow_grpo_fast_draws_one_window_per_iteration_for_every_image() -> None:
    """Listed departure (docs/algorithm.md, "Baselines"): the anchor draws the start per pipeline call
    (sd3_pipeline_with_logprob_fast.py@9745241:136-139), a call being one GPU's 9 images; here one
    plan serves the iteration's rollout, so every image of every prompt has the same window."""
    config = load_config(TrainConfig, DEFAULT_YAML, ["strategy=flow_grpo_fast"])
    sigmas = make_sigmas("shift", 10)
    plan = iteration_plan(config, sigmas, 3)
    tree = rollout(_zero_velocity, None, plan, [5, 6, 7], (1, 2, 2))
    steps = [set(tree.edge_step[tree.edge_prompt == p].tolist()) for p in range(3)]
    start = plan.window_start
    assert steps == [set(range(start, start + 3))] * 3
    assert tree.edge_step.numel() == 3 * 8 * 3  # 8 images a prompt, each 3 trained steps
    starts = {iteration_plan(config, sigmas, i).window_start for i in range(40)}
    assert starts == {0, 1, 2}  # the anchor's range at 10 steps, drawn anew each iteration
    assert iteration_plan(config, sigmas, 3) == plan  # from (seed, iteration): a resumed run repeats it


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


# ---------------------------------------------------------------- 3b. A reward mix under the global std
RAW_MIX = ("flow_grpo", "flow_grpo_fast", "diffusionnft", "awm")


def _taste_mix(strategy: str) -> tuple[TrainConfig, RewardMix]:
    """The protocol's taste task (its own reward mix: scene 0.5, larger_objects 0.5) on ``strategy``."""
    config = load_config(TrainConfig, DEFAULT_YAML, [f"strategy={strategy}", *TASKS["taste"]])
    mix = RewardMix(config.reward, config.effective_reward_weights)
    assert [(t.name, t.weight) for t in mix.terms] == [("scene", 0.5), ("function", 0.5)]
    return config, mix


def _taste_scores(prompts: int, per_prompt: int) -> dict[str, torch.Tensor]:
    """Scene and taste scores whose prompts differ in mean (the between-prompt spread) and whose
    scales differ (the taste's spread ~4x the scene's)."""
    gen = torch.Generator().manual_seed(11)
    offset = torch.linspace(0.0, 0.6, prompts).repeat_interleave(per_prompt)
    scene = (0.3 + offset + 0.05 * torch.randn(prompts * per_prompt, generator=gen)).clamp(0, 1)
    taste = (0.2 + 0.5 * offset.flip(0) + 0.2 * torch.rand(prompts * per_prompt, generator=gen)).clamp(0, 1)
    return {"reward_scene": scene, "reward_function": taste}


@pytest.mark.parametrize("strategy", RAW_MIX)
def test_a_reward_mix_is_summed_raw_before_the_global_std(strategy: str) -> None:
    """flow_grpo@ac4c86e flow_grpo/rewards.py:393-400 (DiffusionNFT@24af555 :295-302): ``avg`` is the
    weighted sum of the raw scores; stat_tracking.py:27 (DiffusionNFT's :28): A = (r - mean of its
    prompt) / (np.std of every r + 1e-4)."""
    config, mix = _taste_mix(strategy)
    loss = config.effective_loss
    assert loss.reward_mix == "auto" and loss.mix_rule == "raw"
    plan = build_plan(config.strategy_config, make_sigmas("shift", config.strategy_config.steps), seed=1)
    tree = rollout(_zero_velocity, None, plan, [1, 2, 3], (1, 2, 2))
    prompts, per_prompt = tree.num_prompts, tree.leaves_per_prompt
    scores = _taste_scores(prompts, per_prompt)
    leaf_prompt = tree.node_prompt[tree.leaf_node]
    # the trainer's path (loop.py rollout_and_score): training_signal by the loss's rule, then targets
    values = mix.training_signal(scores, leaf_prompt, loss.mix_rule)
    targets = prepare_targets(tree, values, loss)
    r_mix = 0.5 * scores["reward_scene"].double().numpy() + 0.5 * scores["reward_function"].double().numpy()
    means = r_mix.reshape(prompts, per_prompt).mean(axis=1).repeat(per_prompt)
    expected = (r_mix - means) / (np.std(r_mix) + 1e-4)
    assert np.abs(expected).max() < 5.0  # below the clip, so the values are compared as they are
    got = leaf_advantages(tree, targets.leaf_value, None, loss.advantage_scale, loss.advantage_std,
                          ddof=loss.std_ddof, eps=loss.std_eps)  # DiffusionNFT's (loop.py _nft_update)
    assert np.allclose(got.double().numpy(), expected, atol=1e-5)
    assert np.allclose(targets.leaf_value.double().numpy(), r_mix, atol=1e-6)  # the evaluated ``reward``
    if strategy.startswith("flow_grpo"):  # Flow-GRPO's edges: the last SDE edge of each image is its leaf's
        last = torch.isin(tree.edge_child, tree.leaf_node)
        leaf_pos = {int(n): i for i, n in enumerate(tree.leaf_node.tolist())}
        pos = [leaf_pos[int(n)] for n in tree.edge_child[last].tolist()]
        assert np.allclose(targets.edge_advantage[last].double().numpy(), expected[pos], atol=1e-5)
    # the same from the two reward columns and their weights (prepare_targets' own combination)
    stacked = torch.stack([scores["reward_scene"], scores["reward_function"]], dim=1)
    direct = prepare_targets(tree, stacked, loss, reward_weights=torch.tensor([0.5, 0.5]))
    assert torch.allclose(direct.leaf_value, targets.leaf_value, atol=1e-6)
    # the per-term rule would have lost the spread between prompts the anchors keep in the std
    per_term = mix.training_signal(scores, leaf_prompt, "normalised")
    assert not torch.allclose(per_term, targets.leaf_value, atol=1e-3)


def test_dgpo_sums_a_reward_mix_raw_then_divides_by_the_prompts_std() -> None:
    """DGPO@01ceb4b flow_grpo/rewards.py:492-499 (the raw weighted sum) and stat_tracking.py:25-31 with
    global_std False (config/dgpo.py:78): A = (r - mean of its prompt) / (np.std of its prompt + 1e-4)."""
    config, mix = _taste_mix("dgpo")
    loss = config.effective_loss
    assert loss.mix_rule == "raw" and loss.advantage_std == "group"
    plan = build_plan(config.strategy_config, make_sigmas("shift", config.strategy_config.steps))
    tree = rollout(_zero_velocity, None, plan, [1, 2, 3], (1, 2, 2))
    prompts, per_prompt = tree.num_prompts, tree.leaves_per_prompt
    scores = _taste_scores(prompts, per_prompt)
    values = mix.training_signal(scores, tree.node_prompt[tree.leaf_node], loss.mix_rule)
    targets = prepare_targets(tree, values, loss)
    got = leaf_advantages(tree, targets.leaf_value, None, loss.advantage_scale, loss.advantage_std,
                          ddof=loss.std_ddof, eps=loss.std_eps)
    r_mix = (0.5 * scores["reward_scene"].double() + 0.5 * scores["reward_function"].double()).numpy()
    r = r_mix.reshape(prompts, per_prompt)
    expected = ((r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + 1e-4)).ravel()
    assert np.allclose(got.double().numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("strategy",
                         ("mixgrpo", "mixgrpo_flash", "dancegrpo", "branchgrpo", "dynamic_treerpo"))
def test_a_reward_mix_is_normalised_per_term_elsewhere(strategy: str) -> None:
    """MixGRPO (its multi-reward rule, finetune_flux_grpo_MixGRPO.sh:62 ``advantage_aggr``) and the
    tree: each reward normalised within its prompt's images, then weighted. DanceGRPO's and BranchGRPO's
    scripts score one reward, so they keep the shared rule."""
    config, mix = _taste_mix(strategy)
    assert config.effective_loss.mix_rule == "normalised"
    scores = _taste_scores(3, 8)
    groups = torch.arange(3).repeat_interleave(8)
    got = mix.training_signal(scores, groups, config.effective_loss.mix_rule)

    def z(x: torch.Tensor) -> np.ndarray:
        a = x.double().numpy().reshape(3, 8)
        return ((a - a.mean(axis=1, keepdims=True)) / (a.std(axis=1, keepdims=True) + 1e-8)).ravel()

    expected = 0.5 * z(scores["reward_scene"]) + 0.5 * z(scores["reward_function"])
    assert np.allclose(got.double().numpy(), expected, atol=1e-5)


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
    weights = edge_weights(tree, "transition")
    trained = weights[tree.edge_train]
    assert torch.allclose(trained, torch.full_like(trained, 1.0 / trained.numel()))
    layer = edge_weights(tree, "layer")[tree.edge_train]
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


def test_mixgrpo_window_is_the_trees_depth_on_the_benchmarks_10_steps() -> None:
    """Listed departure (docs/algorithm.md, "Baselines"): the anchor's window is 4 of 25 steps
    (finetune_flux_grpo_MixGRPO.sh:54 sampling_steps 25, :58 group_size 4, read by
    train_grpo_flux.py:916-919); at the benchmark's 10 steps it is the tree's depth, 3, as the anchors'
    own pair has it at 25 (the paper's depth 4, MixGRPO's window 4)."""
    anchor = MixGRPOConfig()
    assert (anchor.steps, anchor.window_size) == (25, 4)
    for strategy in ("mixgrpo", "mixgrpo_flash"):
        config = load_config(TrainConfig, DEFAULT_YAML, [*bed_overrides(False, None), f"strategy={strategy}"])
        mix = config.strategy_config
        assert (mix.steps, mix.window_size) == (10, 3) == (config.tree.steps, config.tree.depth)
        plan = iteration_plan(config, make_sigmas("shift", 10), 0)
        assert sum(op.train for op in plan.ops) == 3
    assert TrainConfig().mixgrpo.window_size == 3  # the defaults without the YAML, the same
    assert round(4 / 25 * 10) == 2  # the proportional window it departs from


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


def _anchor_ema(updates: int, calls: int, every: int, value_at: list[float]) -> list[float]:
    """The anchors' order written out: ``calls`` micro-batches per optimizer step, the EMA stepped after
    each with ``global_step`` the steps done (flow_grpo@ac4c86e train_sd3.py:952 and 954-955;
    DiffusionNFT@24af555 train_nft_sd3.py:1021-1029 with one call a step), averaging when
    ``(global_step + 1) % every == 0`` with min((1 + n) / (10 + n), 0.9) (flow_grpo/ema.py:33-49).
    Returns the average after each optimizer step (its last micro-batch's call)."""
    shadow, weight, global_step, out = 0.0, value_at[0], 0, []
    for _ in range(updates):
        for micro in range(calls):
            if micro == calls - 1:  # the step's last micro-batch: the optimizer steps
                global_step += 1
                weight = value_at[global_step]
            if (global_step + 1) % every == 0:
                d = min((1 + global_step) / (10 + global_step), 0.9)
                shadow += (1 - d) * (weight - shadow)
        out.append(shadow)
    return out


@pytest.mark.parametrize("strategy", ("flow_grpo", "flow_grpo_fast", "diffusionnft"))
def test_the_trainers_ema_is_stepped_as_the_anchor_steps_it(strategy: str) -> None:
    published = published_ema(strategy)
    calls = 1 if strategy == "diffusionnft" else 2  # config/grpo.py:83,88: 4 batches a GPU, 2 updates
    assert published.per_update == calls
    p = torch.nn.Parameter(torch.zeros(1))
    trainer = Trainer.__new__(Trainer)  # only what _apply_update reads: the optimizer, the EMA, the counts
    trainer.optimizer = torch.optim.SGD([p], lr=1.0)
    trainer.ema = ParameterEMA([p], published.decay, published.every, published.per_update)
    trainer.dist, trainer.optimizer_steps, trainer.skipped_in_a_row = Dist(), 0, 0
    updates = 33  # past the 8-step interval's turns at 7, 15, 23 and 31
    value_at = [float(k * k) for k in range(updates + 1)]  # the weight after k optimizer steps
    ours = []
    for k in range(1, updates + 1):
        p.grad = torch.tensor([value_at[k - 1] - value_at[k]])
        assert trainer._apply_update(torch.tensor(1.0), 0.0)
        ours.append(float(trainer.ema.shadow[0]))
    expected = _anchor_ema(updates, calls, published.every, value_at)
    assert ours == pytest.approx(expected, rel=1e-5)
    if strategy != "diffusionnft":  # first moved after the 7th step, twice toward its weights
        assert ours[5] == 0.0 and ours[6] > 0.0
        d = ema_decay(7, 0.9)
        assert ours[7] == pytest.approx(value_at[7] * (1 - d * d), rel=1e-5)


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

# ---------------------------------------------------------------- AWM (advantage_weighted_matching@be51372)
def test_awm_values_are_its_geneval_sd3_config() -> None:
    """config/dgx_awm.py, geneval_sd3_no_cfg_1node (C) and config/base_awm.py (B)."""
    c = AWMConfig()
    assert c.group_size == 24  # C:45 num_image_per_prompt
    assert c.noise_level == 0.4  # C:48
    assert (c.noise_low, c.noise_high) == (0.3, 0.9)  # sd3_pipeline_with_logprob.py:296 tau window
    assert c.train_timesteps == 6 and c.timestep_fraction == 0.9  # C:56, C:60
    assert c.power == 0.25  # C:63-64 ghuber, p 0.25
    assert c.adv_clip == 5.0 and c.advantage_max == 1.0  # B:91, C:58
    assert c.kl_beta == 0.001 and c.slow_kl_beta == 1.0  # C:55, C:67
    assert (c.slow_decay_rate, c.slow_decay_cap) == (0.001, 0.3)  # C:66, C:68 (linear)
    assert published_updates("awm") == 1  # C:51-54: accumulation over the epoch's 72 micro-batches
    ema = published_ema("awm")
    assert ema.enabled and ema.decay == 0.99 and ema.every == 1  # C:91-92, stepped at T:1391-1392
    assert ema.per_update == 1  # once per epoch, after its one optimizer step
    loss = _config("awm").effective_loss
    # flow_grpo/stat_tracking.py:27-28 with global_std True (C:72): (r - prompt mean) / (std(all) + 1e-4)
    assert loss.advantage == "leaf" and loss.advantage_std == "global"
    assert loss.std_ddof == 0 and loss.std_eps == 1e-4


def test_awm_noise_level_buckets_leave_out_the_first_step() -> None:
    """T:1197-1205: linspace(1, int(14 * 0.9), 7).long() bounds, one index drawn from each bucket."""
    assert timestep_buckets(14, 6, 0.9) == [(1, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    assert timestep_buckets(10, 6, 0.9) == [(1, 2), (2, 3), (3, 5), (5, 6), (6, 7), (7, 9)]
    with pytest.raises(ValueError, match="train_timesteps 6"):
        AWMConfig(steps=6)


def test_awm_plan_is_an_sde_only_inside_its_noise_window() -> None:
    sigmas = make_sigmas("shift", 10)
    plan = build_plan(AWMConfig(steps=10, group_size=4), sigmas)
    assert plan.roots_per_prompt == 4 and not plan.shared_root_noise
    for op in plan.ops:
        inside = 0.3 <= op.sigma <= 0.9 and op.sigma_next > 0
        assert op.solver == ("sde" if inside else "dpm2m")
        assert not op.train and (op.noise_level == 0.4 if inside else op.noise_level == 0.0)
    assert any(op.solver == "sde" for op in plan.ops) and any(op.solver == "dpm2m" for op in plan.ops)


def test_awm_loss_is_the_advantage_times_the_ghuber_log_likelihood() -> None:
    """T:237-239 (error in float64), T:248-249 (ghuber), T:1282-1284 (on policy: ratio 1),
    T:1293-1299 (clip at 5, scale to [-1, 1]), T:1316-1327 (-A ratio)."""
    assert torch.allclose(scaled_advantage(torch.tensor([-9.0, -2.5, 0.0, 5.0, 7.0])),
                          torch.tensor([-1.0, -0.5, 0.0, 1.0, 1.0]))
    error = torch.tensor([0.04, 0.25], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0.5, 0.9])
    logp = ghuber_log_likelihood(error, t, 0.25)
    expected = -t.double() * ((error.detach() + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25
    assert torch.allclose(logp.detach(), expected)
    a = torch.tensor([0.6, -0.4])
    loss = awm_policy_loss(logp, a)
    assert torch.allclose(loss.detach(), -a.double())  # the value is -A: the ratio is 1
    loss.sum().backward()
    # d/de of -A * (-t ((e + eps)^p - eps^p) / p) = A t (e + eps)^(p - 1)
    grad = a.double() * t.double() * (error.detach() + 1e-10) ** (0.25 - 1.0)
    assert torch.allclose(error.grad, grad)
    x0, noise, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    assert matching_error(v, x0, noise).dtype == torch.float64
    assert torch.allclose(matching_error(v, x0, noise).float(), ((v - (noise - x0)) ** 2).mean(dim=(1, 2)))


def test_slow_copy_decay_is_linear_then_capped() -> None:
    """AWM C:66,68 (kl_ema_decay 0.3, linear) and DGPO T:1175-1177: min(0.3, 0.001 step)."""
    assert slow_copy_decay(0) == 0.0 and slow_copy_decay(100) == pytest.approx(0.1)
    assert slow_copy_decay(300) == pytest.approx(0.3) and slow_copy_decay(5000) == 0.3


def _linear_tree(config, prompts: int = 2):
    weight = torch.nn.Parameter(torch.tensor(0.3))

    def velocity(x, sigma, cond):
        return weight * x

    plan = build_plan(config, make_sigmas("shift", config.steps))
    tree = rollout(velocity, None, plan, list(range(prompts)), (2, 2))
    return weight, velocity, tree


def test_awm_backward_matches_its_loss_by_hand() -> None:
    config = AWMConfig(steps=10, group_size=3)
    weight, velocity, tree = _linear_tree(config)
    sigmas = make_sigmas("shift", 10)
    advantages = torch.tensor([2.0, -1.0, -1.0, 0.5, 0.5, -1.0])
    slow = OldPolicy([weight])
    with torch.no_grad():
        slow.values = [torch.tensor(0.1)]

    def reference(x, sigma, cond):
        return 0.2 * x

    stats = awm_backward(velocity, None, tree, advantages, sigmas, config, slow, reference, 0, 0, 4)
    got = weight.grad.clone()
    weight.grad = None
    leaf, step = awm_rows(tree, config, 0, 0)
    assert leaf.numel() == 6 * 6 and stats.rows == 36 and stats.nfe == 36 * 3
    assert stats.nfe == closed_form(config).train_nfe * 2  # two prompts
    # each image trains one noise level from each bucket
    for image in range(6):
        levels = sorted(step[leaf == image].tolist())
        buckets = timestep_buckets(10, 6, 0.9)
        assert all(low <= s < high for s, (low, high) in zip(levels, buckets, strict=True))
    noise = nft_noise(36, (2, 2), 0, 0, 0, leaf, 3)
    x0 = tree.leaf_latents[leaf].float()
    t = sigmas[step].float()
    x_t = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
    v = weight * x_t
    error = ((v.double() - (noise - x0).double()) ** 2).mean(dim=(1, 2))
    logp = -t.double() * ((error + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25
    a = (advantages.clamp(-5, 5) / 5)[leaf]
    loss = (-a.double() * logp).mean() + 0.001 * ((v - 0.2 * x_t) ** 2).mean(dim=(1, 2)).mean() \
        + 1.0 * ((v - 0.1 * x_t) ** 2).mean(dim=(1, 2)).mean()
    loss.backward()
    assert torch.allclose(got, weight.grad.float(), rtol=1e-4)


# ---------------------------------------------------------------- DGPO (DGPO@01ceb4b)
def test_dgpo_values_are_its_geneval_sd3_config() -> None:
    """config/dgpo.py (D), geneval_sd3, and scripts/train_sd3_dgpo.py (T)."""
    c = DGPOConfig()
    assert c.group_size == 16  # D:67
    assert c.train_timesteps == 4 and c.max_train_step == 4  # D:28, D:64 trunc_steps
    assert c.beta_dpo == 100.0  # D:88
    assert c.clip == 0.01 and c.kl_beta == 0.02  # D:59, D:63
    assert c.switch_step == 500 and c.shared_noise  # D:61, D:30
    assert (c.slow_decay_rate, c.slow_decay_cap) == (0.001, 0.3)  # T:1175-1177
    assert published_updates("dgpo") == 1  # D:73-74: accumulation over every (batch, noise level)
    ema = published_ema("dgpo")
    assert ema.enabled and ema.decay == 0.9 and ema.every == 8  # T:627, evaluated at 391-392
    assert ema.per_update == 2  # called per training batch (T:1214-1215), 2 batches a step (D:67-70)
    loss = _config("dgpo").effective_loss
    # stat_tracking.py:25-31 with global_std False (D:78): the prompt's own population std + 1e-4
    assert loss.advantage == "leaf" and loss.advantage_std == "group"
    assert loss.std_ddof == 0 and loss.std_eps == 1e-4
    plan = build_plan(_config("dgpo").strategy_config, make_sigmas("shift", 10))
    assert all(op.solver == "dpm2m" for op in plan.ops)  # T:557-559 DPM-Solver++, no SDE


def test_dgpo_draws_distinct_noise_levels_from_the_first_steps() -> None:
    """T:52-74: random.sample(range(trunc_steps + 1), 4), one draw for every image."""
    seen = set()
    for seed in range(50):
        levels = dgpo_timesteps(DGPOConfig(), seed)
        assert len(set(levels)) == 4 and all(0 <= s <= 4 for s in levels)
        seen.update(levels)
    assert seen == {0, 1, 2, 3, 4}


def test_dgpo_gradient_is_the_group_log_sigmoid_loss() -> None:
    """T:162-193: loss sigmoid(s_g) A e has the gradient of (G / beta) (-log sigmoid(-s_g)),
    s_g = sum_i A_i beta (e_i - e_ref_i) / G."""
    config = DGPOConfig(group_size=3, beta_dpo=2.0, clip=10.0)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    a = torch.tensor([1.0, -0.5, -0.5, 0.2, 0.3, -0.5], dtype=torch.float64)
    ref = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    e = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    dgpo_loss(a, e, ref, e.detach(), groups, config).sum().backward()
    got = e.grad.clone()
    e.grad = None
    s = torch.stack([(a * 2.0 * (e - ref) / 3)[groups == g].sum() for g in (0, 1)])
    ((3 / 2.0) * -torch.nn.functional.logsigmoid(-s)).sum().backward()
    assert torch.allclose(got, e.grad)


def test_dgpo_trust_region_stops_the_gradient_of_a_row_that_moved_too_far() -> None:
    """T:1133-1144: ratio exp(e_old - e) > 1 + c for A > 0 (or < 1 - c for A <= 0): e detached."""
    a = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    old = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    e = torch.tensor([0.3, 0.499, 0.7, 0.501], dtype=torch.float64)
    assert outside_trust_region(a, e, old, 0.01).tolist() == [True, False, True, False]
    e.requires_grad_(True)
    dgpo_loss(a, e, old, old, torch.zeros(4, dtype=torch.long), DGPOConfig(group_size=4)).sum().backward()
    assert e.grad[0] == 0 and e.grad[2] == 0 and e.grad[1] != 0 and e.grad[3] != 0


def test_dgpo_micro_batches_hold_whole_groups_and_share_their_noise() -> None:
    assert group_blocks(5, 4, 8) == [range(0, 2), range(2, 4), range(4, 5)]
    assert group_blocks(3, 16, 8) == [range(0, 1), range(1, 2), range(2, 3)]  # never split a group
    prompts, places = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
    shared = dgpo_noise((2, 2), prompts, places, 3, 0, 0, 0, True)
    assert torch.equal(shared[0], shared[1]) and not torch.equal(shared[0], shared[2])
    own = dgpo_noise((2, 2), prompts, places, 3, 0, 0, 0, False)
    assert not torch.equal(own[0], own[1])


def test_dgpo_backward_counts_three_forwards_a_row() -> None:
    config = DGPOConfig(steps=10, group_size=3)
    weight, velocity, tree = _linear_tree(config)
    stats = dgpo_backward(velocity, None, tree, torch.tensor([1.0, -0.5, -0.5, 0.2, 0.3, -0.5]),
                          make_sigmas("shift", 10), config, OldPolicy([weight]), lambda x, s, c: 0.2 * x,
                          0, 0, 4)
    assert stats.rows == 6 * 4 and stats.nfe == 3 * 24 == 2 * closed_form(config).train_nfe
    assert weight.grad is not None and weight.grad != 0


def test_dgpo_needs_a_lora() -> None:
    with pytest.raises(ValueError, match=r"dgpo .* needs a LoRA"):
        load_config(TrainConfig, None, ["strategy=dgpo", "lora.enabled=false"])
