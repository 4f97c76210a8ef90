"""A personal reward: a small head, fitted on a person's picks, over a frozen image backbone.

``reward: picks`` with ``reward_weights: {picks: FOLDER}`` (``data.picks: FOLDER``): the picks folder's
labelled trees give preference pairs (``preferences.pairs``: liked > unmarked > disliked, within a
tree), and a two-layer head on frozen image features is fitted to them with the Bradley-Terry loss
``softplus(s_worse - s_better)``. The head's score of a new image is the reward.

Backbones (frozen; the head is all that learns):

- ``pooled`` (any image size): the image and its brightest channel average-pooled on
  8x8, 4x4, 2x2 and 1x1 grids (340 numbers): where the colour is, how much, how bright. No trained
  weights and nothing of the scene reward: it serves the embedded model, whose 64 px scenes it
  describes well enough for tastes of size, place and shade.
- ``content`` (the default since 0.4.0): ``pooled``, plus the colour, amount and place of what is
  drawn, apart from its size (``pixel_features``). Why: a linear head on pooled pixels mixes an
  object's colour with its size, and training then finds "more of a colour" for a taste of shades.
- ``scene-clip`` (the embedded model's 64 px pictures only): the embedding of the embedded model's own
  image encoder, trained CLIP-style on its scenes' captions (``embedded/image_tower.py``), beside the
  ``content`` features (``scene_clip``): what is drawn, how many, which colour on which shape, on which
  side, with the pixels' shade, size and place.
- ``pickscore`` / ``hps-v2.1``: the image embedding of that reward's CLIP (its weights path), for real
  models, where a taste is about style and content that pooled pixels cannot see.

Heads (``picks.head``):

- ``linear`` (the default): a Bradley-Terry score linear in the features' top principal directions
  (``preferences.linear_reward``: standardised, projected on 16 directions found on the picked trees'
  leaves, a Gaussian prior on the weights, fitted by Newton's method in milliseconds, no randomness).
  ``treerpo bench picking`` measured it ordering the hidden taste's pairs better than the two-layer
  head from the same picks (docs/picks.md, "How many picks", gives the figures per taste).
- ``quadratic``: the linear head plus the squares of a few leading coordinates of the same basis (the
  backbone's summary features and the top directions) and the products of the first few of them
  (``preferences.nonlinear_reward``), under a tighter prior than the linear weights: it can express a
  distance ("near the centre") and a peak ("about this much"), which a linear score cannot.
- ``kernel``: the linear head plus random Fourier features of the basis coordinates (a Gaussian kernel
  whose bandwidth is the leaves' median distance, drawn with a fixed seed): Bradley-Terry with a Gaussian
  prior on their weights is a Gaussian-process preference model with its Laplace posterior.
- ``ensemble``: the mean of linear heads fitted on bootstrap resamples of the trees, with the weights'
  spread across the resamples as their posterior: a steadier direction from few trees.
- ``ard`` (experimental): the linear head with one prior precision per direction, set from the picks'
  evidence (``preferences.relevance``): directions the picks do not need are shrunk to zero, so training
  has fewer directions along which the reward rises without the taste.
- ``mlp``: a two-layer head on the standardised features (64 hidden units, AdamW), the first version.

Every head but ``mlp`` has a posterior, so ``picks.pessimism`` can score its lower bound
(:class:`LinearHead`, :class:`MappedHead`). ``treerpo bench taste-rewards`` compares the heads' orders
against hidden tastes on the same picks.

Why a small head on frozen features: 25 to 200 labelled trees give a few hundred to a few thousand
pairs, far too few to train a network. Before the final fit on every labelled tree, a fit on 80% of
them (by tree) is scored on the other 20%: the held-out pair accuracy says how well the head
generalises (logged, and reported by ``treerpo bench taste``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..preferences.linear_reward import Basis, fit_basis, fit_linear, pair_differences
from ..preferences.nonlinear_reward import (
    FeatureMap,
    fit_bootstrap,
    fit_fourier_map,
    fit_mapped,
    fit_quadratic_map,
)
from ..preferences.pairs import Pair, split_trees, tree_pairs
from ..preferences.relevance import fit_relevance
from ..preferences.store import PickStore
from .pixel_features import content_features, pooled_features

HIDDEN = 64
HELD_OUT = 0.2
Features = Callable[[Tensor], Tensor]


def clip_features(name: str, weights: str | None, device: str | torch.device = "cpu",
                  built: Any = None) -> Features:
    """The unit-norm image embedding of the ``pickscore`` or ``hps-v2.1`` reward's CLIP. ``built``: that
    reward, already built as a term of the same run, so that one copy of the CLIP serves both."""
    from .clip_family import build_hps, build_pickscore

    builder = {"pickscore": build_pickscore, "hps-v2.1": build_hps}.get(name)
    if builder is None:
        raise ValueError(f"unknown personal-reward backbone {name!r}; expected pooled, content, scene-clip, "
                         "pickscore or hps-v2.1")
    reward = built if built is not None else builder(weights, device)
    return lambda images: reward.encode_images(images).float().cpu()


def summary_features(features: Features) -> int:
    """How many of a backbone's last features are summaries the linear head keeps as they are (the
    ``content`` backbone's ``summary``; 0 for the others)."""
    return int(getattr(features, "summary", 0))


