"""AWM's training step on a rollout (the math is ``core/awm.py``).

Why a module of its own: like DiffusionNFT, AWM trains no step of the rollout; it re-noises the
clean images at a few drawn noise levels and weights each row's flow-matching "log-likelihood" by
the image's advantage, with two proximity terms that need the LoRA-free model's and a slow copy's
velocity (:class:`~.nft.OldPolicy` holds the copy). Each micro-batch evaluates those two first (no
gradient), then the trained velocity with gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..core.awm import (
    AWMConfig,
    awm_policy_loss,
    draw_timesteps,
    ghuber_log_likelihood,
    matching_error,
    scaled_advantage,
    timestep_buckets,
)
from ..core.cond import Cond
from ..core.tree import Tree, VelocityFn, keyed_generator
from .nft import NftStats, OldPolicy, nft_noise, renoised_batches


def awm_rows(tree: Tree, config: AWMConfig, seed: int, iteration: int,
             first_prompt: int = 0) -> tuple[Tensor, Tensor]:
    """``(leaf index, grid step)`` of every training row: per image, one grid step from each bucket,
    drawn from a generator of the image's prompt (its index in the whole batch) and place, so
    sharding prompts across ranks changes nothing. The anchor shares one draw across a micro-batch
    of 3 images; each image's levels have the same distribution either way."""
    buckets = timestep_buckets(config.steps, config.train_timesteps, config.timestep_fraction)
    leaves, steps = [], []
    per_prompt = tree.leaves_per_prompt
    for leaf in range(tree.leaf_node.numel()):
        prompt, place = divmod(leaf, per_prompt)
        key = [seed, iteration, first_prompt + prompt, place, 29]
        chosen = draw_timesteps(buckets, keyed_generator(key))
        leaves.append(torch.full((chosen.numel(),), leaf, dtype=torch.long))
        steps.append(chosen)
    return torch.cat(leaves), torch.cat(steps)


def _mean_square(a: Tensor, b: Tensor) -> Tensor:
    return ((a - b) ** 2).flatten(1).mean(dim=1)


def awm_backward(velocity: VelocityFn, cond: Cond, tree: Tree, advantages: Tensor, sigmas: Tensor,
                 config: AWMConfig, slow: OldPolicy,
                 reference: Callable[[Tensor, Tensor, Cond], Tensor] | None,
                 seed: int, iteration: int, max_batch: int | None, first_prompt: int = 0,
                 rows_total: int | None = None) -> NftStats:
    """Accumulate the gradient of AWM's loss over this rank's images: the mean over every row of the
    whole batch (``rows_total``, default this rank's) of ``-A logp + kl_beta KL(ref) +
    slow_kl_beta KL(slow copy)``; the slow copy's term comes only with the KL, as in the anchor
    (``train_sd3_awm.py`` 1336-1350). ``reference`` None: no KL term (full fine-tuning)."""
    leaf, step = awm_rows(tree, config, seed, iteration, first_prompt)
    noise = nft_noise(leaf.numel(), tree.leaf_latents.shape[1:], seed, iteration, first_prompt, leaf,
                      tree.leaves_per_prompt)
    advantage = scaled_advantage(advantages, config.adv_clip, config.advantage_max)
    with_kl = reference is not None and config.kl_beta > 0
    with_slow = with_kl and config.slow_kl_beta > 0
    total_rows = rows_total or leaf.numel()
    stats = NftStats()
    for b in renoised_batches(tree, cond, leaf, step, noise, sigmas, max_batch):
        rows, x0, t, eps, x_t, cond_rows, dev = b.rows, b.x0, b.t, b.noise, b.x_t, b.cond, b.x0.device
        with torch.no_grad():
            v_ref = reference(x_t, t, cond_rows).float() if with_kl else None
            v_slow = None
            if with_slow:
                with slow.applied():
                    v_slow = velocity(x_t, t, cond_rows).float()
        v_theta = velocity(x_t, t, cond_rows).float()
        log_likelihood = ghuber_log_likelihood(matching_error(v_theta, x0, eps), t.to(dev), config.power)
        policy = awm_policy_loss(log_likelihood, advantage[leaf[rows]].to(dev)).float()
        loss = policy.sum() / total_rows
        kl = torch.zeros((), device=dev)
        if v_ref is not None:
            kl = _mean_square(v_theta, v_ref).sum() / total_rows
            loss = loss + config.kl_beta * kl
        if v_slow is not None:
            loss = loss + config.slow_kl_beta * _mean_square(v_theta, v_slow).sum() / total_rows
        loss.backward()
        stats.loss += float(loss.detach())
        stats.policy += float(policy.detach().sum()) / total_rows
        stats.kl += float(kl.detach())
        stats.rows += rows.numel()
        stats.nfe += rows.numel() * (1 + with_kl + with_slow)
    return stats
