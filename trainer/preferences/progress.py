"""Whether more picks would still help: a learning curve of the picks, and one plain line about it.

The labelled trees are split by tree into ``FOLDS`` folds (``REPEATS`` times, each a fixed shuffle). A
quick linear reward (``linear_reward``) fitted on the other folds orders the held-out fold's pairs; the
share it orders as the person did is the *held-out pair accuracy*: how well the picks agree with each
other. It is measured with all the training trees of each fold and with ``FRACTIONS`` of them, on the
same held-out pairs, and a line through accuracy against the log of the tree count gives the gain that
half as many picks again would bring (from two thirds of the trees to all of them). Why a line through
four sizes and not two: at 20 to 50 trees, one difference of two accuracies swings by more than
``FLAT`` with which trees happen to be labelled; the slope is steadier.

The rule (``advise``): below ``MIN_TREES`` no advice; below ``STOP_FROM`` "still rising"; from there,
"stopped rising" once that gain is under ``FLAT``. ``advise`` is pure; ``learning_curve`` fits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .linear_reward import Basis, differences_accuracy, fit_basis, fit_differences, pair_differences
from .pairs import Pair

FOLDS = 5
REPEATS = 4
FRACTIONS = (1 / 2, 2 / 3, 5 / 6, 1.0)  # of each fold's training trees
MIN_TREES = 8  # fewer labelled trees say nothing about agreement: no advice yet
STOP_FROM = 25  # the curve is never called flat before this many trees (noise: treerpo bench picking)
FLAT = 0.01  # less gain in accuracy than this from 50% more picks: stopped rising
DISAGREE = 0.6  # below this held-out accuracy, the picks hardly agree with each other


@dataclass(frozen=True)
class Curve:
    """Held-out pair accuracy by training-tree count (means over folds and repeats)."""

    trees: int  # labelled trees
    sizes: tuple[float, ...]  # mean training trees at each fraction
    accuracies: tuple[float, ...]

    @property
    def accuracy(self) -> float:
        """With all the training trees of each fold."""
        return self.accuracies[-1]

    @property
    def gain(self) -> float:
        """Accuracy gained by 50% more trees, from the least-squares line of accuracy on log(trees)."""
        logs = [math.log(s) for s in self.sizes]
        mean_log, mean_acc = sum(logs) / len(logs), sum(self.accuracies) / len(self.accuracies)
        spread = sum((u - mean_log) ** 2 for u in logs)
        if spread == 0:
            return 0.0
        pairs = zip(logs, self.accuracies, strict=True)
        return sum((u - mean_log) * (a - mean_acc) for u, a in pairs) / spread * math.log(1.5)


@dataclass(frozen=True)
class Advice:
    """One line for the person, and whether more picks help (None: too few trees to say)."""

    text: str
    more_helps: bool | None
    trees: int
    accuracy: float | None = None
    gain: float | None = None


def learning_curve(tree_ids: Sequence[str], picks: Mapping[str, Sequence[Pair]],
                   features: Mapping[str, Tensor], basis: Basis | None = None, folds: int = FOLDS,
                   repeats: int = REPEATS) -> Curve:
    """The cross-validated curve of the labelled ``tree_ids`` (their pairs in ``picks``, leaf features in
    ``features``). Deterministic: the shuffles are seeded by repeat, from the sorted ids."""
    ids = sorted(t for t in tree_ids if picks.get(t))
    if len(ids) < 3:
        raise ValueError(f"a learning curve needs at least 3 labelled trees with pairs, got {len(ids)}")
    basis = basis or fit_basis([features[t] for t in ids])
    diffs = {t: pair_differences({t: basis(features[t])}, {t: picks[t]}) for t in ids}  # once per tree
    k = min(folds, len(ids))
    accuracies: list[list[float]] = [[] for _ in FRACTIONS]
    sizes: list[list[int]] = [[] for _ in FRACTIONS]
    for repeat in range(repeats):
        order = list(ids)
        random.Random(repeat).shuffle(order)
        for fold in range(k):
            held = set(order[fold::k])
            train = [t for t in order if t not in held]
            test = torch.cat([diffs[t] for t in order[fold::k]])
            for f, fraction in enumerate(FRACTIONS):
                chosen = train[: max(1, round(fraction * len(train)))]
                model = fit_differences(torch.cat([diffs[t] for t in chosen]))
                accuracies[f].append(differences_accuracy(model, test))
                sizes[f].append(len(chosen))
    return Curve(len(ids), tuple(sum(s) / len(s) for s in sizes), tuple(sum(a) / len(a) for a in accuracies))


def advise(trees: int, curve: Curve | None) -> Advice:
    """The line the picking panel shows under its counter (``curve``: None below ``MIN_TREES``)."""
    if curve is None or trees < MIN_TREES:
        more = MIN_TREES - trees
        return Advice(f"label {more} more tree{'s' * (more != 1)} to see how well your picks agree", None,
                      trees)
    agree = f"your picks agree with each other on {curve.accuracy:.0%} of held-out pairs"
    gain = curve.gain
    if trees < STOP_FROM or gain >= FLAT:
        return Advice(f"{agree}; still rising: more picks help", True, trees, curve.accuracy, gain)
    if curve.accuracy < DISAGREE:
        return Advice(f"{agree}, hardly better than chance, and no longer rising: pick for one clear thing "
                      "at a time (or the reward cannot see what you pick for)", False, trees, curve.accuracy,
                      gain)
    return Advice(f"{agree}; it has stopped rising: you can train now", False, trees, curve.accuracy, gain)


def folder_advice(tree_ids: Sequence[str], picks: Mapping[str, Sequence[Pair]],
                  features: Mapping[str, Tensor], basis: Basis | None = None) -> Advice:
    """``advise`` for the labelled trees among ``tree_ids`` (``picks``: the pairs of each labelled one)."""
    labelled = [t for t in tree_ids if t in picks]
    if len(labelled) < MIN_TREES:
        return advise(len(labelled), None)
    return advise(len(labelled), learning_curve(labelled, picks, features, basis))
