"""Load CLIP checkpoints without trusting them, and turn open_clip checkpoints into transformers models.

Why a converter of our own: HPS v2.1 ships as an open_clip ViT-H-14 state dict, and the ``hpsv2`` package
cannot run offline (its wheel lacks the BPE vocabulary and it always downloads ViT-H-14). One transformers
``CLIPModel`` then serves CLIP, PickScore and HPS with the same scoring code.

open_clip -> transformers, per tower (``P`` = ``visual.`` for images, ``""`` for text):
    ``P.transformer.resblocks.i.attn.in_proj_{weight,bias}`` -> q/k/v ``_proj`` (split in thirds, q first)
    ``attn.out_proj`` -> ``self_attn.out_proj``; ``ln_1``/``ln_2`` -> ``layer_norm1``/``2``;
    ``mlp.c_fc``/``mlp.c_proj`` -> ``mlp.fc1``/``mlp.fc2``
    images: ``conv1`` -> patch embedding, ``class_embedding``, ``positional_embedding``, ``ln_pre``
    -> ``pre_layrnorm``, ``ln_post`` -> ``post_layernorm``, ``proj`` (``[width, embed]``) ->
    ``visual_projection`` (transposed); text: ``token_embedding``, ``positional_embedding``, ``ln_final``
    -> ``final_layer_norm``, ``text_projection`` (transposed); ``logit_scale`` as is.
The text tower then matches open_clip: causal mask, pooling at the end-of-text token (open_clip pools at
the argmax id, which is that token in the OpenAI BPE; transformers pools at the first ``eos_token_id``),
and padding after it cannot change the pooled feature because of the causal mask.

Every load uses ``torch.load(..., weights_only=True)`` or safetensors: no pickled code is ever run.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from ..utils.atomic import atomic_write_text, one_line

# ViT-H-14 (HPS v2/v2.1, PickScore): 1280-wide image tower with 80-wide heads, 1024-wide text tower with
# 64-wide heads, exact GELU. Head counts are the one thing the tensor shapes do not say.
VISION_HEAD_WIDTH = 80
TEXT_HEAD_WIDTH = 64
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which open_clip uses
IGNORED_KEYS = ("attn_mask", "visual.attn_mask")  # causal-mask buffers some versions saved; rebuilt anyway
_DIRECT = {  # open_clip name -> transformers name, tensors that are only renamed
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}
_REQUIRED = ("visual.conv1.weight", "visual.positional_embedding", "visual.proj", "token_embedding.weight",
             "positional_embedding", "text_projection", "logit_scale")
OPENAI_BPE_MERGES = 49152 - 256 - 2  # merges the OpenAI CLIP vocabulary uses out of its BPE file
BOS_TOKEN, EOS_TOKEN = "<|startoftext|>", "<|endoftext|>"


def load_safetensors_file(path: Path) -> dict[str, Tensor]:
    """All tensors of a ``.safetensors`` file; a corrupt or truncated file is a one-line ValueError."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:
        raise ValueError(f"cannot read weights {path} (corrupt or truncated safetensors): "
                         f"{one_line(exc)}") from None


# ---------------------------------------------------------------- open_clip -> transformers


def _count_blocks(sd: dict[str, Tensor], prefix: str) -> int:
    ids = {int(k[len(prefix):].split(".", 1)[0]) for k in sd if k.startswith(prefix)}
    if not ids or ids != set(range(len(ids))):
        raise ValueError(f"transformer blocks under {prefix!r} are missing or not numbered 0..n-1")
    return len(ids)


def _heads(width: int, head_width: int, tower: str) -> int:
    if width % head_width:
        raise ValueError(f"{tower} width {width} is not a multiple of the ViT-H-14 head width {head_width}; "
                         "only ViT-H-14-style open_clip checkpoints are supported")
    return width // head_width


