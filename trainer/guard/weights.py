"""The guard can choose the picks weight too: the same picks trained once per weight, one run kept.

Why: the best weight of the picks against prompt-following differs per taste: at a fixed weight even the
oracle, trained on the hidden taste itself, gained far more of one taste at 0.5 than at 0.3. Each run
already measures, on validation pairs and never on the hidden taste or the test pairs, how much personal
reward its chosen checkpoint gained within the person's limit; the run that gained more is kept. 0.5.0's
default chose between 0.3 and 0.5 this way, at twice the training; since 0.6 the default trains once, at
0.4, which kept at least as much of the oracle frontier on the same runs (docs/results-taste.md, "One
training"). Pure functions: the training layer trains the runs (``trainer/training/weighted.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .choice import Choice
from .trail import Trail


def validation_gain(trail: Trail, choice: Choice) -> float:
    """How much taste the chosen point gained over the base model on the validation pairs (0 where the
    base model was kept): what a run offers, in the personal reward's units, within the limit."""
    point = choice.point
    if point is None or not math.isfinite(point.taste):
        return 0.0
    return point.taste - trail.base.taste


@dataclass(frozen=True)
class WeightChoice:
    """Which of the runs at ``weights`` was kept (``index``), each run's validation gain, and each run's
    trail (for the trade plot; empty when not kept)."""

    weights: tuple[float, ...]
    gains: tuple[float, ...]
    index: int
    trails: tuple[Trail, ...] = field(default=(), compare=False, repr=False)

    def others(self) -> list[Trail]:
        """The trails of the runs not kept."""
        return [t for i, t in enumerate(self.trails) if i != self.index]

    @property
    def weight(self) -> float:
        return self.weights[self.index]

    def line(self) -> str:
        """One line a person reads: the weights tried and why one was kept."""
        if len(self.weights) == 1:
            return f"trained your picks at weight {self.weight:g}"
        pairs = enumerate(zip(self.weights, self.gains, strict=True))
        others = ", ".join(f"{w:g}: {g:+.3g}" for i, (w, g) in pairs if i != self.index)
        if max(self.gains) <= 0:
            return (f"trained your picks at weights {_listed(self.weights)}; no run gained taste within the "
                    f"limit on validation pairs, so the run at {self.weight:g} is shown ({others})")
        return (f"trained your picks at weights {_listed(self.weights)} and kept {self.weight:g}: its choice "
                f"gained {self.gains[self.index]:+.3g} of your taste on validation pairs ({others})")

    def to_json(self) -> dict[str, object]:
        return {"weights": list(self.weights), "validation_gains": list(self.gains), "kept": self.weight}


def _listed(weights: Sequence[float]) -> str:
    names = [f"{w:g}" for w in weights]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def choose_weight(weights: Sequence[float], gains: Sequence[float], trails: Sequence[Trail] = ()
                  ) -> WeightChoice:
    """The run whose chosen point gained the most validation taste; the first weight on ties (the
    earlier default, 0.3, when nothing gained). ``trails``: each run's, kept for the trade plot."""
    if not weights or len(weights) != len(gains):
        raise ValueError("choose_weight needs one validation gain per weight")
    index = max(range(len(weights)), key=lambda i: (gains[i], -i))
    return WeightChoice(tuple(float(w) for w in weights), tuple(float(g) for g in gains), index,
                        tuple(trails))
