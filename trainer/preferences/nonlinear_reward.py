"""Bradley-Terry rewards that are not linear in the basis: a quadratic score, a kernel score, and the
bootstrap average of linear scores, each with a Gaussian posterior over its weights.

Why: a linear score in the basis (``linear_reward``) cannot express a taste for "near the centre" (a
distance, quadratic in where the content sits) or for "about this much" (a peak), and its direction is
noisy from a few dozen trees. Each model here keeps the linear reward's machinery: the leaves' features
go through the same :class:`~.linear_reward.Basis`, then through a fixed *feature map* fitted without
any pick (only the leaves' spread), and a score linear in the mapped features is fitted by Newton's
method with a Gaussian prior (``fit_differences``), whose Laplace posterior is what a pessimistic
reward reads. The prior keeps the linear reward's unit precision on every weight; a map multiplies the
terms it adds by a scale instead, which is the same as a prior of that standard deviation on their
weights (kept small: the added terms must earn their place). Its terms are centred on the fitting
leaves, so the posterior spread of a score is its spread relative to an average image, as the linear
reward's is.
Everything is float64 and seeded: a folder state always gives the same reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .linear_reward import LinearReward, fit_differences, pair_differences
from .pairs import Pair

FeatureMap = Callable[[Tensor], Tensor]
"""Basis coordinates ``[n, k]`` -> the features a linear score is fitted on ``[n, m]``."""

QUADRATIC_COORDINATES = 12  # leading coordinates whose squares are added
QUADRATIC_PRODUCTS = 4  # the first of them whose pairwise products are added too
QUADRATIC_SCALE = 0.1  # the added terms' prior standard deviation, beside the linear weights' 1: a tree's
# pairs share its few marks, so they say less than their count, and a looser prior lets the squares fit noise
FOURIER_FEATURES = 256  # random Fourier features: enough for a smooth score of the basis coordinates
FOURIER_SEED = 0
FOURIER_SCALE = 1.0  # the kernel part's prior standard deviation of a score, as one linear weight's
MEDIAN_ROWS = 400  # leaves whose pairwise distances set the bandwidth (evenly spaced, no randomness)
BOOTSTRAP_ROUNDS = 32
BOOTSTRAP_SEED = 0


def quadratic_coordinates(k: int, summary: int, count: int = QUADRATIC_COORDINATES) -> Tensor:
    """The basis coordinates the quadratic map squares and multiplies: the ``summary`` features kept
    last in the basis (where the content sits, how much, its colour: distances and peaks are about them),
    then the top principal directions, ``count`` in all."""
    if not 0 <= summary <= k:
        raise ValueError(f"summary must be within the basis's {k} coordinates, got {summary}")
    kept = list(range(k - summary, k))[:count]
    directions = list(range(min(k - summary, max(count - len(kept), 0))))
    return torch.tensor(directions + kept, dtype=torch.long)


def quadratic_terms(count: int, products: int) -> tuple[Tensor, Tensor]:
    """The positions ``(i, j)`` of the terms ``z_i z_j`` among ``count`` coordinates: every square, and
    the products of the first ``products`` (a full quadratic in all of them has too many weights for a
    few dozen trees)."""
    left, right = torch.triu_indices(count, count)
    keep = (left == right) | (right < products)
    return left[keep], right[keep]


@dataclass(frozen=True)
class QuadraticMap:
    """``z -> [z, scale * standardised products z_i z_j]`` for the chosen coordinates' terms."""

    coordinates: Tensor  # [c] indices into the basis
    left: Tensor  # [c(c+1)/2] positions in ``coordinates``
    right: Tensor
    mean: Tensor  # of the products on the fitting leaves
    std: Tensor
    scale: float = QUADRATIC_SCALE

    def products(self, z: Tensor) -> Tensor:
        chosen = z.double()[:, self.coordinates]
        return chosen[:, self.left] * chosen[:, self.right]

    def __call__(self, z: Tensor) -> Tensor:
        terms = (self.products(z) - self.mean) / self.std
        return torch.cat([z.double(), self.scale * terms], dim=1)


def fit_quadratic_map(z: Tensor, summary: int = 0, count: int = QUADRATIC_COORDINATES,
                      products: int = QUADRATIC_PRODUCTS, scale: float = QUADRATIC_SCALE) -> QuadraticMap:
    """The quadratic map of the leaves' basis coordinates ``z`` ``[n, k]`` (their products' mean and
    spread standardise the added terms, so that one prior scale fits them all)."""
    coordinates = quadratic_coordinates(z.shape[1], summary, count)
    left, right = quadratic_terms(coordinates.numel(), products)
    draft = QuadraticMap(coordinates, left, right, torch.zeros(0), torch.ones(0), scale)
    products = draft.products(z)
    return QuadraticMap(coordinates, left, right, products.mean(dim=0),
                        products.std(dim=0).clamp(min=1e-6), scale)