def open_clip_config(sd: dict[str, Tensor], hidden_act: str = "gelu"):
    """The transformers ``CLIPConfig`` of an open_clip state dict, read from its tensor shapes.

    Head counts follow ViT-H-14's head widths (80 image, 64 text), so the same code converts the real
    checkpoint and tiny test ones built with those head widths. ``hidden_act``: open_clip models other
    than OpenAI's use exact GELU (``"gelu"``); OpenAI-trained ones use ``"quick_gelu"``.
    """
    from transformers import CLIPConfig

    missing = [k for k in _REQUIRED if k not in sd]
    if missing:
        raise ValueError(f"not an open_clip CLIP checkpoint: missing {', '.join(missing[:4])}")
    conv = sd["visual.conv1.weight"]
    v_width, patch = conv.shape[0], conv.shape[-1]
    grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    if conv.shape[-2] != patch or grid * grid + 1 != sd["visual.positional_embedding"].shape[0]:
        raise ValueError("unsupported open_clip image tower: non-square patches or position grid")
    t_ctx, t_width = sd["positional_embedding"].shape
    vocab = sd["token_embedding.weight"].shape[0]
    embed = sd["text_projection"].shape[1]
    vision = dict(
        hidden_size=v_width, patch_size=patch, image_size=patch * grid, num_channels=conv.shape[1],
        num_hidden_layers=_count_blocks(sd, "visual.transformer.resblocks."),
        intermediate_size=sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        num_attention_heads=_heads(v_width, VISION_HEAD_WIDTH, "image tower"),
        hidden_act=hidden_act, layer_norm_eps=LAYER_NORM_EPS, projection_dim=embed,
    )
    text = dict(
        hidden_size=t_width, vocab_size=vocab, max_position_embeddings=t_ctx,
        num_hidden_layers=_count_blocks(sd, "transformer.resblocks."),
        intermediate_size=sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        num_attention_heads=_heads(t_width, TEXT_HEAD_WIDTH, "text tower"),
        hidden_act=hidden_act, layer_norm_eps=LAYER_NORM_EPS, projection_dim=embed,
        # OpenAI BPE: <|startoftext|> and <|endoftext|> are the last two ids; open_clip pads with 0
        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=0,
    )
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed)  # logit_scale: loaded


def _block_map(src: str, dst: str, sd: dict[str, Tensor], out: dict[str, Tensor], used: set[str]) -> None:
    """One residual block: split the fused q/k/v projection, rename the rest."""
    w, b = sd[f"{src}.attn.in_proj_weight"], sd[f"{src}.attn.in_proj_bias"]
    for name, wi, bi in zip(("q_proj", "k_proj", "v_proj"), w.chunk(3, 0), b.chunk(3, 0), strict=True):
        out[f"{dst}.self_attn.{name}.weight"], out[f"{dst}.self_attn.{name}.bias"] = wi, bi
    used.update((f"{src}.attn.in_proj_weight", f"{src}.attn.in_proj_bias"))
    for a, c in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                 ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
        for p in ("weight", "bias"):
            out[f"{dst}.{c}.{p}"] = sd[f"{src}.{a}.{p}"]
            used.add(f"{src}.{a}.{p}")


def convert_open_clip_state_dict(sd: dict[str, Tensor], config) -> dict[str, Tensor]:
    """transformers ``CLIPModel`` tensors for an open_clip state dict and its ``open_clip_config``.

    Every source tensor must be used: a key we do not map (layer scale, attentional pooling, ...) means an
    architecture this converter would silently mis-load, so it is an error instead.
    """
    out: dict[str, Tensor] = {}
    used: set[str] = {*IGNORED_KEYS, *_DIRECT, *_TRANSPOSED}
    try:
        for i in range(config.vision_config.num_hidden_layers):
            _block_map(f"visual.transformer.resblocks.{i}", f"vision_model.encoder.layers.{i}", sd, out, used)
        for i in range(config.text_config.num_hidden_layers):
            _block_map(f"transformer.resblocks.{i}", f"text_model.encoder.layers.{i}", sd, out, used)
        out.update({dst: sd[src] for src, dst in _DIRECT.items()})
        out.update({dst: sd[src].t() for src, dst in _TRANSPOSED.items()})
    except KeyError as exc:
        raise ValueError(f"not a ViT-style open_clip CLIP checkpoint: missing {exc.args[0]}") from None
    extra = sorted(set(sd) - used)
    if extra:
        raise ValueError(f"unsupported open_clip checkpoint: unexpected tensors {', '.join(extra[:3])}"
                         + (f" (+{len(extra) - 3} more)" if len(extra) > 3 else ""))
    out["logit_scale"] = out["logit_scale"].reshape(())
    return {k: v.contiguous() for k, v in out.items()}


