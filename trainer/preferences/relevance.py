"""A linear Bradley-Terry reward whose prior learns which directions matter (automatic relevance
determination): the ``ard`` head of the personal reward.

Why: the linear head's one Gaussian prior lets every direction that the picks correlate with take some
weight. From a few hundred noisy pairs, directions that merely travel with the taste on base-model trees
(more ink at the bottom, for a taste of objects lower in the frame) then carry weight, and training,
which moves the images far from those trees, can raise the reward along them without raising the
taste. Relevance determination gives each direction its own prior precision and sets it from the
evidence (MacKay's update on the Laplace posterior, as in the relevance vector machine): a direction the
picks do not need is shrunk to zero, so the reward keeps fewer ways to be raised. Pure functions, float64,
no randomness.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .linear_reward import PRIOR, LinearReward, fit_differences

ROUNDS = 30  # evidence updates; they settle in about ten on the embedded model's picks
LEAST_PRECISION = 1e-2  # a direction's prior never gets wider than N(0, 100) (pairs can be separable)
MOST_PRECISION = 1e6  # a direction at this precision is pruned: its weight is held at about zero
SETTLED = 1e-4  # the largest relative change of a log precision that counts as settled


def relevance_update(weights: Tensor, covariance: Tensor, precision: Tensor) -> Tensor:
    """MacKay's update of each weight's prior precision: ``gamma / w^2``, where ``gamma = 1 - alpha *
    Sigma_jj`` is how well the picks determine that weight (1: fully, 0: the prior alone), within
    ``[LEAST_PRECISION, MOST_PRECISION]``; a weight already at zero is pruned."""
    determined = (1.0 - precision * covariance.diagonal()).clamp(min=0.0)
    squared = weights.square()
    updated = torch.where(squared < 1e-12, torch.full_like(squared, MOST_PRECISION),
                          determined / squared.clamp(min=1e-12))
    return updated.clamp(LEAST_PRECISION, MOST_PRECISION)


def fit_relevance(d: Tensor, rounds: int = ROUNDS) -> tuple[LinearReward, Tensor]:
    """The Bradley-Terry posterior on pairs given as ``d`` (``pair_differences``) under a prior whose
    per-direction precisions are set by relevance determination, starting from the linear head's
    ``PRIOR``; returns the model and the precisions (large: a direction the picks did not need)."""
    d = d.double()
    precision = torch.full((d.shape[1],), PRIOR, dtype=torch.float64)
    model = fit_differences(d, precision)
    for _ in range(rounds):
        updated = relevance_update(model.weights, model.covariance, precision)
        change = float((updated.log() - precision.log()).abs().max()) if d.shape[1] else 0.0
        precision = updated
        model = fit_differences(d, precision)
        if change < SETTLED:
            break
    return model, precision
