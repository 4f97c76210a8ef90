"""Two running scales of a run, each a moving average over its iterations.

**Clip spread**: clip bounds that bind, from a running estimate of how far the ratios move. With
the element-averaged log-probability, ratios of an update stay far nearer 1 than the published clip
bounds (1e-4..1e-3) reach, so those would never bind (docs/algorithm.md, "Loss").
After each update the spread ``quantile(|r - 1|)`` feeds an exponential moving average, and every clip
bound is scaled so the top bound (``eps_high``, or ``fixed``) sits at that average.

**Reward scale**: ``s_ref`` of the corrected LayerTuning weight ``tanh(eta (V(n*) - mean_k) /
s_ref)``, the usual spread of leaf rewards, so a layer's best-node gap is judged against how much
rewards usually vary: a flat layer weighs ~0, a standout one ~1. It averages the std of each
iteration's leaf rewards (all ranks' leaves), updated before the iteration's targets are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from .losses import ClipConfig, ratio_spread


@dataclass(frozen=True)
class ClipSpreadConfig:
    """Make clipping bind: scale the clip bounds so ``eps_high`` sits at a quantile of the
    measured ``|r - 1|`` of recent updates (an exponential moving average). Off: bounds as set.
    ``on_baselines``: a baseline with its published (fixed) clip takes the rescale too; off by
    default, as no baseline publishes it (the protocol's clip treatments switch it on)."""

    enabled: bool = True
    quantile: float = 0.9
    momentum: float = 0.9
    on_baselines: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")


def moving_average(average: float | None, value: float, momentum: float) -> float | None:
    """``value`` folded into ``average`` (the first value starts it); a value that is not a
    positive finite number (no spread measured) leaves the average as it is."""
    if value <= 0.0 or not math.isfinite(value):
        return average
    return value if average is None else momentum * average + (1 - momentum) * value


def top_bound(clip: ClipConfig) -> float:
    """The bound the spread is matched to: ``fixed`` for a fixed clip, else ``eps_high``."""
    return clip.fixed if clip.mode == "fixed" else clip.eps_high


@dataclass
class ClipSpread:
    """The moving average of ``|r - 1|`` and the clip scale it implies (state of one run)."""

    config: ClipSpreadConfig
    top: float
    ema: float | None = None

    def scale(self) -> float:
        """What every clip bound is multiplied by (1 until a spread was measured, or when off)."""
        if not self.config.enabled or self.ema is None:
            return 1.0
        return self.ema / self.top

    def update(self, ratios: Tensor) -> None:
        """Fold the ratios of one update into the average (empty or degenerate spreads are skipped)."""
        if ratios.numel() == 0 or not self.config.enabled:
            return
        self.ema = moving_average(self.ema, float(ratio_spread(ratios, self.config.quantile)),
                                  self.config.momentum)


@dataclass
class RewardScale:
    """The moving average of the leaf rewards' std (state of one run, checkpointed)."""

    momentum: float = 0.9
    ema: float | None = None

    def update(self, leaf_values: Tensor) -> float:
        """Fold one iteration's leaf values in; returns ``s_ref`` (0 until a spread was seen)."""
        value = float(leaf_values.detach().float().std(unbiased=False)) if leaf_values.numel() > 1 else 0.0
        self.ema = moving_average(self.ema, value, self.momentum)
        return 0.0 if self.ema is None else self.ema
