"""Image statistics a taste nobody chose can be built from: what a person might like in a picture beyond
the five named tastes, computed from pixels alone.

Why these: the personal reward's ``content`` features describe where the drawn content is, how much of it
there is and its colours (``trainer/rewards/pixel_features.py``). A generated taste that only re-weighed
those would measure how well the reward fits its own features. These statistics are other things a
person sees (symmetry, crisp or soft edges, how many objects, how compact or scattered they are, how
colourful, the background, texture) and nonlinear readings of the content's place and hue (closeness to a
point or a hue), so that fitting the features to the family means fitting tastes in general.

Each is a function ``images [B, 3, H, W] in [0, 1] -> [B]`` in ``[0, 1]``, 0 for a picture without ink (the
named tastes' convention, ``hidden_tastes.py``). Nothing here is fitted: the same picture scores the same on
every machine and run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import Tensor

from .hidden_tastes import INK, ink_mask

Statistic = Callable[[Tensor], Tensor]


def _with_ink(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where the picture has ink, 0 elsewhere, clipped to ``[0, 1]``."""
    has_ink = mask.flatten(1).sum(dim=1) > 0
    return torch.where(has_ink, values.clamp(0.0, 1.0), torch.zeros_like(values))


def _ink_mean(values: Tensor, mask: Tensor) -> Tensor:
    """The mean of ``values [B, H, W]`` over each picture's ink."""
    return (values * mask).flatten(1).sum(dim=1) / mask.flatten(1).sum(dim=1).clamp(min=1.0)


def mirror_symmetry(images: Tensor) -> Tensor:
    """How alike the ink is to its left-right mirror image: the overlap of the two masks over their union."""
    mask = ink_mask(images)
    flipped = mask.flip(-1)
    overlap = (mask * flipped).flatten(1).sum(dim=1)
    union = torch.maximum(mask, flipped).flatten(1).sum(dim=1).clamp(min=1.0)
    return _with_ink(overlap / union, mask)


def upright_symmetry(images: Tensor) -> Tensor:
    """How alike the ink is to its top-bottom mirror image."""
    return mirror_symmetry(images.transpose(-1, -2))


def edge_sharpness(images: Tensor) -> Tensor:
    """How crisp the objects' edges are: the brightness gradient's energy over its mass (a step edge puts
    its change into few pixels, a soft one spreads it), on the scale of a full step from black to white."""
    peak = images.float().clamp(0, 1).amax(dim=1)
    dy = peak[:, 1:, :-1] - peak[:, :-1, :-1]
    dx = peak[:, :-1, 1:] - peak[:, :-1, :-1]
    grad = (dx**2 + dy**2).sqrt().flatten(1)
    return _with_ink((grad**2).sum(dim=1) / grad.sum(dim=1).clamp(min=1e-6), ink_mask(images))


def object_count(images: Tensor) -> Tensor:
    """How many separate objects (4-connected pieces of ink of at least 4 pixels), over 4, clipped to 1."""
    masks = ink_mask(images).cpu().numpy() > 0
    counts = []
    for mask in masks:
        labels, found = ndimage.label(mask)
        sizes = np.bincount(labels.ravel())[1:] if found else np.zeros(0)
        counts.append(float((sizes >= 4).sum()))
    return torch.tensor(counts, dtype=torch.float32) / 4.0


def compactness(images: Tensor) -> Tensor:
    """How much of the ink's bounding box the ink fills (one solid blob: near 1; scattered pieces: low)."""
    mask = ink_mask(images)
    box = (_span(mask.amax(dim=2)) * _span(mask.amax(dim=1))).clamp(min=1.0)
    return _with_ink(mask.flatten(1).sum(dim=1) / box, mask)


def _span(occupied: Tensor) -> Tensor:
    """``[B, N]`` 0/1 occupancy -> the number of positions from the first occupied one to the last."""
    n = occupied.shape[1]
    index = torch.arange(n, dtype=torch.float32)
    first = torch.where(occupied > 0, index, torch.full_like(index, n)).amin(dim=1)
    last = torch.where(occupied > 0, index, torch.full_like(index, -1.0)).amax(dim=1)
    return (last - first + 1).clamp(min=0.0)


def colour_variety(images: Tensor) -> Tensor:
    """How many different hues the ink shows: one minus the length of the ink's mean unit hue vector (one
    colour: 0; hues all around the wheel: near 1)."""
    mask = ink_mask(images)
    hue_x, hue_y = _hue_vector(images)
    norm = (hue_x**2 + hue_y**2).sqrt().clamp(min=1e-6)
    mean_x, mean_y = _ink_mean(hue_x / norm, mask), _ink_mean(hue_y / norm, mask)
    return _with_ink(1.0 - (mean_x**2 + mean_y**2).sqrt(), mask)


def _hue_vector(images: Tensor) -> tuple[Tensor, Tensor]:
    """Each pixel's chroma as a 2-d vector (red at angle 0, green at 120 degrees, blue at 240)."""
    x = images.float().clamp(0, 1)
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    return r - 0.5 * (g + b), (math.sqrt(3) / 2) * (g - b)


