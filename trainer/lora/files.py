"""LoRA files in the formats users load: write and read ComfyUI, diffusers and kohya files.

- ComfyUI: ``comfyui_lora.safetensors`` (keys of :mod:`.keys`).
- diffusers: ``pytorch_lora_weights.safetensors`` written by diffusers itself, each module's
  ``alpha / rank`` folded into its ``lora_B`` so that the file loads at its strength in every
  diffusers release (older ones ignore an adapter config in the metadata) and in ComfyUI (load with
  ``pipe.load_lora_weights`` or :func:`load_diffusers_lora`).
- kohya: ``kohya_lora.safetensors``, ``lora_unet_<layer>`` keys in the model's original layout
  (FLUX's BFL names, SD3's MMDiT names; fused layers as one LoRA of the summed rank, :mod:`.kohya`);
  ComfyUI, kohya's sd-scripts and diffusers read it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor, nn

from ..utils.atomic import atomic_save_safetensors
from .adapters import attach_lora_weights, check_lora_fits, lora_scale, lora_state_dict
from .keys import COMFYUI_PREFIX, comfyui_state
from .kohya import check_kind, from_kohya, to_kohya

COMFYUI_FILE = "comfyui_lora.safetensors"
DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"
DIFFUSERS_PREFIX = "transformer."
ADAPTER_METADATA = "lora_adapter_metadata"  # where diffusers 0.35+ keep the adapter config


def save_comfyui_lora(path: str | os.PathLike[str], transformer: nn.Module,
                      prefix: str = COMFYUI_PREFIX) -> Path:
    """The adapter in ComfyUI keys with ``.alpha`` tensors, written atomically to ``path``."""
    rank, alpha = lora_scale(transformer)
    return save_comfyui_state(path, lora_state_dict(transformer), rank, alpha, prefix)


def save_comfyui_state(path: str | os.PathLike[str], state: Mapping[str, Tensor], rank: int, alpha: float,
                       prefix: str = COMFYUI_PREFIX) -> Path:
    """A peft LoRA state in ComfyUI keys with ``.alpha`` tensors, written atomically to ``path``."""
    path = Path(path)
    atomic_save_safetensors(comfyui_state(state, alpha, prefix), path,
                            metadata={"format": "pt", "lora_rank": str(rank), "lora_alpha": str(alpha)})
    return path


def save_diffusers_lora(path: str | os.PathLike[str], transformer: nn.Module) -> Path:
    """The adapter as diffusers writes it, scale folded into ``lora_B``, atomically to ``path``."""
    alpha = lora_scale(transformer)[1]
    state = lora_state_dict(transformer)
    return save_diffusers_state(path, state, {k.rsplit(".lora_", 1)[0]: alpha for k in state})


def save_diffusers_state(path: str | os.PathLike[str], state: Mapping[str, Tensor],
                         alphas: Mapping[str, float]) -> Path:
    """A peft state in diffusers module names, with one ``alpha`` per module, as diffusers writes it,
    each module's ``alpha / rank`` folded into its ``lora_B`` (scale 1 for every reader)."""
    folded = {}
    for key, value in state.items():
        module = key.rsplit(".lora_", 1)[0]
        rank = state[f"{module}.lora_A.weight"].shape[0]
        folded[key] = value * (float(alphas[module]) / rank) if ".lora_B." in key else value
    return _write_diffusers(Path(path), folded)


def _write_diffusers(path: Path, state: dict[str, Tensor]) -> Path:
    from diffusers import FluxPipeline

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        FluxPipeline.save_lora_weights(tmp, transformer_lora_layers=state)
        os.replace(Path(tmp) / DIFFUSERS_FILE, path)
    return path


