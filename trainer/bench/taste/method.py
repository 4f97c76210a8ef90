"""The method ``treerpo bench taste`` measures: a personal reward fitted on a simulated person's picks,
training under the guard (validation pairs only), and the chosen checkpoint measured on the test pairs.

With two rounds (``TasteBudget.rounds``) the person labels half the trees on the base model, the method
trains and chooses, the person labels the other half on trees the chosen model samples (on-policy
pairs: where the first reward is now wrong), and the reward refitted on every pick trains again from
the base model. Both rounds count their clicks: 25 + 25 trees stand against 50 from the base model.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from ...guard.choice import choose, take
from ...guard.weights import WeightChoice
from ...preferences.pairs import tree_pairs
from ...preferences.store import PickStore
from ...training.from_picks import model_id, store_trees
from ...training.guarded import guard_trainer, separate_validation_pairs
from ...training.loop import Trainer
from ...training.weighted import train_at_weights
from .person import SimulatedPerson, Taste

MARGINS_MEASURED = (0.0, 0.5, 1.0)
"""The margins whose choice is measured on the test pairs too (``summary.py``'s sensitivity table)."""


def picks_features(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The personal reward's backbone that ``config.picks`` names (``content`` by default)."""
    from ...rewards.personal import backbone

    return backbone(config.picks.backbone, config.picks.backbone_weights)


def fit_picks(store: PickStore, ids: Sequence[str], config: Any) -> Any:
    """The personal reward's fit on the labelled trees ``ids``, as ``config.picks`` sets it."""
    from ...rewards.personal import FitConfig, fit_from_store

    fit_config = FitConfig(head=config.picks.head, pessimism=config.picks.pessimism)
    return fit_from_store(store, picks_features(config), list(ids), config=fit_config)


def on_policy_accuracy(fit: Any, store: PickStore, ids: Sequence[str],
                       features: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """How well ``fit`` (on ``features``) orders the person's pairs on trees it was not fitted on
    (``ids``): on trees of a trained model, where training has moved the images, this is the accuracy
    that matters."""
    from ...rewards.personal import pair_accuracy

    labelled = dict(store.labelled())
    with torch.no_grad():
        feats = {t: features(store.load_images(t)) for t in ids}
    pairs = {t: tree_pairs(labelled[t], feats[t].shape[0]) for t in ids}
    return pair_accuracy(fit.head, feats, pairs)


def train_guarded(config: Any, fit: Any, weights: Sequence[float], quiet: Callable[[str], None]
                  ) -> tuple[Trainer, Any, WeightChoice]:
    """Train ``config`` on ``picks:w, scene:1-w`` with the personal reward under the guard, once per picks
    weight ``w`` of ``weights``, as the node and ``treerpo train`` do (``trainer/training/weighted.py``):
    the trainer (its policy holds the chosen checkpoint of the kept run), the kept run's result, and
    which weight was kept with each run's validation gain."""
    from ...rewards.mix import RewardMix
    from ...rewards.personal import PersonalReward

    first = weights[0]
    spec = f"picks:{first:g},scene:{1 - first:g}"
    trainer = Trainer(config)
    trainer.reward = RewardMix(spec, {}, trainer.device,
                               prebuilt={"picks": PersonalReward(fit, picks_features(config)),
                                         **trainer.reward.fns})
    pairs = separate_validation_pairs(config, trainer.eval_pairs)

    def tracker_for(written: str) -> Any:
        return guard_trainer(trainer, pairs, taste="picks", log=quiet, reward_spec=written)

    tracked = train_at_weights(trainer, weights, tracker_for, 0, config.iterations, reward=spec)
    return trainer, tracked.result, tracked.choice


def trail_test_points(transformer: Any, result: Any, before: dict[str, float],
                      measure: Callable[[], dict[str, float]], every_point: bool = False
                      ) -> list[dict[str, Any]]:
    """Every point of the kept run's trail with its validation figures, and the test figures of the points
    some margin in ``MARGINS_MEASURED`` chooses (``every_point``: of every point, so that what the reward
    gained and what the guard's choice lost can be told apart). The base model's are ``before`` (a zero
    LoRA draws the same images); the run's choice is applied again at the end."""
    trail = result.trail
    picked = [result.choice.point, *(choose(trail, margin).point for margin in MARGINS_MEASURED)]
    wanted = {(p.iteration, p.strength) for p in picked if p is not None}
    points = []
    for p in trail.points:
        row = asdict(p)
        if p.iteration == 0:
            row.update({"test_taste": before["taste"], "test_scene": before["scene"]})
        elif every_point or (p.iteration, p.strength) in wanted:
            result.apply(transformer, take(trail, p.iteration, p.strength))
            row.update({f"test_{k}": v for k, v in measure().items()})
        points.append(row)
    result.apply(transformer)
    return points


def test_points(trainer: Trainer, result: Any, before: dict[str, float], taste: Taste, scene: Any,
                measure: Callable[..., dict[str, float]]) -> list[dict[str, Any]]:
    """:func:`trail_test_points` of the benchmark's own loop (its trainer measures the test pairs)."""
    return trail_test_points(trainer.policy.transformer, result, before,
                             lambda: measure(trainer, taste, scene))


def summary(fit: Any, result: Any, points: list[dict[str, Any]]) -> dict[str, Any]:
    """A method run as ``taste.json`` stores it: the chosen point's test figures, why, and every point."""
    trail, point = result.trail, result.choice.point
    key = (0, 1.0) if point is None else (point.iteration, point.strength)
    chosen = next(q for q in points if (q["iteration"], q["strength"]) == key)
    return {"taste": chosen["test_taste"], "scene": chosen["test_scene"], "accuracy": fit.held_out_accuracy,
            "held_out_pairs": float(fit.held_out_pairs),
            "chosen": {"iteration": 0 if point is None else point.iteration,
                       "strength": 0.0 if point is None else point.strength, "reason": result.choice.reason,
                       "validation_taste_gain": 0.0 if point is None else point.taste - trail.base.taste,
                       "validation_scene_fall": 0.0 if point is None else trail.fall(point)},
            "limit": trail.limit, "points": points,
            "picks_weights": [p.picks_weight for p in trail.points if p.picks_weight is not None]}


def label_trees(store: PickStore, ids: Sequence[str], person: SimulatedPerson, rng: random.Random) -> None:
    """The person picks on each tree, saved through the store (as the ComfyUI picker saves them)."""
    for tree_id in ids:
        liked, disliked = person.pick(store.load_images(tree_id), store.meta(tree_id).prompt, rng)
        store.save_picks(tree_id, liked, disliked)


def second_round_trees(trainer: Trainer, store: PickStore, prompts: Sequence[str], seeds: Sequence[int],
                       plan: Any, person: SimulatedPerson, rng: random.Random) -> list[str]:
    """Trees of the chosen model (the policy as the first round left it), labelled by the person; the
    store records the LoRA that sampled each."""
    policy = trainer.policy
    ids = store_trees(policy, store, list(prompts), list(seeds), plan, model_id(policy, "embedded"),
                      max_batch=trainer.config.max_batch)
    label_trees(store, ids, person, rng)
    return ids
