"""``treerpo sample``: render prompts with the embedded model, optionally with a LoRA."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..core.flow import make_sigmas
from ..embedded.policy import EmbeddedPolicy
from ..lora.adapters import attach_lora_weights, check_lora_fits
from ..lora.files import DIFFUSERS_PREFIX, load_diffusers_lora, load_kohya_file, read_lora_file
from ..lora.keys import from_comfyui_state
from ..lora.kohya import kohya_kind
from ..training.evaluate import generate
from ..training.logs import save_image_grid


def load_lora_file(transformer: torch.nn.Module, path: str | Path) -> None:
    """Apply a LoRA file in ComfyUI (``diffusion_model.`` keys, ``.alpha`` or scale 1), diffusers
    (``transformer.`` keys) or kohya format to the embedded transformer."""
    path = Path(path)
    state = read_lora_file(path)
    kind = kohya_kind(state)
    if kind == "sd3":
        raise ValueError(f"{path} is a kohya SD3 LoRA; this model is the embedded (FLUX-architecture) one")
    if kind is not None:
        load_kohya_file(transformer, path, kind)
        return
    if state and all(k.startswith(DIFFUSERS_PREFIX) for k in state):
        load_diffusers_lora(transformer, path)
        return
    weights, alphas = from_comfyui_state(state)
    if not weights:
        raise ValueError(f"{path} holds no LoRA weights")
    check_lora_fits(transformer, weights, path)
    modules = {k.rsplit(".lora_", 1)[0] for k in weights}
    attach_lora_weights(transformer, weights, {m: alphas.get(m, weights[f"{m}.lora_A.weight"].shape[0])
                                               for m in modules})


@torch.no_grad()
def sample_grid(prompts: Sequence[str], seeds: Sequence[int], out: str | Path,
                lora: str | Path | None = None, model: str | Path | None = None, steps: int = 10,
                shift: float = 3.0) -> torch.Tensor:
    """Images for every prompt x seed, written as one grid (rows: prompts); returns them."""
    policy = EmbeddedPolicy.from_pretrained(model)
    if lora is not None:
        load_lora_file(policy.transformer, lora)
    policy.eval()
    pairs = [(p, s) for p in prompts for s in seeds]
    sigmas = make_sigmas("shift", steps, shift)
    images = generate(policy, [p for p, _ in pairs], [s for _, s in pairs], sigmas)
    save_image_grid(images, out, nrow=len(seeds), captions=[p for p, _ in pairs])
    return images
