"""ImageReward v1.0 (THUDM) as a reward, rebuilt on transformers' own BLIP classes (4.45 to 5).

Why not the ``image-reward`` package: version 1.5 does not import with transformers 5 and downloads
bert-base-uncased when it loads. The model is small to port: BLIP's ViT (``BlipVisionModel`` has the same
layers as BLIP's timm-style ViT, fused ``qkv`` included), BLIP's BERT with cross-attention into the image
tokens (``BlipTextModel`` was ported from the same ``med.py``, so its keys match), and a stack of Linear
layers read on the first text token. The score is ImageReward's normalised one:
``(head(text[:, 0]) - 0.16717...) / 1.03333...``, i.e. what ``ImageReward.score`` returns.

``weights`` (``--weights PATH`` on the CLI, ``reward_weights: {imagereward: PATH}`` in a config) is a folder
holding
- ``ImageReward.pt`` and ``med_config.json`` from https://huggingface.co/THUDM/ImageReward,
- ``vocab.txt`` from https://huggingface.co/google-bert/bert-base-uncased, in the folder or in ``tokenizer/``.
The path of ``ImageReward.pt`` itself is accepted too; the other files are then looked for beside it.
Sizes are read from the checkpoint and ``med_config.json`` (a tiny test checkpoint loads with the same code);
the ViT's head count is not stored anywhere, so it is width // 64 as in every BLIP ViT.

Preprocessing reproduces the reference's PIL pipeline on tensors: the image is taken as its 8-bit version
(values rounded to 1/255, as the PIL image the reference needs), its shorter side resized to 224 with PIL's
own fixed-point bicubic (same pixels as Pillow 13), centre-cropped, CLIP-normalised. So scores equal the
reference's for any size (to ~1e-5 on CPU). On CUDA, cuDNN's default TF32 convolutions add a small error
(~1e-3 relative in the patch embedding); this module leaves that global setting to the caller.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..compat.transformers_api import wordpiece_tokenizer
from ..utils.atomic import load_state_dict_file
from .registry import RewardFn

if TYPE_CHECKING:
    from transformers import BertTokenizer, BlipTextConfig, BlipVisionConfig

REWARD_MEAN = 0.16717362830052426  # ImageReward's fixed normalisation of the head output
REWARD_STD = 1.0333394966054072
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_TOKENS = 35  # ImageReward pads/truncates every prompt to this many tokens
VIT_HEAD_DIM = 64
BATCH = 32  # images per forward pass; bounds activation memory of the real ViT-L
_PIL_BITS = 22  # fixed-point precision of PIL's 8-bit resampling
IR_HUB = "https://huggingface.co/THUDM/ImageReward"
BERT_HUB = "https://huggingface.co/google-bert/bert-base-uncased"
_WHAT = f"ImageReward.pt and med_config.json from {IR_HUB} and vocab.txt from {BERT_HUB}"

# Saved by the reference model but unused by its score (ITC projections, a BERT buffer).
_UNUSED_KEYS = frozenset({
    "blip.vision_proj.weight", "blip.vision_proj.bias", "blip.text_proj.weight", "blip.text_proj.bias",
    "blip.text_encoder.embeddings.position_ids",
})
_VIT_TOP = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
_VIT_BLOCK = re.compile(r"blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)")
_VIT_BLOCK_PARTS = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.qkv": "self_attn.qkv",
                    "attn.proj": "self_attn.projection", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_HEAD_KEY = re.compile(r"(\d+)\.(weight|bias)")


def _vit_key(key: str) -> str | None:
    """BLIP/timm ViT key (after ``blip.visual_encoder.``) -> BlipVisionModel key, None if unknown."""
    if key in _VIT_TOP:
        return _VIT_TOP[key]
    m = _VIT_BLOCK.fullmatch(key)
    return f"encoder.layers.{m[1]}.{_VIT_BLOCK_PARTS[m[2]]}.{m[3]}" if m else None


def _vit_key_back(key: str) -> str:
    """BlipVisionModel key -> the ImageReward checkpoint key it is read from (for error messages)."""
    back = {v: k for k, v in _VIT_TOP.items()}
    if key in back:
        return "blip.visual_encoder." + back[key]
    for old, new in _VIT_BLOCK_PARTS.items():
        key = key.replace(f".{new}.", f".{old}.")
    return "blip.visual_encoder." + key.replace("encoder.layers.", "blocks.")


@dataclass(frozen=True)
class ImageRewardFiles:
    checkpoint: Path
    med_config: Path
    vocab: Path


def locate_files(weights: str | Path) -> ImageRewardFiles:
    """Find the three files, each missing one a one-line error saying where to get it."""
    root = Path(weights).expanduser()
    if root.is_file():
        ckpt, root = root, root.parent
    elif root.is_dir():
        ckpt = root / "ImageReward.pt"
    else:
        raise FileNotFoundError(f"imagereward weights folder {root} does not exist; it must hold {_WHAT}")
    if not ckpt.is_file():
        raise FileNotFoundError(f"ImageReward.pt not found in {root}; download it from {IR_HUB}")
    med = root / "med_config.json"
    if not med.is_file():
        raise FileNotFoundError(f"med_config.json not found in {root}; download it from {IR_HUB}")
    for vocab in (root / "vocab.txt", root / "tokenizer" / "vocab.txt"):
        if vocab.is_file():
            return ImageRewardFiles(ckpt, med, vocab)
    raise FileNotFoundError(f"vocab.txt not found in {root} or {root / 'tokenizer'}; "
                            f"download it from {BERT_HUB}")


def read_checkpoint(path: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors as float32 (the real file and the test fixture may differ in dtype)."""
    try:
        state = load_state_dict_file(path)
    except ValueError as err:
        raise ValueError(f"not an ImageReward checkpoint: {err}; re-download ImageReward.pt from "
                         f"{IR_HUB}") from None
    return {k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}


