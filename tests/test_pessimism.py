"""The personal reward's lower bound: an image far along directions the picks never settled scores lower."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.preferences.pairs import Pair
from dynamic_treerpo.trainer.rewards.personal import FitConfig, fit_any, fit_linear_head


def _picks(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, list[Pair]]]:
    """Trees of 8 leaves whose features vary in 4 dimensions; the picks order them by dimension 0 only."""
    g = torch.Generator().manual_seed(seed)
    features, pairs = {}, {}
    for t in range(12):
        x = torch.randn(8, 4, generator=g)
        features[f"t{t}"] = x
        order = torch.argsort(x[:, 0], descending=True).tolist()
        pairs[f"t{t}"] = [Pair(order[0], order[-1]), Pair(order[1], order[-2])]
    return features, pairs


def test_the_lower_bound_is_the_score_less_beta_posterior_deviations() -> None:
    features, pairs = _picks()
    mean_head = fit_linear_head(features, pairs)
    lcb_head = fit_linear_head(features, pairs, pessimism=1.0)
    x = torch.cat(list(features.values()))
    assert torch.all(lcb_head(x) <= mean_head(x) + 1e-6)  # never above the mean score
    gap = (mean_head(x) - lcb_head(x)).double()
    lcb2 = fit_linear_head(features, pairs, pessimism=2.0)
    assert torch.allclose((mean_head(x) - lcb2(x)).double(), 2 * gap, atol=1e-5)  # linear in beta
    # the typical image is certain, an image far out along a direction the picks barely constrain is not
    far = x.mean(dim=0, keepdim=True).repeat(2, 1)
    far[1] += 6 * x.std(dim=0)
    penalty = mean_head(far) - lcb_head(far)
    assert penalty[1] > 3 * penalty[0]


def test_pessimism_needs_the_linear_head_and_a_non_negative_beta() -> None:
    features, pairs = _picks()
    with pytest.raises(ValueError, match="needs the linear head"):
        fit_any(features, pairs, FitConfig(head="mlp", pessimism=1.0))
    with pytest.raises(ValueError, match="must be >= 0"):
        fit_any(features, pairs, FitConfig(pessimism=-1.0))
    with pytest.raises(ValueError, match=r"needs picks\.head: linear"):
        load_config(TrainConfig, None, ["picks.head=mlp", "experimental.picks.pessimism=1"])
    config = load_config(TrainConfig, None, ["experimental.picks.pessimism=1.5"])
    assert config.picks.pessimism == 1.5 and load_config(TrainConfig, None, []).picks.pessimism == 0.0