def median_distance(z: Tensor, rows: int = MEDIAN_ROWS) -> float:
    """The median distance between two leaves' coordinates (at most ``rows`` evenly spaced leaves): the
    kernel's bandwidth, so that it neither sees every leaf alike nor every leaf alone."""
    z = z.double()
    if z.shape[0] > rows:
        z = z[torch.linspace(0, z.shape[0] - 1, rows).round().long()]
    distances = torch.cdist(z, z)
    upper = distances[torch.triu(torch.ones_like(distances, dtype=torch.bool), diagonal=1)]
    median = float(upper.median()) if upper.numel() else 1.0
    return median if median > 1e-9 else 1.0


@dataclass(frozen=True)
class FourierMap:
    """``z -> [z, scale * (sqrt(2/D) cos(z W + b) - centre)]``: the linear score plus a Gaussian-kernel
    score of bandwidth ``1 / |W|``'s scale (random Fourier features), whose Gaussian prior on the weights
    makes the fit a Gaussian-process preference model with a linear plus squared-exponential kernel."""

    frequencies: Tensor  # [k, D]: standard normal draws over the bandwidth
    phases: Tensor  # [D] uniform on [0, 2 pi)
    centre: Tensor  # [D] the features' mean on the fitting leaves
    scale: float = FOURIER_SCALE

    def waves(self, z: Tensor) -> Tensor:
        d = self.phases.numel()
        return math.sqrt(2.0 / d) * torch.cos(z.double() @ self.frequencies + self.phases)

    def __call__(self, z: Tensor) -> Tensor:
        return torch.cat([z.double(), self.scale * (self.waves(z) - self.centre)], dim=1)


def fit_fourier_map(z: Tensor, features: int = FOURIER_FEATURES, seed: int = FOURIER_SEED,
                    scale: float = FOURIER_SCALE) -> FourierMap:
    """The Fourier map of the leaves' basis coordinates ``z`` ``[n, k]``: bandwidth by the median
    heuristic, frequencies and phases drawn from a generator seeded with ``seed`` alone."""
    bandwidth = median_distance(z)
    generator = torch.Generator().manual_seed(seed)
    frequencies = torch.randn(z.shape[1], features, generator=generator, dtype=torch.float64) / bandwidth
    phases = torch.rand(features, generator=generator, dtype=torch.float64) * 2.0 * math.pi
    draft = FourierMap(frequencies, phases, torch.zeros(features, dtype=torch.float64), scale)
    return FourierMap(frequencies, phases, draft.waves(z).mean(dim=0), scale)


def fit_mapped(x: Mapping[str, Tensor], pairs: Mapping[str, Sequence[Pair]],
               feature_map: FeatureMap) -> LinearReward:
    """Bradley-Terry on ``feature_map`` of the trees' basis coordinates ``x``: the posterior mode and
    Laplace covariance of the mapped features' weights (unit prior precision on every weight)."""
    mapped = {t: feature_map(z) for t, z in x.items()}
    return fit_differences(pair_differences(mapped, pairs))


def fit_bootstrap(x: Mapping[str, Tensor], pairs: Mapping[str, Sequence[Pair]],
                  rounds: int = BOOTSTRAP_ROUNDS, seed: int = BOOTSTRAP_SEED) -> LinearReward:
    """The mean of linear rewards fitted on ``rounds`` resamples of the trees (with replacement), and
    the weights' covariance across the resamples as their posterior. Why trees and not pairs: a tree's
    pairs share its leaves and the person's one mood, so they are not independent draws."""
    trees = [t for t, p in pairs.items() if p]
    if not trees:
        raise ValueError("the picks give no preference pair: like some leaves more than others")
    if rounds < 2:
        raise ValueError(f"a bootstrap needs at least 2 rounds, got {rounds}")
    per_tree = {t: pair_differences({t: x[t]}, {t: pairs[t]}) for t in trees}
    generator = torch.Generator().manual_seed(seed)
    weights = []
    for _ in range(rounds):
        drawn = torch.randint(len(trees), (len(trees),), generator=generator).tolist()
        weights.append(fit_differences(torch.cat([per_tree[trees[i]] for i in drawn])).weights)
    stacked = torch.stack(weights)
    return LinearReward(stacked.mean(dim=0), torch.cov(stacked.T).reshape(stacked.shape[1], -1))
