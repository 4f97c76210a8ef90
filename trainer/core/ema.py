"""An exponential moving average of the trained parameters, as Flow-GRPO and DiffusionNFT evaluate with.

Both anchors keep ``ema <- d ema + (1 - d) theta`` with the warm-up ``d = min((1 + n) / (10 + n),
decay)`` at optimizer step ``n``, updated every ``interval`` steps (flow_grpo@ac4c86e
``flow_grpo/ema.py:33-49``; Flow-GRPO: decay 0.9 every 8 steps, ``scripts/train_sd3.py:444-445``;
DiffusionNFT: 0.9 every step, ``scripts/train_nft_sd3.py:565-567``), and evaluate by copying the
average into the model and back (``train_sd3.py:218-219``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def ema_decay(step: int, decay: float) -> float:
    """The warmed-up decay at optimizer step ``step`` (0-based)."""
    return min((1.0 + step) / (10.0 + step), decay)


class ParameterEMA:
    """A float32 shadow copy of ``params``, averaged at every ``interval``-th optimizer step."""

    def __init__(self, params: Iterable[nn.Parameter], decay: float = 0.9, interval: int = 1) -> None:
        if not 0.0 <= decay < 1.0 or interval < 1:
            raise ValueError(f"EMA decay must be in [0, 1) and interval >= 1, got {decay}, {interval}")
        self.params = list(params)
        self.decay, self.interval = decay, interval
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def step(self, optimizer_step: int) -> None:
        """After optimizer step ``optimizer_step`` (0-based): average when its turn comes."""
        if (optimizer_step + 1) % self.interval:
            return
        d = ema_decay(optimizer_step, self.decay)
        for shadow, param in zip(self.shadow, self.params, strict=True):
            shadow.mul_(d).add_(param.detach().float(), alpha=1.0 - d)

    @contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The average in the model's parameters for the ``with`` block, the trained values after."""
        saved: list[Tensor] = [p.detach().clone() for p in self.params]
        for shadow, param in zip(self.shadow, self.params, strict=True):
            param.copy_(shadow.to(param.dtype))
        try:
            yield
        finally:
            for value, param in zip(saved, self.params, strict=True):
                param.copy_(value)

    def state_dict(self) -> dict[str, Tensor]:
        return {str(i): s for i, s in enumerate(self.shadow)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if len(state) != len(self.shadow):
            raise ValueError(f"EMA state holds {len(state)} tensors, the model trains {len(self.shadow)}")
        self.shadow = [state[str(i)].float().clone() for i in range(len(self.shadow))]
