"""Rewards by name. A reward maps images ``[B, 3, H, W]`` in ``[0, 1]`` and their prompts to a dict
of per-image tensors; ``reward`` is what training maximises, other keys are logged beside it.

Model rewards load from a local path (``--weights`` on the command line, ``reward_weights`` in a
config): nothing is downloaded. Each entry says where users get its files, so a missing path is a
one-line error that tells them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module

import torch
from torch import Tensor

from ..compat.versions import check_versions

RewardFn = Callable[[Tensor, Sequence[str]], dict[str, Tensor]]

PICKS = "picks"
"""The personal reward's name in a reward spec: fitted on a person's picks folder (docs/picks.md)."""


@dataclass(frozen=True)
class RewardEntry:
    """How to build one named reward: the module and its builder ``fn(weights, device)``, whether
    it needs a weights path, and what that path is."""

    module: str
    needs_weights: bool
    weights_help: str
    builder: str = "build"


# Every reward by name: a new reward is one entry here (a test may add a stand-in).
REWARDS: dict[str, RewardEntry] = {
    "scene": RewardEntry("scene_reward", False, "none: the embedded default's programmatic reward"),
    "clip": RewardEntry("clip_family", True,
                        "a transformers CLIP folder, e.g. openai/clip-vit-large-patch14", "build_clip"),
    "pickscore": RewardEntry("clip_family", True,
                             "the yuvalkirstain/PickScore_v1 folder (tokenizer files from "
                             "laion/CLIP-ViT-H-14-laion2B-s32B-b79K in it or in processor/)",
                             "build_pickscore"),
    "hps-v2.1": RewardEntry("clip_family", True,
                            "HPS_v2.1_compressed.pt from xswu/HPSv2 (runs on open_clip_torch: .[hps])",
                            "build_hps"),
    "imagereward": RewardEntry("imagereward", True,
                               "a folder with ImageReward.pt and med_config.json from THUDM/ImageReward "
                               "and vocab.txt from google-bert/bert-base-uncased"),
    "ocr": RewardEntry("ocr", False, "optional: a folder of PP-OCR ONNX models (default: the ones "
                                     "shipped in the rapidocr-onnxruntime wheel)"),
    PICKS: RewardEntry("personal", True, "a picks folder of labelled trees (data.picks; docs/picks.md): "
                                         "a personal reward is fitted on its picks"),
    "function": RewardEntry("function", True, "MODULE:FUNCTION or FILE.py:FUNCTION of a Python function "
                                              "(images [B, 3, H, W] in [0, 1], prompts) -> B scores"),
}


def reward_names() -> list[str]:
    return sorted(REWARDS)


def reward_entry(name: str) -> RewardEntry:
    """The registry entry of ``name``; an unknown name is a one-line error listing the known ones."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; available: {', '.join(reward_names())}")
    return REWARDS[name]


def needs_weights(name: str) -> bool:
    return reward_entry(name).needs_weights


def get_reward(name: str, weights: str | None = None, device: str | torch.device = "cpu") -> RewardFn:
    """Build the reward registered under ``name`` from its local ``weights`` path, on ``device``."""
    entry = reward_entry(name)
    if entry.needs_weights and weights is None:
        raise ValueError(f"reward {name!r} needs its weights: give a local PATH (treerpo score --weights "
                         f"PATH; in a training config reward_weights: {{{name}: PATH}}); PATH is "
                         f"{entry.weights_help}")
    if entry.module in ("clip_family", "imagereward"):
        check_versions(["transformers", "tokenizers"])
    module = import_module(f".{entry.module}", __package__)
    return getattr(module, entry.builder)(weights, device)
