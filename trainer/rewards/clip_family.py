"""CLIP-family rewards: ``clip`` and ``pickscore`` on a transformers CLIPModel, ``hps-v2.1`` on open_clip.

Weights (``weights`` argument of the builders; ``--weights PATH`` / ``reward_weights: {name: PATH}``):

- ``clip``: a local transformers CLIP folder, e.g. a download of ``openai/clip-vit-large-patch14``:
  ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``), ``vocab.json`` + ``merges.txt`` (or
  ``tokenizer.json``) and optionally ``preprocessor_config.json``.
- ``pickscore``: a local folder of ``yuvalkirstain/PickScore_v1`` (``config.json`` + weights). Its tokenizer
  and processor files come from ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``: put them in the same folder or
  in a ``processor/`` subfolder.
- ``hps-v2.1``: ``HPS_v2.1_compressed.pt`` from the ``xswu/HPSv2`` hub repository (an open_clip ViT-H-14
  state dict), or a folder holding it. It runs on ``open_clip_torch`` (the ``hps`` extra), as HPSv2's own
  reference does: open_clip's ``CLIP`` (built from the checkpoint's tensor shapes, which give ViT-H-14 for
  the release) and its tokenizer, whose bundled BPE vocabulary is the one HPS was trained with, so
  nothing is downloaded. The ``hpsv2`` package itself is not used: it downloads ViT-H-14 on every load.

Scores (each also logs the raw cosine of the normalised embeddings: ``clip_cosine``, ``pickscore_cosine``,
``hps_cosine``):

- ``clip``: ``reward = 2.5 * cosine``, CLIPScore's weight (Hessel et al. 2021) without its clamp at 0,
  so values sit near 0.5-0.9 like our other rewards and poor samples keep their ranking for the advantage.
- ``pickscore``: ``reward = logit_scale.exp() * cosine / 26`` (Flow-GRPO's convention): PickScore is
  defined with the model's learnt temperature (~100); /26 brings the usual ~21-23 to ~0.8-0.9.
  ``pickscore_logit`` logs the undivided value papers report.
- ``hps-v2.1``: ``reward = cosine``, HPSv2's own definition (typically ~0.25-0.35).

Images go through ``clip_preprocess`` in torch on the model's device (no PIL round trip): bicubic
antialiased resize of the shortest side, centre crop, CLIP mean/std normalisation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat.transformers_api import clip_tokenizer, projected_features
from ..utils.atomic import load_state_dict_file, one_line

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's normalisation, also used by LAION models
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIPSCORE_WEIGHT = 2.5
PICKSCORE_DIVISOR = 26.0
HPS_FILE = "HPS_v2.1_compressed.pt"
LAION_H14 = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
WHERE = {
    "clip": "download a transformers CLIP repository such as openai/clip-vit-large-patch14 (config.json, "
            "model.safetensors, vocab.json, merges.txt, preprocessor_config.json)",
    "pickscore": f"download yuvalkirstain/PickScore_v1 and the tokenizer/processor files of {LAION_H14} "
                 "(into the same folder or a processor/ subfolder)",
    "hps-v2.1": f"download {HPS_FILE} from the xswu/HPSv2 hub repository",
}
HPS_NEEDS_OPEN_CLIP = "reward 'hps-v2.1' needs open_clip: pip install open_clip_torch (or .[hps])"
# open_clip checkpoints do not say their head counts: ViT-H-14's head widths (HPS v2.1), exact GELU
VISION_HEAD_WIDTH, TEXT_HEAD_WIDTH = 80, 64
IGNORED_KEYS = ("attn_mask", "visual.attn_mask")  # causal-mask buffers some versions saved; rebuilt anyway
_OPEN_CLIP_REQUIRED = ("visual.conv1.weight", "visual.positional_embedding", "visual.proj",
                       "token_embedding.weight", "positional_embedding", "text_projection", "logit_scale")


# ---------------------------------------------------------------- preprocessing


def clip_preprocess(images: Tensor, size: int, mean: Sequence[float] = CLIP_MEAN,
                    std: Sequence[float] = CLIP_STD) -> Tensor:
    """``[B, 3, H, W]`` in [0, 1] -> normalised ``[B, 3, size, size]``, as CLIP's processors do.

    Shortest side to ``size`` (long side truncated like torchvision/PIL pipelines), bicubic with
    antialiasing, clamped to [0, 1] (reference pipelines go through uint8 images, which clip the
    bicubic overshoot), centre crop, then ``(x - mean) / std``. Stays on the input's device and dtype.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W], got {tuple(images.shape)}")
    x = images.float().clamp(0, 1)
    h, w = x.shape[-2:]
    if (h, w) != (size, size):
        short, long = min(h, w), max(h, w)
        new_long = int(size * long / short)
        new_hw = (size, new_long) if h <= w else (new_long, size)
        if new_hw != (h, w):
            x = F.interpolate(x, size=new_hw, mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
        top, left = round((x.shape[-2] - size) / 2), round((x.shape[-1] - size) / 2)
        x = x[..., top: top + size, left: left + size]
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return ((x - m) / s).to(images.dtype if images.is_floating_point() else torch.float32)


# ---------------------------------------------------------------- the reward callable


class ClipReward:
    """``fn(images, prompts) -> {"reward", "<name>_cosine", ...}``: one CLIPModel, a tokenizer, a scale.

    Prompts repeated in a batch (a GRPO group) are encoded once; images go through the image tower
    in chunks of ``batch_size`` to bound memory.
    """

    def __init__(self, name: str, model, tokenizer, scale: Callable[[Tensor, Tensor], dict[str, Tensor]],
                 mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD,
                 clean_text: Callable[[str], str] | None = None, batch_size: int = 32):
        self.name, self.model, self.tokenizer, self.scale = name, model, tokenizer, scale
        self.mean, self.std = tuple(mean), tuple(std)
        self.clean_text, self.batch_size = clean_text, batch_size
        self.image_size = int(model.config.vision_config.image_size)
        self.max_length = int(model.config.text_config.max_position_embeddings)

    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    @torch.inference_mode()
    def encode_images(self, images: Tensor) -> Tensor:
        """Unit-norm image embeddings ``[B, D]`` of images in [0, 1]."""
        dtype = self.model.logit_scale.dtype
        feats = []
        for chunk in images.split(self.batch_size):
            pix = clip_preprocess(chunk.to(self.device), self.image_size, self.mean, self.std).to(dtype)
            feats.append(self._image_features(pix))
        return F.normalize(torch.cat(feats).float(), dim=-1)

    def _image_features(self, pixels: Tensor) -> Tensor:
        return projected_features(self.model.get_image_features(pixel_values=pixels))

    def _text_features(self, tokens: dict[str, Tensor]) -> Tensor:
        return projected_features(self.model.get_text_features(input_ids=tokens["input_ids"],
                                                               attention_mask=tokens["attention_mask"]))

    def tokenize(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """Token ids and attention mask, truncated to the model's context (end-of-text token kept).

        ``split_special_tokens``: a prompt is text, so a literal ``<|endoftext|>`` in it is spelt out
        (as open_clip does) rather than ending the prompt early.
        """
        texts = [self.clean_text(p) for p in prompts] if self.clean_text else list(prompts)
        return self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                              split_special_tokens=True, return_tensors="pt")

    @torch.inference_mode()
    def encode_texts(self, prompts: Sequence[str]) -> Tensor:
        """Unit-norm text embeddings ``[N, D]``."""
        tok = {k: v.to(self.device) for k, v in self.tokenize(prompts).items()}
        return F.normalize(self._text_features(tok).float(), dim=-1)

    @torch.inference_mode()
    def __call__(self, images: Tensor, prompts: Sequence[str]) -> dict[str, Tensor]:
        if images.ndim != 4 or len(prompts) != images.shape[0]:
            raise ValueError(f"{self.name}: expected [B, 3, H, W] images and B prompts, got "
                             f"{tuple(images.shape)} and {len(prompts)} prompts")
        index = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
        text = self.encode_texts(list(index))[torch.tensor([index[p] for p in prompts], device=self.device)]
        cos = (self.encode_images(images) * text).sum(-1)
        out = {f"{self.name}_cosine": cos, **self.scale(cos, self.model.logit_scale.float().exp())}
        return {k: v.float().cpu() for k, v in out.items()}


def _clip_scale(cos: Tensor, _temp: Tensor) -> dict[str, Tensor]:
    return {"reward": CLIPSCORE_WEIGHT * cos}


def _pickscore_scale(cos: Tensor, temp: Tensor) -> dict[str, Tensor]:
    logit = temp * cos
    return {"reward": logit / PICKSCORE_DIVISOR, "pickscore_logit": logit}


def _hps_scale(cos: Tensor, _temp: Tensor) -> dict[str, Tensor]:
    return {"reward": cos}


class OpenClipReward(ClipReward):
    """``ClipReward`` on an open_clip ``CLIP`` and open_clip's tokenizer (HPSv2's reference runtime).

    Features are ``encode_image`` / ``encode_text`` of the model, as HPSv2 scores them; the tokenizer
    does open_clip's prompt cleaning (ftfy, HTML unescape, spaces) and truncates keeping end-of-text.
    """

    def __init__(self, name: str, model, tokenizer, scale: Callable[[Tensor, Tensor], dict[str, Tensor]],
                 batch_size: int = 32):
        self.name, self.model, self.tokenizer, self.scale = name, model, tokenizer, scale
        self.mean, self.std, self.clean_text, self.batch_size = CLIP_MEAN, CLIP_STD, None, batch_size
        self.image_size = int(model.visual.image_size[0])
        self.max_length = int(model.context_length)

    def tokenize(self, prompts: Sequence[str]) -> dict[str, Tensor]:
        """Token ids ``[N, context]`` (padded with 0 after the end-of-text token, as open_clip does)."""
        return {"input_ids": self.tokenizer(list(prompts))}

    def _image_features(self, pixels: Tensor) -> Tensor:
        return self.model.encode_image(pixels)

    def _text_features(self, tokens: dict[str, Tensor]) -> Tensor:
        return self.model.encode_text(tokens["input_ids"])


# ---------------------------------------------------------------- loading helpers


def load_safetensors_file(path: Path) -> dict[str, Tensor]:
    """All tensors of a ``.safetensors`` file; a corrupt or truncated file is a one-line ValueError."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:
        raise ValueError(f"cannot read weights {path} (corrupt or truncated safetensors): "
                         f"{one_line(exc)}") from None


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


def _need_weights(name: str, weights: str | Path | None) -> Path:
    if weights is None:
        raise ValueError(f"reward {name!r} needs weights: pass --weights PATH on the CLI or "
                         f"reward_weights: {{{name}: PATH}} in the config; {WHERE[name]}")
    path = Path(weights).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{name} weights not found: {path}; {WHERE[name]}")
    return path


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (
        (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())


def _load_tokenizer(source: Path, where: str, eos_id: int, vocab_size: int):
    """CLIP's tokenizer from a folder; checks it fits the model."""
    try:
        tok = clip_tokenizer(source)
    except Exception as exc:
        raise ValueError(f"cannot load the tokenizer from {where}: {one_line(exc)}") from None
    if tok.eos_token_id != eos_id or len(tok) > vocab_size:
        raise ValueError(f"the tokenizer in {where} does not fit the model (end-of-text id "
                         f"{tok.eos_token_id}, {len(tok)} tokens; the model expects id {eos_id}, "
                         f"at most {vocab_size} tokens)")
    return tok


def _pooled_eos(text_config) -> int:
    """The end-of-text id the text tower pools at (``eos_token_id == 2`` is transformers' legacy flag
    for "the highest id in the sequence", which is the end-of-text token, the last of the vocabulary)."""
    eos = int(text_config.eos_token_id)
    return int(text_config.vocab_size) - 1 if eos == 2 else eos


def _processor_stats(folders: Sequence[Path]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``image_mean``/``image_std`` of the first ``preprocessor_config.json`` found, else CLIP's."""
    for folder in folders:
        cfg_file = folder / "preprocessor_config.json"
        if cfg_file.is_file():
            try:
                cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
                mean = tuple(map(float, cfg.get("image_mean", CLIP_MEAN)))
                std = tuple(map(float, cfg.get("image_std", CLIP_STD)))
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"cannot read {cfg_file}: {one_line(exc)}") from None
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ValueError(f"{cfg_file}: image_mean/image_std must be 3 values (std > 0)")
            return mean, std
    return CLIP_MEAN, CLIP_STD


def _read_hf_weights(folder: Path, name: str) -> tuple[dict[str, Tensor], Path]:
    """The state dict of a transformers folder: ``model.safetensors``, a sharded index, or a ``.bin``."""
    single, index, binary = folder / "model.safetensors", folder / "model.safetensors.index.json", \
        folder / "pytorch_model.bin"
    if single.is_file():
        return load_safetensors_file(single), single
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read {index}: {one_line(exc)}") from None
        sd: dict[str, Tensor] = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{name}: shard {folder / shard} listed in {index} is missing")
            sd.update(load_safetensors_file(folder / shard))
        return sd, index
    if binary.is_file():
        return load_state_dict_file(binary), binary
    raise FileNotFoundError(f"{name}: no model.safetensors or pytorch_model.bin in {folder}; {WHERE[name]}")


def read_hf_clip_config(folder: Path, name: str):
    """The ``CLIPConfig`` of a transformers folder; checked before any weights are read."""
    from transformers import CLIPConfig

    if not folder.is_dir():
        raise ValueError(f"{name} weights must be a folder (config.json + model.safetensors), "
                         f"got the file {folder}; {WHERE[name]}")
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{name}: no config.json in {folder}; {WHERE[name]}")
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"cannot read {cfg_file}: {one_line(exc)}") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "clip":
        kind = raw.get("model_type") if isinstance(raw, dict) else None
        raise ValueError(f"{cfg_file} is not a CLIP model config (model_type {kind!r}, expected 'clip'); "
                         f"{WHERE[name]}")
    try:
        return CLIPConfig.from_dict(raw)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"cannot use {cfg_file}: {one_line(exc)}") from None