StateDict = dict[str, Tensor]


def split_checkpoint(state: StateDict) -> tuple[StateDict, StateDict, StateDict]:
    """ImageReward keys -> (BlipVisionModel, BlipTextModel, head) state dicts; unknown keys are errors."""
    vision: dict[str, Tensor] = {}
    text: dict[str, Tensor] = {}
    head: dict[str, Tensor] = {}
    for key, value in state.items():
        if key in _UNUSED_KEYS:
            continue
        if key.startswith("blip.visual_encoder."):
            new = _vit_key(key.removeprefix("blip.visual_encoder."))
            if new is None:
                raise ValueError(f"not an ImageReward checkpoint: unexpected key {key!r}")
            vision[new] = value
        elif key.startswith("blip.text_encoder."):
            text[key.removeprefix("blip.text_encoder.")] = value  # checked against BlipTextModel below
        elif key.startswith("mlp.layers.") and _HEAD_KEY.fullmatch(key.removeprefix("mlp.layers.")):
            head[key.removeprefix("mlp.")] = value
        else:
            raise ValueError(f"not an ImageReward checkpoint: unexpected key {key!r}")
    for part, sd in (("blip.visual_encoder", vision), ("blip.text_encoder", text), ("mlp.layers", head)):
        if not sd:
            raise ValueError(f"not an ImageReward checkpoint: no {part}.* keys")
    return vision, text, head


def _need(sd: dict[str, Tensor], key: str, original: str) -> Tensor:
    """sd[key]; a missing one is reported under its checkpoint name ``original``."""
    if key not in sd:
        raise ValueError(f"not an ImageReward checkpoint: missing key {original!r}")
    return sd[key]


