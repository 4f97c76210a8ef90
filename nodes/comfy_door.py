"""The nodes' only door to ComfyUI: the one module of ``nodes/`` that imports it (``comfy``,
``comfy_api``, ``folder_paths``). The pack's one other importer is ComfyUI's host for headless
workflows, ``trainer/comfyui_host/runner.py``; ``scripts/check_imports.py`` keeps it so.

Everything ComfyUI-specific that the nodes need goes through here, so that a change in
ComfyUI's internals is fixed in one place. ComfyUI imports the pack by file path, so this
module is only ever imported inside a running ComfyUI (or a test that has set one up).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import Any

import comfy.conds
import comfy.latent_formats
import comfy.model_base
import comfy.model_management
import comfy.model_patcher
import comfy.model_sampling
import comfy.sample
import comfy.sampler_helpers
import comfy.samplers
import comfy.sd
import comfy.supported_models_base
import comfy.utils
import folder_paths
import latent_preview
import torch
from comfy_api.latest import ComfyExtension, io, ui

from .budget import MemoryNeed

__all__ = [
    "TESTED_FAMILIES",
    "ComfyExtension",
    "FlowFamily",
    "decode_images",
    "denoise",
    "embedded_model_patcher",
    "embedded_policy_of",
    "flow_family",
    "guided_sample",
    "io",
    "ksampler",
    "latent_shape_of",
    "load_for_training",
    "lora_patched",
    "model_roots",
    "model_sigmas",
    "models_directory",
    "node_progress",
    "output_directory",
    "preview_images",
    "progress_bar",
    "prompt_model_conds",
    "temp_directory",
    "tree_memory",
]


def output_directory() -> str:
    """ComfyUI's output folder (what SaveImage writes into)."""
    return folder_paths.get_output_directory()


def models_directory() -> str:
    """ComfyUI's models folder (relative reward weight paths are looked up under it)."""
    return folder_paths.models_dir


def model_roots() -> list[str]:
    """Every folder ComfyUI reads models from: its models folder first, then each model type's
    folders (extra_model_paths.yaml included). Paths the nodes read must lie inside one."""
    roots = [folder_paths.models_dir]
    for folders, _extensions in folder_paths.folder_names_and_paths.values():
        roots.extend(f for f in folders if f not in roots)
    return roots


def temp_directory() -> str:
    return folder_paths.get_temp_directory()


def progress_bar(total: int) -> comfy.utils.ProgressBar:
    """ComfyUI's progress bar (shown on the node in the UI, sent over the websocket)."""
    return comfy.utils.ProgressBar(total)


def node_progress(total: int) -> Any:
    """``report(done, text, image)``: the running node's progress bar with ``image`` (a PIL image) as its
    live preview, and ``text`` shown on the node (ComfyUI's progress text), as samplers report theirs."""
    bar = comfy.utils.ProgressBar(total)

    def report(done: int, text: str = "", image: Any = None) -> None:
        bar.update_absolute(done, total, ("JPEG", image, 512) if image is not None else None)
        if text:
            send_node_text(text)

    return report


def send_node_text(text: str) -> None:
    """Text shown on the running node in the web UI (nothing when no server is listening: headless)."""
    from comfy_execution.utils import get_executing_context

    module = sys.modules.get("server")  # ComfyUI's server module, loaded only when a server runs
    server = getattr(getattr(module, "PromptServer", None), "instance", None)
    context = get_executing_context()
    if server is not None and context is not None:
        server.send_progress_text(text, context.node_id)


def _unfold_pixels(latents: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pixel_shuffle(latents, 4)


class EmbeddedLatentFormat(comfy.latent_formats.LatentFormat):
    """Pixel space: 64x64 RGB in [-1, 1] folded 4x4 into 48 channels of 16x16, no scaling. Live
    previews unfold it and show the pixels as they are (ComfyUI's latent-to-RGB previewer)."""

    latent_channels = 48
    latent_rgb_factors = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]  # noqa: RUF012
    latent_rgb_factors_reshape = staticmethod(_unfold_pixels)


