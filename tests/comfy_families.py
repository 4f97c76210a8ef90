"""Tiny random-weight instances of ComfyUI's rectified-flow image model families, with stand-ins for
their text encoders and VAEs, so that tests train LoRAs on every family on a CPU in seconds.

The diffusion models are ComfyUI's own classes (``comfy.supported_models.<Family>(unet_config)
.get_model``), configured like the real releases (same kinds of blocks, guidance embedding where the
release has one, qk norms, modulation layout) but 32 wide (SD3: 64, one head of 64; Z-Image: 256,
see its config) with one or two blocks of each kind and two heads. The text encoder stand-in gives
CONDITIONING shaped as the family's real encoder gives it through CLIPTextEncode; the VAE stand-in
only decodes, as the trainer uses it.

Import this inside a process where ComfyUI is on ``sys.path`` and set up (args parsing off, CPU).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from types import ModuleType
from typing import Any

import comfy.model_management
import comfy.model_patcher
import comfy.supported_models
import torch

FAMILIES: tuple[str, ...] = (
    "Flux", "FluxSchnell", "Flux2", "Chroma", "SD3", "QwenImage", "Lumina2", "ZImage", "HiDream",
    "AuraFlow", "HunyuanImage21",
)

# unet_config of each family as comfy/model_detection.py detects it from a real checkpoint, with the
# widths, depths and head counts shrunk. The comment names the release whose layout it mirrors.
_CONFIGS: dict[str, dict[str, Any]] = {
    # FLUX.1-dev: 19 double + 38 single blocks, guidance embedding, T5 context + CLIP-L pooled vector.
    "Flux": {
        "image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
        "vec_in_dim": 24, "context_in_dim": 48, "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2,
        "depth": 2, "depth_single_blocks": 2, "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2,
        "qkv_bias": True,
    },
    # FLUX.1-schnell: FLUX.1's blocks without the guidance embedding (timestep-distilled, CFG 1).
    "FluxSchnell": {
        "image_model": "flux", "guidance_embed": False, "in_channels": 16, "out_channels": 16,
        "vec_in_dim": 24, "context_in_dim": 48, "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2,
        "depth": 2, "depth_single_blocks": 2, "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2,
        "qkv_bias": True,
    },
    # FLUX.2-dev: shared (global) modulation, SiLU-gated MLPs, no biases, 128-channel latent without
    # patching, context = three stacked Mistral layers, guidance embedding, no pooled vector.
    "Flux2": {
        "image_model": "flux2", "guidance_embed": True, "in_channels": 128, "out_channels": 128,
        "vec_in_dim": None, "context_in_dim": 48, "hidden_size": 32, "mlp_ratio": 3.0, "num_heads": 2,
        "depth": 2, "depth_single_blocks": 2, "axes_dim": [4, 4, 4, 4], "theta": 2000, "patch_size": 1,
        "qkv_bias": False, "global_modulation": True, "mlp_silu_act": True, "ops_bias": False,
        "default_ref_method": "index", "ref_index_scale": 10.0,
    },
    # Chroma: FLUX.1-schnell blocks without per-block modulation; one distilled-guidance approximator
    # makes all modulations; T5 context only, no pooled vector, no guidance embedding.
    "Chroma": {
        "image_model": "chroma", "in_channels": 64, "out_channels": 64, "context_in_dim": 48,
        "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
        "axes_dim": [4, 6, 6], "theta": 10000, "patch_size": 2, "qkv_bias": True, "in_dim": 64,
        "out_dim": 32, "hidden_dim": 32, "n_layers": 2,
    },
    # SD3.5 Large: MMDiT joint blocks with RMS qk norm, the last context block pre-only; CLIP-L/G
    # pooled vector (adm) and T5 context. Width is 64 x depth with depth heads, so: one head of 64.
    "SD3": {
        "in_channels": 16, "out_channels": 16, "patch_size": 2, "depth": 1, "num_blocks": 2,
        "input_size": None, "adm_in_channels": 24,
        "context_embedder_config": {"target": "torch.nn.Linear",
                                    "params": {"in_features": 48, "out_features": 64}},
        "num_patches": 64, "pos_embed_max_size": 8, "qk_norm": "rms", "pos_embed_scaling_factor": None,
        "x_block_self_attn_layers": [],
    },
    # Qwen-Image: 60 dual-stream blocks (separate img/txt weights, joint attention), Qwen2.5-VL context.
    "QwenImage": {
        "image_model": "qwen_image", "in_channels": 64, "out_channels": 16, "patch_size": 2,
        "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 48,
        "axes_dims_rope": (4, 6, 6),
    },
    # Lumina Image 2.0: NextDiT with noise/context refiners, grouped-query attention, Gemma-2 context.
    "Lumina2": {
        "image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 32, "cap_feat_dim": 40,
        "n_layers": 2, "n_refiner_layers": 1, "qk_norm": True, "n_heads": 2, "n_kv_heads": 1,
        "axes_dims": [4, 6, 6], "axes_lens": [300, 512, 512], "rope_theta": 10000.0,
        "ffn_dim_multiplier": 4.0,
    },
    # Z-Image (Turbo): Lumina 2's NextDiT with Z-Image modulation, padded tokens, Qwen3 context. Its
    # timestep embedding is 256 wide whatever the width, and the modulation reads min(width, 256) of
    # it, so the width cannot go below 256 (2M weights even with one block of each kind and the
    # feed-forward at 1x instead of 8/3x the width).
    "ZImage": {
        "image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 256, "cap_feat_dim": 40,
        "n_layers": 1, "n_refiner_layers": 1, "qk_norm": True, "n_heads": 2, "n_kv_heads": 2,
        "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512], "rope_theta": 256.0,
        "ffn_dim_multiplier": 1.0, "z_image_modulation": True, "time_scale": 1000.0,
        "pad_tokens_multiple": 32,
    },
    # HiDream-I1: 16 double + 32 single blocks with mixture-of-experts feed-forwards; T5 context plus
    # one Llama-3.1 hidden layer per block (the last layer repeated), CLIP-L/G pooled vector.
    "HiDream": {
        "image_model": "hidream", "attention_head_dim": 16, "axes_dims_rope": [8, 4, 4],
        "caption_channels": [48, 40], "max_resolution": [128, 128], "in_channels": 16,
        "out_channels": 16, "patch_size": 2, "llama_layers": [0, 1, 1], "num_attention_heads": 2,
        "num_routed_experts": 4, "num_activated_experts": 2, "num_layers": 1, "num_single_layers": 2,
        "text_emb_dim": 24,
    },
    # AuraFlow 0.3: 4 MMDiT (double) then 32 DiT (single) layers, register tokens, learned positions.
    "AuraFlow": {
        "in_channels": 4, "out_channels": 4, "patch_size": 2, "dim": 32, "n_heads": 2,
        "global_conddim": 32, "cond_seq_dim": 48, "max_seq": 64, "n_double_layers": 2, "n_layers": 4,
    },
    # HunyuanImage-2.1 (base, not the distilled/meanflow one): HunyuanVideo's double/single blocks on
    # 2-D patches with a token refiner on the Qwen2.5-VL context. Its ByT5 glyph mapper has fixed
    # 1472/2048 widths (7M weights) and only runs for quoted text, so it is left out.
    "HunyuanImage21": {
        "image_model": "hunyuan_video", "in_channels": 64, "out_channels": 64, "patch_size": [1, 1],
        "vec_in_dim": None, "axes_dim": [8, 8], "meanflow": False, "context_in_dim": 48,
        "hidden_size": 32, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 2,
        "theta": 256, "qkv_bias": True, "byt5": False, "guidance_embed": False,
        "use_cond_type_embedding": False, "vision_in_dim": None,
    },
}

# What the family's empty-latent node gives per image (channels, pixel side per latent side).
_LATENT: dict[str, tuple[int, int]] = {
    "Flux": (16, 8), "FluxSchnell": (16, 8), "Flux2": (128, 16), "Chroma": (16, 8), "SD3": (16, 8),
    "QwenImage": (16, 8),
    "Lumina2": (16, 8), "ZImage": (16, 8), "HiDream": (16, 8), "AuraFlow": (4, 8),
    "HunyuanImage21": (64, 32),
}

# The text encoders, in miniature. context: width of the token features; pooled: width of the pooled
# vector (None: the encoder gives pooled_output None); min_tokens: the real tokenizer pads to a fixed
# length (T5 256/128, CLIP 77), scaled down; mask: the encoder returns an all-ones attention_mask
# (QwenImage's and HunyuanImage's drop it when nothing is masked); llama: HiDream's per-layer
# Llama states (layers, width).
_ENCODERS: dict[str, dict[str, Any]] = {
    "Flux": {"context": 48, "pooled": 24, "min_tokens": 8},
    "FluxSchnell": {"context": 48, "pooled": 24, "min_tokens": 8},
    "Flux2": {"context": 48, "mask": True},
    "Chroma": {"context": 48},
    "SD3": {"context": 48, "pooled": 24, "min_tokens": 8},
    "QwenImage": {"context": 48},
    "Lumina2": {"context": 40, "mask": True},
    "ZImage": {"context": 40, "mask": True},
    "HiDream": {"context": 48, "pooled": 24, "min_tokens": 8, "llama": (2, 40)},
    "AuraFlow": {"context": 48, "min_tokens": 8},
    "HunyuanImage21": {"context": 48},
}
_MAX_TOKENS = 24


def _family(family: str) -> str:
    if family not in _CONFIGS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    return family


def _fill(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Random weights with O(1) activations: norm gains 1, matrices N(0, 1/fan_in), biases and
    embeddings small (real checkpoints zero some output layers; random ones make every block matter)."""
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if not tensor.is_floating_point():
            continue
        leaf = name.rsplit(".", 1)[-1]
        if tensor.dim() == 1 and leaf in ("weight", "scale"):
            value = torch.ones(tensor.shape)
        elif tensor.dim() >= 2 and leaf == "weight":
            value = torch.randn(tensor.shape, generator=generator) / math.sqrt(tensor[0].numel())
        else:
            value = torch.randn(tensor.shape, generator=generator) * (0.02 if leaf == "bias" else 0.1)
        tensor.copy_(value)