def clip_model_from_state_dict(config, sd: dict[str, Tensor], dtype: torch.dtype, source: Path):
    """A ``CLIPModel`` built on the meta device and filled with ``sd`` (no random init, no second copy).

    Missing or unexpected tensors are a one-line ValueError naming ``source``.
    """
    from transformers import CLIPModel

    sd = {k: v.to(dtype) if v.is_floating_point() else v
          for k, v in sd.items() if not k.endswith("position_ids")}  # old checkpoints saved these buffers
    with torch.device("meta"):
        model = CLIPModel(config)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unexpected:
        what = (f"missing {', '.join(missing[:3])}" if missing else "") + (
            f"{'; ' if missing else ''}unexpected {', '.join(unexpected[:3])}" if unexpected else "")
        raise ValueError(f"{source} does not match a CLIP model of its config: {what}")
    bad = [k for k, v in model.state_dict().items() if tuple(v.shape) != tuple(sd[k].shape)]
    if bad:
        raise ValueError(f"{source}: tensor {bad[0]} has shape {tuple(sd[bad[0]].shape)}, "
                         f"the config expects {tuple(model.state_dict()[bad[0]].shape)}")
    model.load_state_dict(sd, strict=True, assign=True)
    for mod in model.modules():  # non-persistent buffers are not in any checkpoint: rebuild them
        for name, buf in list(mod.named_buffers(recurse=False)):
            if buf.is_meta and name == "position_ids":
                ids = torch.arange(buf.shape[-1]).expand(buf.shape).clone()
                mod.register_buffer(name, ids, persistent=False)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{source}: tensors left uninitialised after loading: {', '.join(left[:3])}")
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------- OpenAI CLIP BPE vocabulary


def byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE uses for bytes 0..255, in vocabulary order.

    Printable latin-1 bytes stand for themselves; the others (controls, space, ...) are given the
    code points from 256 upwards in byte order. The vocabulary lists the printable ones first.
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in set(kept)]
    table = {b: chr(b) for b in kept} | {b: chr(256 + i) for i, b in enumerate(moved)}
    return [table[b] for b in [*kept, *moved]]


def openai_bpe_vocab(lines: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of the OpenAI CLIP tokenizer from its ``bpe_simple_vocab_16e6.txt`` lines.

    Ids: the 256 byte symbols, the same with ``</w>``, one per merge, then ``<|startoftext|>`` and
    ``<|endoftext|>`` (49406, 49407 for the full file). That is the layout of ``vocab.json`` in the
    transformers CLIP repositories, so the two tokenizers give the same ids.
    """
    body = list(lines)[1: OPENAI_BPE_MERGES + 1]  # the first line is a version header
    merges = [tuple(line.split()) for line in body if line.strip()]
    if not merges or any(len(m) != 2 for m in merges):
        raise ValueError("not a BPE merges file: expected lines of two symbols")
    symbols = byte_alphabet()
    tokens = [*symbols, *(s + "</w>" for s in symbols), *("".join(m) for m in merges), BOS_TOKEN, EOS_TOKEN]
    return {tok: i for i, tok in enumerate(tokens)}, merges  # type: ignore[return-value]


def read_openai_bpe_gz(path: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``openai_bpe_vocab`` of a gzipped BPE file such as open_clip's ``bpe_simple_vocab_16e6.txt.gz``."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return openai_bpe_vocab(fh.read().split("\n"))
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(f"cannot read BPE vocabulary {path}: {one_line(exc)}") from None


def write_tokenizer_files(vocab: dict[str, int], merges: list[tuple[str, str]], folder: Path) -> None:
    """Write ``vocab.json`` + ``merges.txt`` in the layout ``CLIPTokenizer.from_pretrained`` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "vocab.json", json.dumps(vocab, ensure_ascii=False))
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    atomic_write_text(folder / "merges.txt", "\n".join(lines) + "\n")
