"""FLUX.1 (dev or schnell) from diffusers as a :class:`~trainer.policy.Policy`.

Latents are the unpacked VAE latents in model space, ``[B, 16, H/8, W/8]`` (what FluxPipeline
packs into 2x2 tokens, after ``(z - shift_factor) * scaling_factor``). ``velocity`` packs them,
builds ``img_ids``/``txt_ids`` and the timestep as the pipeline does (``timestep = sigma``; the
pipeline passes ``t / 1000``), adds the guidance embedding when the transformer has one
(FLUX.1-dev, default 3.5; schnell has none and ignores ``guidance``), and returns ``v ~ eps - x0``
in float32 on the input's device: FLUX's transformer predicts exactly the flow velocity.

Conditioning: ``{"prompt_embeds": [P, S, 4096], "pooled_prompt_embeds": [P, 768]}`` (T5 with
``max_sequence_length`` tokens, default 512 like the pipeline; CLIP's pooled output). Each distinct
prompt is encoded once and cached on the CPU; ``encode`` returns rows on the device.

Weights come from a local diffusers folder (``FluxPolicy.from_pretrained``), optionally with the
transformer from a single ``.safetensors`` file; or build the policy from modules, with a
``prompt_encoder`` callable instead of text encoders (see :class:`FluxPolicy`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from .diffusers_common import (
    DiffusersPolicy,
    ModelSource,
    PromptEncoder,
    check_resolution,
    check_sequence_length,
    load_local,
    load_transformer,
    module_device,
    parse_dtype,
    read_model_index,
    require_model,
    require_tokenizer,
)
from .patches import image_ids, pack, unpack

FLUX_SOURCE = ModelSource(
    family="FLUX.1",
    hint=("black-forest-labs/FLUX.1-dev on the Hugging Face hub (gated: accept the licence, then download "
          "the whole repository; FLUX.1-schnell is open)"),
    pipeline="Flux",
)
MAX_T5_TOKENS = 512


class FluxPolicy(DiffusersPolicy):
    """A FLUX.1 transformer (+ VAE, + CLIP/T5 or a ``prompt_encoder``) as a Policy.

    Built from modules: ``FluxPolicy(transformer, vae, height=, width=, text_encoder=,
    tokenizer=, text_encoder_2=, tokenizer_2=)``. Without text encoders pass
    ``prompt_encoder(prompts: list[str]) -> {"prompt_embeds": [n, S, joint_attention_dim],
    "pooled_prompt_embeds": [n, pooled_projection_dim]}`` (e.g. precomputed embeddings); its output
    is cached like the encoders'. ``vae=None`` works for latent-space rewards (``decode`` then
    raises); ``vae_scale_factor`` is read from the VAE (8 without one).
    """

    cache_keys = ("prompt_embeds", "pooled_prompt_embeds")

    def __init__(self, transformer: nn.Module, vae: nn.Module | None = None, *, height: int, width: int,
                 text_encoder: nn.Module | None = None, tokenizer=None,
                 text_encoder_2: nn.Module | None = None, tokenizer_2=None,
                 prompt_encoder: PromptEncoder | None = None, guidance: float = 3.5,
                 max_sequence_length: int = MAX_T5_TOKENS, offload: bool = False,
                 gradient_checkpointing: bool = False, decode_batch: int = 4,
                 device: str | torch.device | None = None, vae_scale_factor: int | None = None) -> None:
        check_sequence_length(max_sequence_length, MAX_T5_TOKENS)
        if prompt_encoder is None and None in (text_encoder, tokenizer, text_encoder_2, tokenizer_2):
            raise ValueError("FluxPolicy needs CLIP and T5 (text_encoder, tokenizer, text_encoder_2, "
                             "tokenizer_2) or a prompt_encoder callable")
        super().__init__(transformer, vae, height=height, width=width,
                         latent_channels=int(transformer.config.in_channels) // 4,
                         text_modules=[text_encoder, text_encoder_2], prompt_encoder=prompt_encoder,
                         offload=offload, device=device, gradient_checkpointing=gradient_checkpointing,
                         decode_batch=decode_batch, vae_scale_factor=vae_scale_factor)
        self.text_encoder = text_encoder
        self.text_encoder_2 = text_encoder_2
        self.tokenizer = tokenizer
        self.tokenizer_2 = tokenizer_2
        self.guidance = float(guidance)
        self.max_sequence_length = int(max_sequence_length)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, *, height: int, width: int,
                        dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
                        guidance: float = 3.5,
                        max_sequence_length: int = MAX_T5_TOKENS, offload: bool = False,
                        gradient_checkpointing: bool = False, decode_batch: int = 4,
                        transformer_file: str | Path | None = None,
                        vae_dtype: str | torch.dtype = "float32") -> FluxPolicy:
        """Load a local diffusers FLUX.1 folder; ``transformer_file`` replaces its transformer weights.

        ``dtype`` applies to the transformer and the text encoders, ``vae_dtype`` to the VAE. Every
        component is checked before any is loaded, so a missing file fails in one line at once.
        """
        from diffusers import AutoencoderKL, FluxTransformer2DModel
        from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

        check_resolution(height, width)
        root = Path(path)
        read_model_index(root, FLUX_SOURCE)
        torch_dtype, vae_torch_dtype = parse_dtype(dtype), parse_dtype(vae_dtype)
        if transformer_file is None:
            require_model(root, "transformer", FLUX_SOURCE, "transformer")
        parts = {
            "vae": require_model(root, "vae", FLUX_SOURCE, "VAE"),
            "text_encoder": require_model(root, "text_encoder", FLUX_SOURCE, "CLIP text encoder"),
            "tokenizer": require_tokenizer(root, "tokenizer", FLUX_SOURCE, "CLIP tokenizer"),
            "text_encoder_2": require_model(root, "text_encoder_2", FLUX_SOURCE, "T5 text encoder"),
            "tokenizer_2": require_tokenizer(root, "tokenizer_2", FLUX_SOURCE, "T5 tokenizer"),
        }
        transformer = load_transformer(FluxTransformer2DModel, root, FLUX_SOURCE, torch_dtype,
                                       transformer_file)
        vae = load_local(AutoencoderKL.from_pretrained, parts["vae"], "VAE", torch_dtype=vae_torch_dtype)
        text_encoder = load_local(CLIPTextModel.from_pretrained, parts["text_encoder"], "CLIP text encoder",
                                  dtype=torch_dtype)
        text_encoder_2 = load_local(T5EncoderModel.from_pretrained, parts["text_encoder_2"],
                                    "T5 text encoder", dtype=torch_dtype)
        tokenizer = load_local(CLIPTokenizer.from_pretrained, parts["tokenizer"], "CLIP tokenizer")
        tokenizer_2 = load_local(T5TokenizerFast.from_pretrained, parts["tokenizer_2"], "T5 tokenizer")
        return cls(transformer, vae, height=height, width=width, text_encoder=text_encoder,
                   tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                   guidance=guidance, max_sequence_length=max_sequence_length, offload=offload,
                   gradient_checkpointing=gradient_checkpointing, decode_batch=decode_batch, device=device)

    # ------------------------------------------------------------------ text
    @torch.no_grad()
    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        """CLIP's pooled output and T5's last hidden state, as FluxPipeline.encode_prompt builds them."""
        with self.offload.using(self.text_encoder, self.text_encoder_2):
            clip_ids = self.tokenizer(prompts, padding="max_length",
                                      max_length=self.tokenizer.model_max_length, truncation=True,
                                      return_tensors="pt").input_ids
            pooled = self.text_encoder(clip_ids.to(module_device(self.text_encoder)),
                                       output_hidden_states=False).pooler_output
            t5_ids = self.tokenizer_2(prompts, padding="max_length", max_length=self.max_sequence_length,
                                      truncation=True, return_tensors="pt").input_ids
            text = self.text_encoder_2(t5_ids.to(module_device(self.text_encoder_2)),
                                       output_hidden_states=False)[0]
        return {"prompt_embeds": text, "pooled_prompt_embeds": pooled}

    # ------------------------------------------------------------------ velocity
    def velocity(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        """``v(x, sigma)`` for unpacked latents ``[B, C, h, w]``; float32 on ``x``'s device."""
        self.check_latents(x)
        dev, dtype = self.device, self.dtype
        b, c, h, w = x.shape
        text = cond["prompt_embeds"].to(dev, dtype)
        pooled = cond["pooled_prompt_embeds"].to(dev, dtype)
        if text.shape[0] != b or pooled.shape[0] != b:
            raise ValueError(f"conditioning has {text.shape[0]} rows for {b} latents")
        # as FluxPipeline: t = 1000 sigma in the model dtype, divided by 1000
        timestep = (sigma.to(dev, torch.float32).reshape(b) * 1000.0).to(dtype) / 1000.0
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((b,), self.guidance, device=dev, dtype=torch.float32)
        out = self.transformer_forward()(
            hidden_states=pack(x.to(dev, torch.float32)).to(dtype),
            timestep=timestep,
            guidance=guidance,
            pooled_projections=pooled,
            encoder_hidden_states=text,
            txt_ids=torch.zeros(text.shape[1], 3, device=dev, dtype=dtype),
            img_ids=image_ids(h, w).to(dev, dtype),
            return_dict=False,
        )[0]
        return unpack(out.float(), c, h, w).to(x.device)