class EmbeddedConfig(comfy.supported_models_base.BASE):
    """A flow-matching model config: ``sigma = shift t / (1 + (shift - 1) t)``, as trained."""

    unet_config = {"disable_unet_model_creation": True}  # noqa: RUF012 - ComfyUI reads these
    sampling_settings = {"shift": 3.0, "multiplier": 1.0}  # noqa: RUF012
    latent_format = EmbeddedLatentFormat
    # ComfyUI's estimate of a forward's memory scales with this: 1.0 overstated what a batch of the
    # embedded model's 64x64 images needs on a CPU many times over; 0.1 still errs above it (docs/nodes.md
    # gives the figures)
    memory_usage_factor = 0.1
    supported_inference_dtypes = [torch.float32]  # noqa: RUF012


def _model_config(shift: float) -> EmbeddedConfig:
    config = EmbeddedConfig(EmbeddedConfig.unet_config)  # copies the class-level settings
    config.sampling_settings["shift"] = shift
    return config


class EmbeddedBaseModel(comfy.model_base.BaseModel):
    """ComfyUI's model interface over the pack's embedded policy.

    ``diffusion_model`` is the diffusers transformer itself, so ComfyUI's generic LoRA keys
    (``diffusion_model.<module>``) reach its layers. The policy predicts the clean image; the
    velocity it derives gives back that prediction as ComfyUI's ``denoised``.
    """

    def __init__(self, policy: Any, shift: float, device: torch.device | None = None) -> None:
        super().__init__(_model_config(shift), comfy.model_base.ModelType.FLOW, device=device)
        self.diffusion_model = policy.transformer
        self.__dict__["policy"] = policy  # not a submodule: its transformer is registered above

    def extra_conds(self, **kwargs: Any) -> dict[str, Any]:
        out = super().extra_conds(**kwargs)
        pooled = kwargs.get("pooled_output")
        if pooled is not None:
            out["pooled"] = comfy.conds.CONDRegular(pooled)
        return out

    def _apply_model(self, x: torch.Tensor, t: torch.Tensor, c_concat: Any = None,
                     c_crossattn: torch.Tensor | None = None, control: Any = None,
                     transformer_options: dict | None = None, **kwargs: Any) -> torch.Tensor:
        if c_crossattn is None or "pooled" not in kwargs:
            raise ValueError("the embedded TreeRPO model needs conditioning from "
                             "TreeRPOEmbeddedTextEncode")
        if tuple(x.shape[1:]) != tuple(self.policy.latent_shape):
            raise ValueError(f"the latent is {'x'.join(map(str, x.shape[1:]))} but the embedded TreeRPO "
                             f"model takes {'x'.join(map(str, self.policy.latent_shape))}: make it with "
                             "TreeRPO Embedded Empty Latent")
        sigma = t.float()
        cond = {"text": c_crossattn.float(), "pooled": kwargs["pooled"].float()}
        v = self.policy.velocity(x.float(), sigma, cond)
        return self.model_sampling.calculate_denoised(sigma, v, x)


def embedded_model_patcher(policy: Any, shift: float) -> comfy.model_patcher.ModelPatcher:
    """A ComfyUI MODEL (``ModelPatcher``) sampling the embedded policy."""
    load = comfy.model_management.get_torch_device()
    offload = comfy.model_management.unet_offload_device()
    model = EmbeddedBaseModel(policy, shift, device=offload)
    return comfy.model_patcher.ModelPatcher(model, load_device=load, offload_device=offload)


def embedded_policy_of(model: comfy.model_patcher.ModelPatcher) -> tuple[Any, float]:
    """The embedded policy behind a MODEL from ``TreeRPOEmbeddedLoader`` and its sigma shift.

    A MODEL carrying ComfyUI LoRA patches is refused: training starts from the policy's own weights
    and would silently ignore them.
    """
    base = getattr(model, "model", None)
    policy = getattr(base, "__dict__", {}).get("policy") if base is not None else None
    if policy is None:
        raise ValueError("this node trains the embedded TreeRPO model: connect the MODEL of "
                         "TreeRPO Embedded Model Loader")
    if getattr(model, "patches", None):
        raise ValueError("the MODEL carries LoRA patches: train the base model, apply LoRAs after")
    return policy, float(base.model_sampling.shift)


