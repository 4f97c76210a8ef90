"""The points a guarded run measured: taste and prompt-following of its checkpoints on validation pairs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrailPoint:
    """One checkpoint (``iteration`` 0: the base model) at one LoRA ``strength``: the mean taste
    (personal reward) and guard reward over the validation pairs, and the standard error of the
    guard's change from the base (paired: the same prompts and seeds); ``picks_weight``: the taste's
    weight training used up to this checkpoint (its path, when a guard steered it; None: not recorded)."""

    iteration: int
    strength: float
    taste: float
    guard: float
    guard_se: float = 0.0
    picks_weight: float | None = None

    @property
    def label(self) -> str:
        """How a person names it: 'iteration 12' or 'iteration 12 at strength 0.5'."""
        if self.iteration == 0:
            return "the base model"
        weaker = f" at strength {self.strength:g}" if self.strength != 1.0 else ""
        return f"iteration {self.iteration}{weaker}"


def paired_se(scores: Tensor, base: Tensor, groups: Sequence[str] | None = None) -> float:
    """Standard error of ``mean(scores - base)`` over the pairs (0 with one pair). With ``groups`` (each
    pair's prompt), over the groups' mean differences instead: the error of the fall on other prompts
    of the same kind, where the pairs of one prompt are not independent draws (0 with one group)."""
    diff = (scores.double() - base.double()).flatten()
    if groups is not None:
        if len(groups) != diff.numel():
            raise ValueError(f"{len(groups)} groups for {diff.numel()} pairs")
        position = {name: k for k, name in enumerate(dict.fromkeys(groups))}
        index = torch.tensor([position[g] for g in groups])
        sums = torch.zeros(len(position), dtype=diff.dtype).index_add_(0, index, diff)
        counts = torch.zeros(len(position), dtype=diff.dtype).index_add_(0, index, torch.ones_like(diff))
        diff = sums / counts
    if diff.numel() < 2:
        return 0.0
    return float(diff.std(unbiased=True) / math.sqrt(diff.numel()))


@dataclass
class Trail:
    """Every point of a run, in the order measured, with the limit they were judged against."""

    limit: float
    guard_spread: float
    points: list[TrailPoint] = field(default_factory=list)

    @property
    def base(self) -> TrailPoint:
        for point in self.points:
            if point.iteration == 0:
                return point
        raise ValueError("the trail has no measurement of the base model")

    def find(self, iteration: int, strength: float = 1.0) -> TrailPoint | None:
        for point in self.points:
            if point.iteration == iteration and math.isclose(point.strength, strength):
                return point
        return None

    def fall(self, point: TrailPoint) -> float:
        """How far the guard's mean fell from the base model's (negative: it rose)."""
        return self.base.guard - point.guard

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "guard_spread": self.guard_spread,
                "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trail:
        return cls(float(data["limit"]), float(data["guard_spread"]),
                   [TrailPoint(**p) for p in data["points"]])


def scaled_lora(state: dict[str, Tensor], strength: float) -> dict[str, Tensor]:
    """The LoRA at ``strength``: its up (``lora_B``) weights scaled, so the file loads at strength 1
    anywhere and gives this strength's images."""
    if strength == 1.0:
        return dict(state)
    return {k: (v * strength if ".lora_B." in k else v) for k, v in state.items()}


def snapshot(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A CPU copy of LoRA weights (a run keeps one per checkpoint)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}



def point_key(point: TrailPoint) -> str:
    """``"<iteration>@<strength>"``: how a point's images are filed."""
    return f"{point.iteration}@{point.strength:g}"
