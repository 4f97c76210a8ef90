"""The headless training loop: rollout, reward, advantages, loss, update; logs, checkpoints, exports.

All randomness of iteration ``i`` derives from ``(seed, i)``: prompts, rollout seeds, the plan and
the split of forwards into updates. With the LoRA and optimizer state restored, a resumed run
repeats exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config.schema import TrainConfig
from ..core.advantages import leaf_advantages
from ..core.awm import AWMConfig, slow_copy_decay
from ..core.dgpo import DGPOConfig
from ..core.losses import clip_bounds
from ..core.objective import LossConfig, TrainTargets, backward_over_tree, layer_groups, prepare_targets
from ..core.tree import RolloutPlan, Tree, keyed_generator, rollout
from ..lora.adapters import load_lora_state, lora_state_dict, set_adapters_enabled
from ..lora.files import save_lora_files
from ..lora.full_export import save_full_transformer
from ..lora.keys import COMFYUI_PREFIX, DIFFUSERS_MODEL_PREFIX
from ..models.policy import Policy
from ..rewards.mix import RewardMix
from .awm import awm_backward
from .build import build_reward, build_run
from .dgpo import dgpo_backward
from .distributed import (
    Dist,
    full_state,
    gather,
    load_full_state,
    load_optimizer_state,
    optimizer_state,
    reduce_max,
    reduce_sum,
    shard,
    sum_over_ranks,
)
from .evaluate import drift_loss, evaluate
from .nft import nft_backward
from .plans import iteration_plan, iteration_seeds

COLUMNS = (
    "iteration", "strategy", "window_start", "reward_mean", "reward_std", "reward_max",
    "exact_mean", "eval_reward", "eval_exact", "eval_colour", "eval_shape", "eval_position",
    "eval_count", "drift", "loss", "grpo_loss", "prm_loss", "prm_weight", "kl",
    "clip_frac", "clip_scale", "ratio_dev_max", "grad_norm", "skipped_updates", "lr", "nfe_rollout",
    "nfe_train", "scored_images", "iteration_s", "wall_s",
)
SAMPLE_PAIRS = 16


def update_chunks(fwd_prompt: torch.Tensor, fwd_step: torch.Tensor, forwards: torch.Tensor, updates: int,
                  epochs: int, seed: int, iteration: int, first_prompt: int = 0) -> list[torch.Tensor]:
    """The trained forwards of each optimizer update: per epoch, ``updates`` chunks. Each prompt's
    forwards of each tree layer are shuffled by a generator of the prompt's index in the whole batch
    (``first_prompt`` + local index) and dealt evenly over the chunks, starting at a chunk drawn per
    layer. So a chunk is the same set of forwards however the prompts are sharded across ranks,
    and on every rank it spans the same layers with the same counts: the same micro-batches, which
    FSDP needs (its collectives run in every forward and backward)."""
    prompt_of, step_of = fwd_prompt[forwards], fwd_step[forwards]
    chunks: list[torch.Tensor] = []
    for epoch in range(epochs):
        parts: list[list[torch.Tensor]] = [[] for _ in range(updates)]
        for layer in step_of.unique().tolist():
            offset = int(np.random.default_rng([seed, iteration, epoch, layer, 11]).integers(updates))
            for p in prompt_of.unique().tolist():
                mine = forwards[(prompt_of == p) & (step_of == layer)]
                key = [seed, iteration, epoch, first_prompt + p, layer, 7]
                order = torch.randperm(mine.numel(), generator=keyed_generator(key))
                for j, piece in enumerate(torch.tensor_split(mine[order], updates)):
                    parts[(j + offset) % updates].append(piece)
        chunks.extend(torch.cat(part).sort().values for part in parts)
    return chunks


def layer_weight_sum(tree: Tree, targets: TrainTargets) -> tuple[float, int]:
    """``(sum of the LayerTuning weights w_k over this rank's (prompt, layer) groups, groups)``:
    their mean is the logged ``prm_weight``."""
    forwards = targets.train_forwards
    if forwards.numel() == 0:
        return 0.0, 0
    unique, group = torch.unique(layer_groups(tree, forwards), return_inverse=True)
    # w_k is one value per group: writing each forward's into its group's slot keeps that value
    per_group = torch.zeros(unique.numel()).scatter_(0, group, targets.layer_weight[forwards].float())
    return float(per_group.sum()), int(unique.numel())


class TrainingStopped(ValueError):
    """The run cannot go on (e.g. every update diverges); its last checkpoint is intact."""


@dataclass
class Rollout:
    """One iteration's samples on this rank: its prompts, their tree, the scores and the targets."""

    prompts: list[str]
    first_prompt: int  # this rank's first prompt in the whole batch (0 in one process)
    plan: RolloutPlan
    cond: Any
    tree: Tree
    scores: dict[str, torch.Tensor]
    targets: TrainTargets


@dataclass
class UpdateStats:
    """Sums over one iteration's optimizer updates, on this rank."""

    lr: float
    losses: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSS_TERMS, 0.0))
    clipped: float = 0.0
    edges: int = 0
    ratio_dev_max: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0
    nfe_train: int = 0
    clip_scale: float = 1.0


