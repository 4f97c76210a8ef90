"""DGPO's training step on a rollout (the math is ``core/dgpo.py``).

Why a module of its own: DGPO trains no step of the rollout either. Its loss couples the images of
a prompt's group (the group's implicit reward weighs every image of it), so a micro-batch holds
whole groups at one noise level, as the anchor's does (one group per GPU and noise level:
``scripts/train_sd3_dgpo.py`` 1049-1056). Each micro-batch evaluates the LoRA-free model and the
slow copy first (no gradient), then the trained velocity with gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ..core.awm import matching_error
from ..core.cond import Cond, select_rows
from ..core.dgpo import DGPOConfig, dgpo_loss, draw_timesteps, outside_trust_region
from ..core.nft import renoise
from ..core.tree import Tree, VelocityFn, keyed_generator
from .nft import NftStats, OldPolicy


def dgpo_noise(latent_shape: tuple[int, ...], prompts: Tensor, places: Tensor, level: int, seed: int,
               iteration: int, first_prompt: int, shared: bool) -> Tensor:
    """The re-noising draw of each row at grid step ``level``: one per prompt group (``shared``) or
    one per image, from the prompt's index in the whole batch, so sharding changes nothing."""
    out = torch.empty((prompts.numel(), *latent_shape))
    for i, (prompt, place) in enumerate(zip(prompts.tolist(), places.tolist(), strict=True)):
        key = [seed, iteration, first_prompt + prompt, level, 31] if shared else \
            [seed, iteration, first_prompt + prompt, place, level, 37]
        out[i] = torch.randn(latent_shape, generator=keyed_generator(key))
    return out


def group_blocks(prompts: int, per_prompt: int, max_batch: int | None) -> list[range]:
    """Consecutive prompts per micro-batch: as many whole groups as fit in ``max_batch`` rows, and
    at least one (a group is never split: its loss needs all of its images)."""
    per_block = prompts if not max_batch else max(1, max_batch // per_prompt)
    return [range(p, min(p + per_block, prompts)) for p in range(0, prompts, per_block)]


def dgpo_backward(velocity: VelocityFn, cond: Cond, tree: Tree, advantages: Tensor, sigmas: Tensor,
                  config: DGPOConfig, slow: OldPolicy, reference: Callable[[Tensor, Tensor, Cond], Tensor],
                  seed: int, iteration: int, max_batch: int | None, first_prompt: int = 0,
                  rows_total: int | None = None) -> NftStats:
    """Accumulate the gradient of DGPO's loss over this rank's images: the mean over every row of the
    whole batch (``rows_total``, default this rank's) of ``sigmoid(s_g) A e + kl_beta KL(ref)``. The
    noise levels are drawn once for the rollout (from ``seed`` and ``iteration``: every rank draws
    the same ones). Returns the sums; ``clip_frac`` is read from ``stats.clipped``."""
    levels = draw_timesteps(config, int(np.random.default_rng([seed, iteration, 41]).integers(2**62)))
    per_prompt = tree.leaves_per_prompt
    prompts = tree.leaf_node.numel() // per_prompt
    total_rows = rows_total or tree.leaf_node.numel() * len(levels)
    leaf_prompt = tree.node_prompt[tree.leaf_node]
    stats = NftStats()
    dev = tree.leaf_latents.device
    for level in levels:
        for block in group_blocks(prompts, per_prompt, max_batch):
            leaves = torch.arange(block.start * per_prompt, block.stop * per_prompt)
            groups = leaf_prompt[leaves] - block.start
            x0 = tree.leaf_latents[leaves.to(dev)].float()
            t = sigmas[level].float().to(dev).expand(leaves.numel())
            eps = dgpo_noise(tuple(x0.shape[1:]), leaf_prompt[leaves], leaves % per_prompt, level, seed,
                             iteration, first_prompt, config.shared_noise).to(dev)
            x_t = renoise(x0, t, eps)
            cond_rows = select_rows(cond, leaf_prompt[leaves])
            with torch.no_grad():
                v_ref = reference(x_t, t, cond_rows).float()
                with slow.applied():
                    v_old = velocity(x_t, t, cond_rows).float()
            v_theta = velocity(x_t, t, cond_rows).float()
            error = matching_error(v_theta, x0, eps)
            ref_error, old_error = matching_error(v_ref, x0, eps), matching_error(v_old, x0, eps)
            a = advantages[leaves].to(dev)
            policy = dgpo_loss(a, error, ref_error, old_error, groups.to(dev), config).float()
            kl = ((v_theta - v_ref) ** 2).flatten(1).mean(dim=1).sum() / total_rows
            loss = policy.sum() / total_rows + config.kl_beta * kl
            loss.backward()
            clipped = outside_trust_region(a.double().clamp(-config.adv_clip, config.adv_clip), error,
                                           old_error, config.clip)
            stats.loss += float(loss.detach())
            stats.policy += float(policy.detach().sum()) / total_rows
            stats.kl += float(kl.detach())
            stats.rows += leaves.numel()
            stats.clipped += int(clipped.sum())
            stats.nfe += 3 * leaves.numel()
    return stats
