"""The personal reward's nonlinear heads (``quadratic``, ``kernel``) and the bootstrap ``ensemble``: they
learn a taste a linear score cannot express, give the same reward on every fit, and score a lower bound."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.preferences.nonlinear_reward import (
    fit_quadratic_map,
    median_distance,
    quadratic_coordinates,
    quadratic_terms,
)
from dynamic_treerpo.trainer.preferences.pairs import Pair, tree_pairs
from dynamic_treerpo.trainer.preferences.records import Picks
from dynamic_treerpo.trainer.rewards.personal import HEADS, FitConfig, fit_any, pair_accuracy

Trees = tuple[dict[str, torch.Tensor], dict[str, list[Pair]], dict[str, list[Pair]]]


def near_a_point(count: int, seed: int, dims: int = 6) -> Trees:
    """Trees of 8 leaves with random features whose last two say where the content sits; the taste likes
    leaves near a point close to the middle (a distance: no linear score orders it). Returns the
    features, the picks (2 liked, 1 disliked, no mistake) and every pair the taste orders."""
    g = torch.Generator().manual_seed(seed)
    features, picks, truth = {}, {}, {}
    for t in range(count):
        x = torch.randn(8, dims, generator=g)
        taste = -((x[:, -2] - 0.3) ** 2 + (x[:, -1] + 0.2) ** 2)
        order = taste.argsort(descending=True).tolist()
        features[f"t{t}"] = x
        picks[f"t{t}"] = tree_pairs(Picks(tuple(order[:2]), tuple(order[-1:])), 8)
        truth[f"t{t}"] = [Pair(i, j) for i in range(8) for j in range(8) if taste[i] > taste[j]]
    return features, picks, truth


def test_the_quadratic_and_kernel_heads_learn_closeness_to_a_point_where_the_linear_head_cannot() -> None:
    features, picks, _ = near_a_point(40, seed=0)
    held, _, truth = near_a_point(30, seed=1)
    accuracy = {head: pair_accuracy(fit_any(features, picks, FitConfig(head=head, summary=2)), held, truth)
                for head in ("linear", "quadratic", "kernel", "ensemble")}
    assert accuracy["linear"] < 0.65 and accuracy["ensemble"] < 0.65  # a distance is not a direction
    assert accuracy["quadratic"] > 0.8 and accuracy["kernel"] > 0.8


@pytest.mark.parametrize("head", ["quadratic", "kernel", "ensemble"])
def test_a_head_gives_the_same_reward_on_every_fit(head: str) -> None:
    features, picks, _ = near_a_point(12, seed=2)
    x = torch.cat(list(features.values()))
    first = fit_any(features, picks, FitConfig(head=head, summary=2))(x)
    assert torch.equal(first, fit_any(features, picks, FitConfig(head=head, summary=2))(x))


@pytest.mark.parametrize("head", ["quadratic", "kernel", "ensemble"])
def test_a_nonlinear_head_scores_its_lower_bound(head: str) -> None:
    features, picks, _ = near_a_point(12, seed=3)
    x = torch.cat(list(features.values()))
    mean = fit_any(features, picks, FitConfig(head=head, summary=2))
    bound = fit_any(features, picks, FitConfig(head=head, summary=2, pessimism=1.0))
    twice = fit_any(features, picks, FitConfig(head=head, summary=2, pessimism=2.0))
    gap = (mean(x) - bound(x)).double()
    assert torch.all(gap >= -1e-5) and float(gap.max()) > 0
    assert torch.allclose((mean(x) - twice(x)).double(), 2 * gap, atol=1e-4)  # linear in beta


def test_the_heads_refuse_what_they_cannot_do() -> None:
    features, picks, _ = near_a_point(6, seed=4)
    with pytest.raises(ValueError, match="needs the linear head or another with a posterior"):
        fit_any(features, picks, FitConfig(head="mlp", pessimism=1.0))
    with pytest.raises(ValueError, match="unknown personal-reward head 'forest'; expected linear, quadratic, "
                                         "kernel, ensemble, ard or mlp"):
        fit_any(features, picks, FitConfig(head="forest"))
    for head in ("quadratic", "kernel", "ensemble"):
        with pytest.raises(ValueError, match="no preference pair"):
            fit_any(features, {t: [] for t in picks}, FitConfig(head=head))
    with pytest.raises(ValueError, match=r"needs picks\.head: linear, quadratic, kernel, ensemble or ard"):
        load_config(TrainConfig, None, ["picks.head=mlp", "experimental.picks.pessimism=1"])
    for head in HEADS:
        assert load_config(TrainConfig, None, [f"picks.head={head}"]).picks.head == head
    config = load_config(TrainConfig, None, ["picks.head=kernel", "experimental.picks.pessimism=1"])
    assert config.picks.pessimism == 1.0


def test_the_quadratic_map_squares_the_summary_and_the_top_directions() -> None:
    # a basis of 16 directions then 9 summary features: the 3 top directions and the 9 summaries
    assert quadratic_coordinates(25, 9, 12).tolist() == [0, 1, 2, *range(16, 25)]
    assert quadratic_coordinates(16, 0, 12).tolist() == list(range(12))
    left, right = quadratic_terms(5, 2)
    assert sorted(zip(left.tolist(), right.tolist(), strict=True)) == [(0, 0), (0, 1), (1, 1), (2, 2), (3, 3),
                                                                       (4, 4)]
    z = torch.randn(40, 25, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mapped = fit_quadratic_map(z, summary=9)(z)
    assert mapped.shape == (40, 25 + 12 + 6) and torch.equal(mapped[:, :25], z)
    assert median_distance(torch.zeros(5, 3)) == 1.0  # identical leaves: no bandwidth to read


def test_the_personal_reward_builds_each_head_from_a_picks_folder(tmp_path) -> None:
    """``reward: picks`` with ``picks.head`` quadratic, kernel or ensemble (and its lower bound) fits on a
    real picks folder of the embedded model and scores images, standardised over the picked leaves."""
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
    from dynamic_treerpo.trainer.preferences.store import PickStore
    from dynamic_treerpo.trainer.rewards.personal import build
    from dynamic_treerpo.trainer.training.from_picks import model_id, store_trees
    from dynamic_treerpo.trainer.training.loop import Trainer

    config = load_config(TrainConfig, None, ["data.eval_pairs=2", "tree.steps=5", "tree.depth=2",
                                             "tree.trees_per_prompt=1", "lora.rank=4"])
    trainer = Trainer(config, EmbeddedPolicy.from_pretrained(), evaluation=False)
    store = PickStore(tmp_path, create=True)
    ids = store_trees(trainer.policy, store, ["a red circle", "two yellow circles"] * 4, list(range(8)),
                      trainer.plan(0), model_id(trainer.policy, "embedded"))
    images = torch.cat([store.load_images(t) for t in ids])
    for tree_id in ids:
        order = store.load_images(tree_id).mean(dim=(1, 2, 3)).argsort(descending=True).tolist()
        store.save_picks(tree_id, liked=order[:1], disliked=order[-1:])
    for head, pessimism in (("quadratic", 0.0), ("kernel", 1.0), ("ensemble", 1.0)):
        lines: list[str] = []
        reward = build(str(tmp_path), head=head, pessimism=pessimism, log=lines.append)
        scores = reward(images, [""] * images.shape[0])["reward"]
        assert scores.shape == (images.shape[0],) and torch.isfinite(scores).all()
        assert abs(float(scores.mean())) < 1e-3 and f"({head} head on content features" in lines[0]
