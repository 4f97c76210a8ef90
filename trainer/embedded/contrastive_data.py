"""What the embedded image encoder learns from: scenes, their captions, near-miss captions, and the
embedded model's own way of drawing them.

- **Scenes**: fresh renders of the scene grammar (``scenes.sample_spec`` / ``layout`` / ``render``), each
  captioned exactly, its groups in a random order (the same scene, so the caption side learns that order
  carries nothing).
- **Near misses** (``near_misses``): captions one composition error away from the scene: a count flipped,
  the colours permuted among the groups, the regions swapped, one group's shape or colour changed. Why:
  random captions of other scenes differ in many words, so a contrastive loss would be met by colours and
  shapes alone; the near misses make it see counts, which colour goes with which shape, and sides.
- **The model's drawings** (``redraw``): a render noised to a level drawn from ``REDRAW_LEVELS`` and
  denoised by the embedded model with the exact caption (the first steps of SDEdit). The composition of
  the render survives, drawn as the model draws: blobby shapes, soft edges, bleeding colours. Why not
  the model's own samples with their prompts: the shipped model follows counts, binding and regions only
  at chance, so its prompt is a wrong caption half of the time.
- **Augmentation** (``augment``): a light blur and pixel noise, as the model's drawings and 8-bit PNGs
  have; colours and places are left as they are (tastes read them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .captions import binding_errors
from .scenes import COLOURS, SHAPES, SceneSpec, layout, render, sample_spec, spec_to_prompt

KINDS = ("count", "binding", "region", "shape", "colour")
REDRAW_LEVELS = (0.35, 0.75)  # noise levels a render is redrawn from: low enough that its layout survives
REDRAW_STEPS = 10  # the shifted schedule the redraw follows from its level down
BLUR = 1.0  # the largest Gaussian blur, in pixels
NOISE = 0.03  # the largest pixel noise standard deviation

SceneKey = frozenset


def scene_key(spec: SceneSpec) -> SceneKey:
    """What a caption says, whatever the order of its groups: equal keys are the same scene."""
    return frozenset(spec.groups)


def shuffled_prompt(spec: SceneSpec, rng: np.random.Generator) -> str:
    """The caption of ``spec`` with its groups in a random order."""
    order = rng.permutation(len(spec.groups))
    return spec_to_prompt(SceneSpec(tuple(spec.groups[int(i)] for i in order)))


def _valid(spec: SceneSpec) -> bool:
    pairs = [(g.colour, g.shape) for g in spec.groups]
    return len(set(pairs)) == len(pairs)


def near_misses(spec: SceneSpec) -> dict[str, list[SceneSpec]]:
    """Every caption one error away from ``spec``, by kind (``KINDS``); none describes ``spec`` itself."""
    groups = spec.groups
    out: dict[str, list[SceneSpec]] = {kind: [] for kind in KINDS}
    for i, g in enumerate(groups):
        def swap(new, i=i):
            return SceneSpec((*groups[:i], new, *groups[i + 1:]))
        out["count"].append(swap(replace(g, count=3 - g.count)))
        out["shape"] += [swap(replace(g, shape=s)) for s in SHAPES if s != g.shape]
        out["colour"] += [swap(replace(g, colour=c)) for c in COLOURS if c != g.colour]
    out["binding"] = binding_errors(spec)
    if any(g.region for g in groups):
        regions = [g.region for g in groups][::-1]
        swapped = tuple(replace(g, region=r) for g, r in zip(groups, regions, strict=True))
        out["region"].append(SceneSpec(swapped))
    key = scene_key(spec)
    return {kind: [s for s in specs if _valid(s) and scene_key(s) != key] for kind, specs in out.items()}


def sample_near_misses(spec: SceneSpec, count: int, rng: np.random.Generator) -> list[SceneSpec]:
    """``count`` near misses of ``spec``: a kind drawn uniformly among those that apply, then one of its
    captions (repeats allowed: a single-object scene has few)."""
    misses = {kind: specs for kind, specs in near_misses(spec).items() if specs}
    kinds = sorted(misses)
    picked = []
    for _ in range(count):
        specs = misses[kinds[int(rng.integers(len(kinds)))]]
        picked.append(specs[int(rng.integers(len(specs)))])
    return picked


def sample_scenes(count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[SceneSpec]]:
    """``count`` fresh renders ``[count, 3, 64, 64]`` and their specs."""
    specs = [sample_spec(rng) for _ in range(count)]
    return np.stack([render(layout(s, rng)) for s in specs]), specs


def augment(images: Tensor, gen: torch.Generator) -> Tensor:
    """A Gaussian blur of a random width up to ``BLUR`` px (none for half of the pictures) and pixel
    noise up to ``NOISE``, per picture."""
    b = images.shape[0]
    sigma = torch.rand(b, generator=gen) * BLUR * (torch.rand(b, generator=gen) < 0.5)
    taps = torch.arange(-2, 3, dtype=torch.float32)
    kernel = torch.exp(-0.5 * (taps.view(1, -1) / sigma.clamp(min=1e-3).view(-1, 1)) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # [B, 5]; a zero width leaves the centre tap alone
    x = images.float().reshape(1, b * 3, *images.shape[2:])
    rows = kernel.repeat_interleave(3, dim=0)
    x = F.conv2d(F.pad(x, (2, 2, 0, 0), mode="replicate"), rows.view(-1, 1, 1, 5), groups=b * 3)
    x = F.conv2d(F.pad(x, (0, 0, 2, 2), mode="replicate"), rows.view(-1, 1, 5, 1), groups=b * 3)
    x = x.reshape(images.shape)
    noise = torch.randn(x.shape, generator=gen) * (torch.rand(b, generator=gen) * NOISE).view(-1, 1, 1, 1)
    return (x + noise).clamp(0.0, 1.0)


@torch.no_grad()
def redraw(policy, images: np.ndarray, prompts: Sequence[str], gen: torch.Generator) -> Tensor:
    """The embedded model's drawing of each render: noised to a level in ``REDRAW_LEVELS``, then denoised
    along the shifted schedule with the caption (Euler steps on the model's velocity)."""
    from ..core.flow import make_sigmas

    x0 = policy.encode_images(torch.from_numpy(images))
    cond = policy.encode(list(prompts))
    low, high = REDRAW_LEVELS
    start = low + (high - low) * torch.rand(x0.shape[0], generator=gen)
    noise = torch.randn(x0.shape, generator=gen)
    x = (1.0 - start.view(-1, 1, 1, 1)) * x0 + start.view(-1, 1, 1, 1) * noise
    schedule = make_sigmas("shift", REDRAW_STEPS, 3.0)
    sigma = start.clone()
    while bool((sigma > 0).any()):
        rows = (sigma > 0).nonzero().flatten()
        now = sigma[rows]
        below = schedule.view(1, -1) < now.view(-1, 1) - 1e-6
        following = torch.where(below, schedule.view(1, -1), torch.zeros(1)).amax(dim=1)
        v = policy.velocity(x[rows], now, {k: c[rows] for k, c in cond.items()})
        x[rows] = x[rows] + (following - now).view(-1, 1, 1, 1) * v
        sigma[rows] = following
    return policy.decode(x).float()