def vision_config(vision: dict[str, Tensor]) -> BlipVisionConfig:
    """BlipVisionConfig from the ViT weights' shapes (BLIP ViTs: head dim 64, LayerNorm eps 1e-6)."""
    from transformers import BlipVisionConfig

    def need(key: str) -> Tensor:
        return _need(vision, key, _vit_key_back(key))

    pos = need("embeddings.position_embedding")
    patch = need("embeddings.patch_embedding.weight")
    width, grid = pos.shape[-1], math.isqrt(pos.shape[1] - 1)
    if grid * grid != pos.shape[1] - 1 or width % VIT_HEAD_DIM:
        raise ValueError(f"not an ImageReward checkpoint: ViT pos_embed shape {tuple(pos.shape)} is not "
                         f"a square grid of a width divisible by {VIT_HEAD_DIM}")
    depth = 1 + max((int(k.split(".")[2]) for k in vision if k.startswith("encoder.layers.")), default=-1)
    fc1 = need("encoder.layers.0.mlp.fc1.weight")
    return BlipVisionConfig(hidden_size=width, intermediate_size=fc1.shape[0], num_hidden_layers=depth,
                            num_attention_heads=width // VIT_HEAD_DIM, image_size=grid * patch.shape[-1],
                            patch_size=patch.shape[-1], hidden_act="gelu", layer_norm_eps=1e-6)


def text_config(med_config: Path, encoder_width: int) -> BlipTextConfig:
    """BlipTextConfig from ImageReward's BERT med_config.json; cross-attention reads the ViT width."""
    from transformers import BlipTextConfig

    try:
        med = json.loads(med_config.read_text(encoding="utf-8"))
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
        sizes = {k: int(med[k]) for k in keys}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{med_config} is not ImageReward's med_config.json ({type(exc).__name__}: {exc}); "
                         f"download it from {IR_HUB}") from None
    return BlipTextConfig(**sizes, encoder_hidden_size=encoder_width,
                          hidden_act=str(med.get("hidden_act", "gelu")),
                          layer_norm_eps=float(med.get("layer_norm_eps", 1e-12)),
                          pad_token_id=int(med.get("pad_token_id", 0)), bos_token_id=None, eos_token_id=None,
                          sep_token_id=None, is_decoder=True, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)


def build_head(head: dict[str, Tensor], in_features: int) -> RewardHead:
    """ImageReward's MLP: Linear layers at the saved indices, no activation between them (dropout only,
    which is identity at inference), so indices of the saved keys line up with ``layers.N``."""
    idx = sorted({int(k.split(".")[1]) for k in head})
    layers: list[nn.Module] = [nn.Identity() for _ in range(idx[-1] + 1)]
    width = in_features
    for i in idx:
        w = _need(head, f"layers.{i}.weight", f"mlp.layers.{i}.weight")
        _need(head, f"layers.{i}.bias", f"mlp.layers.{i}.bias")
        if w.dim() != 2 or w.shape[1] != width:
            raise ValueError(f"not an ImageReward checkpoint: mlp.layers.{i}.weight has shape "
                             f"{tuple(w.shape)}, expected [*, {width}]")
        layers[i] = nn.Linear(w.shape[1], w.shape[0])
        width = w.shape[0]
    if width != 1:
        raise ValueError(f"not an ImageReward checkpoint: the mlp ends in {width} outputs, expected 1")
    return RewardHead(layers)