def tiny_model(family: str, seed: int = 0,
               dtype: torch.dtype | None = None) -> comfy.model_patcher.ModelPatcher:
    """ComfyUI's model class of ``family`` with random weights, built as UNETLoader builds it: the
    weight dtype (``dtype``, e.g. ``torch.float8_e4m3fn`` as weight_dtype fp8_e4m3fn gives; float32
    by default, so that gradients can be checked) and the compute dtype ComfyUI picks for it choose
    ``comfy.ops`` (manual-cast ops for fp8), and the model is made and filled inside
    ``torch.inference_mode`` as ComfyUI's loaders run. So its weights are inference tensors and
    require grad, as a loaded model's do: training replaces and freezes them first."""
    model_config = getattr(comfy.supported_models, _family(family))(_CONFIGS[family])
    load_device = comfy.model_management.get_torch_device()
    offload_device = comfy.model_management.unet_offload_device()
    dtype = torch.float32 if dtype is None else dtype
    manual_cast = comfy.model_management.unet_manual_cast(dtype, load_device,
                                                          model_config.supported_inference_dtypes)
    model_config.set_inference_dtype(dtype, manual_cast)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        base = model_config.get_model({}, device=offload_device)
        _fill(base.diffusion_model, generator)
        return comfy.model_patcher.ModelPatcher(base, load_device=load_device, offload_device=offload_device)


