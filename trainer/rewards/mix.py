"""Several rewards as one: a spec like ``hps-v2.1:0.7,clip:0.3``, weights paths bound to names,
and the weighted sum the advantages use, by the loss's rule (the core's
:func:`~trainer.core.advantages.combine_rewards`, ``MixRule``).

Why normalise within the group (``normalised``, MixGRPO's recipe and the default): rewards live on
different scales (HPS ~0.3, ImageReward ~1, OCR in [0, 1]); the sum of raw values would let the widest
one decide every advantage. Each reward is standardised over the images of one prompt, then weighted,
so a weight means what it says. Why not always: Flow-GRPO and DiffusionNFT sum the raw scores
(``raw``) and divide by the spread of that sum over the whole batch, the spread between prompts
included, which per-reward normalisation would take away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.advantages import MixRule, combine_rewards
from .registry import RewardFn, get_reward, needs_weights, reward_entry


@dataclass(frozen=True)
class RewardTerm:
    name: str
    weight: float


def parse_reward_spec(spec: str) -> list[RewardTerm]:
    """``"a:0.7,b"`` -> terms with weights (1 when absent); unknown names, repeats, empty names and
    weights that are not positive numbers are one-line errors."""
    terms: list[RewardTerm] = []
    for part in spec.split(","):
        name, sep, weight_text = part.strip().partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"empty reward name in {spec!r}")
        reward_entry(name)
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"reward weight {weight_text.strip()!r} of {name!r} is not a number") from None
        if not weight > 0.0:
            raise ValueError(f"reward weight of {name!r} must be > 0, got {weight_text.strip()}")
        if any(t.name == name for t in terms):
            raise ValueError(f"reward {name!r} named twice in {spec!r}")
        terms.append(RewardTerm(name, weight))
    return terms


def bind_weights(names: Sequence[str], items: Sequence[str]) -> dict[str, str]:
    """Weights paths per reward name from ``--weights`` items.

    ``NAME=PATH`` binds explicitly; a bare ``PATH`` goes to the next named reward that needs weights
    (so with one model reward, ``--weights PATH`` just works). Extra or doubled paths are errors.
    """
    out: dict[str, str] = {}
    bare: list[str] = []
    for item in items:
        name, sep, path = item.partition("=")
        if sep and name in names:
            if name in out:
                raise ValueError(f"two weights paths for reward {name!r}")
            out[name] = path
        else:
            bare.append(item)
    waiting = [n for n in names if n not in out and needs_weights(n)]
    if len(bare) > len(waiting):
        raise ValueError(f"weights path {bare[len(waiting)]!r} has no reward to go to "
                         f"(rewards needing weights: {', '.join(waiting) or 'none'})")
    out.update(zip(waiting, bare, strict=False))
    for name in waiting[len(bare):]:
        get_reward(name, None)  # the one-line "needs its weights" error, before any other work
    return out


class RewardMix:
    """Callable reward over several terms.

    One term: its own output, unchanged. Several: ``reward`` is the weighted sum of raw scores (what
    evaluation reports), ``reward_<name>`` each term's score, and the terms' other keys prefixed by
    their name. :meth:`training_signal` gives the value that advantages use.
    """

    def __init__(self, spec: str, weights_paths: Mapping[str, str] | None = None,
                 device: str | torch.device = "cpu", prebuilt: Mapping[str, RewardFn] | None = None) -> None:
        """``prebuilt``: terms already built by the caller (the training layer builds the ``picks``
        reward with its backbone options), the others by the registry from ``weights_paths``."""
        self.terms = parse_reward_spec(spec)
        paths = dict(weights_paths or {})
        unknown = sorted(set(paths) - {t.name for t in self.terms})
        if unknown:
            raise ValueError(f"weights given for reward {unknown[0]!r}, which is not in {spec!r}")
        ready = dict(prebuilt or {})
        self.fns: dict[str, RewardFn] = {t.name: ready[t.name] if t.name in ready else
                                         get_reward(t.name, paths.get(t.name), device) for t in self.terms}

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.terms]

    def weight_of(self, name: str) -> float:
        return next(t.weight for t in self.terms if t.name == name)

    def set_share(self, name: str, weight: float) -> None:
        """Give term ``name`` the weight ``weight`` and the other terms ``1 - weight``, shared as their
        weights were: how a guard that steers training moves the picks weight between iterations."""
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the weight of {name!r} must lie in (0, 1], got {weight}")
        others = sum(t.weight for t in self.terms if t.name != name)
        self.terms = [RewardTerm(t.name, weight if t.name == name else
                                 (1.0 - weight) * (t.weight / others if others > 0 else 0.0))
                      for t in self.terms]

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> dict[str, Tensor]:
        if len(self.terms) == 1:
            return self.fns[self.terms[0].name](images, prompts)
        out: dict[str, Tensor] = {}
        total = torch.zeros(images.shape[0])
        for term in self.terms:
            result = self.fns[term.name](images, prompts)
            score = result["reward"].detach().float().cpu()
            out[f"reward_{term.name}"] = score
            for key, value in result.items():
                if key != "reward":
                    out[f"{term.name}_{key}"] = value
            total += term.weight * score
        out["reward"] = total
        return out

    def training_signal(self, scores: Mapping[str, Tensor], groups: Tensor,
                        rule: MixRule = "normalised") -> Tensor:
        """The per-image value advantages are built from: the raw reward for one term, else the terms
        weighted, each normalised within its group first (``groups``: the prompt of each image) or,
        ``raw``, as scored (the ``reward`` that :meth:`__call__` reports)."""
        if len(self.terms) == 1:
            return scores["reward"].detach().float().cpu()
        stacked = torch.stack([scores[f"reward_{t.name}"].float().cpu() for t in self.terms], dim=1)
        return combine_rewards(stacked, torch.as_tensor(groups, dtype=torch.long),
                               torch.tensor([t.weight for t in self.terms]), rule)
