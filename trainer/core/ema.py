"""An exponential moving average of the trained parameters, as Flow-GRPO and DiffusionNFT evaluate with.

Both anchors keep ``ema <- d ema + (1 - d) theta`` and call ``ema.step(params, global_step)`` with
``global_step`` the optimizer steps done so far; a call averages when ``(global_step + 1) % interval
== 0``, with the warm-up ``d = min((1 + global_step) / (10 + global_step), decay)`` (flow_grpo@ac4c86e
``flow_grpo/ema.py:33-49``). Flow-GRPO (decay 0.9, interval 8: ``scripts/train_sd3.py:444-445``)
calls after every training micro-batch (``train_sd3.py:954-955``), those before a step's last with
the count before that step, so several times per optimizer step; DiffusionNFT (0.9, interval 1:
``scripts/train_nft_sd3.py:565-567``) once after each optimizer step (1021-1029). Both evaluate by
copying the average into the model and back (``train_sd3.py:218-219``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def ema_decay(step: int, decay: float) -> float:
    """The warmed-up decay at the anchors' counter ``step`` (optimizer steps done)."""
    return min((1.0 + step) / (10.0 + step), decay)


class ParameterEMA:
    """A float32 shadow copy of ``params``, averaged as the anchors' ``ema.step`` calls do;
    ``per_update`` calls per optimizer step (Flow-GRPO: one per accumulated micro-batch)."""

    def __init__(self, params: Iterable[nn.Parameter], decay: float = 0.9, interval: int = 1,
                 per_update: int = 1) -> None:
        if not 0.0 <= decay < 1.0 or interval < 1 or per_update < 1:
            raise ValueError(f"EMA decay must be in [0, 1), interval and per_update >= 1, got {decay}, "
                             f"{interval}, {per_update}")
        self.params = list(params)
        self.decay, self.interval, self.per_update = decay, interval, per_update
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def step(self, steps_done: int) -> None:
        """One anchor call, ``steps_done`` optimizer steps done: average when its turn comes."""
        if (steps_done + 1) % self.interval:
            return
        d = ema_decay(steps_done, self.decay)
        for shadow, param in zip(self.shadow, self.params, strict=True):
            shadow.mul_(d).add_(param.detach().float(), alpha=1.0 - d)

    def before_update(self, steps_done: int) -> None:
        """The calls after the micro-batches that precede an optimizer step's last one: on the weights
        before the step, with the count before it (``per_update - 1`` calls)."""
        for _ in range(self.per_update - 1):
            self.step(steps_done)

    def after_update(self, steps_done: int) -> None:
        """The call after the step's last micro-batch, the step taken (``steps_done`` counts it)."""
        self.step(steps_done)

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
