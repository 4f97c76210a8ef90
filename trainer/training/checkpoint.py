"""Checkpoints of a training run: trained weights, optimizer, run state; written atomically, resumable.

Layout: ``checkpoints/iter_000025/{weights.safetensors, optimizer.pt, state.pt}`` and
``checkpoints/latest.json`` naming the newest complete one (written last, atomically). Loading
falls back to an older checkpoint when the newest is unreadable, and never runs pickled code.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from ..utils.atomic import atomic_save_safetensors, atomic_torch_save, atomic_write_text, safe_torch_load

LATEST = "latest.json"
WEIGHTS = "weights.safetensors"
OLD_WEIGHTS = "lora.safetensors"  # the name before full fine-tuning shared the file; still read


@dataclass
class Checkpoint:
    iteration: int
    weights: dict[str, Tensor]  # the LoRA, or every weight of a full fine-tuning
    optimizer: dict[str, Any]
    state: dict[str, Any]
    folder: Path


def _folder(root: Path, iteration: int) -> Path:
    return root / f"iter_{iteration:06d}"


def save_checkpoint(root: str | Path, iteration: int, weights: dict[str, Tensor],
                    optimizer: dict[str, Any], state: dict[str, Any], keep: int = 2) -> Path:
    """Write one checkpoint, then point ``latest.json`` at it, then prune to ``keep``."""
    root = Path(root)
    folder = _folder(root, iteration)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(weights, folder / WEIGHTS)
    atomic_torch_save(optimizer, folder / "optimizer.pt")
    atomic_torch_save({**state, "iteration": iteration}, folder / "state.pt")
    atomic_write_text(root / LATEST, json.dumps({"iteration": iteration, "folder": folder.name}) + "\n")
    for old in sorted(root.glob("iter_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def _load(folder: Path) -> Checkpoint:
    state = safe_torch_load(folder / "state.pt")
    weights = folder / WEIGHTS if (folder / WEIGHTS).is_file() else folder / OLD_WEIGHTS
    return Checkpoint(int(state["iteration"]), load_file(weights),
                      safe_torch_load(folder / "optimizer.pt"), state, folder)


def load_latest(root: str | Path) -> Checkpoint | None:
    """The newest readable checkpoint under ``root`` (None when there is none)."""
    root = Path(root)
    folders = sorted(root.glob("iter_*"), reverse=True)
    pointer = root / LATEST
    if pointer.is_file():
        try:
            named = root / json.loads(pointer.read_text())["folder"]
            folders = [named] + [f for f in folders if f != named and f.name < named.name]
        except (ValueError, KeyError, TypeError):
            pass
    for folder in folders:
        try:
            return _load(folder)
        except Exception as err:  # corrupt or truncated: say so, use the previous one
            print(f"warning: checkpoint {folder} is unreadable ({type(err).__name__}); "
                  "trying an older one", file=sys.stderr)
    return None