def backbone(name: str = "content", weights: str | None = None,
             device: str | torch.device = "cpu", built: Any = None) -> Features:
    if name == "pooled":
        return pooled_features
    if name == "content":
        return content_features
    if name == "scene-clip":
        from .scene_clip import scene_clip_features

        return scene_clip_features
    return clip_features(name, weights, device, built)


class PreferenceHead(nn.Module):
    """Standardised features -> one score (a two-layer MLP)."""

    def __init__(self, mean: Tensor, std: Tensor, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float().clamp(min=1e-6))
        self.net = nn.Sequential(nn.Linear(mean.numel(), hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, features: Tensor) -> Tensor:
        return self.net((features.float() - self.mean) / self.std).squeeze(-1)


class LinearHead(nn.Module):
    """Features -> ``((x - mean) / std) @ directions @ weights``: the linear Bradley-Terry score; with
    ``pessimism`` beta > 0 and the weights' posterior ``covariance``, its lower bound
    ``z @ w - beta * sqrt(z^T Sigma z)`` (``z`` the projected features): an image far along directions
    the picks never settled scores lower, so training is not pushed where the reward is a guess."""

    def __init__(self, mean: Tensor, std: Tensor, directions: Tensor, weights: Tensor,
                 covariance: Tensor | None = None, pessimism: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("mean", mean.double())
        self.register_buffer("std", std.double())
        self.register_buffer("projection", (directions.double() @ weights.double()))
        self.pessimism = float(pessimism)
        if self.pessimism > 0:
            if covariance is None:
                raise ValueError("a pessimistic linear head needs the weights' posterior covariance")
            self.register_buffer("directions", directions.double())
            self.register_buffer("covariance", covariance.double())

    def forward(self, features: Tensor) -> Tensor:
        x = (features.double() - self.mean) / self.std
        score = x @ self.projection
        if self.pessimism > 0:
            z = x @ self.directions
            score = score - self.pessimism * ((z @ self.covariance) * z).sum(dim=-1).clamp(min=0).sqrt()
        return score.float()


class MappedHead(nn.Module):
    """Features -> basis coordinates ``z`` -> a fixed feature map ``phi(z)`` (quadratic or Fourier,
    ``preferences.nonlinear_reward``) -> ``phi @ weights``; with ``pessimism`` beta > 0, its lower bound
    ``phi @ w - beta * sqrt(phi^T Sigma phi)``, as :class:`LinearHead`'s in the mapped features. The map
    holds its own tensors (float64, on the CPU, where the personal reward scores its images)."""

    def __init__(self, basis: Basis, feature_map: FeatureMap, weights: Tensor,
                 covariance: Tensor | None = None, pessimism: float = 0.0) -> None:
        super().__init__()
        self.basis, self.feature_map = basis, feature_map
        self.register_buffer("weights", weights.double())
        self.pessimism = float(pessimism)
        if self.pessimism > 0:
            if covariance is None:
                raise ValueError("a pessimistic head needs the weights' posterior covariance")
            self.register_buffer("covariance", covariance.double())

    def forward(self, features: Tensor) -> Tensor:
        phi = self.feature_map(self.basis(features))
        score = phi @ self.weights
        if self.pessimism > 0:
            score = score - self.pessimism * ((phi @ self.covariance) * phi).sum(dim=-1).clamp(min=0).sqrt()
        return score.float()


HEADS = ("linear", "quadratic", "kernel", "ensemble", "ard", "mlp")
POSTERIOR_HEADS = ("linear", "quadratic", "kernel", "ensemble", "ard")
"""The heads with a posterior over their weights: those whose lower bound ``picks.pessimism`` scores."""


@dataclass(frozen=True)
class FitConfig:
    epochs: int = 400
    lr: float = 1e-2
    weight_decay: float = 1e-3
    seed: int = 0
    head: str = "linear"
    pessimism: float = 0.0  # a head's lower bound: beta posterior standard deviations (0: off)
    summary: int = 0  # the backbone's last features the linear head keeps beside its directions


def fit_linear_head(features: dict[str, Tensor], pairs: dict[str, list[Pair]], pessimism: float = 0.0,
                    summary: int = 0, relevance: bool = False) -> LinearHead:
    """The linear head on ``features``' principal directions (found on every given tree's leaves) and
    their last ``summary`` features; ``pessimism``: score its lower bound (:class:`LinearHead`);
    ``relevance``: one prior precision per direction, set from the picks (the ``ard`` head)."""
    if not any(pairs.values()):
        raise ValueError("the picks give no preference pair: like some leaves more than others")
    basis = fit_basis(list(features.values()), keep_last=summary)
    x = {t: basis(f) for t, f in features.items()}
    model = fit_relevance(pair_differences(x, pairs))[0] if relevance else fit_linear(x, pairs)
    return LinearHead(basis.mean, basis.std, basis.directions, model.weights, model.covariance,
                      pessimism).eval()


def fit_nonlinear_head(features: dict[str, Tensor], pairs: dict[str, list[Pair]], head: str,
                       pessimism: float = 0.0, summary: int = 0) -> nn.Module:
    """The ``quadratic``, ``kernel`` or ``ensemble`` head on the linear head's basis (found on every given
    tree's leaves, its last ``summary`` features kept); ``pessimism``: score its lower bound."""
    if not any(pairs.values()):
        raise ValueError("the picks give no preference pair: like some leaves more than others")
    basis = fit_basis(list(features.values()), keep_last=summary)
    x = {t: basis(f) for t, f in features.items()}
    if head == "ensemble":
        model = fit_bootstrap(x, pairs)
        return LinearHead(basis.mean, basis.std, basis.directions, model.weights, model.covariance,
                          pessimism).eval()
    z = torch.cat(list(x.values()))
    if head == "quadratic":
        feature_map: FeatureMap = fit_quadratic_map(z, summary)
    elif head == "kernel":
        feature_map = fit_fourier_map(z)
    else:
        raise ValueError(f"unknown nonlinear head {head!r}; expected quadratic, kernel or ensemble")
    model = fit_mapped(x, pairs, feature_map)
    return MappedHead(basis, feature_map, model.weights, model.covariance, pessimism).eval()


def fit_any(features: dict[str, Tensor], pairs: dict[str, list[Pair]], config: FitConfig) -> nn.Module:
    """The head ``config.head`` names, fitted on ``pairs``."""
    if config.pessimism < 0:
        raise ValueError(f"picks.pessimism must be >= 0, got {config.pessimism:g}")
    if config.pessimism > 0 and config.head not in POSTERIOR_HEADS:
        raise ValueError(f"picks.pessimism needs the linear head or another with a posterior "
                         f"({', '.join(POSTERIOR_HEADS[1:])}): the {config.head} head has none")
    if config.head in ("linear", "ard"):
        return fit_linear_head(features, pairs, config.pessimism, config.summary, config.head == "ard")
    if config.head in POSTERIOR_HEADS:
        return fit_nonlinear_head(features, pairs, config.head, config.pessimism, config.summary)
    if config.head == "mlp":
        return fit_head(features, pairs, config)
    raise ValueError(f"unknown personal-reward head {config.head!r}; expected {', '.join(HEADS[:-1])} or "
                     f"{HEADS[-1]}")


def _pair_tensors(features: dict[str, Tensor], pairs: dict[str, list[Pair]]) -> tuple[Tensor, Tensor, Tensor]:
    """All images stacked, and the rows of each pair's better and worse image."""
    rows, better, worse, offset = [], [], [], 0
    for tree_id, feats in features.items():
        rows.append(feats)
        better += [offset + p.better for p in pairs[tree_id]]
        worse += [offset + p.worse for p in pairs[tree_id]]
        offset += feats.shape[0]
    return torch.cat(rows), torch.tensor(better, dtype=torch.long), torch.tensor(worse, dtype=torch.long)


def fit_head(features: dict[str, Tensor], pairs: dict[str, list[Pair]], config: FitConfig = FitConfig()
             ) -> PreferenceHead:
    """Bradley-Terry on every pair of the given trees (full batch, AdamW, seeded)."""
    images, better, worse = _pair_tensors(features, pairs)
    if better.numel() == 0:
        raise ValueError("the picks give no preference pair: like some leaves more than others")
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        head = PreferenceHead(images.mean(dim=0), images.std(dim=0))
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    with torch.enable_grad(), torch.inference_mode(False):
        for _ in range(config.epochs):
            scores = head(images)
            loss = F.softplus(scores[worse] - scores[better]).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return head.eval().requires_grad_(False)


def pair_accuracy(head: nn.Module, features: dict[str, Tensor], pairs: dict[str, list[Pair]]) -> float:
    """The share of pairs the head orders as the person did (ties count half); nan without pairs."""
    images, better, worse = _pair_tensors(features, pairs)
    if better.numel() == 0:
        return float("nan")
    with torch.no_grad():
        scores = head(images)
    diff = scores[better] - scores[worse]
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


@dataclass(frozen=True)
class PersonalFit:
    """A fitted personal reward and how well it generalises."""

    head: nn.Module
    trees: int
    pairs: int
    held_out_trees: int
    held_out_pairs: int
    held_out_accuracy: float
    score_mean: float = 0.0  # of the head's scores over the fitted images: the reward is standardised
    score_std: float = 1.0


def fit_from_store(store: PickStore, features: Features, tree_ids: Sequence[str] | None = None,
                   held_out: float = HELD_OUT, config: FitConfig = FitConfig()) -> PersonalFit:
    """Fit on the labelled trees of ``store`` (or ``tree_ids``): first on 80% to measure the held-out
    pair accuracy, then on all of them."""
    config = replace(config, summary=summary_features(features))
    labelled = dict(store.labelled())
    ids = [t for t in (tree_ids if tree_ids is not None else labelled) if t in labelled]
    if not ids:
        raise ValueError(f"the picks folder {store.root} has no labelled tree to fit a personal reward on")
    with torch.no_grad():
        feats = {t: features(store.load_images(t)) for t in ids}
    pairs = {t: tree_pairs(labelled[t], feats[t].shape[0]) for t in ids}
    fit_ids, held_ids = split_trees(ids, held_out, config.seed)
    accuracy = float("nan")
    if held_ids:
        trial = fit_any({t: feats[t] for t in fit_ids}, {t: pairs[t] for t in fit_ids}, config)
        accuracy = pair_accuracy(trial, {t: feats[t] for t in held_ids}, {t: pairs[t] for t in held_ids})
    head = fit_any(feats, pairs, config)
    with torch.no_grad():
        scores = head(torch.cat(list(feats.values())))
    return PersonalFit(head, len(ids), sum(len(p) for p in pairs.values()), len(held_ids),
                       sum(len(pairs[t]) for t in held_ids), accuracy, float(scores.mean()),
                       max(float(scores.std()), 1e-6) if scores.numel() > 1 else 1.0)


class PersonalReward:
    """``fn(images, prompts) -> {"reward": head(backbone(images))}``, standardised over the picked trees'
    images (mean 0, std 1 there). Why: Bradley-Terry fixes only differences of scores, whose scale
    grows with fitting; a person reading the training curve wants a number that means the same in every
    run (within-prompt normalisation of the advantages makes training itself indifferent to it)."""

    def __init__(self, fit: PersonalFit, features: Features) -> None:
        self.fit, self.features = fit, features

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: Sequence[str]) -> dict[str, Tensor]:
        scores = self.fit.head(self.features(images.float().cpu())).float().cpu()
        return {"reward": (scores - self.fit.score_mean) / self.fit.score_std}


def build(weights: str | None, device: str | torch.device = "cpu", backbone_name: str = "content",
          backbone_weights: str | None = None, log: Callable[[str], None] = print,
          built_backbone: Any = None, head: str = "linear", pessimism: float = 0.0) -> PersonalReward:
    """The personal reward of the picks folder ``weights``; ``built_backbone``: the backbone's reward,
    when the run has already built it as one of its terms."""
    if not weights:
        raise ValueError("reward 'picks' needs the picks folder: data.picks: FOLDER (or reward_weights: "
                         "{picks: FOLDER})")
    store = PickStore(Path(weights))
    store.check()
    features = backbone(backbone_name, backbone_weights, device, built_backbone)
    fit = fit_from_store(store, features, config=FitConfig(head=head, pessimism=pessimism))
    bound = f", its lower bound at {pessimism:g} posterior sd" if pessimism > 0 else ""
    log(f"personal reward ({head} head on {backbone_name} features{bound}): fitted on {fit.trees} labelled "
        f"trees ({fit.pairs} pairs); held-out pair accuracy {fit.held_out_accuracy:.3f} on "
        f"{fit.held_out_pairs} pairs of {fit.held_out_trees} trees")
    return PersonalReward(fit, features)
