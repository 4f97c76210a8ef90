"""What a ``treerpo bench taste`` run spends and keeps: its budget, the tastes of the published table, the
per-seed result it stores, and the training config each of a seed's trainings starts from.

Why one module: a resumed run, a borrowed frontier and an assembled default are all checked against the
budget, so every part of the wing reads it from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...config.files import load_config
from ...config.picks_budget import PICKS_BUDGET, PicksBudget
from ...config.schema import TrainConfig
from ...guard.levels import GUARDED_PICKS_WEIGHT

CHECKPOINTS = (25, 50, 100)
FRONTIER_WEIGHTS = (0.3, 0.5, 0.8)
TASTE_SET = ("larger_objects", "central_objects", "deep_shades", "lower_objects", "warm_shades")
"""The tastes of the published table: the three built in first, two of kinds added for it (where the
objects sit, and warm against cool shades), both of which pull against the prompt."""
QUICK_TASTES = ("larger_objects", "lower_objects")


@dataclass(frozen=True)
class TasteBudget:
    """How much the benchmark trains, labels and measures. The training is the shipped picks budget
    (:data:`~...config.picks_budget.PICKS_BUDGET`, the node's defaults) unless a field says otherwise;
    ``as_node``: the method runs as the node does (``as_node.py``: the node's config and training, on the
    labelled trees' prompts, validated on those prompts at unseen seeds). Runs stored before 0.6 trained
    their own way (``as_node`` false, the config's LoRA size: ``storage.budget_fields`` says so)."""

    trees: int = 100
    seeds: int = 5
    iterations: int = PICKS_BUDGET.iterations
    prompts_per_iteration: int = PICKS_BUDGET.prompts_per_iteration
    lr: float = PICKS_BUDGET.lr
    eval_pairs: int = 512  # held-out test pairs: every reported figure (fewer measure a fall too coarsely)
    validation_pairs: int = PICKS_BUDGET.validation_pairs  # the guard's (never test pairs, never trained on)
    keep: str = "closely"
    checkpoints: int = PICKS_BUDGET.checkpoints
    margin: float = PICKS_BUDGET.margin
    picks_weight: float = GUARDED_PICKS_WEIGHT  # the reward as written; the steered frontier starts there
    picks_weights: tuple[float, ...] = PICKS_BUDGET.weights  # the guard's (guard.weights); (): picks_weight
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
    lora_rank: int | None = PICKS_BUDGET.lora_rank  # None: the config's (runs stored before 0.6)
    lora_alpha: float | None = PICKS_BUDGET.lora_alpha
    as_node: bool = True
    template: bool = False  # the template's trees (its prompts, trees per prompt, tree shape): its row
    every_point: bool = False  # measure every checkpoint and strength on the test pairs, not just the chosen

    def __post_init__(self) -> None:
        if self.rounds not in (1, 2):
            raise ValueError(f"rounds must be 1 or 2, got {self.rounds}")
        if self.rounds == 2 and min(self.tree_counts()) < 2:
            raise ValueError("two rounds need at least 2 labelled trees at every count (--at)")
        if self.rounds == 2 and self.as_node:
            raise ValueError("two rounds run in the benchmark's own loop (--budget bench-0.5)")

    def tree_counts(self) -> list[int]:
        points = [n for n in self.at if n < self.trees]
        return [*points, self.trees]

    def picks_budget(self) -> PicksBudget:
        """The training part of this budget as the node reads it."""
        return replace(PICKS_BUDGET, iterations=self.iterations, lr=self.lr,
                       prompts_per_iteration=self.prompts_per_iteration,
                       lora_rank=self.lora_rank or PICKS_BUDGET.lora_rank,
                       lora_alpha=self.lora_alpha or PICKS_BUDGET.lora_alpha, checkpoints=self.checkpoints,
                       validation_pairs=self.validation_pairs,
                       weights=self.picks_weights or (self.picks_weight,), margin=self.margin)


def template_budget(seeds: int = 5) -> TasteBudget:
    """The template as it opens: its trees (every one labelled), the node's training, nothing more."""
    trees = PICKS_BUDGET.template.trees
    return TasteBudget(trees=trees, seeds=seeds, at=(), template=True)


QUICK = TasteBudget(trees=6, seeds=2, iterations=2, prompts_per_iteration=2, eval_pairs=4,
                    validation_pairs=4, checkpoints=2, frontier_weights=(0.3, 0.5), at=(3,))
BENCH_050 = TasteBudget(iterations=24, lr=0.0016, checkpoints=4, lora_rank=None, lora_alpha=None,
                        as_node=False)
"""0.5.0's benchmark budget: more training than the node gave, in the benchmark's own loop."""
NODE_050 = {"iterations": 8, "lr": 0.001, "lora_rank": 8, "lora_alpha": 8.0, "checkpoints": 6}
"""0.5.0's node and template defaults (the budget they trained with before 0.6), as changes to a budget."""
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
    lora = [] if budget.lora_rank is None else [f"lora.rank={budget.lora_rank}",
                                                 f"lora.alpha={budget.lora_alpha or budget.lora_rank:g}"]
    return load_config(TrainConfig, None, [
        f"seed={seed}", f"iterations={budget.iterations}", f"optim.lr={budget.lr}",
        f"data.prompts_per_iteration={budget.prompts_per_iteration}", f"data.eval_pairs={budget.eval_pairs}",
        f"reward={reward}", f"reward_weights={{{spec}}}", f"guard.keep={budget.keep}",
        f"guard.checkpoints={budget.checkpoints}", f"guard.pairs={budget.validation_pairs}",
        f"guard.margin={budget.margin}", *lora, *extra])
