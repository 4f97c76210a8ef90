"""A simulated person who labels trees with a hidden taste, and makes mistakes as people do.

Shown a tree's leaves, the person likes the ``likes`` leaves their taste scores highest and dislikes
the ``dislikes`` lowest, and each of those marks is, with probability ``mistakes``, put on a random
other leaf instead (a slip, or a different mood). Ties are broken at random. The taste is any function
``(images [B, 3, H, W] in [0, 1], prompts) -> [B] scores`` (``hidden_tastes.py`` beside this module, or a
user's): no shipped reward measures it, so the pack learns it only through the picks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Taste = Callable[[Tensor, Sequence[str]], Tensor]


def taste_spec(name: str) -> str:
    """The ``function`` reward's spec of a taste: a named one (``hidden_tastes.py``), one of the generated
    family (``family.py``), or a ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION`` as given."""
    from . import family, hidden_tastes

    if ":" in name:
        return name
    if name in family.FAMILY:
        return f"{family.MODULE}:{name}"
    return hidden_tastes.function_spec(name)


def load_taste(spec: str) -> tuple[str, Taste]:
    """``(name, function)`` of a taste: a name of ``hidden_tastes.TASTES`` or of the generated family, or
    ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION`` (the ``function`` reward's loader)."""
    from ...rewards.function import load_function
    from .family import FAMILY
    from .hidden_tastes import TASTES

    if spec in TASTES:
        return spec, TASTES[spec]
    if spec in FAMILY:
        return spec, FAMILY[spec]
    fn = load_function(spec)
    return spec.rpartition(":")[2], lambda images, prompts: torch.as_tensor(fn(images, list(prompts))).float()


@dataclass(frozen=True)
class SimulatedPerson:
    """Likes the top ``likes`` leaves of a tree by ``taste``, dislikes the bottom ``dislikes``; each
    mark lands on a random other leaf with probability ``mistakes``."""

    taste: Taste
    likes: int = 2
    dislikes: int = 1
    mistakes: float = 0.15

    def pick(self, images: Tensor, prompt: str, rng: random.Random) -> tuple[list[int], list[int]]:
        """``(liked, disliked)`` leaf indices of one tree's ``images``."""
        leaves = images.shape[0]
        scores = self.taste(images, [prompt] * leaves).float().flatten().tolist()
        order = list(range(leaves))
        rng.shuffle(order)  # random tie-breaks
        order.sort(key=lambda i: -scores[i])
        liked, disliked = order[: self.likes], order[leaves - self.dislikes:] if self.dislikes else []
        marks = [*liked, *disliked]
        for k in range(len(marks)):
            if rng.random() < self.mistakes:
                free = [i for i in range(leaves) if i not in marks]
                if free:
                    marks[k] = rng.choice(free)
        return sorted(marks[: len(liked)]), sorted(marks[len(liked):])
