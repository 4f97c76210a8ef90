"""The preference pairs a tree's picks imply, for fitting a personal reward (Bradley-Terry).

Within one tree, a liked leaf beats every unmarked and every disliked leaf, and an unmarked leaf beats
every disliked one. Pairs never cross trees: two leaves of one tree share their prompt and most of
their sampling, so a pick compares what the person sees side by side, not two prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .records import Picks


@dataclass(frozen=True)
class Pair:
    """Leaf ``better`` of a tree was preferred to its leaf ``worse`` (indices into that tree)."""

    better: int
    worse: int


def tree_pairs(picks: Picks, leaves: int) -> list[Pair]:
    """Every ordered pair the picks imply, by leaf value (liked 1 > unmarked 0 > disliked -1)."""
    values = picks.values(leaves)
    return [Pair(i, j) for i in range(leaves) for j in range(leaves) if values[i] > values[j]]


def split_trees(tree_ids: Sequence[str], held_out: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """``(fit, held out)`` tree ids: a seeded shuffle, at least one tree on each side when there are
    two or more (with one tree, nothing is held out)."""
    import random

    ids = list(tree_ids)
    random.Random(seed).shuffle(ids)
    if len(ids) < 2 or held_out <= 0:
        return ids, []
    count = min(len(ids) - 1, max(1, round(held_out * len(ids))))
    return ids[count:], ids[:count]
