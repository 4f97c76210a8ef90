"""``s_ref`` of the corrected LayerTuning weight: the usual spread of leaf rewards.

The weight ``tanh(eta (V(n*) - mean_k) / s_ref)`` judges a layer's best-node gap against how much
rewards usually vary, so a flat layer weighs ~0 and a standout one ~1. ``s_ref`` is an exponential
moving average of the std of each iteration's leaf rewards (all ranks' leaves), updated before the
iteration's targets are computed, so it is defined from the first iteration on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass
class RewardScale:
    """The moving average of the leaf rewards' std (state of one run, checkpointed)."""

    momentum: float = 0.9
    ema: float | None = None

    def update(self, leaf_values: Tensor) -> float:
        """Fold one iteration's leaf values in; returns ``s_ref`` (0 until a spread was seen)."""
        value = float(leaf_values.detach().float().std(unbiased=False)) if leaf_values.numel() > 1 else 0.0
        if value > 0.0 and math.isfinite(value):
            m = self.momentum
            self.ema = value if self.ema is None else m * self.ema + (1 - m) * value
        return 0.0 if self.ema is None else self.ema
