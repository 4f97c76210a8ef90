"""AWM, advantage-weighted matching (scxue/advantage_weighted_matching@be51372), as its SD3 GenEval
recipe has it (``config/dgx_awm.py`` ``geneval_sd3_no_cfg_1node``, ``scripts/train_sd3_awm.py``).

Like DiffusionNFT it trains no step of the rollout: the clean images the sampler made are re-noised
afresh and the model is trained with a flow-matching error. The error of each (image, noise level)
row is turned into a "log-likelihood" by a generalised Huber weighting, and the loss is that
log-likelihood weighted by the image's advantage; the update is exactly on-policy (one optimizer
step per rollout), so the PPO ratio it computes is 1 and its clip never binds. Two proximity terms:
a KL to the LoRA-free model (``kl_beta``) and one to a slow copy of the trained LoRA
(``slow_kl_beta``; the anchor's second, "ema" adapter).

Anchor lines (``scripts/train_sd3_awm.py`` unless named): the noise-level buckets 1197-1205; fresh
noise and the interpolation 1215-1232; the error in float64 237-239; the ghuber weighting 248-249;
the advantage clip and scale 1293-1299; the on-policy ratio 1282-1284; the loss 1316-1327; the KL
terms 1336-1350; the slow copy's decay 1409-1419; ``config/dgx_awm.py`` (``geneval_sd3_no_cfg_1node``)
for the values of :class:`AWMConfig`. Pure functions of tensors; ``trainer/training/awm.py`` feeds them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

HUBER_EPS = 1e-10  # the ghuber weighting's offset: train_sd3_awm.py:248-249


@dataclass(frozen=True)
class AWMConfig:
    """AWM's rollout and loss. ``group_size`` images per prompt (24: ``num_image_per_prompt``, C:45),
    sampled with an SDE of ``noise_level`` (0.4, C:48) where ``noise_low <= sigma <= noise_high``
    (0.3..0.9, its SA-Solver's ``tau``, sd3_pipeline_with_logprob.py:296) and deterministically
    elsewhere; ``train_timesteps`` (6, C:56) noise levels per image, one from each of as many
    buckets of the first ``int(steps * timestep_fraction)`` (0.9, C:60) grid steps, the first step
    left out (``discrete_wo_init``, C:88); the ghuber ``power`` (0.25, C:63-64); ``adv_clip`` (5) and
    the scale to ``[-1, 1]`` (``advantage_max`` 1, C:58); ``kl_beta`` (0.001, C:55) to the LoRA-free
    model and ``slow_kl_beta`` (1, ``ema_beta``, C:67) to the slow copy, which follows the trained
    LoRA with the decay ``min(slow_decay_cap, slow_decay_rate * step)`` (0.3 and 0.001, C:66,68)."""

    steps: int = 10
    group_size: int = 24
    noise_level: float = 0.4
    noise_low: float = 0.3
    noise_high: float = 0.9
    train_timesteps: int = 6
    timestep_fraction: float = 0.9
    power: float = 0.25
    adv_clip: float = 5.0
    advantage_max: float = 1.0
    kl_beta: float = 0.001
    slow_kl_beta: float = 1.0
    slow_decay_rate: float = 0.001
    slow_decay_cap: float = 0.3

    def __post_init__(self) -> None:
        if self.steps < 2 or self.group_size < 2:
            raise ValueError("awm.steps and awm.group_size must be >= 2")
        if not 0.0 < self.timestep_fraction <= 1.0 or self.train_timesteps < 1:
            raise ValueError("awm.timestep_fraction must be in (0, 1] and awm.train_timesteps >= 1")
        timestep_buckets(self.steps, self.train_timesteps, self.timestep_fraction)  # they must fit
        if self.power <= 0 or self.adv_clip <= 0 or self.advantage_max <= 0:
            raise ValueError("awm.power, awm.adv_clip and awm.advantage_max must be > 0")
        if self.noise_level < 0 or not 0.0 <= self.noise_low <= self.noise_high:
            raise ValueError("awm.noise_level must be >= 0 and 0 <= awm.noise_low <= awm.noise_high")


def timestep_buckets(steps: int, count: int, fraction: float) -> list[tuple[int, int]]:
    """The ``[low, high)`` grid-index ranges AWM draws one training noise level from each:
    ``count + 1`` evenly spaced integer bounds from 1 to ``int(steps * fraction)`` (truncated, as
    ``torch.linspace(...).long()`` does), so the first step (pure noise) is never trained."""
    top = int(steps * fraction)
    bounds = torch.linspace(1, top, count + 1).long().tolist()
    buckets = list(itertools.pairwise(bounds))
    if any(high <= low for low, high in buckets):
        raise ValueError(f"awm.train_timesteps {count}: that many buckets do not fit in grid steps 1..{top} "
                         f"(int(steps * timestep_fraction)); lower it or sample with more steps")
    return buckets


def draw_timesteps(buckets: list[tuple[int, int]], generator: torch.Generator) -> Tensor:
    """One grid index drawn uniformly from each bucket."""
    return torch.tensor([int(torch.randint(low, high, (1,), generator=generator)) for low, high in buckets])


def scaled_advantage(advantage: Tensor, adv_clip: float = 5.0, advantage_max: float = 1.0) -> Tensor:
    """``clip(A, -c, c) * advantage_max / c``: the advantage in ``[-advantage_max, advantage_max]``."""
    return advantage.float().clamp(-adv_clip, adv_clip) * (advantage_max / adv_clip)


def matching_error(v_theta: Tensor, x0: Tensor, noise: Tensor) -> Tensor:
    """Per row, the mean squared error of the velocity against ``noise - x0``, in float64."""
    return ((v_theta.double() - (noise.double() - x0.double())) ** 2).flatten(1).mean(dim=1)


def ghuber_log_likelihood(error: Tensor, t: Tensor, power: float = 0.25) -> Tensor:
    """``-t ((e + 1e-10)^p - 1e-10^p) / p`` per row: the generalised-Huber "log-likelihood" of a
    row's matching error ``e`` at noise level ``t`` (a power below 1 lets a large error weigh less
    than its square would)."""
    tt = t.to(error.dtype)
    return -tt * ((error + HUBER_EPS) ** power - HUBER_EPS**power) / power


def awm_policy_loss(log_likelihood: Tensor, advantage: Tensor) -> Tensor:
    """Per row, ``-A * exp(logp - logp.detach())``: its value is ``-A`` (the update is on policy, the
    ratio 1), its gradient ``-A`` times that of ``logp``."""
    ratio = torch.exp(log_likelihood - log_likelihood.detach())
    return -advantage.to(ratio.dtype) * ratio


def slow_copy_decay(step: int, rate: float = 0.001, cap: float = 0.3) -> float:
    """How much of the slow copy an update keeps: ``min(cap, rate * step)`` (AWM's ``linear`` kind,
    DGPO's ``ema_ref``): near 0 at first, so the copy tracks the trained LoRA closely."""
    return min(cap, rate * step)