def latent_shape(family: str) -> tuple[int, int, int]:
    """One LATENT (channels, height, width) as the family's empty-latent node gives it: 8x8, whose
    sides every family's patching divides. QwenImage's latent format is 3-D: ComfyUI's samplers add a
    frame axis (``comfy.sample.fix_empty_latent_channels``), and its model needs [B, C, 1, H, W]."""
    return (_LATENT[_family(family)][0], 8, 8)


def has_guidance_embedding(family: str) -> bool:
    """Whether the tiny model, like the release it mirrors (FLUX.1-dev, FLUX.2-dev), embeds a
    distilled guidance scale (the ``guidance`` model input) instead of relying on CFG alone."""
    return bool(_CONFIGS[_family(family)].get("guidance_embed", False))


def _generator(family: str, text: str) -> torch.Generator:
    seed = int(hashlib.sha256(f"{family}\0{text}".encode()).hexdigest()[:15], 16)
    return torch.Generator().manual_seed(seed)


class StandInClip:
    """tokenize / encode_from_tokens_scheduled as ComfyUI's CLIP has them, for one family: fixed
    random features per text (seeded by its sha256), with the keys and widths CLIPTextEncode gives
    (``pooled_output`` is None where the real encoder has no pooled vector). One token per word plus
    an end token, at least the family's padded length in miniature."""

    def __init__(self, family: str) -> None:
        self.family = _family(family)
        self.spec = _ENCODERS[family]

    def tokenize(self, text: str) -> str:
        return text

    def encode_from_tokens_scheduled(self, tokens: str) -> list[list[Any]]:
        spec, g = self.spec, _generator(self.family, tokens)
        count = min(max(len(tokens.split()) + 1, spec.get("min_tokens", 1)), _MAX_TOKENS)
        cond = torch.randn(1, count, spec["context"], generator=g)
        pooled = None if spec.get("pooled") is None else torch.randn(1, spec["pooled"], generator=g)
        extras: dict[str, Any] = {"pooled_output": pooled}
        if spec.get("mask"):
            extras["attention_mask"] = torch.ones(1, count, dtype=torch.long)
        if "llama" in spec:
            layers, width = spec["llama"]
            extras["conditioning_llama3"] = torch.randn(1, layers, count, width, generator=g)
        return [[cond, extras]]


