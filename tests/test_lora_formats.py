"""kohya LoRA files (trainer.lora.kohya): exact in diffusers, in ComfyUI's own patching, and back.

Tiny random transformers with a LoRA on many layers (fused q/k/v and single-block linear1 parts,
partly targeted, modulation layers, the final layer with its swapped adaLN halves) are exported;
the file must change the model exactly as the trained adapter does, whoever loads it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import diffusers
import pytest
import torch
from comfyui_server import require_comfyui
from diffusers import FluxPipeline, FluxTransformer2DModel, SD3Transformer2DModel
from packaging.version import Version
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dynamic_treerpo.trainer.lora.adapters import (
    attach_lora,
    attach_lora_weights,
    lora_scale,
    lora_state_dict,
)
from dynamic_treerpo.trainer.lora.files import (
    KOHYA_FILE,
    load_diffusers_lora,
    load_kohya_file,
    save_diffusers_state,
    save_kohya_file,
)
from dynamic_treerpo.trainer.lora.kohya import from_kohya, kohya_kind, native_to_diffusers, to_kohya

RANK, ALPHA = 4, 8.0
FLUX_CONFIG = {"patch_size": 1, "in_channels": 64, "num_layers": 1, "num_single_layers": 1,
               "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
               "pooled_projection_dim": 32, "axes_dims_rope": (4, 6, 6), "guidance_embeds": True}
# ComfyUI's own Flux model of the same shape (2x2 patches of 16 channels = diffusers' 64)
COMFY_FLUX_CONFIG = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
                     "vec_in_dim": 32, "context_in_dim": 32, "hidden_size": 32, "mlp_ratio": 4.0,
                     "num_heads": 2, "depth": 1, "depth_single_blocks": 1, "axes_dim": [4, 6, 6],
                     "theta": 10000, "patch_size": 2, "qkv_bias": True}
# hidden = 64 * depth, as ComfyUI's MMDiT assumes; block 0 has SD3.5's second attention
SD3_CONFIG = {"sample_size": 8, "patch_size": 2, "in_channels": 4, "num_layers": 2, "attention_head_dim": 64,
              "num_attention_heads": 2, "joint_attention_dim": 32, "caption_projection_dim": 128,
              "pooled_projection_dim": 32, "out_channels": 4, "pos_embed_max_size": 16,
              "dual_attention_layers": (0,), "qk_norm": "rms_norm"}

# everything but add_v_proj: the txt qkv layer is partly targeted (zero block for v)
DOUBLE = [*(f"transformer_blocks.0.attn.to_{p}" for p in "qkv"),
          "to_out.0", "add_q_proj", "add_k_proj", "to_add_out", "ff.net.0.proj", "ff.net.2",
          "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear"]
TOP = ["x_embedder", "context_embedder", "norm_out.linear", "proj_out", "linear_1", "linear_2"]
SINGLE = ["single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_k", "proj_mlp",
          "norm.linear"]  # linear1 without v; proj_out (linear2) comes with TOP's "proj_out"
FLUX_TARGETS = DOUBLE + TOP + SINGLE
SD3_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
               "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear",
               "norm1_context.linear", "context_embedder", "norm_out.linear", "proj_out", "linear_1",
               "linear_2"]


def _flux() -> nn.Module:
    torch.manual_seed(0)
    return FluxTransformer2DModel(**FLUX_CONFIG)


def _sd3() -> nn.Module:
    torch.manual_seed(0)
    return SD3Transformer2DModel(**SD3_CONFIG)


def _trained(base: nn.Module, targets: list[str], seed: int = 1) -> nn.Module:
    """A copy of ``base`` with a LoRA whose B weights are random (a trained-looking adapter)."""
    model = copy.deepcopy(base)
    attach_lora(model, RANK, ALPHA, targets)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _deltas(state: dict[str, Tensor], alphas: dict[str, float] | float) -> dict[str, Tensor]:
    """``alpha / r * B @ A`` per module of a peft state."""
    out = {}
    for key, a in state.items():
        if key.endswith(".lora_A.weight"):
            module = key[: -len(".lora_A.weight")]
            alpha = alphas[module] if isinstance(alphas, dict) else alphas
            out[module] = alpha / a.shape[0] * state[f"{module}.lora_B.weight"].double() @ a.double()
    return out


def _flux_inputs() -> dict:
    gen = torch.Generator().manual_seed(2)
    batch, tokens, text = 2, 16, 8
    return {"hidden_states": torch.randn(batch, tokens, 64, generator=gen),
            "encoder_hidden_states": torch.randn(batch, text, 32, generator=gen),
            "pooled_projections": torch.randn(batch, 32, generator=gen),
            "timestep": torch.rand(batch, generator=gen), "guidance": torch.full((batch,), 3.5),
            "img_ids": torch.randn(tokens, 3, generator=gen), "txt_ids": torch.zeros(text, 3),
            "return_dict": False}


def _sd3_inputs() -> dict:
    gen = torch.Generator().manual_seed(2)
    return {"hidden_states": torch.randn(2, 4, 8, 8, generator=gen),
            "encoder_hidden_states": torch.randn(2, 8, 32, generator=gen),
            "pooled_projections": torch.randn(2, 32, generator=gen),
            "timestep": torch.rand(2, generator=gen) * 1000,
            "return_dict": False}


@torch.no_grad()
def _out(model: nn.Module) -> Tensor:
    return model(**(_sd3_inputs() if isinstance(model, SD3Transformer2DModel) else _flux_inputs()))[0]


def _assert_same_output(got: nn.Module, trained: nn.Module, base: nn.Module) -> None:
    want, plain = _out(trained), _out(base)
    scale = want.abs().max().item()
    assert (want - plain).abs().max().item() > 0.05 * scale  # the LoRA matters
    assert (_out(got) - want).abs().max().item() <= 1e-5 * scale


@pytest.mark.skipif(Version(diffusers.__version__) < Version("0.42"),
                    reason="diffusers' kohya FLUX converter before 0.42 skips top-level layers (0.35) or "
                           "asserts FLUX.1's sizes (0.31): a limit of that converter, not of the file")
def test_flux_kohya_file_loads_exactly_with_diffusers_converter(tmp_path) -> None:
    """diffusers' kohya FLUX converter reads our file into the same model (its single-block
    ``linear1`` split is hard-coded to FLUX.1's 3072 size: tested at that size below)."""
    base = _flux()
    trained = _trained(base, DOUBLE + TOP + ["norm.linear"])
    path = save_kohya_file(tmp_path / KOHYA_FILE, trained, kind="flux")
    state = FluxPipeline.lora_state_dict(str(path))
    # diffusers 0.42 names top-level layers without "transformer." (its loader then skips them)
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    trained_modules = {k.rsplit(".lora_", 1)[0] for k in lora_state_dict(trained)}
    assert trained_modules <= {k.rsplit(".lora_", 1)[0] for k in state}
    fresh = copy.deepcopy(base)
    attach_lora_weights(fresh, state)  # diffusers' converted state has scale 1
    _assert_same_output(fresh, trained, base)


