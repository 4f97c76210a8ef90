"""The embedded default model's architecture: configs and tokenizer, built from code.

Pixel space, no autoencoder: a 64x64 RGB image in ``[-1, 1]`` is pixel-unshuffled by 4 into a
``[48, 16, 16]`` latent, which the FLUX transformer packs 2x2 into 64 tokens of 192 values (8x8
pixel patches). The transformer predicts the clean image (x0); the velocity the sampler needs is
derived as ``v = (x - x0_hat) / max(s, min_sigma)``, which a model this small learns far better
than ``v`` itself. The prompt encoder is a one-layer CLIP text model over a closed word
vocabulary (the scene grammar), with a word-level tokenizer: both standard transformers classes.
"""

from __future__ import annotations

from typing import Any

from .scenes import IMAGE_SIZE, VOCABULARY

PIXEL_UNSHUFFLE = 4
LATENT_SHAPE = (3 * PIXEL_UNSHUFFLE**2, IMAGE_SIZE // PIXEL_UNSHUFFLE, IMAGE_SIZE // PIXEL_UNSHUFFLE)
MAX_TOKENS = 16
TEXT_DIM = 64
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PUNCTUATION = (",",)

# What a loader needs besides the standard configs (saved as embedded.json beside the weights).
EMBEDDED_SPEC: dict[str, Any] = {
    "format": "dynamic-treerpo-embedded",
    "version": 1,
    "image_size": IMAGE_SIZE,
    "latent": f"pixel_unshuffle_{PIXEL_UNSHUFFLE}",
    "latent_shape": list(LATENT_SHAPE),
    "prediction": "x0",
    "min_sigma": 0.05,
    "max_tokens": MAX_TOKENS,
}


def vocabulary() -> list[str]:
    """Special tokens, punctuation, then the scene grammar's words in sorted order (stable ids)."""
    return [*SPECIAL_TOKENS, *PUNCTUATION, *sorted(VOCABULARY)]


def unknown_words(text: str) -> list[str]:
    """The words of ``text`` the embedded text encoder has no token for (lower-cased, split as its
    tokenizer splits: at whitespace and punctuation), in order, each once."""
    import re

    known = set(vocabulary())
    out: list[str] = []
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        if word not in known and word not in out:
            out.append(word)
    return out


def known_words() -> list[str]:
    """The scene grammar's words, sorted: what a prompt for the embedded model may use."""
    return sorted(VOCABULARY)


def transformer_config() -> dict[str, Any]:
    """``FluxTransformer2DModel`` arguments: 2 double + 2 single blocks, 4 heads x 32 (1.85M)."""
    return {
        "patch_size": 1,
        "in_channels": LATENT_SHAPE[0] * 4,
        "num_layers": 2,
        "num_single_layers": 2,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": TEXT_DIM,
        "pooled_projection_dim": TEXT_DIM,
        "guidance_embeds": False,
        "axes_dims_rope": (8, 12, 12),
    }


def text_encoder_config() -> dict[str, Any]:
    """``CLIPTextConfig`` arguments for a one-layer encoder over :func:`vocabulary`."""
    return {
        "vocab_size": len(vocabulary()),
        "hidden_size": TEXT_DIM,
        "intermediate_size": 2 * TEXT_DIM,
        "projection_dim": TEXT_DIM,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": MAX_TOKENS,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def build_tokenizer():
    """A word-level fast tokenizer: lower-cases, splits words and punctuation, adds <bos>/<eos>."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 1), ("<eos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>",
                                   model_max_length=MAX_TOKENS, clean_up_tokenization_spaces=False)
