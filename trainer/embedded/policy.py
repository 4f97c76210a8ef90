"""The embedded default model as a :class:`~trainer.models.policy.Policy` (pixel space, x0-prediction).

Loads from a folder laid out like diffusers components (``transformer/``, ``text_encoder/``,
``tokenizer/``) plus ``embedded.json`` (see ``embedded/architecture.py``). The weights shipped with
the project live in ``trainer/embedded/weights``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat.transformers_api import load_clip_text_model, save_clip_text_model
from ..compat.versions import check_versions
from ..models.patches import image_ids, pack, unpack
from ..models.policy import PolicyBase
from ..utils.atomic import atomic_write_text
from .architecture import (
    EMBEDDED_SPEC,
    MAX_TOKENS,
    PIXEL_UNSHUFFLE,
    build_tokenizer,
    text_encoder_config,
    transformer_config,
)

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
REQUIRED_FILES = (
    "embedded.json",
    "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors",
    "text_encoder/config.json",
    "text_encoder/model.safetensors",
    "tokenizer/tokenizer.json",
)


def image_to_latent(images: Tensor) -> Tensor:
    """``[B, 3, 64, 64]`` in ``[0, 1]`` -> ``[B, 48, 16, 16]`` in ``[-1, 1]``."""
    return F.pixel_unshuffle(images.float() * 2.0 - 1.0, PIXEL_UNSHUFFLE)


def latent_to_image(latents: Tensor) -> Tensor:
    """Inverse of :func:`image_to_latent`, clamped to ``[0, 1]``."""
    return ((F.pixel_shuffle(latents.float(), PIXEL_UNSHUFFLE) + 1.0) / 2.0).clamp(0.0, 1.0)


def check_weights_dir(path: Path) -> None:
    """One-line error naming the first missing file and how to get it."""
    for name in REQUIRED_FILES:
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"embedded model file missing: {path / name} (the project ships it in "
                "trainer/embedded/weights; rebuild with "
                "`python -m dynamic_treerpo.trainer.embedded.pretrain`)")


def _drop_source_path(config: Path) -> None:
    """Remove ``_name_or_path`` (where the weights were loaded from) from a saved config."""
    data = json.loads(config.read_text())
    if data.pop("_name_or_path", None) is not None:
        atomic_write_text(config, json.dumps(data, indent=2, sort_keys=True) + "\n")


class EmbeddedPolicy(PolicyBase, nn.Module):
    """Transformer + text encoder + tokenizer of the embedded default, as a Policy."""

    def __init__(self, transformer: nn.Module, text_encoder: nn.Module, tokenizer: Any,
                 spec: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.transformer = transformer
        self.text_encoder = text_encoder.requires_grad_(False).eval()
        self.tokenizer = tokenizer
        self.spec = dict(spec or EMBEDDED_SPEC)
        self.latent_shape: tuple[int, ...] = tuple(self.spec["latent_shape"])
        # pixel space: the latent is the image pixel-unshuffled (pooled SDE noise pools pixels)
        self.latent_unshuffle = PIXEL_UNSHUFFLE
        self.image_tokens = (self.latent_shape[1] // 2) * (self.latent_shape[2] // 2)  # 2x2 patches
        self.min_sigma = float(self.spec["min_sigma"])
        self._cache: dict[str, tuple[Tensor, Tensor]] = {}
        self.source: Path | None = None  # the folder it was loaded from (fresh_copy reloads it)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_scratch(cls, seed: int = 0) -> EmbeddedPolicy:
        """Random weights from the architecture's configs (for pretraining and tests)."""
        from diffusers import FluxTransformer2DModel
        from transformers import CLIPTextConfig, CLIPTextModel

        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(**transformer_config())
        text_encoder = CLIPTextModel(CLIPTextConfig(**text_encoder_config()))
        return cls(transformer, text_encoder, build_tokenizer())

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None) -> EmbeddedPolicy:
        """Load from ``path`` (default: the weights shipped in the package)."""
        from diffusers import FluxTransformer2DModel
        from transformers import PreTrainedTokenizerFast

        check_versions(["transformers", "tokenizers", "diffusers"])
        root = Path(path) if path is not None else WEIGHTS_DIR
        check_weights_dir(root)
        spec = json.loads((root / "embedded.json").read_text())
        if spec.get("format") != EMBEDDED_SPEC["format"]:
            raise ValueError(f"{root / 'embedded.json'}: not an embedded-default model folder")
        transformer = FluxTransformer2DModel.from_pretrained(root / "transformer")
        text_encoder = load_clip_text_model(root / "text_encoder")  # strictly, on transformers 4 and 5
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer" / "tokenizer.json"),
                                            pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                            unk_token="<unk>", model_max_length=MAX_TOKENS,
                                            clean_up_tokenization_spaces=False)
        policy = cls(transformer, text_encoder, tokenizer, spec)
        policy.source = root
        return policy

    def fresh_copy(self) -> EmbeddedPolicy:
        """An independent copy with plain (autograd-capable) tensors and no adapter.

        Why: a front end that trains must not change the model other nodes hold, and tensors made
        under ``torch.inference_mode`` (as ComfyUI runs nodes) cannot take part in autograd. A
        policy loaded from a folder is loaded again from it.
        """
        from diffusers import FluxTransformer2DModel

        with torch.inference_mode(False):
            if self.source is not None:
                # from the files: a host such as ComfyUI may hold its own patches (LoRAs of other
                # nodes) in the live weights of this model
                copy = EmbeddedPolicy.from_pretrained(self.source).to(self.device)
                copy._cache = {k: (t.clone(), p.clone()) for k, (t, p) in self._cache.items()}
                return copy
            transformer = FluxTransformer2DModel.from_config(self.transformer.config)
            state = {k: v.clone() for k, v in self.transformer.state_dict().items()
                     if "lora_" not in k}
            state = {k.replace(".base_layer.", "."): v for k, v in state.items()}
            transformer.load_state_dict(state)
            transformer.to(self.device)
            copy = EmbeddedPolicy(transformer, self.text_encoder, self.tokenizer, self.spec)
            copy._cache = {k: (t.clone(), p.clone()) for k, (t, p) in self._cache.items()}
        return copy

    def save_pretrained(self, path: str | Path) -> None:
        """Write the folder :meth:`from_pretrained` reads (safetensors weights)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(root / "transformer", safe_serialization=True)
        save_clip_text_model(self.text_encoder, root / "text_encoder")  # readable by transformers 4 and 5
        self.tokenizer.save_pretrained(root / "tokenizer")
        atomic_write_text(root / "embedded.json", json.dumps(self.spec, indent=2) + "\n")
        _drop_source_path(root / "transformer" / "config.json")

    # ------------------------------------------------------------------ Policy
    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def _encode_uncached(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        batch = self.tokenizer(list(prompts), padding="max_length", max_length=MAX_TOKENS,
                               truncation=True, return_tensors="pt")
        ids = batch.input_ids
        unk = self.tokenizer.convert_tokens_to_ids("<unk>")
        for prompt, row in zip(prompts, ids, strict=True):
            if bool((row == unk).any()):
                pieces = self.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(prompt.lower())
                words = [w for w, _ in pieces if self.tokenizer.convert_tokens_to_ids(w) == unk]
                from .architecture import known_words

                raise ValueError(f"prompt {prompt!r}: unknown word {words[0]!r} for the embedded model; it "
                                 f"knows: {' '.join(known_words())} (and commas)")
        with torch.no_grad():
            out = self.text_encoder(input_ids=ids.to(self.device),
                                    attention_mask=batch.attention_mask.to(self.device))
        return out.last_hidden_state, out.pooler_output

    def encode(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """``{"text": [P, S, D], "pooled": [P, D]}``; prompts are cached (the encoder is frozen)."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        if missing:
            text, pooled = self._encode_uncached(missing)
            for i, prompt in enumerate(missing):
                self._cache[prompt] = (text[i], pooled[i])
        return {"text": torch.stack([self._cache[p][0] for p in prompts]),
                "pooled": torch.stack([self._cache[p][1] for p in prompts])}

    def predict_x0(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        """The transformer's clean-latent prediction."""
        _, c, h, w = x.shape
        dtype = next(self.transformer.parameters()).dtype
        text = cond["text"]
        out = self.transformer_forward()(
            hidden_states=pack(x).to(dtype),
            encoder_hidden_states=text.to(dtype),
            pooled_projections=cond["pooled"].to(dtype),
            timestep=sigma.to(dtype),
            img_ids=image_ids(h, w).to(x.device),
            txt_ids=torch.zeros(text.shape[1], 3, device=x.device),
            return_dict=False,
        )[0]
        return unpack(out.float(), c, h, w)

    def velocity(self, x: Tensor, sigma: Tensor, cond: dict[str, Tensor]) -> Tensor:
        """``v = (x - x0_hat) / max(s, min_sigma)``."""
        x0 = self.predict_x0(x, sigma, cond)
        s = sigma.float().clamp(min=self.min_sigma).reshape(-1, 1, 1, 1)
        return (x.float() - x0) / s

    def decode(self, latents: Tensor) -> Tensor:
        return latent_to_image(latents)

    def encode_images(self, images: Tensor) -> Tensor:
        return image_to_latent(images)

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]