def save_lora_files(folder: str | os.PathLike[str], transformer: nn.Module,
                    comfyui_prefix: str = COMFYUI_PREFIX, kind: str = "embedded") -> dict[str, Path]:
    """Write the ComfyUI, diffusers and kohya files of the transformer's adapter into ``folder``;
    ``kind`` (``embedded``, ``flux``, ``sd3``) names the kohya layout."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kohya = folder / KOHYA_FILE
    save_kohya_file(kohya, transformer, kind=kind)
    return {"comfyui": save_comfyui_lora(folder / COMFYUI_FILE, transformer, comfyui_prefix),
            "diffusers": save_diffusers_lora(folder / DIFFUSERS_FILE, transformer), "kohya": kohya}


def diffusers_alphas(path: Path, state: Mapping[str, Tensor]) -> dict[str, float]:
    """Each module's alpha in a diffusers LoRA file: from the adapter config diffusers 0.35 and later
    write into the metadata (the files of this pack's earlier versions), else its rank (scale 1)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        config = json.loads((handle.metadata() or {}).get(ADAPTER_METADATA, "null") or "null")
    modules = {key.rsplit(".lora_", 1)[0] for key in state}
    ranks = {m: float(state[f"{m}.lora_A.weight"].shape[0]) for m in modules}
    if not isinstance(config, dict) or "lora_alpha" not in config:
        return ranks
    pattern = config.get("alpha_pattern") or {}
    return {m: float(pattern.get(m, config["lora_alpha"])) for m in modules}


def load_diffusers_lora(transformer: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load a diffusers-format LoRA file into ``transformer`` at its saved strength."""
    path = Path(path)
    stored = read_lora_file(path)
    if not stored or not all(k.startswith(DIFFUSERS_PREFIX) for k in stored):
        raise ValueError(f"{path} is not a LoRA this model reads: expected diffusers keys "
                         f"({DIFFUSERS_PREFIX}<module>.lora_A/lora_B.weight)")
    state = {k.removeprefix(DIFFUSERS_PREFIX): v for k, v in stored.items()}
    if not all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in state):
        raise ValueError(f"{path} is not a LoRA this model reads: keys other than lora_A/lora_B weights")
    check_lora_fits(transformer, state, path)
    attach_lora_weights(transformer, state, diffusers_alphas(path, state))


KOHYA_FILE = "kohya_lora.safetensors"
def save_kohya_file(path: str | os.PathLike[str], transformer_or_state: nn.Module | Mapping[str, Tensor],
                    alpha: float | None = None, kind: str = "flux") -> Path:
    """Write a transformer's adapter (or a peft state with ``alpha``) as a kohya file, atomically."""

    check_kind(kind)
    if isinstance(transformer_or_state, nn.Module):
        state = lora_state_dict(transformer_or_state)
        alpha = lora_scale(transformer_or_state)[1] if alpha is None else alpha
    else:
        state = dict(transformer_or_state)
        if alpha is None:
            raise ValueError("save_kohya_file needs the LoRA alpha when given a state dict")
    path = Path(path)
    atomic_save_safetensors(to_kohya(state, alpha, kind), path,
                            metadata={"format": "pt", "lora_format": "kohya", "model_kind": kind})
    return path


def read_lora_file(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """A LoRA file's tensors; a missing or unreadable file is a one-line error."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA file not found: {path}")
    try:
        return load_file(path)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors LoRA ({err})") from None


def load_kohya_file(transformer: nn.Module, path: str | os.PathLike[str], kind: str) -> None:
    """Attach a kohya file's LoRA to a diffusers transformer (ranks per module as stored)."""
    check_kind(kind)
    path = Path(path)
    state = read_lora_file(path)
    names = [name for name, _ in transformer.named_modules()]
    try:
        peft_state, alphas = from_kohya(state, kind, modules=names)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if not peft_state:
        raise ValueError(f"{path} holds no LoRA weights")
    known = set(names)
    missing = sorted({k.rsplit(".lora_", 1)[0] for k in peft_state} - known)
    if missing:
        raise ValueError(f"{path} does not fit this model: it has no module {missing[0]!r}")
    attach_lora_weights(transformer, peft_state, alphas)
