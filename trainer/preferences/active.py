"""Which unlabelled tree to show next: the ones whose leaves' order the picks so far leave most open.

Oldest first until ``WARMUP`` trees are labelled (too few picks to know what is unsure). From then on, a
quick linear reward (``linear_reward``) is fitted on the picks, and each unlabelled tree is scored by
how much its picks would tell: for every pair of its leaves, the mutual information between the pair's
order and the reward's weights (Houlsby et al.'s BALD), averaged over the tree's pairs. A tree whose
leaves the reward already orders confidently, or whose leaves look alike (no weight could order them),
scores low; one where plausible weights disagree scores high. Ties keep the oldest first.

Pure functions of the folder's state (features, picks, tree ids): the same state gives the same order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import torch
from torch import Tensor

from .linear_reward import Basis, LinearReward, fit_basis, fit_linear
from .pairs import Pair

WARMUP = 5  # labelled trees before the order follows the reward's doubt
ORDERS = ("oldest", "active")
# What the picking panel uses unless asked. ``treerpo bench picking`` compared the two orders by the personal
# reward's accuracy against the hidden taste: the active order helped at the first few labelled trees but
# not measurably at the 25 trees aimed at, so oldest first stays the default (docs/picks.md, "How many
# picks", gives the figures).
DEFAULT_ORDER = "oldest"
_QUADRATURE = 24  # Gauss-Hermite nodes for the expectations over the posterior


@lru_cache(maxsize=1)
def _hermite() -> tuple[Tensor, Tensor]:
    import numpy as np

    nodes, weights = np.polynomial.hermite.hermgauss(_QUADRATURE)
    return torch.from_numpy(nodes), torch.from_numpy(weights / math.sqrt(math.pi))


def _entropy(p: Tensor) -> Tensor:
    """Binary entropy in nats."""
    p = p.clamp(1e-12, 1 - 1e-12)
    return -(p * p.log() + (1 - p) * (1 - p).log())


def order_information(mean: Tensor, variance: Tensor) -> Tensor:
    """Mutual information (nats) between a pair's order and the weights, for a Bradley-Terry margin
    ``N(mean, variance)``: the entropy of the expected order minus the expected entropy."""
    nodes, weights = _hermite()
    margins = mean.unsqueeze(-1) + (2 * variance.clamp(min=0)).sqrt().unsqueeze(-1) * nodes
    p = torch.sigmoid(margins)
    return _entropy((p * weights).sum(-1)) - (_entropy(p) * weights).sum(-1)


def tree_doubt(model: LinearReward, x: Tensor) -> Tensor:
    """How much each tree's picks would tell the reward: ``order_information`` averaged over every pair of
    its leaves (``x``: the leaves' projected features, ``[trees, leaves, k]``) -> ``[trees]``."""
    i, j = torch.triu_indices(x.shape[-2], x.shape[-2], offset=1)
    d = x[..., i, :].double() - x[..., j, :].double()
    mean = d @ model.weights
    variance = ((d @ model.covariance) * d).sum(-1)
    return order_information(mean, variance).mean(-1)


def next_order(tree_ids: Sequence[str], picks: Mapping[str, Sequence[Pair]], features: Mapping[str, Tensor],
               order: str = "active", warmup: int = WARMUP, basis: Basis | None = None) -> list[str]:
    """The unlabelled trees of ``tree_ids`` (oldest first) in the order to show them. ``picks``: the pairs
    of each labelled tree; ``features``: every tree's leaf features ``[leaves, D]`` (the personal reward's
    backbone), needed for ``order="active"`` only; ``basis``: the projection, when the caller keeps one."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: expected one of {', '.join(ORDERS)}")
    unlabelled = [t for t in tree_ids if t not in picks]
    labelled = [t for t in tree_ids if t in picks]
    if order == "oldest" or len(labelled) < warmup or len(unlabelled) < 2:
        return unlabelled
    missing = [t for t in tree_ids if t not in features]
    if missing:
        raise ValueError(f"no features for tree {missing[0]!r}: the active order needs every tree's")
    basis = basis or fit_basis([features[t] for t in tree_ids])
    x = {t: basis(features[t]) for t in tree_ids}
    model = fit_linear({t: x[t] for t in labelled}, {t: picks[t] for t in labelled})
    doubt: dict[str, float] = {}
    for leaves in sorted({x[t].shape[0] for t in unlabelled}):  # one batch per leaf count
        same = [t for t in unlabelled if x[t].shape[0] == leaves]
        doubt.update(zip(same, tree_doubt(model, torch.stack([x[t] for t in same])).tolist(), strict=True))
    age = {t: k for k, t in enumerate(unlabelled)}
    return sorted(unlabelled, key=lambda t: (-round(doubt[t], 12), age[t]))
