"""The kohya (sd-scripts) LoRA key maps for the three model kinds: pure state-dict conversions.

A kohya file names each layer ``lora_unet_<layer path, dots as underscores>`` with
``.lora_down.weight`` [rank, in], ``.lora_up.weight`` [out, rank] and ``.alpha`` (the delta is
``alpha / rank * up @ down``). Which layer path depends on the model kind:

- ``embedded``: ComfyUI runs our diffusers transformer itself, so the path is the diffusers module.
- ``flux``: FLUX.1 in the original BFL layout (``double_blocks.<i>.img_attn.qkv``,
  ``single_blocks.<i>.linear1``, ...), which is what ComfyUI's FLUX model, sd-scripts, and
  diffusers' kohya converter all read.
- ``sd3``: SD3/SD3.5 in the MMDiT layout (``joint_blocks.<i>.x_block.attn.qkv``, ...).
- ``native``: a LoRA trained on ComfyUI's own FLUX/SD3 modules, whose names already are those
  original layouts: the path is the module name.

Why the fused layers are exact: diffusers splits a fused layer (q, k, v; a single block's
``linear1`` also holds the MLP input) into modules that each have a LoRA of rank ``r_i``. Their sum
is one LoRA of rank ``sum(r_i)`` on the fused layer: ``down`` stacks the parts' A rows and ``up`` is
block-diagonal, one block per part at the part's output rows; parts that were not trained are zero
rows. The inverse takes, per part, its rows of ``up`` and the ``down`` rows they use, which is exact.

Every layer is written with its ``alpha / rank`` folded into ``up`` and ``alpha = rank`` (scale 1):
loaders disagree about alphas (ComfyUI reads them, diffusers' kohya converter drops the ones of
``final_layer``), and a scale of 1 reads the same everywhere. BFL and MMDiT order the final (and,
in SD3, the last block's context) adaLN modulation as (shift, scale) where diffusers has
(scale, shift); those layers get their two row halves of ``up`` swapped.

The tables below follow ComfyUI's ``flux_to_diffusers`` / ``mmdit_to_diffusers`` key maps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("embedded", "flux", "sd3", "native")  # native: module names already in the original layout
KOHYA_PREFIX = "lora_unet_"
FLUX_MLP_RATIO = 4  # FLUX.1's single blocks: linear1 = q, k, v (hidden each) + MLP in (4 hidden)

_DOWN, _UP, _ALPHA = ".lora_down.weight", ".lora_up.weight", ".alpha"


@dataclass(frozen=True)
class _Slot:
    """Where a diffusers module lands in the original layout.

    ``part`` indexes the module in a fused layer whose parts have output sizes ``sizes`` (multiples
    of the layer's input size); ``swap`` says the up rows are (scale, shift) halves to swap:
    ``"always"``, ``"if_two"`` (only when the layer outputs exactly two chunks) or ``""``.
    """

    layer: str
    part: int | None = None
    sizes: tuple[int, ...] = ()
    swap: str = ""


_QKV = (1, 1, 1)
_LINEAR1 = (1, 1, 1, FLUX_MLP_RATIO)


def _qkv(layer: str, names: tuple[str, ...], sizes: tuple[int, ...] = _QKV) -> dict[str, _Slot]:
    return {name: _Slot(layer, i, sizes) for i, name in enumerate(names)}


_FLUX_DOUBLE: dict[str, _Slot] = {
    **_qkv("img_attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    **_qkv("txt_attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    "attn.to_out.0": _Slot("img_attn.proj"),
    "attn.to_add_out": _Slot("txt_attn.proj"),
    "norm1.linear": _Slot("img_mod.lin"),
    "norm1_context.linear": _Slot("txt_mod.lin"),
    "ff.net.0.proj": _Slot("img_mlp.0"),
    "ff.net.2": _Slot("img_mlp.2"),
    "ff_context.net.0.proj": _Slot("txt_mlp.0"),
    "ff_context.net.2": _Slot("txt_mlp.2"),
}
_FLUX_SINGLE: dict[str, _Slot] = {
    **_qkv("linear1", ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), _LINEAR1),
    "proj_out": _Slot("linear2"),
    "norm.linear": _Slot("modulation.lin"),
}
_FLUX_TOP: dict[str, _Slot] = {
    "x_embedder": _Slot("img_in"),
    "context_embedder": _Slot("txt_in"),
    "time_text_embed.timestep_embedder.linear_1": _Slot("time_in.in_layer"),
    "time_text_embed.timestep_embedder.linear_2": _Slot("time_in.out_layer"),
    "time_text_embed.text_embedder.linear_1": _Slot("vector_in.in_layer"),
    "time_text_embed.text_embedder.linear_2": _Slot("vector_in.out_layer"),
    "time_text_embed.guidance_embedder.linear_1": _Slot("guidance_in.in_layer"),
    "time_text_embed.guidance_embedder.linear_2": _Slot("guidance_in.out_layer"),
    "proj_out": _Slot("final_layer.linear"),
    "norm_out.linear": _Slot("final_layer.adaLN_modulation.1", swap="always"),
}
_SD3_BLOCK: dict[str, _Slot] = {
    **_qkv("x_block.attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    **_qkv("context_block.attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    **_qkv("x_block.attn2.qkv", ("attn2.to_q", "attn2.to_k", "attn2.to_v")),
    "attn.to_out.0": _Slot("x_block.attn.proj"),
    "attn2.to_out.0": _Slot("x_block.attn2.proj"),
    "attn.to_add_out": _Slot("context_block.attn.proj"),
    "norm1.linear": _Slot("x_block.adaLN_modulation.1"),
    # the last block's context norm is diffusers' AdaLayerNormContinuous (scale, shift)
    "norm1_context.linear": _Slot("context_block.adaLN_modulation.1", swap="if_two"),
    "ff.net.0.proj": _Slot("x_block.mlp.fc1"),
    "ff.net.2": _Slot("x_block.mlp.fc2"),
    "ff_context.net.0.proj": _Slot("context_block.mlp.fc1"),
    "ff_context.net.2": _Slot("context_block.mlp.fc2"),
}
_SD3_TOP: dict[str, _Slot] = {
    "context_embedder": _Slot("context_embedder"),
    "time_text_embed.timestep_embedder.linear_1": _Slot("t_embedder.mlp.0"),
    "time_text_embed.timestep_embedder.linear_2": _Slot("t_embedder.mlp.2"),
    "time_text_embed.text_embedder.linear_1": _Slot("y_embedder.mlp.0"),
    "time_text_embed.text_embedder.linear_2": _Slot("y_embedder.mlp.2"),
    "proj_out": _Slot("final_layer.linear"),
    "norm_out.linear": _Slot("final_layer.adaLN_modulation.1", swap="always"),
}

# per kind: (diffusers block prefix, original block prefix, table); "" prefixes = top level
_LAYOUTS: dict[str, tuple[tuple[str, str, dict[str, _Slot]], ...]] = {
    "flux": (("transformer_blocks", "double_blocks", _FLUX_DOUBLE),
             ("single_transformer_blocks", "single_blocks", _FLUX_SINGLE), ("", "", _FLUX_TOP)),
    "sd3": (("transformer_blocks", "joint_blocks", _SD3_BLOCK), ("", "", _SD3_TOP)),
    # embedded: the diffusers names themselves (the FLUX module vocabulary, for the inverse)
    "embedded": (("transformer_blocks", "transformer_blocks", {k: _Slot(k) for k in _FLUX_DOUBLE}),
                 ("single_transformer_blocks", "single_transformer_blocks",
                  {k: _Slot(k) for k in _FLUX_SINGLE}),
                 ("", "", {k: _Slot(k) for k in _FLUX_TOP})),
    "native": (),  # ComfyUI's own FLUX/SD3 modules: the names are the layers (give ``modules``)
}


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r} for a kohya LoRA: use one of {', '.join(KINDS)}")


def _slot(module: str, kind: str) -> _Slot:
    """The original-layout slot of a diffusers module; a module the format cannot name is an error."""
    if kind in ("embedded", "native"):  # names used as they are (ComfyUI's own FLUX/SD3 modules)
        return _Slot(module)
    for diff_block, orig_block, table in _LAYOUTS[kind]:
        if diff_block:
            match = re.fullmatch(rf"{diff_block}\.(\d+)\.(.+)", module)
            if match and match.group(2) in table:
                slot = table[match.group(2)]
                return _Slot(f"{orig_block}.{match.group(1)}.{slot.layer}", slot.part, slot.sizes, slot.swap)
        elif module in table:
            return table[module]
    raise ValueError(f"LoRA module {module!r} has no place in a kohya {kind} file "
                     f"(not a linear layer of the {kind} transformer that the format names)")


def _kohya_name(layer: str) -> str:
    return KOHYA_PREFIX + layer.replace(".", "_")


def _modules(state: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """peft state -> ``{module: (A [r, in], B [out, r])}``, with one-line errors for odd keys."""
    parts: dict[str, dict[str, Tensor]] = {}
    for key, value in state.items():
        match = re.fullmatch(r"(.+)\.lora_([AB])\.weight", key)
        if match is None:
            raise ValueError(f"{key!r} is not a peft LoRA weight (<module>.lora_A.weight / lora_B.weight)")
        parts.setdefault(match.group(1), {})[match.group(2)] = value
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA module {module!r} lacks its lora_{'B' if 'A' in ab else 'A'} weight")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"LoRA module {module!r} is not a linear LoRA: A {tuple(a.shape)}, "
                             f"B {tuple(b.shape)}")
        out[module] = (a, b)
    return out


def _swap_halves(up: Tensor) -> Tensor:
    first, second = up.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def _swaps(slot: _Slot, out_features: int, in_features: int) -> bool:
    return slot.swap == "always" or (slot.swap == "if_two" and out_features == 2 * in_features)


def to_kohya(state: Mapping[str, Tensor], alpha: float | Mapping[str, float],
             kind: str) -> dict[str, Tensor]:
    """peft LoRA state (diffusers module names) -> kohya keys of ``kind``, scale folded (alpha = rank).

    ``alpha`` is the peft ``lora_alpha`` (or one per module); each module's delta is
    ``alpha / r * B @ A`` with ``r`` its rank, and the file reproduces every delta exactly.
    """
    check_kind(kind)
    modules = _modules(state)
    layers: dict[str, list[tuple[_Slot, Tensor, Tensor]]] = {}
    for module, (a, b) in modules.items():
        module_alpha = alpha.get(module) if isinstance(alpha, Mapping) else alpha
        if module_alpha is None:
            raise ValueError(f"no LoRA alpha given for module {module!r}")
        scaled = (b.float() * (float(module_alpha) / a.shape[0])).to(b.dtype)
        slot = _slot(module, kind)
        layers.setdefault(slot.layer, []).append((slot, a, scaled))
    out: dict[str, Tensor] = {}
    for layer, items in layers.items():
        name = _kohya_name(layer)
        if f"{name}{_DOWN}" in out:
            raise ValueError(f"two LoRA modules map onto the same kohya name {name!r}")
        down, up = _fuse(layer, items)
        out[f"{name}{_DOWN}"] = down.contiguous()
        out[f"{name}{_UP}"] = up.contiguous()
        out[f"{name}{_ALPHA}"] = torch.tensor(float(down.shape[0]))
    return out


def _fuse(layer: str, items: list[tuple[_Slot, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """One layer's (down, up): a plain LoRA, or the block-diagonal union of a fused layer's parts."""
    slot, a, b = items[0]
    if slot.part is None:
        return a, (_swap_halves(b) if _swaps(slot, b.shape[0], a.shape[1]) else b)
    hidden = a.shape[1]
    sizes = [m * hidden for m in slot.sizes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    items = sorted(items, key=lambda item: item[0].part)
    for part_slot, part_a, part_b in items:
        size = sizes[part_slot.part]
        if part_a.shape[1] != hidden or part_b.shape[0] != size:
            raise ValueError(f"LoRA parts of {layer!r} do not fit one fused layer: part {part_slot.part} "
                             f"is {part_b.shape[0]}x{part_a.shape[1]}, expected {size}x{hidden}")
    down = torch.cat([item[1] for item in items], dim=0)
    up = b.new_zeros(sum(sizes), down.shape[0])
    col = 0
    for part_slot, part_a, part_b in items:
        start, r = offsets[part_slot.part], part_a.shape[0]
        up[start: start + part_b.shape[0], col: col + r] = part_b
        col += r
    return down, up


def _layer_index(kind: str, modules: Iterable[str] | None) -> dict[str, list[tuple[str, _Slot]]]:
    """Underscored kohya names -> the diffusers modules (with slots) that make up that layer.

    Block indices are not known in advance, so block layers are listed per index on demand by
    :func:`_resolve`; this index holds the top-level layers and any ``modules`` given.
    """
    index: dict[str, list[tuple[str, _Slot]]] = {}
    for diff_block, _orig_block, table in _LAYOUTS[kind]:
        if not diff_block:
            for module, slot in table.items():
                index.setdefault(_kohya_name(slot.layer), []).append((module, slot))
    for module in modules or ():
        if kind in ("embedded", "native"):
            index[_kohya_name(module)] = [(module, _Slot(module))]
    return index


def _resolve(name: str, kind: str, index: dict[str, list[tuple[str, _Slot]]]) -> list[tuple[str, _Slot]]:
    if name in index:
        return index[name]
    for diff_block, orig_block, table in _LAYOUTS[kind]:
        if not diff_block:
            continue
        match = re.fullmatch(rf"{KOHYA_PREFIX}{orig_block}_(\d+)_(.+)", name)
        if match is None:
            continue
        found = [(f"{diff_block}.{match.group(1)}.{module}",
                  _Slot(f"{orig_block}.{match.group(1)}.{slot.layer}", slot.part, slot.sizes, slot.swap))
                 for module, slot in table.items() if slot.layer.replace(".", "_") == match.group(2)]
        if found:
            return sorted(found, key=lambda item: item[1].part or 0)
    raise ValueError(f"kohya layer {name!r} is not a {kind} transformer layer this trainer knows")


def from_kohya(state: Mapping[str, Tensor], kind: str,
               modules: Iterable[str] | None = None) -> tuple[dict[str, Tensor], dict[str, float]]:
    """kohya keys of ``kind`` -> (peft state in diffusers module names, ``alpha`` per module).

    The scale is folded into ``lora_B`` and each module's alpha is its rank (scale 1), so the state
    loads with any peft/diffusers loader. A fused layer comes back as its diffusers parts, each
    with the ``down`` rows its block of ``up`` uses (the original rank for files from
    :func:`to_kohya`); parts whose rows are all zero are left out (their delta is zero).
    ``modules`` (e.g. a transformer's module names) lets ``embedded`` files name any layer.
    """
    check_kind(kind)
    layers: dict[str, dict[str, Tensor]] = {}
    for key, value in state.items():
        for suffix in (_DOWN, _UP, _ALPHA):
            if key.endswith(suffix):
                layers.setdefault(key[: -len(suffix)], {})[suffix] = value
                break
        else:
            raise ValueError(f"{key!r} is not a kohya LoRA key "
                             "(.lora_down.weight / .lora_up.weight / .alpha)")
    index = _layer_index(kind, modules)
    out: dict[str, Tensor] = {}
    alphas: dict[str, float] = {}
    for name, tensors in layers.items():
        if not name.startswith(KOHYA_PREFIX):
            raise ValueError(f"kohya layer {name!r} is not a transformer layer (lora_unet_...); "
                             "text-encoder LoRAs are not supported")
        if _DOWN not in tensors or _UP not in tensors:
            lacking = "lora_up" if _DOWN in tensors else "lora_down"
            raise ValueError(f"kohya layer {name!r} lacks its {lacking} weight")
        down, up = tensors[_DOWN], tensors[_UP]
        if down.dim() != 2 or up.dim() != 2 or down.shape[0] != up.shape[1]:
            raise ValueError(f"kohya layer {name!r} is not a linear LoRA: down {tuple(down.shape)}, "
                             f"up {tuple(up.shape)}")
        rank = down.shape[0]
        alpha = float(tensors[_ALPHA]) if _ALPHA in tensors else float(rank)
        up = (up.float() * (alpha / rank)).to(up.dtype)
        for module, a, b in _split(name, _resolve(name, kind, index), down, up):
            out[f"{module}.lora_A.weight"] = a.contiguous()
            out[f"{module}.lora_B.weight"] = b.contiguous()
            alphas[module] = float(a.shape[0])
    return out, alphas


def native_to_diffusers(state: Mapping[str, Tensor], alpha: float,
                        kind: str) -> tuple[dict[str, Tensor], dict[str, float]]:
    """A LoRA on ComfyUI's own FLUX/SD3 modules (original layer names) in diffusers module names:
    fused layers split exactly (each part keeps the ``down`` rows and its block of ``up``), the
    scale folded into ``lora_B`` with ``alpha`` per module (see :func:`from_kohya`)."""
    if kind not in ("flux", "sd3"):
        raise ValueError(f"a native LoRA converts to diffusers names for flux or sd3, not {kind!r}")
    return from_kohya(to_kohya(state, alpha, "native"), kind)


def _split(name: str, members: list[tuple[str, _Slot]], down: Tensor,
           up: Tensor) -> list[tuple[str, Tensor, Tensor]]:
    module, slot = members[0]
    if slot.part is None:
        return [(module, down, _swap_halves(up) if _swaps(slot, up.shape[0], down.shape[1]) else up)]
    hidden = down.shape[1]
    sizes = [m * hidden for m in slot.sizes]
    if up.shape[0] != sum(sizes):
        raise ValueError(f"kohya layer {name!r} has {up.shape[0]} outputs, expected {sum(sizes)} "
                         f"for input size {hidden}")
    parts = []
    offset = 0
    for (module, _), size in zip(members, sizes, strict=True):
        rows = up[offset: offset + size]
        offset += size
        used = rows.abs().sum(dim=0).nonzero().flatten()
        if used.numel():
            parts.append((module, down[used], rows[:, used]))
    return parts


def kohya_kind(state: Mapping[str, Tensor]) -> str | None:
    """Which kind's layout a kohya state uses (by its layer names); None when it is not kohya."""
    names = [k for k in state if k.startswith(KOHYA_PREFIX)]
    if not names:
        return None
    for kind, pattern in (("sd3", "joint_blocks_"), ("flux", "double_blocks_"), ("flux", "single_blocks_"),
                          ("flux", "final_layer_"), ("flux", "img_in"), ("sd3", "t_embedder_")):
        if any(k.startswith(KOHYA_PREFIX + pattern) for k in names):
            return kind
    return "embedded"


