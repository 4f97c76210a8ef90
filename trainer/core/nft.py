"""DiffusionNFT (Zheng et al., arXiv 2509.16117), as its public code has it (NVlabs/DiffusionNFT@24af555).

Forward-process RL: no likelihoods and no SDE. Images are sampled with a deterministic solver by an
"old" policy, scored, and the model is then trained with the flow-matching loss on those clean
images, re-noised afresh at the sampler's own timesteps. A reward weight ``r`` in [0, 1] splits the
loss between two implicit policies built from the trained velocity ``v_theta`` and the old one
``v_old``: the positive ``v+ = b v_theta + (1 - b) v_old`` is pulled toward the sample where ``r`` is
high, the negative ``v- = (1 + b) v_old - b v_theta`` where it is low. Each term is divided by its
own per-sample mean error (the adaptive weight), so no step dominates. Pure functions of tensors; the
training loop (``trainer/training/nft.py``) feeds them.

Anchor lines (``scripts/train_nft_sd3.py`` unless named): ``r`` 928-929; ``v+``/``v-`` 934-937; the
adaptive weight 941-956; the loss 959-962; the old policy's decay 169-189; ``config/nft.py`` 61
(``beta`` 1.0), 64-66 (no CFG, the deterministic 2nd-order solver); the reference KL 966-970.
"""

from __future__ import annotations

import torch
from torch import Tensor

WEIGHT_FLOOR = 1e-5  # the adaptive weight's lower clip (train_nft_sd3.py:945)


def reward_weight(advantage: Tensor, adv_clip: float = 5.0) -> Tensor:
    """``r = clamp(clip(A, -c, c) / c / 2 + 0.5, 0, 1)``: 0.5 for an average sample, 1 for ``A >= c``."""
    clipped = advantage.float().clamp(-adv_clip, adv_clip)
    return (clipped / adv_clip / 2.0 + 0.5).clamp(0.0, 1.0)


def implicit_policies(v_theta: Tensor, v_old: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """The positive and negative implicit velocities (``v_old`` is detached: it is not trained)."""
    v_old = v_old.detach()
    return beta * v_theta + (1.0 - beta) * v_old, (1.0 + beta) * v_old - beta * v_theta


def _per_sample_mean(x: Tensor) -> Tensor:
    return x.flatten(1).mean(dim=1)


def adaptive_weight(x0_pred: Tensor, x0: Tensor) -> Tensor:
    """``mean |x0_pred - x0|`` per sample, in float64, detached, at least ``1e-5``."""
    return _per_sample_mean((x0_pred.detach().double() - x0.double()).abs()).clamp(min=WEIGHT_FLOOR)


def nft_loss(v_theta: Tensor, v_old: Tensor, x_t: Tensor, x0: Tensor, t: Tensor, r: Tensor, beta: float,
             adv_clip: float = 5.0) -> Tensor:
    """Per sample: ``c * (r * L+ + (1 - r) * L-) / beta`` with ``L+-`` the adaptively weighted squared
    error of the clean image each implicit policy predicts (``x0+- = x_t - t v+-``) against ``x0``.

    ``t`` is ``[B]`` (the noise level each row was re-noised at), ``r`` ``[B]``; ``c`` is the advantage
    clip, which the anchor keeps as an overall factor.
    """
    if beta <= 0:
        raise ValueError(f"DiffusionNFT's beta must be > 0, got {beta}")
    v_plus, v_minus = implicit_policies(v_theta.float(), v_old.float(), beta)
    tt = t.float().reshape(-1, *([1] * (x_t.dim() - 1)))
    x0_plus, x0_minus = x_t.float() - tt * v_plus, x_t.float() - tt * v_minus
    target = x0.float()
    loss_plus = _per_sample_mean((x0_plus - target) ** 2) / adaptive_weight(x0_plus, target).float()
    loss_minus = _per_sample_mean((x0_minus - target) ** 2) / adaptive_weight(x0_minus, target).float()
    r = r.float().to(loss_plus.device)
    return adv_clip * (r * loss_plus / beta + (1.0 - r) * loss_minus / beta)


def old_policy_decay(step: int, schedule: int = 1) -> float:
    """How much of the old policy an update keeps: ``old <- d old + (1 - d) theta``.

    Schedule 1 (the default configs): ``min(0.001 step, 0.5)``; 2 (its OCR config): 0 before step 75,
    then ``min(0.0075 (step - 75), 0.999)``; 0: 0 (the old policy is the trained one).
    """
    if schedule == 0:
        return 0.0
    if schedule == 1:
        return min(0.001 * step, 0.5)
    if schedule == 2:
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"unknown old-policy decay schedule {schedule}; expected 0, 1 or 2")


def renoise(x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """The forward process: ``x_t = (1 - t) x0 + t eps`` per row."""
    tt = t.float().reshape(-1, *([1] * (x0.dim() - 1)))
    return (1.0 - tt) * x0.float() + tt * noise.float()


def train_timesteps(steps: int, fraction: float, generator: torch.Generator) -> Tensor:
    """The grid indices one sample trains: a random permutation of the sampler's ``steps``, its first
    ``int(steps * fraction)`` (train_nft_sd3.py:810-816 and 854-864; fraction 0.99 gives 9 of 10)."""
    count = max(1, int(steps * fraction))
    return torch.randperm(steps, generator=generator)[:count]
