"""What a picks folder holds, version 1 (docs/picks.md is the reader's description).

A picks folder keeps one subfolder per tree under ``trees/``, named ``<UTC time>_<8 hex>`` so that
names sort by age::

    trees/20261202T101500Z_1a2b3c4d/
        tree.json            # TreeMeta: what was sampled, how, from which model and LoRA
        tree.safetensors     # the rollout (core.tree.Tree): what the tree's own objective trains on
        leaf_00.png ...      # the leaves as the person saw them
        picks/20261202T101533Z_9f8e7d6c.json   # Picks, one file per save: the newest is current

A tree's folder is written whole and then renamed into place, and a pick is a new file written
atomically, so a crash, a killed server or a closed browser tab leaves every earlier tree and pick
intact; nothing is ever rewritten. Readers refuse an unknown format or a newer version in one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import Tensor

from ..core.flow import FULL_NOISE, NoiseSubspace
from ..core.tree import TREE_TENSORS, RolloutPlan, StepOp, Tree

FORMAT = "dynamic-treerpo-picks"
VERSION = 1
LIKED, NEUTRAL, DISLIKED = 1.0, 0.0, -1.0  # the leaf values picks give


class PicksFormatError(ValueError):
    """A file of a picks folder that is not what this version writes (one-line message)."""


@dataclass(frozen=True)
class ModelId:
    """Which weights sampled a tree: a name for people and a fingerprint for the check."""

    kind: str  # embedded | comfyui | flux | sd3
    name: str
    fingerprint: str
    lora: str | None = None  # the LoRA's fingerprint, None without one

    def same_base(self, other: ModelId) -> bool:
        return self.kind == other.kind and self.fingerprint == other.fingerprint


@dataclass(frozen=True)
class TreeMeta:
    """``tree.json``: everything but the tensors."""

    prompt: str
    seed: int
    model: ModelId
    leaves: int
    image_size: tuple[int, int]  # height, width of the leaf images
    latent_shape: tuple[int, ...]
    plan: dict[str, Any]
    negative_prompt: str = ""
    sampler: dict[str, Any] = field(default_factory=dict)  # steps, cfg, shift... as the front end set them
    created: str = ""
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> TreeMeta:
        data = _checked(text, where)
        try:
            model = ModelId(**data.pop("model"))
            data["image_size"] = tuple(data["image_size"])
            data["latent_shape"] = tuple(data["latent_shape"])
            return cls(model=model, **data)
        except (KeyError, TypeError) as err:
            raise PicksFormatError(f"{where}: not a version {VERSION} tree record ({err})") from None


@dataclass(frozen=True)
class Picks:
    """One save of a person's choice on a tree: the leaves they like and those they dislike."""

    liked: tuple[int, ...]
    disliked: tuple[int, ...] = ()
    at: str = ""
    format: str = FORMAT
    version: int = VERSION

    def values(self, leaves: int) -> list[float]:
        """Leaf values: 1 liked, -1 disliked, 0 the rest."""
        out = [NEUTRAL] * leaves
        for leaf in self.liked:
            out[leaf] = LIKED
        for leaf in self.disliked:
            out[leaf] = DISLIKED
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Picks:
        data = _checked(text, where)
        try:
            return cls(liked=tuple(int(i) for i in data.pop("liked")),
                       disliked=tuple(int(i) for i in data.pop("disliked", ())), **data)
        except (KeyError, TypeError, ValueError) as err:
            raise PicksFormatError(f"{where}: not a version {VERSION} picks file ({err})") from None


def check_picks(liked: Sequence[int], disliked: Sequence[int], leaves: int) -> None:
    """A choice that says something: leaf numbers in range, none both liked and disliked, and not every
    leaf the same (all liked, or nothing marked: no preference to learn from)."""
    for leaf in (*liked, *disliked):
        if not 0 <= int(leaf) < leaves:
            raise ValueError(f"leaf {leaf} does not exist: the tree has leaves 0 to {leaves - 1}")
    both = sorted(set(liked) & set(disliked))
    if both:
        raise ValueError(f"leaf {both[0]} is marked both liked and disliked")
    if not liked and not disliked:
        raise ValueError("no leaf is marked: like at least one (or dislike one) to label the tree")
    if len(set(liked)) == leaves or len(set(disliked)) == leaves:
        raise ValueError("every leaf has the same mark: a choice needs some leaves liked more than others")


def _checked(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise PicksFormatError(f"{where} is not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PicksFormatError(f"{where} is not a Dynamic-TreeRPO picks file (format "
                               f"{data.get('format') if isinstance(data, dict) else None!r})")
    if int(data.get("version", 0)) > VERSION:
        raise PicksFormatError(f"{where} is version {data['version']}, newer than this pack reads "
                               f"({VERSION}): update the pack")
    return data


# ------------------------------------------------- the tree's tensors (``core.tree.TREE_TENSORS``)


def plan_to_dict(plan: RolloutPlan) -> dict[str, Any]:
    """A rollout plan as JSON-able data (the noise subspace by its pool and unshuffle)."""
    data = asdict(plan)
    data["ops"] = [asdict(op) for op in plan.ops]
    data["noise"] = {"pool": plan.noise.pool, "unshuffle": plan.noise.unshuffle}
    return data


def plan_from_dict(data: dict[str, Any]) -> RolloutPlan:
    data = dict(data)
    ops = tuple(StepOp(**op) for op in data.pop("ops"))
    noise = data.pop("noise", None)
    subspace = NoiseSubspace(**noise) if noise else FULL_NOISE
    return RolloutPlan(ops=ops, noise=subspace, **data)


def tree_tensors(tree: Tree) -> dict[str, Tensor]:
    """The tensors a stored tree keeps (on the CPU, contiguous), for ``tree.safetensors``."""
    return {name: getattr(tree, name).detach().cpu().contiguous() for name in TREE_TENSORS}


def tree_from(tensors: dict[str, Tensor], plan: RolloutPlan, where: str) -> Tree:
    """The :class:`Tree` of stored tensors (one prompt)."""
    missing = [name for name in TREE_TENSORS if name not in tensors]
    if missing:
        raise PicksFormatError(f"{where}: missing tensor {missing[0]!r}")
    return Tree(plan=plan, num_prompts=1, nfe=0, model_calls=0,
                **{name: tensors[name] for name in TREE_TENSORS})