class StandInVae:
    """decode as ComfyUI's VAE has it: LATENT [B, C, H, W] (or [B, C, 1, H, W]) to images
    [B, H*s, W*s, 3] in [0, 1], s being the family's real spatial compression (8; 16 for FLUX.2,
    32 for HunyuanImage 2.1), by a fixed random 1x1 projection to RGB, a sigmoid and nearest upsampling."""

    def __init__(self, family: str) -> None:
        self.family = _family(family)
        channels, self.scale = _LATENT[family]
        g = torch.Generator().manual_seed(int(hashlib.sha256(family.encode()).hexdigest()[:15], 16))
        self.projection = torch.randn(3, channels, generator=g) / math.sqrt(channels)

    def spacial_compression_decode(self) -> int:
        return self.scale

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        if latents.dim() == 5:  # [B, C, T, H, W]: frames become images, as VAEDecode flattens them
            latents = latents.movedim(2, 1).flatten(0, 1)
        rgb = torch.einsum("rc,bchw->bhwr", self.projection.to(latents.device), latents.float()).sigmoid()
        return rgb.repeat_interleave(self.scale, dim=1).repeat_interleave(self.scale, dim=2)


def load_pack(pack_root: str, name: str = "treerpo_pack") -> ModuleType:
    """Import the pack from its folder as the package ``name``, as ComfyUI's loader imports a custom
    node folder by path, so that ``from <name>.nodes... import ...`` works in a test's process."""
    spec = importlib.util.spec_from_file_location(name, pack_root + "/__init__.py",
                                                  submodule_search_locations=[pack_root])
    pack = importlib.util.module_from_spec(spec)
    sys.modules[name] = pack
    spec.loader.exec_module(pack)
    return pack
