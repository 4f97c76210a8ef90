"""Shared fixtures: tiny velocity models that run in milliseconds on a CPU."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

torch.set_num_threads(int(os.environ.get("TREERPO_TEST_THREADS", "2")))


class TinyVelocity(nn.Module):
    """A small conditional velocity model: per-prompt embedding + a 1x1-conv MLP over channels.

    Rows are processed independently, so results do not depend on batch composition.
    """

    def __init__(self, channels: int = 3, prompts: int = 4, hidden: int = 8, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(prompts, hidden, generator=gen) * 0.1)
        self.inp = nn.Parameter(torch.randn(hidden, channels, generator=gen) * 0.3)
        self.out = nn.Parameter(torch.randn(channels, hidden, generator=gen) * 0.3)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("hc,bc...->bh...", self.inp, x)
        shape = (x.shape[0], -1) + (1,) * (x.ndim - 2)
        h = torch.tanh(h + self.embed[cond].reshape(shape) + sigma.reshape(shape[:1] + (1,) * (x.ndim - 1)))
        return torch.einsum("ch,bh...->bc...", self.out, h)


@pytest.fixture
def tiny_model() -> TinyVelocity:
    return TinyVelocity()
