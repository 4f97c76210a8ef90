"""The personal reward's pixel backbones: ``pooled`` pixels, and ``content``: pooled pixels plus what
is drawn and where.

``pooled`` (any image size): the image and its brightest channel average-pooled on 8x8,
4x4, 2x2 and 1x1 grids (340 numbers): where the colour is, how much, how bright.

Why ``content``: ``pooled`` averages whole grid cells, so an object's colour and its size are mixed in
one number (a cell's mean red rises with a larger red object and with a redder one alike). A linear
reward on those numbers can only learn "more red pixels" for a taste of warmer colours. Here the
*content* of a picture is the pixels that stand out from its background (the brightest channel above
the picture's median), and each grid cell adds how much content it holds and the content's own mean
colour and brightness (a ratio, so a larger object of the same colour gives the same colour), with the
content's centre and spread. The last of these summarise the whole picture (``SUMMARY``), and the
linear head keeps them beside its principal directions (``preferences.linear_reward.fit_basis``). Nothing
here is fitted or downloaded; the features are the same on every run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

POOLED_GRIDS = (8, 4, 2, 1)
CONTENT_GRIDS = (4, 2, 1)
SUMMARY = 9  # the 1x1 cell's amount and colour, and the content's centre and spread
EMPTY = 1e-3  # a cell with less content than this reads as nearly colourless, not as noise


def pooled_features(images: Tensor) -> Tensor:
    """``[B, 3, H, W]`` in [0, 1] -> ``[B, 340]``: RGB and the brightest channel, average-pooled."""
    x = images.float().clamp(0, 1)
    x = torch.cat([x, x.amax(dim=1, keepdim=True)], dim=1)
    return torch.cat([F.adaptive_avg_pool2d(x, g).flatten(1) for g in POOLED_GRIDS], dim=1)


def content_weights(images: Tensor) -> Tensor:
    """``[B, 1, H, W]``: how far each pixel's brightest channel stands out above its picture's median,
    squared (so the faint noise of a background weighs little beside an object)."""
    peak = images.float().clamp(0, 1).amax(dim=1, keepdim=True)
    background = peak.flatten(1).median(dim=1).values.view(-1, 1, 1, 1)
    return (peak - background).clamp(min=0) ** 2


def content_place(weights: Tensor) -> Tensor:
    """``[B, 4]``: the content's centre (row, column, from 0 to 1) and its spread along each."""
    _, _, h, w = weights.shape
    rows = ((torch.arange(h, dtype=torch.float32) + 0.5) / h).view(1, 1, h, 1)
    cols = ((torch.arange(w, dtype=torch.float32) + 0.5) / w).view(1, 1, 1, w)
    total = weights.flatten(1).sum(dim=1).clamp(min=1e-6).view(-1, 1, 1, 1)
    share = weights / total
    row = (share * rows).flatten(1).sum(dim=1)
    col = (share * cols).flatten(1).sum(dim=1)
    row_spread = (share * (rows - row.view(-1, 1, 1, 1)) ** 2).flatten(1).sum(dim=1).sqrt()
    col_spread = (share * (cols - col.view(-1, 1, 1, 1)) ** 2).flatten(1).sum(dim=1).sqrt()
    return torch.stack([row, col, row_spread, col_spread], dim=1)


def content_features(images: Tensor) -> Tensor:
    """``[B, 3, H, W]`` in [0, 1] -> ``[B, 449]``: ``pooled_features`` (340), then per cell of the 4x4,
    2x2 and 1x1 grids the content's amount and its mean RGB and brightest channel (105), then its
    centre and spread (4). The last ``SUMMARY`` (the whole picture's cell, the centre and the spread)
    summarise the picture; the linear head keeps them as they are (``content_features.summary``)."""
    x = images.float().clamp(0, 1)
    weights = content_weights(x)
    channels = torch.cat([x, x.amax(dim=1, keepdim=True)], dim=1)
    parts = [pooled_features(x)]
    for grid in CONTENT_GRIDS:
        amount = F.adaptive_avg_pool2d(weights, grid)
        colour = F.adaptive_avg_pool2d(weights * channels, grid) / (amount + EMPTY)
        parts += [amount.flatten(1), colour.flatten(1)]
    parts.append(content_place(weights))
    return torch.cat(parts, dim=1)


content_features.summary = SUMMARY  # type: ignore[attr-defined]  # read by personal.summary_features
