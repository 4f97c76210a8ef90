"""LoRA adapters on a diffusers transformer (peft): attach, enable, detach, read and load state.

The only module of ``trainer/lora`` that touches peft's modules; the key maps of the file formats
(:mod:`.keys`, :mod:`.kohya`) are pure functions over state dicts, and :mod:`.files` joins the two.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from ..compat.versions import check_versions

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def attach_lora(transformer: nn.Module, rank: int, alpha: float, targets: Sequence[str],
                seed: int = 0) -> None:
    """Freeze ``transformer`` and add a trainable LoRA (B = 0: the model is unchanged)."""
    from peft import LoraConfig

    check_versions(["peft"])
    transformer.requires_grad_(False)
    for module in transformer.modules():  # peft creates a LoRA in its layer's `compute_dtype` when it has
        weight = getattr(module, "weight", None)  # one, else in the weight's: an fp8 init would be rounded
        if isinstance(weight, Tensor) and weight.dtype in FLOAT8 and not hasattr(module, "compute_dtype"):
            module.compute_dtype = torch.float32
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
    for name, param in transformer.named_parameters():  # over fp8 weights stored by diffusers' casting
        if "lora_" in name and param.dtype in FLOAT8:
            param.data = param.data.float()
    if not any(p.requires_grad for p in transformer.parameters()):
        raise ValueError(f"LoRA targets {list(targets)} matched no module of the transformer")
    initialise_by_name(transformer, seed)


def attach_lora_weights(transformer: nn.Module, state: Mapping[str, Tensor],
                        alphas: Mapping[str, float] | None = None) -> None:
    """Attach a LoRA holding ``state`` (``<module>.lora_A/lora_B.weight``) to ``transformer``, each
    module with its own rank (read from the shapes) and ``alphas[module]`` (default: its rank).

    Why not diffusers' ``load_lora_adapter``: it exists from diffusers 0.32 on and changed its
    arguments since; peft's config (the most common rank and alpha, the others as its rank and alpha
    patterns) loads the same adapter on every supported version.
    """
    from peft import LoraConfig

    check_versions(["peft"])
    modules = sorted({key.rsplit(".lora_", 1)[0] for key in state})
    if not modules:
        raise ValueError("the LoRA holds no lora_A/lora_B weights")
    ranks = {m: int(state[f"{m}.lora_A.weight"].shape[0]) for m in modules}
    alpha_of = {m: float(alphas[m]) if alphas is not None else float(ranks[m]) for m in modules}
    rank = max(sorted(set(ranks.values())), key=list(ranks.values()).count)
    alpha = max(sorted(set(alpha_of.values())), key=list(alpha_of.values()).count)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=modules, init_lora_weights=True,
                        rank_pattern={m: r for m, r in ranks.items() if r != rank},
                        alpha_pattern={m: a for m, a in alpha_of.items() if a != alpha})
    transformer.requires_grad_(False)
    if hasattr(transformer, "add_adapter"):  # a diffusers model
        transformer.add_adapter(config)
    else:
        from peft import inject_adapter_in_model

        inject_adapter_in_model(config, transformer)
    load_lora_state(transformer, state)


def initialise_by_name(transformer: nn.Module, seed: int) -> None:
    """peft's LoRA initialisation (A Kaiming-uniform with ``a = sqrt(5)``, B = 0), drawn per layer from
    a generator seeded by ``seed`` and the layer's name.

    Why: peft draws every layer's A from one global stream in the order the layers were registered,
    which diffusers releases change (0.31 registers a FLUX attention's projections in another order
    than 0.35): the same seed then gave another LoRA. Seeding by name gives the same LoRA on every
    supported version.
    """
    with torch.no_grad():
        for name, layer in transformer.named_modules():
            lora_a = getattr(layer, "lora_A", None)
            lora_b = getattr(layer, "lora_B", None)
            if not isinstance(lora_a, nn.ModuleDict) or not isinstance(lora_b, nn.ModuleDict):
                continue
            for adapter, down in lora_a.items():
                generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:{adapter}".encode()))
                weight = torch.empty(down.weight.shape, dtype=torch.float32)
                nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
                down.weight.copy_(weight)
                lora_b[adapter].weight.zero_()


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
