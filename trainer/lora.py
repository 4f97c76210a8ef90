"""LoRA on a diffusers transformer (peft): attach, read, load, and export in the formats users load.

Exports:
- ComfyUI: ``<prefix><module>.lora_down.weight`` / ``lora_up.weight`` plus an ``.alpha`` tensor
  per module, ``<module>`` being the diffusers module path. The prefix is ``diffusion_model.`` for
  the embedded model (in ComfyUI it is that diffusers transformer, so ``LoraLoaderModelOnly`` finds
  every layer) and ``transformer.`` for FLUX.1 and SD3, whose ComfyUI models have their own layout:
  ComfyUI maps ``transformer.<diffusers module>`` onto it (its ``flux_to_diffusers`` /
  ``mmdit_to_diffusers`` tables, q/k/v slices of fused layers included).
  ComfyUI ignores safetensors metadata and scales by ``alpha / rank`` only when an ``.alpha``
  tensor is present, so the tensor is what keeps the strength right.
- diffusers: ``pytorch_lora_weights.safetensors`` written by diffusers itself, with the adapter
  config in its metadata (load with ``pipe.load_lora_weights`` or :func:`load_diffusers_lora`).
- kohya: ``kohya_lora.safetensors``, ``lora_unet_<layer>`` keys in the model's original layout
  (FLUX's BFL names, SD3's MMDiT names; fused layers as one LoRA of the summed rank), written by
  :mod:`trainer.lora_formats`; ComfyUI, kohya's sd-scripts and diffusers read it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from .atomic import atomic_save_safetensors, one_line

COMFYUI_FILE = "comfyui_lora.safetensors"
DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"


def attach_lora(transformer: nn.Module, rank: int, alpha: float, targets: Sequence[str],
                seed: int = 0) -> None:
    """Freeze ``transformer`` and add a trainable LoRA (B = 0: the model is unchanged)."""
    from peft import LoraConfig

    transformer.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if hasattr(transformer, "add_adapter"):  # a diffusers model
            transformer.add_adapter(config)
        else:  # any other torch module (a ComfyUI diffusion model): peft's own injection
            from peft import inject_adapter_in_model

            try:
                inject_adapter_in_model(config, transformer)
            except ValueError as err:  # peft: "Target modules ... not found in the base model"
                raise ValueError(f"LoRA targets {list(targets)} matched no module of the "
                                 "transformer") from err
            for name, param in transformer.named_parameters():
                if "lora_" in name:  # peft copies the base dtype (maybe fp8): train in float32
                    param.data = param.data.float()
    if not any(p.requires_grad for p in transformer.parameters()):
        raise ValueError(f"LoRA targets {list(targets)} matched no module of the transformer")


def _lora_layers(module: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in module.modules() if isinstance(m, BaseTunerLayer)]


def set_adapters_enabled(transformer: nn.Module, enabled: bool) -> None:
    """Switch the LoRA on or off (off: the base model, the reference of the KL term)."""
    if hasattr(transformer, "enable_adapters"):  # a diffusers model
        (transformer.enable_adapters if enabled else transformer.disable_adapters)()
        return
    for layer in _lora_layers(transformer):
        layer.enable_adapters(enabled)


def detach_lora(transformer: nn.Module) -> None:
    """Take the injected LoRA layers out again, leaving the base modules as they were.

    A ComfyUI diffusion model is shared by every node that received its MODEL: training injects
    layers into it for the duration of a step only, and the trained LoRA travels as weight patches.
    """
    layers = {id(m) for m in _lora_layers(transformer)}
    for name, layer in [(n, m) for n, m in transformer.named_modules() if id(m) in layers]:
        parent_name, _, child = name.rpartition(".")
        parent = transformer.get_submodule(parent_name) if parent_name else transformer
        setattr(parent, child, layer.get_base_layer())
    if hasattr(transformer, "peft_config"):
        del transformer.peft_config


def lora_state_dict(transformer: nn.Module) -> dict[str, Tensor]:
    """The adapter's weights, keyed ``<module>.lora_A.weight`` / ``lora_B.weight`` (cloned)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(transformer).items()}


