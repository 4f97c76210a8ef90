"""Stable Diffusion 3 / 3.5 from diffusers as a :class:`~trainer.policy.Policy`.

Latents are the VAE latents in model space, ``[B, 16, H/8, W/8]`` (after ``(z - shift_factor) *
scaling_factor``); the transformer patchifies them itself. ``velocity`` passes ``timestep = 1000
sigma`` as StableDiffusion3Pipeline does, and returns ``v ~ eps - x0`` in float32 on the input's
device (SD3 predicts exactly the flow velocity).

Classifier-free guidance (``guidance``, default 4.5 as used for SD3.5; ``<= 1`` turns it off):
the unconditional and conditional rows go through the transformer in ONE doubled batch and
``v = v_uncond + w (v_cond - v_uncond)``; ``forwards_per_row`` is then 2 so the trainer counts the
doubled rows. The negative prompt is the empty string ``""`` (the pipeline's default), encoded
once and cached. The policy trains through the guided velocity, as Flow-GRPO does for SD3.5.

Conditioning: ``{"prompt_embeds": [P, 77 + S, 4096], "pooled_prompt_embeds": [P, 2048]}``: the two
CLIP encoders' penultimate hidden states side by side, zero-padded to T5's width, followed by T5's
``max_sequence_length`` tokens (default 256, like the pipeline); pooled = both CLIP projections.

T5 is optional, as in the pipeline: a folder whose ``model_index.json`` lists no
``text_encoder_3``, or ``use_t5=False`` (saves ~10 GB), runs with zeros in T5's place, which
lowers prompt adherence. A folder that lists T5 but lacks its files is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .diffusers_common import (
    DiffusersPolicy,
    ModelSource,
    PromptEncoder,
    index_has,
    module_device,
    require_components,
)

SD3_SOURCE = ModelSource(
    family="SD3",
    hint=("stabilityai/stable-diffusion-3.5-medium or stabilityai/stable-diffusion-3.5-large on the Hugging "
          "Face hub (gated: accept the licence, then download the whole repository)"),
    pipeline="StableDiffusion3",
)
NEGATIVE_PROMPT = ""


class SD3Policy(DiffusersPolicy):
    """An SD3/SD3.5 transformer (+ VAE, + CLIP-L/CLIP-G/T5 or a ``prompt_encoder``) as a Policy.

    Built from modules: ``SD3Policy(transformer, vae, height=, width=, text_encoder=, tokenizer=,
    text_encoder_2=, tokenizer_2=, text_encoder_3=, tokenizer_3=)`` (T5 may be None). Without
    text encoders pass ``prompt_encoder(prompts: list[str]) -> {"prompt_embeds": [n, S,
    joint_attention_dim], "pooled_prompt_embeds": [n, pooled_projection_dim]}``; with CFG it is
    also asked for the negative prompt ``""`` once.
    """

    source = SD3_SOURCE
    transformer_class = "SD3Transformer2DModel"
    text_components: ClassVar[dict[str, tuple[str, str]]] = dict(  # folder -> (what, transformers class)
        text_encoder=("CLIP-L text encoder", "CLIPTextModelWithProjection"),
        tokenizer=("CLIP-L tokenizer", "CLIPTokenizer"),
        text_encoder_2=("CLIP-G text encoder", "CLIPTextModelWithProjection"),
        tokenizer_2=("CLIP-G tokenizer", "CLIPTokenizer"))

    def __init__(self, transformer: nn.Module, vae: nn.Module | None = None, *,
                 text_encoder: nn.Module | None = None, tokenizer=None,
                 text_encoder_2: nn.Module | None = None, tokenizer_2=None,
                 text_encoder_3: nn.Module | None = None, tokenizer_3=None,
                 prompt_encoder: PromptEncoder | None = None, guidance: float = 4.5,
                 max_sequence_length: int = 256, **common: Any) -> None:
        """``common``: :class:`DiffusersPolicy`'s keys (``height``, ``width`` required; ``offload``,
        ``device``, ``gradient_checkpointing``, ``decode_batch``, ``vae_scale_factor``)."""
        if prompt_encoder is None and None in (text_encoder, tokenizer, text_encoder_2, tokenizer_2):
            raise ValueError("SD3Policy needs both CLIP encoders (text_encoder, tokenizer, text_encoder_2, "
                             "tokenizer_2) or a prompt_encoder callable")
        if (text_encoder_3 is None) != (tokenizer_3 is None):
            raise ValueError("SD3Policy: give T5 as text_encoder_3 and tokenizer_3 together (or neither)")
        text = {"text_encoder": text_encoder, "tokenizer": tokenizer, "text_encoder_2": text_encoder_2,
                "tokenizer_2": tokenizer_2, "text_encoder_3": text_encoder_3, "tokenizer_3": tokenizer_3}
        super().__init__(transformer, vae, latent_channels=int(transformer.config.in_channels), text=text,
                         prompt_encoder=prompt_encoder, guidance=guidance,
                         max_sequence_length=max_sequence_length, **common)
        self._uncond: dict[str, Tensor] | None = None

    @property
    def cfg(self) -> bool:
        """Classifier-free guidance is on (the pipeline's rule: scale > 1)."""
        return self.guidance > 1.0

    @property
    def forwards_per_row(self) -> int:
        return 2 if self.cfg else 1

    # ------------------------------------------------------------------ loading
    @classmethod
    def text_parts(cls, root: Path, index: dict[str, Any],
                   options: dict[str, Any]) -> tuple[dict[str, Path], dict[str, tuple[str, Any]]]:
        """CLIP-L and CLIP-G, and T5 when the folder has it and ``use_t5`` (default true) allows."""
        from transformers import T5EncoderModel, T5TokenizerFast

        folders, text = super().text_parts(root, index, options)
        if options.pop("use_t5", True) and index_has(index, "text_encoder_3"):
            t5 = {"text_encoder_3": ("T5 text encoder", T5EncoderModel),
                  "tokenizer_3": ("T5 tokenizer", T5TokenizerFast)}
            try:
                folders.update(require_components(root, SD3_SOURCE, {n: what for n, (what, _) in t5.items()}))
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{err} (or run without T5: use_t5=False)") from None
            text.update(t5)
        return folders, text

    # ------------------------------------------------------------------ text
    def _clip(self, encoder: nn.Module, tokenizer, prompts: list[str]) -> tuple[Tensor, Tensor]:
        ids = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids
        out = encoder(ids.to(module_device(encoder)), output_hidden_states=True)
        return out.hidden_states[-2], out[0]  # penultimate layer, projected pooled output

    @torch.no_grad()
    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        """The embeddings StableDiffusion3Pipeline.encode_prompt builds (no clip_skip)."""
        with self.offload.using(self.text_encoder, self.text_encoder_2, self.text_encoder_3):
            hidden_l, pooled_l = self._clip(self.text_encoder, self.tokenizer, prompts)
            hidden_g, pooled_g = self._clip(self.text_encoder_2, self.tokenizer_2, prompts)
            clip = torch.cat([hidden_l, hidden_g.to(hidden_l.device)], dim=-1)
            width = int(self.transformer.config.joint_attention_dim)
            if self.text_encoder_3 is not None:
                ids = self.tokenizer_3(prompts, padding="max_length", max_length=self.max_sequence_length,
                                       truncation=True, add_special_tokens=True,
                                       return_tensors="pt").input_ids
                t5 = self.text_encoder_3(ids.to(module_device(self.text_encoder_3)))[0].to(clip.device)
            else:
                t5 = torch.zeros(len(prompts), self.max_sequence_length, width, device=clip.device,
                                 dtype=clip.dtype)
            clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
            text = torch.cat([clip, t5.to(clip.dtype)], dim=-2)
            pooled = torch.cat([pooled_l, pooled_g.to(pooled_l.device)], dim=-1)
        return {"prompt_embeds": text, "pooled_prompt_embeds": pooled}

    def uncond(self) -> dict[str, Tensor]:
        """The negative prompt's conditioning (one row), encoded once and kept on the device."""
        if self._uncond is None or self._uncond["prompt_embeds"].device != self.device:
            self._uncond = self.cache.get([NEGATIVE_PROMPT], self.device)
        return self._uncond

    # ------------------------------------------------------------------ velocity
    def velocity(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        """Guided ``v(x, sigma)`` for latents ``[B, C, h, w]``; float32 on ``x``'s device."""
        self.check_latents(x)
        dev, dtype = self.device, self.dtype
        b = x.shape[0]
        text = cond["prompt_embeds"].to(dev, dtype)
        pooled = cond["pooled_prompt_embeds"].to(dev, dtype)
        if text.shape[0] != b or pooled.shape[0] != b:
            raise ValueError(f"conditioning has {text.shape[0]} rows for {b} latents")
        hidden = x.to(dev, torch.float32).to(dtype)
        timestep = sigma.to(dev, torch.float32).reshape(b) * 1000.0
        if self.cfg:  # [uncond; cond] in one batch, the pipeline's order
            neg = self.uncond()
            text = torch.cat([neg["prompt_embeds"].to(dtype).expand(b, -1, -1), text])
            pooled = torch.cat([neg["pooled_prompt_embeds"].to(dtype).expand(b, -1), pooled])
            hidden = torch.cat([hidden, hidden])
            timestep = torch.cat([timestep, timestep])
        out = self.transformer_forward()(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text,
                               pooled_projections=pooled, return_dict=False)[0].float()
        if self.cfg:
            v_uncond, v_cond = out.chunk(2)
            out = v_uncond + self.guidance * (v_cond - v_uncond)
        return out.to(x.device)