LOSS_TERMS = ("loss", "grpo_loss", "prm_loss", "kl")


class Trainer:
    """One run: owns the policy, optimizer, reward, prompt source and the clip-spread state."""

    def __init__(self, config: TrainConfig, policy: Policy | None = None, evaluation: bool = True,
                 dist: Dist | None = None) -> None:
        """``policy``: a model already loaded (its weights are trained in place: pass a copy); None loads
        ``config.model``. ``evaluation`` False (training steps in a front end): no held-out set.
        ``dist``: this process's place in a data-parallel job; None is a single process. The parts
        come from :func:`~.build.build_run`; :meth:`build_reward` is how a subclass scores otherwise."""
        self.config = config
        self.dist = dist or Dist()
        parts = build_run(config, policy, evaluation, self.dist, reward=lambda _: self.build_reward())
        self.reward = parts.reward  # its terms' weights are read at every iteration (a guard may steer them)
        self.policy, self.grad_sync, self.params = parts.policy, parts.grad_sync, parts.params
        self.optimizer, self.ema, self.old = parts.optimizer, parts.ema, parts.old
        self.sigmas, self.eval_sigmas = parts.sigmas, parts.eval_sigmas
        self.eval_pairs, self.prompts, self._renders = parts.eval_pairs, parts.prompts, parts.renders
        self.loss, self.spread, self.reward_scale = parts.loss, parts.spread, parts.reward_scale
        self.device = self.policy.device
        self.strategy = config.strategy_config
        self.optimizer_steps = 0
        self.skipped_in_a_row = 0

    def build_reward(self) -> RewardMix | None:
        """The reward that scores rollouts and evaluations (a subclass may score otherwise)."""
        return build_reward(self.config)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "clip_ema": -1.0 if self.spread.ema is None else self.spread.ema,
            "reward_ema": -1.0 if self.reward_scale.ema is None else self.reward_scale.ema,
            "torch_rng": torch.get_rng_state(), "skipped_in_a_row": self.skipped_in_a_row,
            "optimizer_steps": self.optimizer_steps}
        if self.ema is not None:
            state["eval_ema"] = [t.cpu() for t in self.ema.shadow]
        if self.old is not None:
            state["old_policy"] = [t.detach().cpu() for t in self.old.values]
        return state

    def check_progress(self, iteration: int) -> None:
        """Stop (one line, ``TrainingStopped``) after ``optim.max_skipped_in_a_row`` optimizer updates
        in a row whose loss or gradient was not finite: the model is not learning any more."""
        limit = self.config.optim.max_skipped_in_a_row
        if limit and self.skipped_in_a_row >= limit:
            raise TrainingStopped(
                f"stopped at iteration {iteration}: {self.skipped_in_a_row} optimizer updates in a row had "
                "a non-finite loss or gradient (skipped, the model is unchanged since); the last "
                "checkpoint is intact: lower optim.lr or check the reward, then --resume")

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of the model: the LoRA, or every weight when fully fine-tuned
        (unsharded: a collective under FSDP, so every rank calls it)."""
        transformer = self.policy.transformer
        if self.config.lora.enabled:
            return lora_state_dict(transformer)
        return full_state(transformer, self.dist)

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer state by parameter name, unsharded (loads at any world size)."""
        return optimizer_state(self.policy.transformer, self.optimizer)

    def restore(self, weights: dict, optimizer: dict, state: dict) -> None:
        """Continue from a checkpoint: ``weights`` is :meth:`trained_state`'s (LoRA or full)."""
        if self.config.lora.enabled:
            load_lora_state(self.policy.transformer, weights)
        elif self.dist.enabled:
            load_full_state(self.policy.transformer, weights)
        else:
            self.policy.transformer.load_state_dict(weights, strict=True)
        load_optimizer_state(self.policy.transformer, self.optimizer, optimizer)
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        ema = float(state.get("clip_ema", -1.0))
        self.spread.ema = None if ema < 0 else ema
        reward_ema = float(state.get("reward_ema", -1.0))
        self.reward_scale.ema = None if reward_ema < 0 else reward_ema
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        if self.ema is not None and "eval_ema" in state:
            self.ema.shadow = [t.float().to(p.device) for t, p in zip(state["eval_ema"], self.params,
                                                                       strict=True)]
        if self.old is not None and "old_policy" in state:
            self.old.values = [t.to(p.device, p.dtype) for t, p in zip(state["old_policy"], self.params,
                                                                        strict=True)]

    def reference_velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any) -> torch.Tensor:
        """The base model (LoRA disabled): the reference of the optional KL term."""
        set_adapters_enabled(self.policy.transformer, False)
        try:
            return self.policy.velocity(x, sigma, cond)
        finally:
            set_adapters_enabled(self.policy.transformer, True)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, average: bool | None = None) -> tuple[dict[str, float], torch.Tensor]:
        """Held-out reward (and drift): with the weights' average where the recipe evaluates so
        (``average`` None), or with (True) or without it (False) when there is one."""
        self.policy.eval()
        use = self.ema is not None and (average is None or average)
        with self.ema.applied() if use else nullcontext():
            metrics, images = evaluate(self.policy, self.eval_pairs, self.eval_sigmas, self.reward,
                                       self.config.max_batch)
            if self._renders is not None:
                metrics["drift"] = drift_loss(self.policy, self._renders.to(self.device),
                                              [p.prompt for p in self.eval_pairs],
                                              max_batch=self.config.max_batch)
        return metrics, images

    # ------------------------------------------------------------------ one iteration
    def plan(self, iteration: int) -> RolloutPlan:
        """The rollout plan of ``iteration`` (its window, and Flow-GRPO-Fast's SDE steps)."""
        return iteration_plan(self.config, self.sigmas, iteration, self.policy.latent_unshuffle)

    def loss_config(self) -> LossConfig:
        """The configured loss with clip bounds rescaled to the current ratio spread."""
        return replace(self.loss, clip=replace(self.loss.clip, scale=self.spread.scale()))

    def step(self, iteration: int) -> dict[str, Any]:
        """Rollout, reward and ``updates_per_iteration`` optimizer updates; returns the metrics."""
        start = time.perf_counter()
        batch = self.rollout_and_score(iteration)
        stats = self.update(iteration, batch)
        return self.metrics(iteration, batch, stats, start)

    def rollout_and_score(self, iteration: int) -> Rollout:
        """Part 1: this rank's prompts, their tree (no gradients), rewards, and the training
        targets (advantages, clip bounds, LayerTuning weights) computed once for all updates."""
        c = self.config
        everyone = self.prompts.prompts(iteration, c.data.prompts_per_iteration)
        mine = shard(len(everyone), self.dist)  # this rank's prompts (all of them in one process)
        prompts = everyone[mine]
        seeds = iteration_seeds(c.seed, iteration, len(everyone))[mine]
        plan = self.plan(iteration)
        self.policy.eval()
        cond = self.policy.encode(prompts)
        with self.old.applied() if self.samples_with_old else nullcontext():  # DiffusionNFT: the old policy
            tree = rollout(self.policy.velocity, cond, plan, seeds, self.policy.latent_shape,
                           max_batch=c.max_batch, device=self.device)
        leaf_prompt = tree.node_prompt[tree.leaf_node]
        leaf_prompts = [prompts[int(p)] for p in leaf_prompt]
        with torch.no_grad():
            scores = self.reward(self.policy.decode(tree.leaf_latents), leaf_prompts)
        # several rewards: as the loss's reward_mix rule says (each normalised within the prompt's
        # images then weighted, MixGRPO's; or the raw weighted sum, Flow-GRPO's and DiffusionNFT's)
        values = self.reward.training_signal(scores, leaf_prompt, self.loss.mix_rule)
        targets = self.targets_for(tree, values, iteration, mine.start)
        return Rollout(list(prompts), mine.start, plan, cond, tree, scores, targets)

    def targets_for(self, tree: Tree, values: torch.Tensor, iteration: int,
                    first_prompt: int) -> TrainTargets:
        """Advantages and LayerTuning targets of a scored tree (``values``: one per leaf), with the
        running reward scale that the ``tanh`` layer weight reads, updated over every rank's leaves."""
        scale = 0.0
        if self.loss.prm_weight == "tanh" and self.loss.prm_lambda != 0.0:
            scale = self.reward_scale.update(gather(values.float(), self.dist))
        seed = self.config.seed * 1_000_033 + iteration
        return prepare_targets(tree, values, self.loss_config(), seed=seed, reduce=sum_over_ranks(self.dist),
                               first_prompt=first_prompt, reward_scale=scale)

    def update(self, iteration: int, batch: Rollout) -> UpdateStats:
        """Part 2: the iteration's optimizer updates, each over an equal share of every prompt's
        trained forwards (:func:`update_chunks`)."""
        c = self.config
        if self.old is not None:
            return self._matching_update(iteration, batch)
        tree, targets = batch.tree, batch.targets
        forwards = targets.train_forwards
        per_prompt = forwards.numel() // max(1, len(batch.prompts))  # the same for every prompt and rank
        updates = min(c.effective_updates, max(1, per_prompt))
        chunks = update_chunks(tree.fwd_prompt, tree.fwd_step, forwards, updates, c.optim.epochs, c.seed,
                               iteration, batch.first_prompt)
        stats = UpdateStats(lr=c.optim.lr_at(iteration, c.iterations))
        for group in self.optimizer.param_groups:
            group["lr"] = stats.lr
        loss_cfg = self.loss_config()
        reference = self.reference_velocity if self.loss.kl_beta > 0 else None
        for k, chunk in enumerate(chunks):
            if k > 0:  # ratios have moved: re-centre the clip bounds on their measured spread
                loss_cfg = self._rescale_clip_bounds(targets)
            self.policy.train()
            self.optimizer.zero_grad(set_to_none=True)
            result = backward_over_tree(self.policy.velocity, batch.cond, tree, targets, loss_cfg,
                                        c.max_batch, reference=reference, forwards=chunk,
                                        scale=updates, grad_sync=self.grad_sync)
            norm = torch.nn.utils.clip_grad_norm_(self.params, c.optim.grad_clip)
            if not self._apply_update(norm, result.loss):
                stats.skipped += 1
            self.optimizer.zero_grad(set_to_none=True)
            if k > 0:
                self.spread.update(gather(result.ratios, self.dist))
            for key in LOSS_TERMS:
                stats.losses[key] += getattr(result, key)
            stats.clipped += result.clip_frac * result.train_edges
            stats.edges += result.train_edges
            stats.ratio_dev_max = max(stats.ratio_dev_max, result.ratio_dev_max)
            stats.grad_norms.append(float(norm))
            stats.nfe_train += result.train_nfe
        stats.clip_scale = loss_cfg.clip.scale
        return stats

    @property
    def samples_with_old(self) -> bool:
        """Whether the rollout is sampled with the slow copy: DiffusionNFT's always (its old policy),
        DGPO's after ``switch_step`` optimizer steps (``scripts/train_sd3_dgpo.py`` 799-800)."""
        if self.old is None:
            return False
        s = self.strategy
        return not isinstance(s, (AWMConfig, DGPOConfig)) or (isinstance(s, DGPOConfig)
                                                              and self.optimizer_steps > s.switch_step)

    def _matching_update(self, iteration: int, batch: Rollout) -> UpdateStats:
        """DiffusionNFT's, AWM's or DGPO's update: one optimizer step over every image re-noised at its
        drawn noise levels (each recipe's loss), then the slow copy follows the trained weights."""
        c, s = self.config, self.config.strategy_config
        stats = UpdateStats(lr=c.optim.lr_at(iteration, c.iterations))
        for group in self.optimizer.param_groups:
            group["lr"] = stats.lr
        loss = self.loss
        advantages = leaf_advantages(batch.tree, batch.targets.leaf_value, None, loss.advantage_scale,
                                     loss.advantage_std, sum_over_ranks(self.dist), ddof=loss.std_ddof,
                                     eps=loss.std_eps)
        rows = reduce_sum({"rows": batch.tree.leaf_node.numel()}, self.dist)["rows"]
        if isinstance(s, AWMConfig):
            backward, reference = awm_backward, self.reference_velocity if c.lora.enabled else None
            rows *= s.train_timesteps
        elif isinstance(s, DGPOConfig):
            backward, reference = dgpo_backward, self.reference_velocity
            rows *= s.train_timesteps
        else:
            backward = nft_backward
            reference = self.reference_velocity if s.kl_beta > 0 and c.lora.enabled else None
            rows *= max(1, int(s.steps * s.train_fraction))
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.grad_sync(True) if self.grad_sync is not None else nullcontext():
            result = backward(self.policy.velocity, batch.cond, batch.tree, advantages, self.sigmas, s,
                              self.old, reference, c.seed, iteration, c.max_batch, batch.first_prompt,
                              int(rows))
        norm = torch.nn.utils.clip_grad_norm_(self.params, c.optim.grad_clip)
        if not self._apply_update(norm, result.loss):
            stats.skipped += 1
        self.optimizer.zero_grad(set_to_none=True)
        if isinstance(s, (AWMConfig, DGPOConfig)):
            self.old.blend(slow_copy_decay(self.optimizer_steps, s.slow_decay_rate, s.slow_decay_cap))
        else:
            self.old.follow(self.optimizer_steps, s.decay_schedule)
        stats.losses.update(loss=result.loss, grpo_loss=result.policy, kl=result.kl)
        stats.grad_norms.append(float(norm))
        stats.nfe_train = result.nfe
        stats.clipped, stats.edges = result.clipped, result.rows if isinstance(s, DGPOConfig) else 0
        return stats

    def _rescale_clip_bounds(self, targets: TrainTargets) -> LossConfig:
        """Clip bounds at the current ratio spread, written into ``targets``; the loss config."""
        loss_cfg = self.loss_config()
        targets.edge_low, targets.edge_high = clip_bounds(targets.edge_advantage, loss_cfg.clip)
        return loss_cfg

    def _apply_update(self, grad_norm: torch.Tensor, loss: float) -> bool:
        """Step the optimizer unless the loss or gradient is not finite on any rank (every rank
        skips together); counts skips in a row for :meth:`check_progress`."""
        bad = not (torch.isfinite(grad_norm) and math.isfinite(loss))
        if reduce_max(float(bad), self.dist) == 0.0:
            if self.ema is not None:  # the anchor's EMA calls of the micro-batches before the step's last
                self.ema.before_update(self.optimizer_steps)
            self.optimizer.step()
            self.optimizer_steps += 1
            if self.ema is not None:  # and its call after the last, counting the step (core/ema.py)
                self.ema.after_update(self.optimizer_steps)
            self.skipped_in_a_row = 0
            return True
        self.skipped_in_a_row += 1
        return False

    def metrics(self, iteration: int, batch: Rollout, stats: UpdateStats, start: float) -> dict[str, Any]:
        """Part 3: the iteration's metrics row, over the whole batch (every rank holds its prompts'
        share: gathered and summed across ranks)."""
        c, tree, scores = self.config, batch.tree, batch.scores
        rewards = gather(scores["reward"].float().cpu(), self.dist)
        exact = gather(scores["exact"].float(), self.dist) if "exact" in scores else None
        weight_sum, layers = layer_weight_sum(tree, batch.targets)
        sums = reduce_sum({**stats.losses, "clipped": stats.clipped, "edges": stats.edges,
                           "layer_weight": weight_sum, "layers": layers,
                           "nfe_rollout": tree.nfe, "nfe_train": stats.nfe_train,
                           "scored": tree.leaf_node.numel()}, self.dist)
        world = self.dist.world_size
        per_row = self.policy.forwards_per_row  # classifier-free guidance: two forwards per latent
        return {
            "iteration": iteration + 1, "strategy": c.strategy, "window_start": batch.plan.window_start,
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "reward_max": float(rewards.max()),
            "exact_mean": float(exact.mean()) if exact is not None else None,
            **{key: sums[key] / world for key in LOSS_TERMS},  # each rank's loss is the batch's scale
            "prm_weight": sums["layer_weight"] / sums["layers"] if sums["layers"] else None,
            "clip_frac": sums["clipped"] / max(1.0, sums["edges"]), "clip_scale": stats.clip_scale,
            "ratio_dev_max": reduce_max(stats.ratio_dev_max, self.dist),
            "grad_norm": float(np.mean(stats.grad_norms)), "skipped_updates": stats.skipped, "lr": stats.lr,
            "nfe_rollout": int(sums["nfe_rollout"]) * per_row,
            "nfe_train": int(sums["nfe_train"]) * per_row,
            "scored_images": int(sums["scored"]),
            "iteration_s": reduce_max(time.perf_counter() - start, self.dist),
        }

    def export(self, folder: Path) -> dict[str, Path]:
        """The LoRA in ComfyUI and diffusers formats, or the whole fine-tuned transformer. Every rank
        calls it (gathering sharded weights is a collective); only rank 0 writes."""
        if not self.config.lora.enabled:
            if self.dist.enabled:
                state = full_state(self.policy.transformer, self.dist)
                if not self.dist.is_main:
                    return {}
                return save_full_transformer(folder, self.policy.transformer, state)
            return save_full_transformer(folder, self.policy.transformer)
        if not self.dist.is_main:
            return {}
        kind = self.config.model.kind
        return save_lora_files(folder, self.policy.transformer,
                               COMFYUI_PREFIX if kind == "embedded" else DIFFUSERS_MODEL_PREFIX, kind=kind)