def load_lora_state(transformer: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Load adapter weights saved by :func:`lora_state_dict`; a mismatch is an error."""
    from peft import set_peft_model_state_dict

    own = lora_state_dict(transformer)
    unknown = sorted(set(state) - set(own))
    missing = sorted(set(own) - set(state))
    if unknown or missing:
        key = (unknown or missing)[0]
        kind = "unexpected" if unknown else "missing"
        raise ValueError(f"LoRA does not fit this model: {kind} key {key!r}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(f"LoRA does not fit this model: {key!r} has shape {tuple(value.shape)}, "
                             f"expected {tuple(own[key].shape)}")
    set_peft_model_state_dict(transformer, dict(state))


def lora_scale(transformer: nn.Module) -> tuple[int, float]:
    """``(rank, alpha)`` of the attached default adapter."""
    config = next(iter(transformer.peft_config.values()))
    return int(config.r), float(config.lora_alpha)


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
    """The adapter as diffusers writes it (adapter config in the metadata), atomically to ``path``."""
    metadata = next(iter(transformer.peft_config.values())).to_dict()
    return _write_diffusers(Path(path), lora_state_dict(transformer), _plain(metadata))


def save_diffusers_state(path: str | os.PathLike[str], state: Mapping[str, Tensor],
                         alphas: Mapping[str, float]) -> Path:
    """A peft state in diffusers module names, with one ``alpha`` per module, as diffusers writes it:
    the most common rank and alpha in the adapter config, the others as its rank/alpha patterns."""
    ranks = {module: int(state[f"{module}.lora_A.weight"].shape[0]) for module in alphas}
    rank = max(set(ranks.values()), key=list(ranks.values()).count)
    alpha = max(set(alphas.values()), key=list(alphas.values()).count)
    metadata = {"r": rank, "lora_alpha": alpha, "target_modules": sorted(alphas),
                "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
                "alpha_pattern": {m: a for m, a in alphas.items() if a != alpha}}
    return _write_diffusers(Path(path), dict(state), metadata)


def _write_diffusers(path: Path, state: dict[str, Tensor], metadata: dict) -> Path:
    from diffusers import FluxPipeline

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        FluxPipeline.save_lora_weights(tmp, transformer_lora_layers=state,
                                       transformer_lora_adapter_metadata=metadata)
        os.replace(Path(tmp) / DIFFUSERS_FILE, path)
    return path


def save_lora_files(folder: str | os.PathLike[str], transformer: nn.Module,
                    comfyui_prefix: str = COMFYUI_PREFIX, kind: str = "embedded") -> dict[str, Path]:
    """Write the ComfyUI, diffusers and kohya files of the transformer's adapter into ``folder``;
    ``kind`` (``embedded``, ``flux``, ``sd3``) names the kohya layout."""
    from .lora_formats import KOHYA_FILE, save_kohya_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kohya = folder / KOHYA_FILE
    save_kohya_file(kohya, transformer, kind=kind)
    return {"comfyui": save_comfyui_lora(folder / COMFYUI_FILE, transformer, comfyui_prefix),
            "diffusers": save_diffusers_lora(folder / DIFFUSERS_FILE, transformer), "kohya": kohya}


def _plain(value):
    """peft configs hold sets; diffusers' metadata writer wants JSON-able values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    return value


def load_diffusers_lora(transformer: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load a diffusers-format LoRA file into ``transformer`` with its saved rank and alpha."""
    from diffusers import FluxPipeline

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA file not found: {path}")
    try:
        state, metadata = FluxPipeline.lora_state_dict(str(path), return_lora_metadata=True)
    except (ValueError, KeyError, RuntimeError, OSError) as err:
        raise ValueError(f"{path} is not a LoRA this model reads: {one_line(err)}") from None
    check_lora_fits(transformer, {k.removeprefix("transformer."): v for k, v in state.items()}, path)
    transformer.load_lora_adapter(state, prefix="transformer", metadata=metadata)


def check_lora_fits(transformer: nn.Module, state: Mapping[str, Tensor],
                    path: str | os.PathLike[str]) -> None:
    """Every LoRA module is a linear layer of ``transformer`` with matching sizes; else one line
    (diffusers would print a page of missing keys and raise deep inside peft)."""
    linears = {name: m for name, m in transformer.named_modules() if isinstance(m, nn.Linear)}
    for key, value in state.items():
        module, _, part = key.rpartition(".lora_")
        if not module:
            raise ValueError(f"{path}: {key!r} is not a LoRA weight (<module>.lora_A/lora_B.weight)")
        layer = linears.get(module)
        if layer is None:
            raise ValueError(f"{path} does not fit this model: it has no linear layer {module!r} "
                             "(a LoRA for another model?)")
        size = layer.in_features if part.startswith("A") else layer.out_features
        axis = 1 if part.startswith("A") else 0
        if value.dim() != 2 or value.shape[axis] != size:
            raise ValueError(f"{path} does not fit this model: {key!r} has shape {tuple(value.shape)}, "
                             f"the layer takes {size} {'inputs' if axis else 'outputs'}")
