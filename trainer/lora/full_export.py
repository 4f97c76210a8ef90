"""Export of a fully fine-tuned transformer (``lora.enabled: false``) as a diffusers folder.

Why a folder and not a LoRA: every weight moved, so the whole transformer is the result. It is
written with diffusers' own ``save_pretrained`` (safetensors), which ``from_pretrained`` and the
pipelines read, into a temporary folder that replaces the old export in one rename.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from torch import Tensor, nn

FULL_EXPORT = "transformer"


def save_full_transformer(folder: str | Path, transformer: nn.Module,
                          state: dict[str, Tensor] | None = None) -> dict[str, Path]:
    """Write ``folder/transformer`` (config + safetensors) atomically; returns its path. ``state``:
    the weights to write instead of the module's own (an FSDP-sharded module's gathered weights,
    written through an unsharded copy built from the same config)."""
    if state is not None:
        fresh = type(transformer).from_config(transformer.config)
        fresh.load_state_dict(state, strict=True)
        transformer = fresh
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / FULL_EXPORT
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        staged = Path(tmp) / FULL_EXPORT
        transformer.save_pretrained(staged, safe_serialization=True)
        if target.exists():
            old = Path(tmp) / "old"
            target.rename(old)
        staged.rename(target)
        shutil.rmtree(Path(tmp) / "old", ignore_errors=True)
    return {"diffusers": target}