def load_hf_clip(folder: Path, name: str, config, dtype: torch.dtype = torch.float32):
    """A transformers CLIPModel from a local folder, built on the meta device and filled strictly."""
    sd, source = _read_hf_weights(folder, name)
    return clip_model_from_state_dict(config, sd, dtype, source)


def _finish(reward: ClipReward, device: str | torch.device) -> ClipReward:
    reward.model.to(torch.device(device))
    return reward


# ---------------------------------------------------------------- builders


def _tokenizer_dir(name: str, folders: Sequence[Path], where: str) -> Path:
    found = next((d for d in folders if _has_tokenizer(d)), None)
    if found is None:
        raise FileNotFoundError(f"{name}: no tokenizer files (vocab.json + merges.txt, or tokenizer.json) in "
                                f"{' or '.join(map(str, folders))}; {where}")
    return found


def build_clip(weights: str | Path | None, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> ClipReward:
    """``clip`` reward from a transformers CLIP folder (tokenizer files in the same folder)."""
    folder = _need_weights("clip", weights)
    config = read_hf_clip_config(folder, "clip")
    tok_dir = _tokenizer_dir("clip", [folder], WHERE["clip"])
    tc = config.text_config
    tok = _load_tokenizer(tok_dir, str(tok_dir), _pooled_eos(tc), tc.vocab_size)
    mean, std = _processor_stats([folder])
    model = load_hf_clip(folder, "clip", config, dtype)
    return _finish(ClipReward("clip", model, tok, _clip_scale, mean, std), device)


def build_pickscore(weights: str | Path | None, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> ClipReward:
    """``pickscore`` reward from a PickScore_v1 folder; processor files in it or in ``processor/``."""
    folder = _need_weights("pickscore", weights)
    config = read_hf_clip_config(folder, "pickscore")
    proc = _tokenizer_dir("pickscore", [folder, folder / "processor"], f"get them from {LAION_H14}")
    tc = config.text_config
    tok = _load_tokenizer(proc, str(proc), _pooled_eos(tc), tc.vocab_size)
    mean, std = _processor_stats([proc, folder])
    model = load_hf_clip(folder, "pickscore", config, dtype)
    return _finish(ClipReward("pickscore", model, tok, _pickscore_scale, mean, std), device)


def _hps_checkpoint(path: Path) -> Path:
    if path.is_file():
        return path
    if (path / HPS_FILE).is_file():
        return path / HPS_FILE
    found = sorted(path.glob("*.pt"))
    if len(found) == 1:
        return found[0]
    what = "several .pt files" if found else "no .pt file"
    raise FileNotFoundError(f"hps-v2.1: {what} and no {HPS_FILE} in {path}; {WHERE['hps-v2.1']}")


def _import_open_clip():
    try:
        import open_clip
    except ImportError:
        raise ImportError(HPS_NEEDS_OPEN_CLIP) from None
    return open_clip


def _count_blocks(sd: dict[str, Tensor], prefix: str) -> int:
    ids = {int(k[len(prefix):].split(".", 1)[0]) for k in sd if k.startswith(prefix)}
    if not ids or ids != set(range(len(ids))):
        raise ValueError(f"transformer blocks under {prefix!r} are missing or not numbered 0..n-1")
    return len(ids)


def open_clip_cfg(sd: dict[str, Tensor]) -> dict:
    """Keyword arguments of open_clip's ``CLIP`` for an open_clip ViT state dict, read from its shapes.

    Head counts follow ViT-H-14's head widths (80 image, 64 text): the HPS v2.1 release gives exactly
    open_clip's ``ViT-H-14`` config, and tiny test checkpoints built with those head widths load too.
    """
    missing = [k for k in _OPEN_CLIP_REQUIRED if k not in sd]
    if missing:
        raise ValueError(f"not an open_clip CLIP checkpoint: missing {', '.join(missing[:4])}")
    conv, pos = sd["visual.conv1.weight"], sd["visual.positional_embedding"].shape[0]
    v_width, patch = conv.shape[0], conv.shape[-1]
    grid = round((pos - 1) ** 0.5)
    if conv.shape[-2] != patch or grid * grid + 1 != pos:
        raise ValueError("unsupported open_clip image tower: non-square patches or position grid")
    t_ctx, t_width = sd["positional_embedding"].shape
    for tower, width, head in (("image", v_width, VISION_HEAD_WIDTH), ("text", t_width, TEXT_HEAD_WIDTH)):
        if width % head:
            raise ValueError(f"{tower} tower width {width} is not a multiple of the ViT-H-14 head width "
                             f"{head}; only ViT-H-14-style open_clip checkpoints are supported")
    vision = dict(layers=_count_blocks(sd, "visual.transformer.resblocks."), width=v_width,
                  head_width=VISION_HEAD_WIDTH, patch_size=patch, image_size=patch * grid,
                  mlp_ratio=sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / v_width)
    text = dict(context_length=t_ctx, vocab_size=sd["token_embedding.weight"].shape[0], width=t_width,
                heads=t_width // TEXT_HEAD_WIDTH, layers=_count_blocks(sd, "transformer.resblocks."),
                mlp_ratio=sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / t_width)
    return {"embed_dim": sd["text_projection"].shape[1], "vision_cfg": vision, "text_cfg": text}


def open_clip_model_from_state_dict(open_clip, sd: dict[str, Tensor], dtype: torch.dtype, source: Path):
    """open_clip's ``CLIP`` (exact GELU, as HPSv2 builds it) on the meta device, filled strictly with ``sd``.

    A tensor the model lacks (layer scale, attentional pooling, ...) or one it misses is a one-line
    ValueError naming ``source``, never a silently different architecture.
    """
    sd = {k: v for k, v in sd.items() if k not in IGNORED_KEYS}
    with torch.device("meta"):
        model = open_clip.CLIP(**open_clip_cfg(sd), quick_gelu=False)
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        what = (f"missing {', '.join(missing[:3])}" if missing else "") + (
            f"{'; ' if missing else ''}unexpected tensors {', '.join(unexpected[:3])}" if unexpected else "")
        raise ValueError(f"{source}: unsupported open_clip checkpoint: {what}")
    if sd["logit_scale"].numel() == 1:
        sd["logit_scale"] = sd["logit_scale"].reshape(expected["logit_scale"].shape)
    bad = [k for k, v in expected.items() if tuple(v.shape) != tuple(sd[k].shape)]
    if bad:
        raise ValueError(f"{source}: tensor {bad[0]} has shape {tuple(sd[bad[0]].shape)}, "
                         f"the model expects {tuple(expected[bad[0]].shape)}")
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()},
                          strict=True, assign=True)
    ctx = model.context_length  # the causal mask is a non-persistent buffer: built here, as open_clip does
    model.attn_mask = torch.full((ctx, ctx), float("-inf")).triu_(1)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{source}: tensors left uninitialised after loading: {', '.join(left[:3])}")
    return model.eval().requires_grad_(False)


def build_hps(weights: str | Path | None, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> ClipReward:
    """``hps-v2.1`` reward: the open_clip checkpoint on open_clip, scored as HPSv2 does (cosine)."""
    ckpt = _hps_checkpoint(_need_weights("hps-v2.1", weights))
    open_clip = _import_open_clip()
    try:
        model = open_clip_model_from_state_dict(open_clip, load_state_dict_file(ckpt), dtype, ckpt)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        msg = one_line(exc, 300)
        raise ValueError(msg if str(ckpt) in msg else f"{ckpt}: {msg}") from None
    tok = open_clip.tokenizer.SimpleTokenizer(context_length=model.context_length)
    return _finish(OpenClipReward("hps", model, tok, _hps_scale), device)


BUILDERS: dict[str, Callable[..., ClipReward]] = {
    "clip": build_clip,
    "pickscore": build_pickscore,
    "hps-v2.1": build_hps,
}
"""Registry name -> ``build(weights, device)``."""