@pytest.mark.parametrize("parts", [("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
                                   ("attn.to_q", "proj_mlp")])
def test_flux_size_linear1_splits_exactly_in_diffusers(tmp_path, parts) -> None:
    """A single block's fused linear1 at FLUX.1 size, all parts or some, through diffusers."""
    hidden, gen = 3072, torch.Generator().manual_seed(3)
    state = {}
    for part in parts:
        out = 4 * hidden if part == "proj_mlp" else hidden
        state[f"single_transformer_blocks.0.{part}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen)
        state[f"single_transformer_blocks.0.{part}.lora_B.weight"] = torch.randn(out, RANK, generator=gen)
    path = save_kohya_file(tmp_path / KOHYA_FILE, state, alpha=ALPHA, kind="flux")
    assert set(load_file(path)) == {f"lora_unet_single_blocks_0_linear1{s}"
                                    for s in (".lora_down.weight", ".lora_up.weight", ".alpha")}
    got = FluxPipeline.lora_state_dict(str(path))
    probe = torch.randn(hidden, 3, generator=gen, dtype=torch.float64)
    want = _deltas(state, ALPHA)
    for module, delta in want.items():
        a, b = got[f"transformer.{module}.lora_A.weight"], got[f"transformer.{module}.lora_B.weight"]
        mine = delta @ probe
        theirs = b.double() @ (a.double() @ probe)  # diffusers' converted state has scale 1
        assert (theirs - mine).abs().max().item() <= 1e-5 * mine.abs().max().item()


@pytest.mark.parametrize("kind", ["embedded", "flux", "sd3"])
def test_kohya_file_loads_back_into_a_fresh_transformer(tmp_path, kind) -> None:
    base, targets = (_sd3(), SD3_TARGETS) if kind == "sd3" else (_flux(), FLUX_TARGETS)
    trained = _trained(base, targets)
    path = save_kohya_file(tmp_path / KOHYA_FILE, trained, kind=kind)
    fresh = copy.deepcopy(base)
    load_kohya_file(fresh, path, kind)
    _assert_same_output(fresh, trained, base)


def _round_trip(kind: str, model: nn.Module) -> None:
    state = lora_state_dict(model)
    back, alphas = from_kohya(to_kohya(state, ALPHA, kind), kind)
    want, got = _deltas(state, ALPHA), _deltas(back, alphas)
    assert set(got) == set(want)
    for module, delta in want.items():
        assert (got[module] - delta).abs().max().item() <= 1e-6 * delta.abs().max().item(), module
    # our own fused files come back at the trained rank (the block-diagonal structure is found)
    assert {a.shape[0] for k, a in back.items() if k.endswith("lora_A.weight")} == {RANK}


@pytest.mark.parametrize("kind", ["embedded", "flux"])
def test_round_trip_gives_the_same_delta_per_module_flux(kind) -> None:
    _round_trip(kind, _trained(_flux(), FLUX_TARGETS))


def test_round_trip_gives_the_same_delta_per_module_sd3() -> None:
    _round_trip("sd3", _trained(_sd3(), SD3_TARGETS))


def test_flux_names_are_the_bfl_layers() -> None:
    kohya = to_kohya(lora_state_dict(_trained(_flux(), FLUX_TARGETS)), ALPHA, "flux")
    names = {k.rsplit(".", 2)[0] for k in kohya if k.endswith(".lora_down.weight")}
    assert {"lora_unet_double_blocks_0_img_attn_qkv", "lora_unet_double_blocks_0_txt_attn_qkv",
            "lora_unet_double_blocks_0_img_mod_lin", "lora_unet_single_blocks_0_linear1",
            "lora_unet_single_blocks_0_linear2", "lora_unet_single_blocks_0_modulation_lin",
            "lora_unet_final_layer_adaLN_modulation_1", "lora_unet_img_in", "lora_unet_vector_in_in_layer",
            "lora_unet_guidance_in_out_layer"} <= names
    assert not any("transformer_blocks" in n or "to_q" in n for n in names)


def test_kohya_kind_is_recognised_from_layer_names() -> None:
    flux_state = lora_state_dict(_trained(_flux(), ["to_q", "proj_mlp"]))
    sd3_state = lora_state_dict(_trained(_sd3(), ["to_q"]))
    assert kohya_kind(to_kohya(flux_state, ALPHA, "flux")) == "flux"
    assert kohya_kind(to_kohya(flux_state, ALPHA, "embedded")) == "embedded"
    assert kohya_kind(to_kohya(sd3_state, ALPHA, "sd3")) == "sd3"
    assert kohya_kind(flux_state) is None


def test_foreign_fused_layer_with_shared_down_splits_exactly() -> None:
    """A kohya qkv LoRA as other trainers write it (one dense rank-r LoRA, alpha != rank)."""
    gen = torch.Generator().manual_seed(4)
    down, up = torch.randn(6, 32, generator=gen), torch.randn(96, 6, generator=gen)
    name = "lora_unet_double_blocks_0_img_attn_qkv"
    state, alphas = from_kohya({f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
                                f"{name}.alpha": torch.tensor(3.0)}, "flux")
    got = _deltas(state, alphas)
    fused = 3.0 / 6 * up.double() @ down.double()
    for i, part in enumerate(("to_q", "to_k", "to_v")):
        delta = got[f"transformer_blocks.0.attn.{part}"]
        assert (delta - fused[32 * i: 32 * (i + 1)]).abs().max().item() <= 1e-6 * fused.abs().max().item()


def _one_line_error(exc: type[Exception], fn, *args, match: str) -> None:
    with pytest.raises(exc, match=match) as info:
        fn(*args)
    assert "\n" not in str(info.value)


def test_bad_input_gives_one_line_errors(tmp_path) -> None:
    state = lora_state_dict(_trained(_flux(), ["to_q"]))
    _one_line_error(ValueError, to_kohya, state, ALPHA, "sdxl", match="unknown model kind 'sdxl'")
    _one_line_error(ValueError, from_kohya, {}, "sdxl", match="unknown model kind")
    odd = {"transformer_blocks.0.attn.norm_q.lora_A.weight": torch.zeros(4, 8),
           "transformer_blocks.0.attn.norm_q.lora_B.weight": torch.zeros(8, 4)}
    _one_line_error(ValueError, to_kohya, odd, ALPHA, "flux", match="has no place in a kohya flux file")
    single = {k.replace("transformer_blocks", "single_transformer_blocks"): v for k, v in state.items()}
    _one_line_error(ValueError, to_kohya, single, ALPHA, "sd3", match="has no place in a kohya sd3 file")
    _one_line_error(ValueError, to_kohya, {"x.lora_A.weight": torch.zeros(4, 8)}, ALPHA, "embedded",
                    match="lacks its lora_B")
    _one_line_error(ValueError, to_kohya, {"x.lora_magnitude_vector": torch.zeros(4)}, ALPHA, "embedded",
                    match="not a peft LoRA weight")
    clash = {"transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 32),
             "transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(32, 4),
             "transformer_blocks.0.attn.to_k.lora_A.weight": torch.zeros(4, 16),
             "transformer_blocks.0.attn.to_k.lora_B.weight": torch.zeros(32, 4)}
    _one_line_error(ValueError, to_kohya, clash, ALPHA, "flux", match="do not fit one fused layer")
    text_encoder = {"lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha": torch.tensor(1.0)}
    _one_line_error(ValueError, from_kohya, text_encoder, "flux",
                    match="text-encoder LoRAs are not supported")
    unknown = {"lora_unet_double_blocks_0_foo.lora_down.weight": torch.zeros(4, 8),
               "lora_unet_double_blocks_0_foo.lora_up.weight": torch.zeros(8, 4)}
    _one_line_error(ValueError, from_kohya, unknown, "flux", match="not a flux transformer layer")
    _one_line_error(ValueError, from_kohya, {"lora_unet_img_in.lora_down.weight": torch.zeros(4, 8)}, "flux",
                    match="lacks its lora_up")
    _one_line_error(FileNotFoundError, load_kohya_file, _flux(), tmp_path / "missing.safetensors", "flux",
                    match="LoRA file not found")
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    _one_line_error(ValueError, load_kohya_file, _flux(), tmp_path / "bad.safetensors", "flux",
                    match="not a readable safetensors LoRA")
    sd3_file = save_kohya_file(tmp_path / "sd3.safetensors", _trained(_sd3(), ["to_q"]), kind="sd3")
    _one_line_error(ValueError, load_kohya_file, _flux(), sd3_file, "flux",
                    match="not a flux transformer layer")
    _one_line_error(ValueError, save_kohya_file, tmp_path / "x.safetensors", state, None, "flux",
                    match="needs the LoRA alpha")


def test_save_is_atomic_and_tagged(tmp_path) -> None:
    trained = _trained(_flux(), ["to_q", "to_k", "to_v"])
    path = save_kohya_file(tmp_path / "lora" / KOHYA_FILE, trained, kind="flux")
    assert sorted(p.name for p in path.parent.iterdir()) == [KOHYA_FILE]
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert f.metadata()["model_kind"] == "flux"
        assert float(f.get_tensor("lora_unet_double_blocks_0_img_attn_qkv.alpha")) == 3 * RANK


# ---- LoRAs trained on ComfyUI's own modules (original names) in diffusers names ----

# (layer, out, in) of each native layer of the tiny models above, as ComfyUI names them
NATIVE_LAYERS = {
    "flux": [("double_blocks.0.img_attn.qkv", 96, 32), ("double_blocks.0.img_attn.proj", 32, 32),
             ("double_blocks.0.txt_attn.qkv", 96, 32), ("double_blocks.0.txt_attn.proj", 32, 32),
             ("double_blocks.0.img_mlp.0", 128, 32), ("double_blocks.0.img_mlp.2", 32, 128),
             ("double_blocks.0.txt_mlp.0", 128, 32), ("double_blocks.0.txt_mlp.2", 32, 128),
             ("single_blocks.0.linear1", 224, 32), ("single_blocks.0.linear2", 32, 160)],
    "sd3": [("joint_blocks.0.x_block.attn.qkv", 384, 128), ("joint_blocks.0.x_block.attn.proj", 128, 128),
            ("joint_blocks.0.x_block.attn2.qkv", 384, 128), ("joint_blocks.0.x_block.attn2.proj", 128, 128),
            ("joint_blocks.0.x_block.mlp.fc1", 512, 128), ("joint_blocks.0.x_block.mlp.fc2", 128, 512),
            ("joint_blocks.0.context_block.attn.qkv", 384, 128),
            ("joint_blocks.0.context_block.attn.proj", 128, 128),
            ("joint_blocks.1.x_block.attn.qkv", 384, 128),
            ("joint_blocks.1.context_block.attn.qkv", 384, 128)],
}


@pytest.mark.parametrize("kind", ["flux", "sd3"])
def test_native_lora_saves_in_diffusers_names_that_load_with_the_same_deltas(kind, tmp_path) -> None:
    """A LoRA on ComfyUI's FLUX/SD3 modules, saved for diffusers: the file loads into the diffusers
    transformer of the same shape (every key a module of it), and the loaded adapter, laid out again
    in the original layers, has each layer's delta exactly."""
    gen = torch.Generator().manual_seed(3)
    native = {}
    for layer, out_features, in_features in NATIVE_LAYERS[kind]:
        native[f"{layer}.lora_A.weight"] = torch.randn(RANK, in_features, generator=gen)
        native[f"{layer}.lora_B.weight"] = torch.randn(out_features, RANK, generator=gen)
    state, alphas = native_to_diffusers(native, ALPHA, kind)
    path = save_diffusers_state(tmp_path / "lora.safetensors", state, alphas)
    model = _flux() if kind == "flux" else _sd3()
    load_diffusers_lora(model, path)
    from peft import get_peft_model_state_dict

    loaded = get_peft_model_state_dict(model, adapter_name=next(iter(model.peft_config)))
    assert loaded.keys() == state.keys()
    rank, alpha = lora_scale(model)
    back = from_kohya_layers(to_kohya(loaded, alpha, kind))
    for layer, _, _ in NATIVE_LAYERS[kind]:
        a, b = native[f"{layer}.lora_A.weight"], native[f"{layer}.lora_B.weight"]
        expected = ALPHA / RANK * b @ a
        torch.testing.assert_close(back[layer], expected, atol=1e-5, rtol=1e-5)
    assert rank == RANK


def from_kohya_layers(kohya: dict[str, Tensor]) -> dict[str, Tensor]:
    """kohya file -> ``{original layer (dotted): alpha / rank * up @ down}``."""
    out = {}
    for key, down in kohya.items():
        if key.endswith(".lora_down.weight"):
            name = key[: -len(".lora_down.weight")]
            up, alpha = kohya[f"{name}.lora_up.weight"], float(kohya[f"{name}.alpha"])
            out[name] = alpha / down.shape[0] * up.float() @ down.float()
    layers = {layer for kind in NATIVE_LAYERS.values() for layer, _, _ in kind}
    return {next(x for x in layers if "lora_unet_" + x.replace(".", "_") == k): v
            for k, v in out.items() if any("lora_unet_" + x.replace(".", "_") == k for x in layers)}


def test_native_lora_for_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="flux or sd3"):
        native_to_diffusers({}, 1.0, "embedded")


# ---- ComfyUI: its own key map and patching on its own model classes (in a subprocess) ----

_COMFY_SCRIPT = r'''
import json, logging, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
from safetensors.torch import load_file, save_file
import comfy.options
comfy.options.enable_args_parsing(False)
import comfy.cli_args
comfy.cli_args.args.cpu = True
import comfy.lora, comfy.model_base, comfy.model_detection, comfy.model_patcher, comfy.sd
import comfy.supported_models, comfy.supported_models_base, comfy.utils

warnings = []
class Catch(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger().addHandler(Catch())
cpu = torch.device("cpu")

def original_layout(sd, table):
    """diffusers keys -> the model's own keys with ComfyUI's table (slices, swaps); gaps are NaN."""
    pieces, out, unknown = {}, {}, []
    for key, value in sd.items():
        to = table.get(key)
        if to is None:
            unknown.append(key)
        elif isinstance(to, str):
            out[to] = value
        elif to[1] is None:
            out[to[0]] = to[2](value)
        else:
            pieces.setdefault(to[0], []).append((to[1], value))
    for key, parts in pieces.items():
        full = torch.full((max(o + s for (_, o, s), _ in parts), *parts[0][1].shape[1:]), float("nan"))
        for (dim, offset, size), value in parts:
            full.narrow(dim, offset, size).copy_(value)
        out[key] = full
    return out, unknown

for work in map(Path, sys.argv[2:]):
    warnings.clear()
    job = json.loads((work / "job.json").read_text())
    base, merged = load_file(work / "base.safetensors"), load_file(work / "merged.safetensors")
    if job["kind"] == "embedded":
        from diffusers import FluxTransformer2DModel
        config = comfy.supported_models_base.BASE({"disable_unet_model_creation": True})
        model = comfy.model_base.BaseModel(config, comfy.model_base.ModelType.FLOW, device=cpu)
        model.diffusion_model = FluxTransformer2DModel.from_config(job["config"])
        orig, expected, unknown = base, merged, []
    else:
        if job["kind"] == "flux":
            table = comfy.utils.flux_to_diffusers(job["unet_config"])
            orig, unknown = original_layout(base, table)
            model = comfy.supported_models.Flux(job["unet_config"]).get_model({}, device=cpu)
        else:
            table = comfy.utils.mmdit_to_diffusers({"depth": job["depth"]})
            orig, unknown = original_layout(base, table)
            unet_config = comfy.model_detection.detect_unet_config(orig, "")
            model = comfy.supported_models.SD3(unet_config).get_model({}, device=cpu)
        expected, _ = original_layout(merged, table)
    model.diffusion_model.load_state_dict(orig, strict=True)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    lora = load_file(work / "lora.safetensors")
    key_map = comfy.lora.model_lora_keys_unet(patcher.model, {})
    names = sorted({k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in lora})
    patched_model, _ = comfy.sd.load_lora_for_models(patcher, None, lora, 1.0, 0.0)
    patched_model.patch_model()
    patched = patched_model.model.diffusion_model.state_dict()
    patched = {k: v.detach().float().contiguous() for k, v in patched.items()}
    save_file(patched, str(work / "patched.safetensors"))
    save_file({k: v.float().contiguous() for k, v in orig.items()}, str(work / "orig.safetensors"))
    save_file({k: v.float().contiguous() for k, v in expected.items()}, str(work / "expected.safetensors"))
    (work / "report.json").write_text(json.dumps({
        "unmapped": [n for n in names if n not in key_map], "layers": len(names), "warnings": list(warnings),
        "unknown": unknown, "patched": len(patched_model.patches)}))
'''


def _merged(base: nn.Module, trained: nn.Module) -> dict[str, Tensor]:
    """The base weights plus each module's LoRA delta (what a merged export would hold)."""
    merged = {k: v.clone() for k, v in base.state_dict().items()}
    for module, delta in _deltas(lora_state_dict(trained), ALPHA).items():
        merged[f"{module}.weight"] += delta.float()
    return merged


@pytest.fixture(scope="module")
def comfy_runs(tmp_path_factory) -> dict[str, Path]:
    """Each kind's export applied by ComfyUI (one subprocess for all kinds: one ComfyUI import)."""
    root = require_comfyui()
    runs = {}
    for kind, make, targets in (("embedded", _flux, FLUX_TARGETS), ("flux", _flux, FLUX_TARGETS),
                                ("sd3", _sd3, SD3_TARGETS)):
        work = tmp_path_factory.mktemp(f"comfy_{kind}")
        base = make()
        trained = _trained(base, targets)
        save_file(base.state_dict(), str(work / "base.safetensors"))
        save_file(_merged(base, trained), str(work / "merged.safetensors"))
        save_kohya_file(work / "lora.safetensors", trained, kind=kind)
        job = {"kind": kind, "config": {k: v for k, v in base.config.items() if not k.startswith("_")},
               "unet_config": COMFY_FLUX_CONFIG, "depth": SD3_CONFIG["num_layers"]}
        (work / "job.json").write_text(json.dumps(job))
        runs[kind] = work
    done = subprocess.run([sys.executable, "-c", _COMFY_SCRIPT, str(root), *map(str, runs.values())],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return runs


@pytest.mark.parametrize("kind", ["embedded", "flux", "sd3"])
def test_comfyui_applies_the_kohya_file_exactly(comfy_runs, kind) -> None:
    """Every kohya layer is one ComfyUI maps for that model, and its patched weights equal the
    base weights plus our LoRA deltas, laid out by ComfyUI's own diffusers tables."""
    work = comfy_runs[kind]
    report = json.loads((work / "report.json").read_text())
    assert report["unknown"] == []  # ComfyUI's table knows every diffusers weight of the model
    assert report["unmapped"] == []
    assert not [w for w in report["warnings"] if "lora key not loaded" in w or "NOT LOADED" in w]
    assert report["patched"] == report["layers"] > 10
    patched, expected = load_file(work / "patched.safetensors"), load_file(work / "expected.safetensors")
    orig = load_file(work / "orig.safetensors")
    assert set(patched) == set(expected)
    scale = max(v.abs().max().item() for v in expected.values())
    moved = max((expected[k] - orig[k]).abs().max().item() for k in expected)
    assert moved > 0.05 * scale  # the LoRA changes weights: the comparison below is not vacuous
    for key, value in expected.items():
        assert not value.isnan().any(), key
        assert (patched[key] - value).abs().max().item() <= 1e-5 * scale, key