# ------------------------------------------------------------------------------ sampling
SamplerFn = Any  # fn(velocity, x, sigmas, seed, preview) -> samples; velocity(x, sigma[B]) -> v
PreviewFn = Any  # preview(step, steps, x0 of every branch) -> None
PREVIEW_TILES = 8  # branches shown side by side in a live preview


def tiled(x0: torch.Tensor, tiles: int = PREVIEW_TILES) -> torch.Tensor:
    """Up to ``tiles`` rows of ``x0`` laid side by side (two rows of tiles past four) as one latent:
    ComfyUI's previewers show the first latent of a batch, so this shows every branch at once."""
    rows = list(x0[:tiles])
    across = min(len(rows), 4)
    lines = [torch.cat(rows[i:i + across], dim=-1) for i in range(0, len(rows), across)]
    if len(lines) > 1 and lines[-1].shape != lines[0].shape:  # pad a short last line
        pad = lines[0].shape[-1] - lines[-1].shape[-1]
        lines[-1] = torch.nn.functional.pad(lines[-1], (0, pad))
    return torch.cat(lines, dim=-2).unsqueeze(0)


def _denoiser_velocity(model: Any, extra_args: dict) -> Any:
    """ComfyUI's denoiser (cfg, conditioning, patches applied) as a flow velocity
    ``v = (x - denoised) / sigma``: what a FLOW model's denoised output means."""

    def velocity(x: torch.Tensor, sigma: torch.Tensor, _cond: Any = None) -> torch.Tensor:
        s = sigma.to(x.device, x.dtype)
        denoised = model(x, s, **extra_args)
        return (x - denoised) / s.reshape(-1, *([1] * (x.ndim - 1)))

    return velocity


def ksampler(run: SamplerFn) -> comfy.samplers.KSAMPLER:
    """A SAMPLER (for ``SamplerCustomAdvanced``) that hands our sampler a velocity function, and a
    preview function that feeds ComfyUI's live previews (its progress bar and preview method) with
    every branch's predicted image, side by side."""

    def sample(model: Any, x: torch.Tensor, sigmas: torch.Tensor, extra_args: dict | None = None,
               callback: Any = None, disable: bool | None = None) -> torch.Tensor:
        extra_args = dict(extra_args or {})
        seed = int(extra_args.get("seed", 0) or 0)

        def preview(step: int, _steps: int, x0: torch.Tensor) -> None:
            if callback is not None:
                callback({"i": step, "denoised": tiled(x0.to(x.dtype)), "x": x, "sigma": sigmas[step],
                          "sigma_hat": sigmas[step]})

        return run(_denoiser_velocity(model, extra_args), x, sigmas, seed, preview)

    return comfy.samplers.KSAMPLER(sample)


def model_sigmas(model: comfy.model_patcher.ModelPatcher, steps: int,
                 scheduler: str = "simple") -> torch.Tensor:
    """The model's own sigma schedule (its shift) with ComfyUI's scheduler of that name."""
    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), scheduler, steps).cpu()


def guided_sample(model: comfy.model_patcher.ModelPatcher, positive: Any, negative: Any, cfg: float,
                  latent: dict, sigmas: torch.Tensor, run: SamplerFn, seed: int) -> torch.Tensor:
    """Run ``run`` through ComfyUI's CFGGuider, as ``SamplerCustomAdvanced`` does; returns the
    samples in LATENT convention (the batch may have grown: a tree returns its leaves)."""
    latent_image = comfy.sample.fix_empty_latent_channels(model, latent["samples"])
    noise = comfy.sample.prepare_noise(latent_image, seed)
    guider = comfy.samplers.CFGGuider(model)
    guider.set_conds(positive, negative)
    guider.set_cfg(cfg)
    callback = latent_preview.prepare_callback(model, int(sigmas.shape[-1]) - 1)  # as KSampler previews
    return guider.sample(noise, latent_image, ksampler(run), sigmas, callback=callback, disable_pbar=True,
                         seed=seed)


