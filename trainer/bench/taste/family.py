"""Tastes nobody chose: a generated family of hidden tastes, from a documented generator and a fixed seed.

Why: the five named tastes were chosen by hand, and the personal reward's features describe two of them
directly (the content's centre and spread). A table over them cannot say how learning from picks does on
a taste nobody chose, and every feature added for them risks fitting those five. The family is drawn
instead, wide enough that fitting the features to it means fitting tastes in general.

Taste ``family_NN`` is drawn by ``numpy.random.default_rng([FAMILY_SEED, NN])`` from the statistics of
``image_statistics.py`` (symmetry, edges, counts, compactness, colour variety, saturation, background,
texture, scatter; and, with drawn parameters, closeness to a point, to a hue, the share in a region) and
the five named tastes. Its kind is ``KINDS[NN % 4]``:

- ``peak``: one statistic near a drawn target (a Gaussian bump of width ``PEAK_WIDTH``): a liking for
  "about this much", which no linear score expresses;
- ``direction``: a random direction in three statistics (drawn signs and weights, squashed by a
  logistic);
- ``mixture``: two named tastes mixed with drawn weights, each possibly reversed, so that some pull
  against the prompt (objects lower, warm shades, or their opposites);
- ``interaction``: the product of two statistics, each possibly reversed ("symmetric and colourful").

Every taste is a plain function ``(images [B, 3, H, W] in [0, 1], prompts) -> [B]`` in ``[0, 1]``, named
``MODULE:family_NN`` in a config (the ``function`` reward's spec) or ``family_NN`` on the benchmark's command
line; :func:`describe` says in words what each one likes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor

from . import hidden_tastes, image_statistics
from .image_statistics import STATISTICS, Statistic

MODULE = "dynamic_treerpo.trainer.bench.taste.family"
FAMILY_SEED = 20261206
FAMILY_SIZE = 16
KINDS = ("peak", "direction", "mixture", "interaction")
PEAK_WIDTH = 0.15
STEEPNESS = 4.0  # the direction kind's logistic: a change of 0.25 along the direction moves it by e


@dataclass(frozen=True)
class Reading:
    """A statistic with its drawn parameters, possibly reversed (1 - value), and its name in words."""

    name: str
    statistic: Statistic
    reversed: bool = False

    def __call__(self, images: Tensor) -> Tensor:
        value = self.statistic(images).float()
        return 1.0 - value if self.reversed else value

    @property
    def words(self) -> str:
        return f"not {self.name}" if self.reversed else self.name


@dataclass(frozen=True)
class GeneratedTaste:
    """One taste of the family: its name, kind, readings and how they combine."""

    name: str
    kind: str
    readings: tuple[Reading, ...]
    weights: tuple[float, ...]
    target: float = 0.0  # the peak kind's

    def __call__(self, images: Tensor, prompts: Sequence[str] | None = None) -> Tensor:
        values = [r(images) for r in self.readings]
        if self.kind == "peak":
            score = torch.exp(-0.5 * ((values[0] - self.target) / PEAK_WIDTH) ** 2)
        elif self.kind == "direction":
            centred = sum(w * (v - 0.5) for w, v in zip(self.weights, values, strict=True))
            score = torch.sigmoid(STEEPNESS * centred)
        elif self.kind == "mixture":
            score = sum(w * v for w, v in zip(self.weights, values, strict=True))
        else:
            score = values[0] * values[1]
        return torch.as_tensor(score).float().clamp(0.0, 1.0)

    def describe(self) -> str:
        """What the taste likes, in words."""
        if self.kind == "peak":
            return f"{self.readings[0].words} near {self.target:.2f}"
        if self.kind == "interaction":
            return f"{self.readings[0].words} and {self.readings[1].words}"
        terms = [f"{w:+.2f} {r.words}" for w, r in zip(self.weights, self.readings, strict=True)]
        return ("a direction: " if self.kind == "direction" else "a mix: ") + ", ".join(terms)


def _parametrised(rng: np.random.Generator) -> list[tuple[str, Statistic]]:
    """The statistics with drawn parameters, as this taste's draw sets them."""
    row, col = (float(v) for v in rng.uniform(0.15, 0.85, size=2))
    hue = float(rng.uniform(0.0, 2.0 * math.pi))
    top, left = (float(v) for v in rng.uniform(0.0, 0.5, size=2))
    size = (float(v) for v in rng.uniform(0.3, 0.5, size=2))
    height, width = size
    point = partial(image_statistics.closeness_to, row=row, col=col)
    colour = partial(image_statistics.hue_closeness, hue=hue)
    return [(f"close to the point ({row:.2f}, {col:.2f})", point),
            (f"close to hue {math.degrees(hue):.0f} degrees", colour),
            (f"inside the box at ({top:.2f}, {left:.2f}) of {height:.2f} x {width:.2f}",
             partial(image_statistics.share_in_region, top=top, left=left, height=height, width=width))]


def _readings(rng: np.random.Generator, count: int, reverse: bool) -> tuple[Reading, ...]:
    """``count`` distinct statistics (plain or parametrised), each reversed with probability 1/2 when
    ``reverse``."""
    pool = [*STATISTICS.items(), *_parametrised(rng)]
    picked = rng.choice(len(pool), size=count, replace=False)
    return tuple(Reading(pool[int(i)][0], pool[int(i)][1], bool(reverse and rng.random() < 0.5))
                 for i in picked)


def generate(index: int) -> GeneratedTaste:
    """Taste ``family_{index:02d}``: the same taste on every machine and run."""
    rng = np.random.default_rng([FAMILY_SEED, index])
    kind = KINDS[index % len(KINDS)]
    name = f"family_{index:02d}"
    if kind == "peak":
        (reading,) = _readings(rng, 1, reverse=False)
        return GeneratedTaste(name, kind, (reading,), (1.0,), float(rng.uniform(0.2, 0.8)))
    if kind == "direction":
        readings = _readings(rng, 3, reverse=True)
        raw = np.abs(rng.normal(size=3)) + 0.2
        return GeneratedTaste(name, kind, readings, tuple(float(w) for w in raw / raw.sum()))
    if kind == "mixture":
        names = rng.choice(sorted(hidden_tastes.TASTES), size=2, replace=False)
        readings = tuple(Reading(str(n).replace("_", " "), hidden_tastes.TASTES[str(n)],
                                 bool(rng.random() < 0.5)) for n in names)
        share = float(rng.uniform(0.3, 0.7))
        return GeneratedTaste(name, kind, readings, (share, 1.0 - share))
    return GeneratedTaste(name, kind, _readings(rng, 2, reverse=True), (1.0, 1.0))


FAMILY: dict[str, GeneratedTaste] = {f"family_{i:02d}": generate(i) for i in range(FAMILY_SIZE)}
"""Every taste of the family by name."""
globals().update(FAMILY)  # ``MODULE:family_NN`` is a module attribute, as the function reward reads it


def describe(name: str) -> str:
    """What the family's taste ``name`` likes, in words."""
    return FAMILY[name].describe()


def taste_function(name: str) -> Callable[[Tensor, Sequence[str]], Tensor]:
    """The family's taste ``name`` as a plain function."""
    return FAMILY[name]
