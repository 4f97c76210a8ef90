"""A linear Bradley-Terry reward with its posterior, fitted in milliseconds: the quick stand-in for the
personal reward that decides which tree to show next (``active``) and whether more picks still help
(``progress``).

Why a second, simpler model: the personal reward's head (``rewards.personal``) takes about a second
to fit on 50 trees, and the picking panel asks after every save; choosing a tree also needs to know how
*unsure* the reward is, which a point estimate does not say. Here the leaves' frozen features are
standardised and projected on their top principal directions (found on every leaf of the folder,
labelled or not: no pick is used), and a linear score ``x @ w`` is fitted to the pairs by Newton's
method on the Bradley-Terry log-likelihood with a Gaussian prior. The prior and the curvature at the
optimum give a Gaussian posterior over ``w`` (Laplace's approximation): how far each pair's order is
settled. Everything is float64 and free of randomness, so a folder state always gives the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .pairs import Pair

DIMS = 16  # principal directions kept: enough for size, place and shade; few enough for 10 trees
PRIOR = 1.0  # precision of the Gaussian prior on the weights (standardised directions)
NEWTON_STEPS = 25


@dataclass(frozen=True)
class Basis:
    """Standardise features, then project them on the principal directions of the folder's leaves."""

    mean: Tensor  # [D]
    std: Tensor  # [D]
    directions: Tensor  # [D, k]: principal directions scaled to unit variance, then any features kept

    def __call__(self, features: Tensor) -> Tensor:
        return ((features.double() - self.mean) / self.std) @ self.directions


def fit_basis(features: Sequence[Tensor], dims: int = DIMS, keep_last: int = 0) -> Basis:
    """The basis of ``features`` (each ``[leaves, D]``): their mean, spread and top ``dims`` directions;
    ``keep_last``: the last features also kept as they are (standardised), beside the directions. Why:
    a few summary features (the ``content`` backbone's whole-picture colour and place) carry a global
    taste on their own, and the top directions of several hundred features can leave them out."""
    rows = torch.cat([f.double() for f in features])
    if rows.shape[0] < 2:
        raise ValueError("a basis needs at least two leaves")
    if not 0 <= keep_last <= rows.shape[1]:
        raise ValueError(f"keep_last must be within the {rows.shape[1]} features, got {keep_last}")
    mean, std = rows.mean(dim=0), rows.std(dim=0).clamp(min=1e-6)
    centred = (rows - mean) / std
    _, singular, vh = torch.linalg.svd(centred, full_matrices=False)
    keep = min(dims, int((singular > 1e-8 * singular[0]).sum()))
    scale = singular[:keep] / (rows.shape[0] - 1) ** 0.5  # each direction's standard deviation
    # the sign of a singular vector is arbitrary: fix it (largest entry positive) so results never flip
    directions = vh[:keep].T
    signs = torch.sign(directions.gather(0, directions.abs().argmax(dim=0, keepdim=True))).squeeze(0)
    directions = directions * signs / scale
    if keep_last:
        kept = torch.eye(rows.shape[1], dtype=torch.float64)[:, rows.shape[1] - keep_last:]
        directions = torch.cat([directions, kept], dim=1)
    return Basis(mean, std, directions)


@dataclass(frozen=True)
class LinearReward:
    """A score ``x @ weights`` and the posterior covariance of ``weights`` (Laplace's approximation)."""

    weights: Tensor  # [k]
    covariance: Tensor  # [k, k]

    def scores(self, x: Tensor) -> Tensor:
        return x.double() @ self.weights


def pair_differences(x: Mapping[str, Tensor], pairs: Mapping[str, Sequence[Pair]]) -> Tensor:
    """``[pairs, k]``: the better leaf's projected features minus the worse one's, every tree's."""
    rows = [x[t][[p.better for p in ps]] - x[t][[p.worse for p in ps]] for t, ps in pairs.items() if ps]
    k = next(iter(x.values())).shape[-1] if x else 0
    return torch.cat(rows).double() if rows else torch.zeros(0, k, dtype=torch.float64)


def fit_differences(d: Tensor, prior: float | Tensor = PRIOR, steps: int = NEWTON_STEPS) -> LinearReward:
    """The posterior mode of Bradley-Terry on pairs given as ``d`` (``pair_differences``) under a
    ``N(0, 1/prior)`` prior on every weight (``prior``: one precision, or one per weight), and the inverse
    curvature there."""
    d = d.double()
    k = d.shape[1]
    w = torch.zeros(k, dtype=torch.float64)
    prior = torch.as_tensor(prior, dtype=torch.float64).expand(k)
    eye = torch.diag(prior)
    for _ in range(steps):
        p = torch.sigmoid(-(d @ w))  # probability of the wrong order
        hessian = (d * (p * (1 - p)).unsqueeze(1)).T @ d + eye
        step = torch.linalg.solve(hessian, prior * w - d.T @ p)
        w = w - step
        if float(step.abs().max()) < 1e-9:
            break
    p = torch.sigmoid(-(d @ w))
    hessian = (d * (p * (1 - p)).unsqueeze(1)).T @ d + eye
    return LinearReward(w, torch.linalg.inv(hessian))


def fit_linear(x: Mapping[str, Tensor], pairs: Mapping[str, Sequence[Pair]], prior: float = PRIOR,
               steps: int = NEWTON_STEPS) -> LinearReward:
    """``fit_differences`` on ``pairs`` (per tree, indices into ``x[tree]``'s rows)."""
    return fit_differences(pair_differences(x, pairs), prior, steps)


def differences_accuracy(model: LinearReward, d: Tensor) -> float:
    """The share of the pairs ``d`` the model orders as given (ties count half); nan without pairs."""
    if d.shape[0] == 0:
        return float("nan")
    margin = d.double() @ model.weights
    return float(((margin > 0).double() + 0.5 * (margin == 0).double()).mean())


def linear_accuracy(model: LinearReward, x: Mapping[str, Tensor],
                    pairs: Mapping[str, Sequence[Pair]]) -> float:
    """``differences_accuracy`` of ``pairs`` (per tree, indices into ``x[tree]``'s rows)."""
    return differences_accuracy(model, pair_differences(x, pairs))
