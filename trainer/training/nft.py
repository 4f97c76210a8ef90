"""DiffusionNFT's training step on a rollout (the math is ``core/nft.py``).

Why a module of its own: DiffusionNFT trains no step of the rollout. It keeps an *old* policy (a slow
average of the trained LoRA) that samples the images, and trains the LoRA with the flow-matching loss
on those images re-noised afresh, so its update reads only the leaves and their rewards.

- :class:`OldPolicy` holds the old policy's copy of the trained tensors and puts it in the model for a
  ``with`` block (sampling, and the ``v_old`` of the loss);
- :func:`nft_backward` accumulates the loss's gradient over every (image, noise level) row, in
  micro-batches: ``v_old`` and the reference's velocity first (no gradient, old weights swapped in),
  then ``v_theta`` with gradient, so no tensor autograd saved is changed before its backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.cond import Cond, select_rows
from ..core.nft import nft_loss, old_policy_decay, renoise, reward_weight, train_timesteps
from ..core.strategies import DiffusionNFTConfig
from ..core.tree import Tree, VelocityFn, keyed_generator


class OldPolicy:
    """The old policy's values of the trained tensors (at first: the trained ones)."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)
        self.values = [p.detach().clone() for p in self.params]

    @contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The old values in the model for the ``with`` block, the trained ones after."""
        trained = [p.detach().clone() for p in self.params]
        for value, param in zip(self.values, self.params, strict=True):
            param.copy_(value)
        try:
            yield
        finally:
            for value, param in zip(trained, self.params, strict=True):
                param.copy_(value)

    def follow(self, step: int, schedule: int) -> float:
        """After an epoch: ``old <- d old + (1 - d) theta`` with the published decay ``d``."""
        return self.blend(old_policy_decay(step, schedule))

    @torch.no_grad()
    def blend(self, decay: float) -> float:
        """``old <- decay old + (1 - decay) theta`` (AWM's and DGPO's slow copy use their own decay)."""
        for value, param in zip(self.values, self.params, strict=True):
            value.mul_(decay).add_(param.detach(), alpha=1.0 - decay)
        return decay


@dataclass
class NftStats:
    """Sums of one update: the loss, its policy and KL parts, and the model rows evaluated."""

    loss: float = 0.0
    policy: float = 0.0
    kl: float = 0.0
    rows: int = 0
    nfe: int = 0
    clipped: int = 0  # rows outside a trust region (DGPO's)


def nft_rows(tree: Tree, config: DiffusionNFTConfig, seed: int, iteration: int,
             first_prompt: int = 0) -> tuple[Tensor, Tensor]:
    """``(leaf index, grid step)`` of every training row: per image, a random ``train_fraction`` of
    the sampler's steps, drawn from a generator of the image's prompt (its index in the whole batch)
    and place, so sharding prompts across ranks changes nothing."""
    leaves, steps = [], []
    per_prompt = tree.leaves_per_prompt
    for leaf in range(tree.leaf_node.numel()):
        prompt, place = divmod(leaf, per_prompt)
        key = [seed, iteration, first_prompt + prompt, place, 13]
        chosen = train_timesteps(config.steps, config.train_fraction, keyed_generator(key))
        leaves.append(torch.full((chosen.numel(),), leaf, dtype=torch.long))
        steps.append(chosen)
    return torch.cat(leaves), torch.cat(steps)


def nft_noise(rows: int, latent_shape: Sequence[int], seed: int, iteration: int, first_prompt: int,
              leaf: Tensor, per_prompt: int) -> Tensor:
    """Fresh noise of each training row, from the row's image (sharding-independent)."""
    out = torch.empty((rows, *latent_shape))
    for i, index in enumerate(leaf.tolist()):
        prompt, place = divmod(index, per_prompt)
        key = [seed, iteration, first_prompt + prompt, place, i, 17]
        out[i] = torch.randn(tuple(latent_shape), generator=keyed_generator(key))
    return out


@dataclass
class RenoisedBatch:
    """One micro-batch of training rows: their indices, clean images, noise levels, noise, re-noised
    latents and conditioning."""

    rows: Tensor
    x0: Tensor
    t: Tensor
    noise: Tensor
    x_t: Tensor
    cond: Cond


def renoised_batches(tree: Tree, cond: Cond, leaf: Tensor, step: Tensor, noise: Tensor, sigmas: Tensor,
                     max_batch: int | None) -> Iterator[RenoisedBatch]:
    """The rows ``(leaf, grid step)`` with their fresh ``noise``, re-noised, ``max_batch`` at a time:
    the micro-batches of DiffusionNFT's and AWM's updates."""
    prompt_of = tree.node_prompt[tree.leaf_node]
    size = leaf.numel() if not max_batch else max(1, max_batch)
    dev = tree.leaf_latents.device
    for start in range(0, leaf.numel(), size):
        rows = torch.arange(start, min(start + size, leaf.numel()))
        x0 = tree.leaf_latents[leaf[rows]].float()
        t = sigmas[step[rows]].float().to(dev)
        eps = noise[rows].to(dev)
        yield RenoisedBatch(rows, x0, t, eps, renoise(x0, t, eps), select_rows(cond, prompt_of[leaf[rows]]))


def nft_backward(velocity: VelocityFn, cond: Cond, tree: Tree, advantages: Tensor,
                 sigmas: Tensor, config: DiffusionNFTConfig, old: OldPolicy,
                 reference: Callable[[Tensor, Tensor, Cond], Tensor] | None, seed: int, iteration: int,
                 max_batch: int | None, first_prompt: int = 0, rows_total: int | None = None) -> NftStats:
    """Accumulate the gradient of DiffusionNFT's loss over this rank's images (mean over every row of
    the whole batch: ``rows_total``, default this rank's)."""
    leaf, step = nft_rows(tree, config, seed, iteration, first_prompt)
    noise = nft_noise(leaf.numel(), tree.leaf_latents.shape[1:], seed, iteration, first_prompt, leaf,
                      tree.leaves_per_prompt)
    r_all = reward_weight(advantages.float(), config.adv_clip)
    total_rows = rows_total or leaf.numel()
    stats = NftStats()
    for b in renoised_batches(tree, cond, leaf, step, noise, sigmas, max_batch):
        rows, x0, t, x_t, cond_rows, dev = b.rows, b.x0, b.t, b.x_t, b.cond, b.x0.device
        with torch.no_grad():
            with old.applied():
                v_old = velocity(x_t, t, cond_rows).float()
            v_ref = reference(x_t, t, cond_rows).float() if reference is not None else None
        v_theta = velocity(x_t, t, cond_rows).float()
        policy = nft_loss(v_theta, v_old, x_t, x0, t, r_all[leaf[rows]], config.beta, config.adv_clip)
        loss = policy.sum() / total_rows
        kl = torch.zeros((), device=dev)
        if v_ref is not None and config.kl_beta > 0:
            kl = ((v_theta - v_ref) ** 2).flatten(1).mean(dim=1).sum() / total_rows
            loss = loss + config.kl_beta * kl
        loss.backward()
        stats.loss += float(loss.detach())
        stats.policy += float(policy.detach().sum()) / total_rows
        stats.kl += float(kl.detach())
        stats.rows += rows.numel()
        stats.nfe += rows.numel() * (3 if v_ref is not None else 2)
    return stats
