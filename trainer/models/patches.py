"""FLUX-style 2x2 patch packing and positional ids, shared by the embedded model and FLUX.1."""

from __future__ import annotations

import torch
from torch import Tensor


def pack(latents: Tensor) -> Tensor:
    """FLUX 2x2 packing: ``[B, C, H, W]`` -> ``[B, H/2 * W/2, 4C]`` tokens."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: Tensor, channels: int, height: int, width: int) -> Tensor:
    """Inverse of :func:`pack`."""
    b = tokens.shape[0]
    x = tokens.reshape(b, height // 2, width // 2, channels, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, channels, height, width)


def image_ids(height: int, width: int) -> Tensor:
    """FLUX positional ids ``(0, row, col)`` of the packed tokens."""
    rows = torch.arange(height // 2).repeat_interleave(width // 2)
    cols = torch.arange(width // 2).repeat(height // 2)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=1).float()


