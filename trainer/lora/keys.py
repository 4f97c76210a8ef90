"""Pure key maps between peft's LoRA state dict and the ComfyUI format.

ComfyUI: ``<prefix><module>.lora_down.weight`` / ``lora_up.weight`` plus an ``.alpha`` tensor per
module, ``<module>`` being the diffusers module path. The prefix is ``diffusion_model.`` for the
embedded model (in ComfyUI it is that diffusers transformer, so ``LoraLoaderModelOnly`` finds every
layer) and ``transformer.`` for FLUX.1 and SD3, whose ComfyUI models have their own layout: ComfyUI
maps ``transformer.<diffusers module>`` onto it (its ``flux_to_diffusers`` / ``mmdit_to_diffusers``
tables, q/k/v slices of fused layers included). ComfyUI ignores safetensors metadata and scales by
``alpha / rank`` only when an ``.alpha`` tensor is present, so the tensor keeps the strength right.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

COMFYUI_PREFIX = "diffusion_model."
_COMFYUI_NAMES = {"lora_A": "lora_down", "lora_B": "lora_up"}


DIFFUSERS_MODEL_PREFIX = "transformer."


def comfyui_state(state: Mapping[str, Tensor], alpha: float,
                  prefix: str = COMFYUI_PREFIX) -> dict[str, Tensor]:
    """peft keys (``<module>.lora_A.weight``) to ComfyUI's keys under ``prefix``, plus ``.alpha``."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        module, rest = key.rsplit(".lora_", 1)
        name, suffix = rest.split(".", 1)
        out[f"{prefix}{module}.{_COMFYUI_NAMES['lora_' + name]}.{suffix}"] = value
        out[f"{prefix}{module}.alpha"] = torch.tensor(float(alpha))
    return out


def from_comfyui_state(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Inverse of :func:`comfyui_state`: peft keys, and ``alpha`` per module."""
    back = {v: k for k, v in _COMFYUI_NAMES.items()}
    weights: dict[str, Tensor] = {}
    alphas: dict[str, float] = {}
    for key, value in state.items():
        key = key.removeprefix(COMFYUI_PREFIX).removeprefix(DIFFUSERS_MODEL_PREFIX)
        if key.endswith(".alpha"):
            alphas[key[: -len(".alpha")]] = float(value)
            continue
        module, name, suffix = key.rsplit(".", 2)
        weights[f"{module}.{back.get(name, name)}.{suffix}"] = value
    return weights, alphas


