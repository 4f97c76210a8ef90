"""Tastes for the benchmarks: simple visual preferences that no shipped reward measures.

Each is a plain function ``(images [B, 3, H, W] in [0, 1], prompts) -> [B] scores in [0, 1]`` (the
``function`` reward's contract, ``trainer/rewards/function.py``), reading pixels only: a pixel is
*ink* where its brightest channel stands out from the dark background the embedded model draws on.
They serve ``treerpo bench protocol``'s taste task (a taste mixed with the scene reward, so that a
recipe's gain is measured on more than prompt-following) and ``treerpo bench taste``'s simulated person,
who labels trees with a hidden taste. Nothing here reads the scene reward's parsing or renders.

A config names one as ``function: dynamic_treerpo.trainer.bench.taste.hidden_tastes:NAME``; the older
``dynamic_treerpo.trainer.bench.tastes:NAME`` of saved configs still resolves (the function reward's
alias, ``trainer/rewards/function.py``).

- :func:`larger_objects`: more of the picture covered by the objects (area of ink);
- :func:`central_objects`: ink nearer the centre of the picture;
- :func:`deep_shades`: every object in a deep, dark shade of its colour rather than a bright one;
- :func:`lower_objects`: the objects low in the picture. It pulls against the prompt: a prompt that
  asks for something "at the top" loses position credit when the object sinks;
- :func:`warm_shades`: warm shades (more red than blue in the objects). It pulls against the prompt
  where the prompt names a cool colour.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MODULE = "dynamic_treerpo.trainer.bench.taste.hidden_tastes"
"""This module's import path, as the ``function`` reward's spec names it."""
INK = 0.35  # a pixel whose brightest channel exceeds this is part of an object, not the background
AREA_FULL = 0.30  # an ink fraction this large scores 1 for size


def ink_mask(images: Tensor) -> Tensor:
    """``[B, H, W]`` float mask of object pixels."""
    return (images.float().amax(dim=1) > INK).float()


def larger_objects(images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
    """Fraction of the picture covered by ink, over ``AREA_FULL``, clipped to 1."""
    return (ink_mask(images).flatten(1).mean(dim=1) / AREA_FULL).clamp(0.0, 1.0)


def central_objects(images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
    """1 minus the ink's mean distance from the centre, as a fraction of the half-diagonal (0 without
    ink)."""
    mask = ink_mask(images)
    _, h, w = mask.shape
    ys = (torch.arange(h, dtype=torch.float32) + 0.5 - h / 2.0).view(h, 1)
    xs = (torch.arange(w, dtype=torch.float32) + 0.5 - w / 2.0).view(1, w)
    distance = (ys**2 + xs**2).sqrt() / (0.5 * (h**2 + w**2) ** 0.5)
    ink = mask.flatten(1).sum(dim=1)
    mean = (mask * distance).flatten(1).sum(dim=1) / ink.clamp(min=1.0)
    return torch.where(ink > 0, 1.0 - mean, torch.zeros_like(mean))


def deep_shades(images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
    """How deep the objects' colours are: 1 minus the mean brightness of the ink's brightest channel,
    rescaled from ``[INK, 1]`` to ``[1, 0]`` (0 without ink)."""
    mask = ink_mask(images)
    peak = images.float().amax(dim=1)
    ink = mask.flatten(1).sum(dim=1)
    mean = (mask * peak).flatten(1).sum(dim=1) / ink.clamp(min=1.0)
    depth = ((1.0 - mean) / (1.0 - INK)).clamp(0.0, 1.0)
    return torch.where(ink > 0, depth, torch.zeros_like(depth))


def lower_objects(images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
    """How low the ink sits: its mean row as a fraction of the height, 0 at the top edge, 1 at the
    bottom (0 without ink)."""
    mask = ink_mask(images)
    _, h, _ = mask.shape
    rows = ((torch.arange(h, dtype=torch.float32) + 0.5) / h).view(1, h, 1)
    ink = mask.flatten(1).sum(dim=1)
    mean = (mask * rows).flatten(1).sum(dim=1) / ink.clamp(min=1.0)
    return torch.where(ink > 0, mean, torch.zeros_like(mean))


def warm_shades(images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
    """How warm the objects' colours are: the ink's mean of red minus blue, from ``[-1, 1]`` to
    ``[0, 1]`` (0 without ink)."""
    mask = ink_mask(images)
    x = images.float().clamp(0.0, 1.0)
    warmth = (x[:, 0] - x[:, 2] + 1.0) / 2.0
    ink = mask.flatten(1).sum(dim=1)
    mean = (mask * warmth).flatten(1).sum(dim=1) / ink.clamp(min=1.0)
    return torch.where(ink > 0, mean, torch.zeros_like(mean))


TASTES = {"larger_objects": larger_objects, "central_objects": central_objects, "deep_shades": deep_shades,
          "lower_objects": lower_objects, "warm_shades": warm_shades}
"""By name, for ``--taste NAME`` (any ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION`` works too)."""


def function_spec(name: str) -> str:
    """The ``function`` reward's spec of the taste ``name`` of this module (``MODULE:NAME``)."""
    return f"{MODULE}:{name}"