# ------------------------------------------------------------------------------ training a MODEL
# each has a tiny-model test of its own (tests/test_comfy_families.py)
TESTED_FAMILIES = ("Flux", "FluxSchnell", "Flux2", "Chroma", "SD3", "QwenImage", "Lumina2", "ZImage",
                   "HiDream", "AuraFlow", "HunyuanImage21")
AUDIO_MODELS = ("ACEStep", "StableAudio1")  # rectified flow too, but not images


@dataclass(frozen=True)
class FlowFamily:
    """What the trainer needs to know of a rectified-flow MODEL, read from ComfyUI's own objects.

    ``name``: ComfyUI's model config class (``Flux``, ``FluxSchnell``, ``QwenImage``, ``ZImage``...);
    ``guidance_embedding``: the model takes a distilled guidance value (FLUX.1-dev, FLUX.2-dev) instead
    of classifier-free guidance; ``shift``: ``k`` of the sigma schedule ``s = k u / (1 + (k - 1) u)``
    the MODEL samples with (its own, or a ModelSampling node's patch); ``patch``: the latent sides
    must be multiples of it."""

    name: str
    guidance_embedding: bool
    shift: float
    patch: int


def _family_name(base: comfy.model_base.BaseModel) -> str:
    config = getattr(base, "model_config", None)
    return type(config).__name__ if config is not None else type(base).__name__


def flow_family(model: comfy.model_patcher.ModelPatcher) -> FlowFamily:
    """The MODEL's family, or a one-line refusal naming it: TreeRPO's SDE and log-probabilities are
    those of rectified flow (ComfyUI's CONST prediction), on image latents."""
    base = model.model
    name = _family_name(base)
    sampling = model.get_model_object("model_sampling")
    if not isinstance(sampling, comfy.model_sampling.CONST):
        kinds = [c.__name__ for c in type(sampling).__mro__[1:] if c.__module__ == "comfy.model_sampling"]
        raise ValueError(f"{name} is not a rectified-flow model (it predicts {kinds[-1] if kinds else '?'}): "
                         "TreeRPO trains flow models such as FLUX, SD3, Qwen-Image, Z-Image")
    audio = tuple(getattr(comfy.model_base, c) for c in AUDIO_MODELS if hasattr(comfy.model_base, c))
    if isinstance(base, audio) or getattr(base.latent_format, "latent_dimensions", 2) < 2:
        raise ValueError(f"{name} makes audio or 3D shapes: TreeRPO trains text-to-image flow models")
    if name not in TESTED_FAMILIES and not getattr(base, "__dict__", {}).get("policy"):
        logging.warning("TreeRPO: %s is a rectified-flow model without a test of its own here; it goes "
                        "through the generic path (conditioning, guidance and LoRA targets read from the "
                        "model)", name)
    if isinstance(sampling, comfy.model_sampling.ModelSamplingFlux):
        shift = math.exp(float(sampling.shift))  # exp(mu) in FLUX's form is k in the shift form
    elif isinstance(sampling, comfy.model_sampling.ModelSamplingDiscreteFlow):
        shift = float(sampling.shift)
    else:
        raise ValueError(f"{name} samples with {type(sampling).__name__}, a schedule TreeRPO does not know")
    diffusion = base.diffusion_model
    params = getattr(diffusion, "params", None)
    embedding = bool(getattr(params, "guidance_embed", False)) or getattr(diffusion, "guidance_embed", False)
    patch = getattr(params, "patch_size", None) or getattr(diffusion, "patch_size", 1)
    if isinstance(patch, (tuple, list)):
        patch = max(int(p) for p in patch[-2:])
    return FlowFamily(name, bool(embedding), shift, int(patch))


def load_for_training(model: comfy.model_patcher.ModelPatcher) -> torch.device:
    """Load the whole model onto its device with its patches applied (training needs every weight
    there: no partial, low-VRAM loading); returns that device."""
    comfy.model_management.load_models_gpu([model], force_full_load=True)
    return model.load_device


