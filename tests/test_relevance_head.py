"""The ``ard`` head (``preferences.relevance``): from noisy picks of a taste that one direction expresses,
it shrinks the directions that only travel with it, where the linear head's one prior gives them weight;
it repeats on every fit, and a pessimistic ``ard`` head scores its lower bound."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.preferences.linear_reward import PRIOR, fit_differences
from dynamic_treerpo.trainer.preferences.pairs import Pair, tree_pairs
from dynamic_treerpo.trainer.preferences.records import Picks
from dynamic_treerpo.trainer.preferences.relevance import (
    LEAST_PRECISION,
    MOST_PRECISION,
    fit_relevance,
    relevance_update,
)
from dynamic_treerpo.trainer.rewards.personal import FitConfig, fit_any


def one_direction(count: int, seed: int, mistakes: float = 0.15, dims: int = 12
                  ) -> tuple[dict[str, torch.Tensor], dict[str, list[Pair]]]:
    """Trees of 8 leaves whose taste is the first feature alone; the second travels with it (correlation
    about 0.7), the rest are noise. The person likes 2 and dislikes 1 by the taste, and marks at random
    in ``mistakes`` of the trees."""
    g = torch.Generator().manual_seed(seed)
    features, picks = {}, {}
    for t in range(count):
        x = torch.randn(8, dims, generator=g, dtype=torch.float64)
        x[:, 1] = 0.7 * x[:, 0] + 0.7 * x[:, 1]
        order = x[:, 0].argsort(descending=True).tolist()
        if float(torch.rand(1, generator=g)) < mistakes:
            order = torch.randperm(8, generator=g).tolist()
        features[f"t{t}"] = x
        picks[f"t{t}"] = tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 8)
    return features, picks


def differences(features: dict[str, torch.Tensor], picks: dict[str, list[Pair]]) -> torch.Tensor:
    return torch.cat([features[t][[p.better for p in ps]] - features[t][[p.worse for p in ps]]
                      for t, ps in picks.items()])


def test_relevance_keeps_the_tastes_direction_and_shrinks_the_others() -> None:
    d = differences(*one_direction(50, seed=0))
    plain = fit_differences(d).weights
    model, precision = fit_relevance(d)
    weights = model.weights
    off_plain = float(plain[1:].abs().sum() / plain[0].abs())
    off_relevance = float(weights[1:].abs().sum() / weights[0].abs())
    assert weights[0] > 0 and off_relevance < 0.75 * off_plain  # the other directions lose weight
    assert float(precision[0]) < PRIOR < float(precision[2:].median())  # the taste's prior widened


def test_the_update_is_bounded_and_widens_a_well_determined_weight() -> None:
    weights = torch.tensor([2.0, 1e-9, 0.5], dtype=torch.float64)
    covariance = torch.diag(torch.tensor([0.01, 1.0, 0.5], dtype=torch.float64))
    updated = relevance_update(weights, covariance, torch.ones(3, dtype=torch.float64))
    assert float(updated[0]) == pytest.approx((1 - 0.01) / 4.0)  # gamma / w^2
    assert updated[1] == MOST_PRECISION  # no weight, nothing determined: pruned
    assert float(updated[2]) == pytest.approx(2.0)  # half determined by the picks
    tiny = relevance_update(torch.tensor([1e6], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
                            torch.ones(1, dtype=torch.float64))
    assert tiny[0] == LEAST_PRECISION


def test_the_ard_head_repeats_and_scores_its_lower_bound() -> None:
    features, picks = one_direction(12, seed=1)
    x = torch.cat(list(features.values()))
    first = fit_any(features, picks, FitConfig(head="ard"))(x)
    assert torch.equal(first, fit_any(features, picks, FitConfig(head="ard"))(x))
    bound = fit_any(features, picks, FitConfig(head="ard", pessimism=1.0))(x)
    gap = (first - bound).double()
    assert torch.all(gap >= -1e-5) and float(gap.max()) > 0