def hue_closeness(images: Tensor, hue: float) -> Tensor:
    """How near the ink's mean hue lies to ``hue`` (radians on the colour wheel): 1 on it, 0 opposite."""
    mask = ink_mask(images)
    hue_x, hue_y = _hue_vector(images)
    angle = torch.atan2(_ink_mean(hue_y, mask), _ink_mean(hue_x, mask))
    return _with_ink((1.0 + torch.cos(angle - hue)) / 2.0, mask)


def saturation(images: Tensor) -> Tensor:
    """How saturated the ink's colours are: (brightest - darkest channel) / brightest, on the ink."""
    x = images.float().clamp(0, 1)
    peak, low = x.amax(dim=1), x.amin(dim=1)
    mask = ink_mask(images)
    return _with_ink(_ink_mean((peak - low) / peak.clamp(min=1e-6), mask), mask)


def background_brightness(images: Tensor) -> Tensor:
    """How light the background is: the mean brightest channel off the ink, over the ink threshold."""
    mask = ink_mask(images)
    peak = images.float().clamp(0, 1).amax(dim=1)
    off = 1.0 - mask
    mean = (peak * off).flatten(1).sum(dim=1) / off.flatten(1).sum(dim=1).clamp(min=1.0)
    return _with_ink(mean / INK, mask)


def texture(images: Tensor) -> Tensor:
    """How busy the ink's surface is: the mean absolute Laplacian of brightness inside the ink (edges
    left out), over a quarter of the full range."""
    peak = images.float().clamp(0, 1).amax(dim=1, keepdim=True)
    kernel = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]).view(1, 1, 3, 3)
    lap = F.conv2d(F.pad(peak, (1, 1, 1, 1), mode="replicate"), kernel).abs().squeeze(1)
    mask = ink_mask(images)
    inside = -F.max_pool2d(-mask.unsqueeze(1), 3, stride=1, padding=1).squeeze(1)  # eroded: no edges
    return _with_ink(_ink_mean(lap, inside) / 0.25, mask)


def ink_centre(images: Tensor) -> tuple[Tensor, Tensor]:
    """The ink's mean row and column, from 0 (top, left) to 1 (bottom, right)."""
    mask = ink_mask(images)
    _, h, w = mask.shape
    rows = ((torch.arange(h, dtype=torch.float32) + 0.5) / h).view(1, h, 1).expand_as(mask)
    cols = ((torch.arange(w, dtype=torch.float32) + 0.5) / w).view(1, 1, w).expand_as(mask)
    return _ink_mean(rows, mask), _ink_mean(cols, mask)


def closeness_to(images: Tensor, row: float, col: float) -> Tensor:
    """How near the ink's centre lies to the point ``(row, col)``: 1 on it, 0 a picture's diagonal away."""
    r, c = ink_centre(images)
    distance = ((r - row) ** 2 + (c - col) ** 2).sqrt() / math.sqrt(2.0)
    return _with_ink(1.0 - distance, ink_mask(images))


def share_in_region(images: Tensor, top: float, left: float, height: float, width: float) -> Tensor:
    """The share of the ink inside a rectangle of the picture (corner and size as fractions)."""
    mask = ink_mask(images)
    _, h, w = mask.shape
    r0, c0 = int(top * h), int(left * w)
    r1, c1 = max(r0 + 1, int((top + height) * h)), max(c0 + 1, int((left + width) * w))
    inside = mask[:, r0:r1, c0:c1].flatten(1).sum(dim=1)
    return _with_ink(inside / mask.flatten(1).sum(dim=1).clamp(min=1.0), mask)


def scatter(images: Tensor) -> Tensor:
    """How spread out the ink is: the root-mean-square distance of ink from its centre, over half the
    picture's diagonal."""
    mask = ink_mask(images)
    _, h, w = mask.shape
    r, c = ink_centre(images)
    rows = ((torch.arange(h, dtype=torch.float32) + 0.5) / h).view(1, h, 1)
    cols = ((torch.arange(w, dtype=torch.float32) + 0.5) / w).view(1, 1, w)
    d2 = (rows - r.view(-1, 1, 1)) ** 2 + (cols - c.view(-1, 1, 1)) ** 2
    return _with_ink(_ink_mean(d2, mask).sqrt() / (math.sqrt(2.0) / 2.0), mask)


STATISTICS: dict[str, Statistic] = {
    "mirror_symmetry": mirror_symmetry, "upright_symmetry": upright_symmetry,
    "edge_sharpness": edge_sharpness, "object_count": object_count, "compactness": compactness,
    "colour_variety": colour_variety, "saturation": saturation,
    "background_brightness": background_brightness, "texture": texture, "scatter": scatter,
}
"""The statistics without parameters, by name (the family's generator draws from these and from the
parametrised ones: closeness to a point or a hue, the share in a region)."""
