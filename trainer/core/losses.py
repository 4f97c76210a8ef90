"""Loss terms (docs/algorithm.md, "Loss"), each a pure function of per-edge or per-forward tensors.

GRPO with reward-guided dynamic clipping: the clip bound of an edge grows with its advantage,
``eps(e) = eps_low + (eps_high - eps_low) * sigmoid(eta * A(e))``. LayerTuning-RL: a regression
of the velocity at every trained node toward a target built from the best node, weighted per
layer by how much the best node stands out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .advantages import STD_EPS

ClipMode = Literal["dynamic", "fixed", "none"]


@dataclass(frozen=True)
class ClipConfig:
    """Clip range options. ``scale`` multiplies every bound (e.g. by the measured ratio spread)."""

    mode: ClipMode = "dynamic"
    eps_low: float = 1e-4
    eps_high: float = 1e-3
    eta: float = 1.0
    fixed: float = 1e-4
    asymmetric: bool = False
    scale: float = 1.0


def clip_bounds(advantages: Tensor, config: ClipConfig) -> tuple[Tensor, Tensor]:
    """Lower and upper ratio bounds per edge.

    ``dynamic``: ``[1 - eps(e), 1 + eps(e)]``, or ``[1 - eps_low, 1 + eps(e)]`` when asymmetric;
    ``fixed``: ``[1 - fixed, 1 + fixed]``; ``none``: unbounded.
    """
    adv = advantages.float()
    if config.mode == "none":
        inf = torch.full_like(adv, float("inf"))
        return -inf, inf
    if config.mode == "fixed":
        eps = torch.full_like(adv, config.fixed * config.scale)
        return 1.0 - eps, 1.0 + eps
    if config.mode != "dynamic":
        raise ValueError(f"unknown clip mode {config.mode!r}; expected dynamic, fixed or none")
    span = config.eps_high - config.eps_low
    eps = (config.eps_low + span * torch.sigmoid(config.eta * adv)) * config.scale
    low = 1.0 - (torch.full_like(eps, config.eps_low * config.scale) if config.asymmetric else eps)
    return low, 1.0 + eps


@dataclass(frozen=True)
class EdgeLoss:
    """Per-edge clipped surrogate, ratio, and whether the ratio lay outside its bounds."""

    loss: Tensor
    ratio: Tensor
    clipped: Tensor


def grpo_edge_loss(log_prob: Tensor, log_prob_old: Tensor, advantages: Tensor,
                   low: Tensor, high: Tensor) -> EdgeLoss:
    """``-min(r A, clip(r, low, high) A)`` per edge, with ``r = exp(log_prob - log_prob_old)``."""
    ratio = torch.exp(log_prob - log_prob_old.detach())
    adv = advantages.detach()
    unclipped = -ratio * adv
    clipped = -torch.minimum(torch.maximum(ratio, low), high) * adv
    outside = (ratio.detach() < low) | (ratio.detach() > high)
    return EdgeLoss(torch.maximum(unclipped, clipped), ratio, outside)


def layer_weight(best_value: Tensor, layer_mean: Tensor, layer_std: Tensor,
                 eta: float = 1.0) -> Tensor:
    """LayerTuning weight ``sigmoid(eta (V(n*) - mean) / (std + 1e-8))``: the first reading of the
    paper. Since ``V(n*)`` is the layer's maximum it is always >= 0.5, and 0.5 on a flat layer."""
    return torch.sigmoid(eta * (best_value - layer_mean) / (layer_std + STD_EPS))


def layer_weight_tanh(best_value: Tensor, layer_mean: Tensor, reward_scale: float,
                      eta: float = 1.0) -> Tensor:
    """LayerTuning weight ``tanh(eta (V(n*) - mean) / s_ref)`` (the corrected reading): 0 on a flat
    layer (nothing to imitate), towards 1 when the best node stands out. ``s_ref`` is the usual
    spread of leaf rewards (:class:`~.running_scales.RewardScale`), not the layer's own std."""
    return torch.tanh(eta * (best_value - layer_mean) / max(float(reward_scale), STD_EPS))


def x0_target(x: Tensor, best_x0: Tensor, sigma: Tensor) -> Tensor:
    """Velocity that points from the best clean latent to ``x``: ``(x - x0*) / s``."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    return (x.float() - best_x0.float()) / sigma.float().reshape(shape)


def path_target(x_best: Tensor, x_best_child: Tensor, delta: Tensor) -> Tensor:
    """Velocity of the best node's own step: ``(x_{n*_k} - x_{n*_{k+1}}) / D``."""
    shape = (-1,) + (1,) * (x_best.ndim - 1)
    return (x_best.float() - x_best_child.float()) / delta.float().reshape(shape)


def renoised(best_x0: Tensor, noise: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
    """The best leaf's clean latent noised afresh at ``sigma``, and the flow-matching velocity that
    points from there to it: ``x = (1 - s) x0* + s eps``, ``u = eps - x0*``."""
    shape = (-1,) + (1,) * (best_x0.ndim - 1)
    s = sigma.float().reshape(shape)
    x0, eps = best_x0.float(), noise.float()
    return (1.0 - s) * x0 + s * eps, eps - x0


def velocity_mse(v: Tensor, target: Tensor) -> Tensor:
    """``||v - stopgrad(u)||^2 / D`` per sample."""
    return ((v.float() - target.detach().float()) ** 2).flatten(1).mean(dim=1)


def ratio_spread(ratio: Tensor, quantile: float = 0.9) -> Tensor:
    """A quantile of ``|r - 1|``: the scale clip bounds must match to bind at all."""
    return torch.quantile((ratio.detach().float() - 1.0).abs().flatten(), quantile)