class RewardHead(nn.Module):
    """Holds the layers under ``layers`` so the checkpoint's ``mlp.layers.N`` keys load unchanged."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)

    def forward(self, features: Tensor) -> Tensor:
        return self.layers(features)


def _assign(module: nn.Module, sd: dict[str, Tensor], original: Callable[[str], str], what: str) -> None:
    """Strict, shape-checked load into a meta-built module (no random init of the real 0.4B weights)."""
    expected = module.state_dict()
    for key, value in sd.items():
        if key not in expected:
            raise ValueError(f"not an ImageReward checkpoint: unexpected key {original(key)!r}")
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(f"checkpoint and config do not fit: {original(key)} has shape "
                             f"{tuple(value.shape)} but {what} expects {tuple(expected[key].shape)}")
    for key in expected:
        _need(sd, key, original(key))
    module.load_state_dict(sd, strict=True, assign=True)


class ImageRewardModel(nn.Module):
    """BLIP image encoder -> BERT text encoder cross-attending to it -> head on the first token."""

    def __init__(self, vision: nn.Module, text: nn.Module, head: RewardHead) -> None:
        super().__init__()
        self.vision, self.text, self.head = vision, text, head

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Un-normalised head output [B] for CLIP-normalised pixels at the ViT's size."""
        image_tokens = self.vision(pixel_values=pixel_values).last_hidden_state
        text = self.text(input_ids=input_ids, attention_mask=attention_mask,
                         encoder_hidden_states=image_tokens).last_hidden_state
        return self.head(text[:, 0]).squeeze(-1)


def load_model(files: ImageRewardFiles) -> ImageRewardModel:
    """The model on CPU in float32, weights assigned straight from the checkpoint."""
    from transformers import BlipTextModel, BlipVisionModel

    vision_sd, text_sd, head_sd = split_checkpoint(read_checkpoint(files.checkpoint))
    vcfg = vision_config(vision_sd)
    tcfg = text_config(files.med_config, vcfg.hidden_size)
    with torch.device("meta"):
        vision = BlipVisionModel(vcfg)
        text = BlipTextModel(tcfg, add_pooling_layer=False)
    _assign(vision, vision_sd, _vit_key_back, "the ViT sized from the checkpoint")
    _assign(text, text_sd, lambda k: "blip.text_encoder." + k, f"the BERT of {files.med_config.name}")
    positions = torch.arange(tcfg.max_position_embeddings).expand(1, -1)
    text.embeddings.register_buffer("position_ids", positions, persistent=False)  # was left on meta
    head = build_head(head_sd, tcfg.hidden_size)
    head.load_state_dict(head_sd, strict=True)
    return ImageRewardModel(vision, text, head).eval()


def load_tokenizer(vocab: Path, vocab_rows: int) -> BertTokenizer:
    """bert-base-uncased's WordPiece tokenizer plus BLIP's two added tokens ([DEC], [ENC])."""
    tokens = vocab.read_text(encoding="utf-8").splitlines()
    if len(tokens) + 2 != vocab_rows:
        raise ValueError(f"{vocab} has {len(tokens)} tokens but the checkpoint's embedding has {vocab_rows} "
                         f"rows (= vocab + [DEC], [ENC]); use vocab.txt from {BERT_HUB}")
    tok = wordpiece_tokenizer(vocab, do_lower_case=True)
    tok.add_tokens(["[DEC]", "[ENC]"], special_tokens=True)
    return tok


def _cubic(x: Tensor) -> Tensor:
    """PIL's bicubic kernel (a = -0.5)."""
    a, x = -0.5, x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


