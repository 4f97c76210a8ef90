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

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .diffusers_common import (
    MAX_T5_TOKENS,
    DiffusersPolicy,
    ModelSource,
    PromptEncoder,
    module_device,
)
from .patches import image_ids, pack, unpack

FLUX_SOURCE = ModelSource(
    family="FLUX.1",
    hint=("black-forest-labs/FLUX.1-dev on the Hugging Face hub (gated: accept the licence, then download "
          "the whole repository; FLUX.1-schnell is open)"),
    pipeline="Flux",
)


class FluxPolicy(DiffusersPolicy):
    """A FLUX.1 transformer (+ VAE, + CLIP/T5 or a ``prompt_encoder``) as a Policy.

    Built from modules: ``FluxPolicy(transformer, vae, height=, width=, text_encoder=,
    tokenizer=, text_encoder_2=, tokenizer_2=)``. Without text encoders pass
    ``prompt_encoder(prompts: list[str]) -> {"prompt_embeds": [n, S, joint_attention_dim],
    "pooled_prompt_embeds": [n, pooled_projection_dim]}`` (e.g. precomputed embeddings); its output
    is cached like the encoders'. ``vae=None`` works for latent-space rewards (``decode`` then
    raises); ``vae_scale_factor`` is read from the VAE (8 without one).
    """

    source = FLUX_SOURCE
    transformer_class = "FluxTransformer2DModel"
    text_components: ClassVar[dict[str, tuple[str, str]]] = dict(  # folder -> (what, transformers class)
        text_encoder=("CLIP text encoder", "CLIPTextModel"), tokenizer=("CLIP tokenizer", "CLIPTokenizer"),
        text_encoder_2=("T5 text encoder", "T5EncoderModel"), tokenizer_2=("T5 tokenizer", "T5TokenizerFast"))

    def __init__(self, transformer: nn.Module, vae: nn.Module | None = None, *,
                 text_encoder: nn.Module | None = None, tokenizer=None,
                 text_encoder_2: nn.Module | None = None, tokenizer_2=None,
                 prompt_encoder: PromptEncoder | None = None, guidance: float = 3.5,
                 max_sequence_length: int = MAX_T5_TOKENS, **common: Any) -> None:
        """``common``: :class:`DiffusersPolicy`'s keys (``height``, ``width`` required; ``offload``,
        ``device``, ``gradient_checkpointing``, ``decode_batch``, ``vae_scale_factor``)."""
        if prompt_encoder is None and None in (text_encoder, tokenizer, text_encoder_2, tokenizer_2):
            raise ValueError("FluxPolicy needs CLIP and T5 (text_encoder, tokenizer, text_encoder_2, "
                             "tokenizer_2) or a prompt_encoder callable")
        text = {"text_encoder": text_encoder, "tokenizer": tokenizer,
                "text_encoder_2": text_encoder_2, "tokenizer_2": tokenizer_2}
        super().__init__(transformer, vae, latent_channels=int(transformer.config.in_channels) // 4,
                         text=text, prompt_encoder=prompt_encoder, guidance=guidance,
                         max_sequence_length=max_sequence_length, **common)

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
