"""What a ``treerpo bench taste`` run spends and keeps: its budget, the tastes of the published table, the
per-seed result it stores, and the training config each of a seed's trainings starts from.

Why one module: a resumed run, a borrowed frontier and an assembled default are all checked against the
budget, so every part of the wing reads it from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.files import load_config
from ...config.schema import TrainConfig
from ...guard.levels import GUARDED_PICKS_WEIGHT
from ...guard.weights import DEFAULT_WEIGHTS

CHECKPOINTS = (25, 50, 100)
FRONTIER_WEIGHTS = (0.3, 0.5, 0.8)
TASTE_SET = ("larger_objects", "central_objects", "deep_shades", "lower_objects", "warm_shades")
"""The tastes of the published table: the three built in first, two of kinds added for it (where the
objects sit, and warm against cool shades), both of which pull against the prompt."""
QUICK_TASTES = ("larger_objects", "lower_objects")


@dataclass(frozen=True)
class TasteBudget:
    """How much the benchmark trains, labels and measures."""

    trees: int = 100
    seeds: int = 5
    iterations: int = 24
    prompts_per_iteration: int = 8
    lr: float = 0.0016
    eval_pairs: int = 512  # held-out test pairs: every reported figure (fewer measure a fall too coarsely)
    validation_pairs: int = 512  # the guard's (never test prompts, never trained on): guard.pairs' default
    keep: str = "closely"
    checkpoints: int = 4
    margin: float = 1.0
    picks_weight: float = GUARDED_PICKS_WEIGHT  # the reward as written; the steered frontier starts there
    picks_weights: tuple[float, ...] = DEFAULT_WEIGHTS  # the guard's (guard.weights); (): picks_weight alone
    frontier_weights: tuple[float, ...] = FRONTIER_WEIGHTS
    frontier_strengths: int = 4  # lower LoRA strengths the frontier tries, as the guard does (0: none)
    likes: int = 2
    dislikes: int = 1
    mistakes: float = 0.15
    first_seed: int = 0
    modes: tuple[str, ...] = ("reward",)
    rounds: int = 1  # 2: half the clicks on base-model trees, half on trees of the first round's model
    frontier_steer: bool = True  # the frontier also trains the hidden taste with the guard steering
    at: tuple[int, ...] = CHECKPOINTS  # labelled-tree counts measured (those below ``trees``, and it)

    def __post_init__(self) -> None:
        if self.rounds not in (1, 2):
            raise ValueError(f"rounds must be 1 or 2, got {self.rounds}")
        if self.rounds == 2 and min(self.tree_counts()) < 2:
            raise ValueError("two rounds need at least 2 labelled trees at every count (--at)")

    def tree_counts(self) -> list[int]:
        points = [n for n in self.at if n < self.trees]
        return [*points, self.trees]


QUICK = TasteBudget(trees=6, seeds=2, iterations=2, prompts_per_iteration=2, eval_pairs=4,
                    validation_pairs=4, checkpoints=2, frontier_weights=(0.3, 0.5), at=(3,), rounds=2)
QUICK_OVERRIDES = ("tree.steps=6", "sampling.eval_steps=3", "lora.rank=4")

FRONTIER_ONLY = ("frontier_strengths",)
"""Budget fields that change the frontier alone: a resumed run with another value redoes only the frontier
of the seeds already there (the person's trees and the method do not depend on it)."""


@dataclass
class SeedResult:
    """One seed's figures as ``taste.json`` stores them (``storage.seed_results`` reads them back)."""

    seed: int
    taste_before: float
    scene_before: float
    oracle: dict[str, float] = field(default_factory=dict)  # the frontier's best point: taste, scene
    frontier: dict[str, dict[str, Any]] = field(default_factory=dict)  # weight -> best point and trail
    reward: dict[int, dict[str, Any]] = field(default_factory=dict)  # trees -> taste, scene, chosen, ...
    code: dict[str, Any] | None = None  # the code version that ran this seed (provenance.provenance)


def bench_config(budget: TasteBudget, seed: int, reward: str, weights: dict[str, str], extra: Sequence[str]
                 ) -> TrainConfig:
    """The training config of one of a seed's trainings: the budget's options, ``reward`` with its
    ``weights`` (the ``reward_weights`` map), then ``extra`` (``--set``) last so that it wins."""
    spec = ", ".join(f"{k}: {v}" for k, v in weights.items())
    return load_config(TrainConfig, None, [
        f"seed={seed}", f"iterations={budget.iterations}", f"optim.lr={budget.lr}",
        f"data.prompts_per_iteration={budget.prompts_per_iteration}", f"data.eval_pairs={budget.eval_pairs}",
        f"reward={reward}", f"reward_weights={{{spec}}}", f"guard.keep={budget.keep}",
        f"guard.checkpoints={budget.checkpoints}", f"guard.pairs={budget.validation_pairs}",
        f"guard.margin={budget.margin}", *extra])