def latent_shape_of(model: comfy.model_patcher.ModelPatcher, latent: dict) -> tuple[int, ...]:
    """One latent's shape (channels, height, width) from a LATENT such as EmptySD3LatentImage's."""
    samples = comfy.sample.fix_empty_latent_channels(model, latent["samples"])
    return tuple(samples.shape[1:])


def tree_memory(model: comfy.model_patcher.ModelPatcher, latent: dict, stored_per_tree: int,
                leaves_per_tree: int) -> tuple[MemoryNeed, tuple[int, ...], int]:
    """What growing one tree per row of ``latent`` needs on the model's device: its latents (float32, as the
    rollout keeps them) and one model pass over all leaves at once (ComfyUI's own estimate, the one it plans
    its batches with), against the device's memory less the model's weights. Also the latent's shape and
    row count."""
    shape = latent_shape_of(model, latent)
    trees = int(latent["samples"].shape[0])
    model_pass = int(model.model.memory_required([trees * leaves_per_tree, *shape]))
    device = model.load_device
    weights = int(model.model_size())
    total = int(comfy.model_management.get_total_memory(device))
    latents = trees * stored_per_tree * math.prod(shape) * 4
    return MemoryNeed(latents, model_pass, max(total - weights, 0), weights, str(device)), shape, trees


def preview_images(images: torch.Tensor, side: int = 256) -> list[dict]:
    """``images`` (IMAGE, ``[B, H, W, 3]``) at most ``side`` pixels a side as PNGs in ComfyUI's temp folder,
    as PreviewImage saves them: their ``{filename, subfolder, type}`` for a node's UI output."""
    height, width = images.shape[1:3]
    scale = min(1.0, side / max(height, width))
    if scale < 1.0:
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
        images = torch.nn.functional.interpolate(images.movedim(-1, 1), size=size, mode="area").movedim(1, -1)
    saved = ui.ImageSaveHelper.save_images(images, "treerpo_leaf", io.FolderType.temp, None, compress_level=1)
    return [dict(result) for result in saved]


def prompt_model_conds(model: comfy.model_patcher.ModelPatcher, clip: Any, text: str,
                       latent_shape: tuple[int, ...], guidance: float | None) -> dict[str, Any]:
    """The model's inputs for one prompt, encoded as CLIPTextEncode and the samplers do it
    (``guidance``: FLUX's guidance embedding, as FluxGuidance sets it)."""
    conditioning = clip.encode_from_tokens_scheduled(clip.tokenize(text))
    entries = comfy.sampler_helpers.convert_cond(conditioning)[:1]
    if guidance is not None:
        entries[0]["guidance"] = guidance
    noise = torch.zeros(1, *latent_shape)
    encoded = comfy.samplers.encode_model_conds(model.model.extra_conds, entries, noise, model.load_device,
                                                "positive")
    return encoded[0]["model_conds"]


def denoise(model: comfy.model_patcher.ModelPatcher, x: torch.Tensor, sigma: torch.Tensor,
            model_conds: dict[str, Any]) -> torch.Tensor:
    """The model's denoised prediction for a batch that shares one prompt's conditioning."""
    inputs = {}
    for key, cond in model_conds.items():
        value = cond.process_cond(batch_size=x.shape[0], device=x.device, area=None).concat([])
        inputs[key] = value.to(x.device) if isinstance(value, torch.Tensor) else value
    return model.model.apply_model(x, sigma, **inputs)


def decode_images(model: comfy.model_patcher.ModelPatcher, vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Model-space latents to images ``[B, 3, H, W]`` in ``[0, 1]`` with the VAE (VAEDecode's path)."""
    images = vae.decode(model.model.process_latent_out(latents))
    return images.reshape(-1, *images.shape[-3:]).movedim(-1, 1).float().clamp(0, 1)


def lora_patched(model: comfy.model_patcher.ModelPatcher, lora: dict[str, torch.Tensor]
                 ) -> comfy.model_patcher.ModelPatcher:
    """A clone of ``model`` carrying ``lora`` (ComfyUI keys) as weight patches, as LoraLoaderModelOnly
    applies a file."""
    patched, _ = comfy.sd.load_lora_for_models(model, None, lora, 1.0, 0.0)
    return patched
