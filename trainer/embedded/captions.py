"""Web-like caption noise: the systematic errors the embedded default is pretrained into.

Real text-to-image models learn from web captions that name the right objects but often get the
composition wrong: how many there are, which colour goes with which object, where they are. A model
trained on such captions draws the right things in the wrong arrangement, and reinforcement
learning with a reward that checks the composition is what fixes it (Flow-GRPO's GenEval gains).

The embedded default is pretrained on captions corrupted the same way, at rates at which the
corrupted words carry *no* information about the image (a flip with probability 0.5 makes a binary
word independent of what is drawn). Words that are merely omitted, or wrong in a minority of
captions, leave the right association learnable, so the model would learn it anyway (measured:
docs/algorithm.md). The words still reach the transformer intact, through a frozen random text
encoder, so a LoRA on the transformer can learn to follow them.

Each mechanism acts on one attribute of the scene and leaves the rest of the caption exact:

- ``count``: each group's count word ("a" / "two") is flipped;
- ``binding``: in a scene of two or more groups of different colours, the colours are permuted
  among the groups (never to the identity), so "a red circle and a blue square" may show a blue
  circle and a red square;
- ``region``: the two region words of a two-group scene are swapped (left <-> right,
  top <-> bottom), so the caption names the mirror image.

Corrupted captions may describe scenes the generator never draws (four objects); they are only
ever used as pretraining text, never parsed as prompts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from .scenes import Captioner, SceneSpec, sample_batch, spec_to_prompt

_OTHER_COUNT = {1: 2, 2: 1}


@dataclass(frozen=True)
class CaptionNoise:
    """Probability that each mechanism corrupts a caption it applies to (0: exact captions)."""

    count: float = 0.5
    binding: float = 0.5
    region: float = 0.5

    def __post_init__(self) -> None:
        for name in ("count", "binding", "region"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"caption noise {name}={value} is not a probability in [0, 1]")


EXACT = CaptionNoise(0.0, 0.0, 0.0)
WEB_LIKE = CaptionNoise()  # the documented default rates of the shipped base


def _recoloured(spec: SceneSpec, colours: list[str]) -> SceneSpec:
    return SceneSpec(tuple(replace(g, colour=c) for g, c in zip(spec.groups, colours, strict=True)))


def binding_errors(spec: SceneSpec) -> list[SceneSpec]:
    """Every colour permutation among the groups that describes a different scene."""
    colours = [g.colour for g in spec.groups]
    seen = {frozenset(spec.groups)}
    out: list[SceneSpec] = []
    for order in itertools.permutations(range(len(colours))):
        other = _recoloured(spec, [colours[i] for i in order])
        if frozenset(other.groups) not in seen:
            seen.add(frozenset(other.groups))
            out.append(other)
    return out


def binding_applies(spec: SceneSpec) -> bool:
    """Colour binding can be wrong when permuting the groups' colours changes the scene (not for
    "a red circle and a blue circle", which reads the same either way)."""
    return bool(binding_errors(spec))


def region_applies(spec: SceneSpec) -> bool:
    """Only two-group scenes carry region words."""
    return any(g.region is not None for g in spec.groups)


def corrupt(spec: SceneSpec, rng: np.random.Generator, noise: CaptionNoise) -> SceneSpec:
    """The spec a noisy caption describes for an image drawn from ``spec``.

    Random numbers are drawn in a fixed order whatever the rates, so changing one rate does not
    change which captions another mechanism corrupts.
    """
    flips = rng.random(len(spec.groups))
    bind, swap = rng.random(), rng.random()
    groups = tuple(replace(g, count=_OTHER_COUNT[g.count]) if f < noise.count else g
                   for g, f in zip(spec.groups, flips, strict=True))
    out = SceneSpec(groups)
    errors = binding_errors(out)
    if errors and bind < noise.binding:
        out = errors[int(rng.integers(len(errors)))]
    if region_applies(out) and swap < noise.region:
        regions = [g.region for g in out.groups][::-1]
        out = SceneSpec(tuple(replace(g, region=r) for g, r in zip(out.groups, regions, strict=True)))
    return out


def captioner(noise: CaptionNoise) -> Captioner | None:
    """The ``scenes.sample_batch`` captioner for ``noise``; None (exact captions, no random draws)
    when every rate is 0."""
    if noise == EXACT:
        return None

    def caption(spec: SceneSpec, rng: np.random.Generator) -> str:
        return spec_to_prompt(corrupt(spec, rng, noise))

    return caption


def noisy_batch(n: int, rng: np.random.Generator, noise: CaptionNoise
                ) -> tuple[np.ndarray, list[str], list[SceneSpec]]:
    """n pretraining pairs: renders of true scenes, their noisy captions, and the true specs."""
    specs: list[SceneSpec] = []
    noisy = captioner(noise)

    def caption(spec: SceneSpec, rng: np.random.Generator) -> str:
        specs.append(spec)
        return spec_to_prompt(spec) if noisy is None else noisy(spec, rng)

    images, prompts = sample_batch(n, rng, caption)
    return images, prompts, specs
