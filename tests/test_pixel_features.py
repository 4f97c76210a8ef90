"""The ``content`` backbone of the personal reward (``picks.backbone: content``)."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.config.schema import PicksConfig
from dynamic_treerpo.trainer.preferences.pairs import tree_pairs
from dynamic_treerpo.trainer.preferences.records import Picks
from dynamic_treerpo.trainer.rewards.personal import (
    FitConfig,
    backbone,
    fit_any,
    pair_accuracy,
    pooled_features,
    summary_features,
)
from dynamic_treerpo.trainer.rewards.pixel_features import content_features


def _square(colour: tuple[float, float, float], size: int, top: int = 20, left: int = 20) -> torch.Tensor:
    image = torch.full((3, 64, 64), 0.08)
    image[:, top:top + size, left:left + size] = torch.tensor(colour).view(3, 1, 1)
    return image


def test_a_larger_object_of_the_same_colour_has_the_same_content_colour() -> None:
    small, large = _square((0.9, 0.5, 0.1), 12), _square((0.9, 0.5, 0.1), 36)
    features = content_features(torch.stack([small, large]))
    assert features.shape == (2, 449)
    whole = slice(340 + 16 * 5 + 4 * 5 + 1, 340 + 16 * 5 + 4 * 5 + 5)  # the 1x1 cell's RGB and peak
    assert torch.allclose(features[0, whole], features[1, whole], rtol=0.05)
    assert features[1, 340 + 16 * 5 + 4 * 5] > 3 * features[0, 340 + 16 * 5 + 4 * 5]  # its amount
    pooled = pooled_features(torch.stack([small, large]))
    assert pooled[1, -4] > pooled[0, -4] + 0.05  # pooled red mixes size into colour


def test_the_content_s_place_follows_the_object() -> None:
    high, low = _square((0.2, 0.9, 0.2), 10, top=4), _square((0.2, 0.9, 0.2), 10, top=48)
    place = content_features(torch.stack([high, low]))[:, -4:]
    assert place[0, 0] == pytest.approx(9 / 64, abs=0.01) and place[1, 0] == pytest.approx(53 / 64, abs=0.01)
    assert place[0, 1] == pytest.approx(place[1, 1]) and place[0, 2] == pytest.approx(place[1, 2])


def _colour_trees(count: int, generator: torch.Generator, features) -> tuple[dict, dict]:
    """Trees of 8 squares of random size, place and colour; the person likes warmer ones, whatever
    their size."""
    feats, pairs = {}, {}
    for tree in range(count):
        red, blue = torch.rand(8, generator=generator), torch.rand(8, generator=generator)
        sizes = torch.randint(6, 30, (8,), generator=generator).tolist()
        places = torch.randint(0, 34, (8, 2), generator=generator).tolist()
        images = torch.stack([_square((0.3 + 0.6 * float(r), 0.3, 0.3 + 0.6 * float(b)), s, *p)
                              for r, b, s, p in zip(red, blue, sizes, places, strict=True)])
        order = (red - blue).argsort(descending=True).tolist()
        feats[str(tree)] = features(images)
        pairs[str(tree)] = tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 8)
    return feats, pairs


def test_a_colour_taste_is_learnt_apart_from_size_on_content_features() -> None:
    """A taste for warm colours on objects of every size: the linear head orders unseen pairs far better
    on content features, which hold each object's colour apart from its size, than on pooled pixels."""
    accuracy = {}
    for name in ("pooled", "content"):
        gen = torch.Generator().manual_seed(5)
        feats, pairs = _colour_trees(30, gen, backbone(name))
        held_feats, held_pairs = _colour_trees(15, gen, backbone(name))
        config = FitConfig(head="linear", summary=summary_features(backbone(name)))
        accuracy[name] = pair_accuracy(fit_any(feats, pairs, config), held_feats, held_pairs)
    assert accuracy["content"] > 0.9 and accuracy["content"] > accuracy["pooled"] + 0.1, accuracy


def test_the_content_backbone_needs_no_weights() -> None:
    assert PicksConfig(backbone="content").backbone == "content"
    with pytest.raises(ValueError, match=r"picks\.backbone must be pooled, content, pickscore or hps-v2\.1"):
        PicksConfig(backbone="pixels")


def test_the_linear_head_keeps_the_content_summary_beside_its_directions() -> None:
    """A taste for deep shades reads the whole picture's colour: the head on content features keeps those
    summary features, so 8 principal directions that miss them still learn it."""
    from dynamic_treerpo.trainer.preferences.linear_reward import fit_basis
    assert summary_features(content_features) == 9 and summary_features(pooled_features) == 0
    rows = content_features(torch.stack([_square((0.2 + 0.1 * k, 0.2, 0.2), 6 + 2 * k) for k in range(6)]))
    basis = fit_basis([rows], dims=3, keep_last=9)
    assert basis.directions.shape == (449, 12)
    kept = basis(rows)[:, 3:]
    assert torch.allclose(kept, (rows[:, -9:].double() - basis.mean[-9:]) / basis.std[-9:])
    with pytest.raises(ValueError, match="keep_last must be within the 449 features"):
        fit_basis([rows], keep_last=450)