@lru_cache(maxsize=16)
def _pil_weights(in_size: int, out_size: int) -> Tensor:
    """[out, in] resampling matrix of PIL's 8-bit bicubic resize, in its 22-bit fixed point (as float64
    integers): the antialiased kernel widened by the down-scale factor, normalised per output pixel."""
    scale = in_size / out_size
    widen = max(scale, 1.0)
    support = 2.0 * widen
    weights = torch.zeros(out_size, in_size, dtype=torch.float64)
    for i in range(out_size):
        center = (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        k = _cubic((torch.arange(lo, hi, dtype=torch.float64) - center + 0.5) * (1.0 / widen))
        if k.sum() != 0:
            k = k / k.sum()
        k = k * (1 << _PIL_BITS)
        # C's (int)(k - .5) / (int)(k + .5): rounds half away from zero
        weights[i, lo:hi] = torch.where(k < 0, torch.ceil(k - 0.5), torch.floor(k + 0.5))
    return weights


def _pil_round(x: Tensor) -> Tensor:
    """PIL's fixed-point sum -> 8-bit value: add half, arithmetic shift, clip."""
    return torch.floor((x + (1 << (_PIL_BITS - 1))) / (1 << _PIL_BITS)).clamp(0, 255)


def pil_bicubic_resize(levels: Tensor, height: int, width: int) -> Tensor:
    """Resize 8-bit levels [B, C, H, W] (float, integer-valued) exactly as Pillow 13's ``resize(BICUBIC)``
    does an 8-bit image: two 1-D passes, each rounded to 8 bits (float64 sums of the fixed-point products are
    exact). Pillow runs the vertical pass first when the height shrinks by more than twice as many pixels as
    the width; older Pillow always ran the horizontal one first, which differs by +-1 level then."""
    x = levels.double()
    h, w = x.shape[-2:]

    def horizontal(x: Tensor) -> Tensor:
        return _pil_round(x @ _pil_weights(w, width).to(x.device).T) if width != w else x

    def vertical(x: Tensor) -> Tensor:
        return _pil_round(_pil_weights(h, height).to(x.device) @ x) if height != h else x

    vertical_first = 0 < h - height and h - height > 2 * (w - width)
    x = horizontal(vertical(x)) if vertical_first else vertical(horizontal(x))
    return x.float()


def preprocess(images: Tensor, size: int) -> Tensor:
    """[B, 3, H, W] in [0, 1] -> CLIP-normalised [B, 3, size, size], the pixels the reference computes from
    the 8-bit image (values rounded to 1/255): torchvision's Resize(size, BICUBIC) on PIL (shorter side to
    size, longer one truncated), CenterCrop(size), ToTensor, Normalize."""
    x = (images.float().clamp(0, 1) * 255).round()
    h, w = x.shape[-2:]
    short, long = min(h, w), max(h, w)
    if short != size:
        new_long = int(size * long / short)
        x = pil_bicubic_resize(x, *((size, new_long) if h <= w else (new_long, size)))
    top = round((x.shape[-2] - size) / 2.0)
    left = round((x.shape[-1] - size) / 2.0)
    x = x[..., top:top + size, left:left + size] / 255
    mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def build(weights: str | Path | None, device: str | torch.device = "cpu") -> RewardFn:
    """Load ImageReward once; the callable maps (images [B, 3, H, W] in [0, 1], B prompts) to
    {"reward": ImageReward's normalised score [B], float32 on CPU}."""
    if weights is None:
        raise ValueError("reward 'imagereward' needs weights: pass --weights PATH on the CLI or "
                         "reward_weights: {imagereward: PATH} in the config, PATH being a folder with "
                         + _WHAT)
    files = locate_files(weights)
    model = load_model(files).to(device)
    rows = model.text.embeddings.word_embeddings.num_embeddings
    tokenizer = load_tokenizer(files.vocab, rows)
    size = model.vision.config.image_size
    dev = torch.device(device)

    @torch.inference_mode()
    def imagereward(images: Tensor, prompts: list[str] | tuple[str, ...]) -> dict[str, Tensor]:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"imagereward expects images [B, 3, H, W], got {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"imagereward got {images.shape[0]} images but {len(prompts)} prompts")
        tokens = tokenizer(list(prompts), padding="max_length", truncation=True, max_length=MAX_TOKENS,
                           return_tensors="pt")
        ids, mask = tokens["input_ids"].to(dev), tokens["attention_mask"].to(dev)
        raw = [model(preprocess(images[i:i + BATCH].to(dev), size), ids[i:i + BATCH], mask[i:i + BATCH])
               for i in range(0, images.shape[0], BATCH)]
        reward = (torch.cat(raw) - REWARD_MEAN) / REWARD_STD
        return {"reward": reward.float().cpu()}

    return imagereward
