"""CLIP-family rewards on tiny random models: HPS matches open_clip's own forward (HPSv2's reference),
clip/pickscore match transformers' own CLIPModel + processor, preprocessing matches
torchvision/CLIPImageProcessor, and bad input gives one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

from dynamic_treerpo.trainer.rewards.clip_family import (
    BUILDERS,
    CLIP_MEAN,
    CLIP_STD,
    build_clip,
    build_hps,
    build_pickscore,
    clip_preprocess,
    open_clip_cfg,
)
from tests.tiny_models import tiny_hf_clip, write_small_bpe

PROMPTS = ["a red circle", "Two BLUE squares, on the left!", "a red circle"]
OC_PROMPTS = [
    "a photo of a cat &amp; a dog\u2019s  toy", "A RED square", "Café crème brûlée, 1984!!! ok?",
    "emoji 🐱🚀 and 中文", "it's they're we've", "  tabs\tand\nnewlines  ", "don\u2019t \u201cquote\u201d",
    "<|endoftext|> literal", "fish &amp;amp; chips <b>", " ".join(["word"] * 100),
]
PROC_MEAN, PROC_STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


def _single_line_error(exc_info, *parts: str) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"
    return msg


def _images(n: int, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    """Images on the uint8 grid, so a processor's uint8 round trip is exact."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255


# ---------------------------------------------------------------- tiny transformers CLIP folders


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    vocab = write_small_bpe(folder)
    tiny_hf_clip(folder, vocab, legacy_eos=False, seed=1)
    return folder


@pytest.fixture(scope="module")
def pick_dir(tmp_path_factory) -> Path:
    """PickScore layout: weights at the top, tokenizer + processor files (own mean/std) in processor/."""
    folder = tmp_path_factory.mktemp("pickscore")
    vocab = write_small_bpe(folder / "processor")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                       image_mean=PROC_MEAN, image_std=PROC_STD).save_pretrained(folder / "processor")
    tiny_hf_clip(folder, vocab, legacy_eos=True, seed=2)
    return folder


def _reference_logits(weights: Path, proc: Path, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """transformers' own path: CLIPImageProcessor on uint8 arrays + CLIPTokenizer + CLIPModel.forward."""
    model = CLIPModel.from_pretrained(weights).eval()
    tok = CLIPTokenizer.from_pretrained(proc)
    pix = CLIPImageProcessor.from_pretrained(proc) if (proc / "preprocessor_config.json").is_file() else \
        CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    arrays = [(im * 255).round().to(torch.uint8).permute(1, 2, 0).numpy() for im in images]
    inputs = tok(prompts, padding=True, return_tensors="pt")
    inputs["pixel_values"] = pix(images=arrays, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(**inputs).logits_per_image.diagonal()


def test_clip_matches_transformers_forward(clip_dir):
    images = _images(3, seed=3)
    reward = build_clip(str(clip_dir))
    out = reward(images, PROMPTS)
    temp = CLIPModel.from_pretrained(clip_dir).logit_scale.exp().item()
    cos = _reference_logits(clip_dir, clip_dir, images, PROMPTS) / temp
    assert out["reward"].shape == (3,) and out["reward"].dtype == torch.float32
    assert out["reward"].device.type == "cpu"
    assert torch.allclose(out["clip_cosine"], cos, atol=1e-5), (out["clip_cosine"], cos)
    assert torch.allclose(out["reward"], 2.5 * cos, atol=1e-5)


def test_pickscore_matches_transformers_forward(pick_dir):
    images = _images(3, seed=4)
    reward = BUILDERS["pickscore"](str(pick_dir))
    out = reward(images, PROMPTS)
    logits = _reference_logits(pick_dir, pick_dir / "processor", images, PROMPTS)
    assert torch.allclose(out["pickscore_logit"], logits, atol=1e-4), (out["pickscore_logit"], logits)
    assert torch.allclose(out["reward"], logits / 26, atol=1e-5)
    assert reward.mean == tuple(PROC_MEAN) and reward.std == tuple(PROC_STD)


def test_pickscore_without_processor_files_fails_in_one_line(pick_dir, tmp_path):
    bare = tmp_path / "pick"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((pick_dir / name).read_bytes())
    with pytest.raises(FileNotFoundError) as err:
        build_pickscore(str(bare))
    _single_line_error(err, "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", str(bare / "processor"), "vocab.json")


def test_tokenizer_that_does_not_fit_the_model_is_refused(pick_dir, tmp_path):
    folder = tmp_path / "pick"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((pick_dir / name).read_bytes())
    vocab = json.loads((pick_dir / "processor" / "vocab.json").read_text(encoding="utf-8"))
    vocab["<|endoftext|>"], vocab["<|startoftext|>"] = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_bytes((pick_dir / "processor" / "merges.txt").read_bytes())
    with pytest.raises(ValueError) as err:
        build_pickscore(str(folder))
    _single_line_error(err, "does not fit the model", str(folder))


# ---------------------------------------------------------------- preprocessing


def test_preprocess_matches_torchvision_and_clip_processor():
    tv = pytest.importorskip("torchvision.transforms.v2.functional")
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 45), torch.linspace(0, 1, 70), indexing="ij")
    smooth = torch.stack([torch.stack([yy, xx, yy * xx]), torch.stack([xx * xx, 1 - yy, xx])])  # [2,3,45,70]
    smooth = (smooth * 255).round() / 255
    ours = clip_preprocess(smooth, 32)
    assert ours.shape == (2, 3, 32, 32)
    ref = tv.resize(smooth, 32, interpolation=tv.InterpolationMode.BICUBIC, antialias=True).clamp(0, 1)
    ref = tv.normalize(tv.center_crop(ref, [32, 32]), CLIP_MEAN, CLIP_STD)
    assert (ours - ref).abs().max() < 1e-5
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    arrays = [(im * 255).round().to(torch.uint8).permute(1, 2, 0).numpy() for im in smooth]
    hf = proc(images=arrays, return_tensors="pt")["pixel_values"]
    assert (ours - hf).abs().max() < 0.03  # uint8 rounding of the resized image in the processor
    tall = clip_preprocess(smooth.transpose(-1, -2), 32)  # portrait: crop is vertical
    assert torch.allclose(tall, clip_preprocess(smooth, 32).transpose(-1, -2), atol=1e-5)


# ---------------------------------------------------------------- HPS v2.1 on open_clip


@pytest.fixture(scope="module")
def open_clip_model():
    open_clip = pytest.importorskip("open_clip")
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(5)
    # ViT-H-14's head widths (80 image, 64 text) at a tiny size: 2 heads per tower
    vision = CLIPVisionCfg(layers=2, width=160, head_width=80, patch_size=8, image_size=32)
    text = CLIPTextCfg(context_length=77, vocab_size=49408, width=128, heads=2, layers=2)
    model = CLIP(embed_dim=24, vision_cfg=vision, text_cfg=text).eval()
    with torch.no_grad():  # open_clip zero-inits some tensors; make every weight matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model, open_clip.get_tokenizer("ViT-H-14")


@pytest.fixture(scope="module")
def hps_dir(open_clip_model, tmp_path_factory) -> Path:
    """HPS layout: ``{"state_dict": {"module.<key>": tensor}}`` in fp16, alone in its folder."""
    model, _ = open_clip_model
    folder = tmp_path_factory.mktemp("hps")
    sd = {f"module.{k}": v.half() for k, v in model.state_dict().items()}  # the release is fp16
    torch.save({"state_dict": sd}, folder / "HPS_v2.1_compressed.pt")
    return folder


def test_hps_matches_open_clip(open_clip_model, hps_dir):
    """HPSv2's score: open_clip's forward (normalised features), ``diag(image @ text.T)``, on our pixels."""
    model, oc_tok = open_clip_model
    model = model.half().float()  # the checkpoint was saved in fp16: compare the same weights
    reward = build_hps(str(hps_dir))
    images = _images(3, 40, 52, seed=6)
    out = reward(images, PROMPTS)
    pixels = clip_preprocess(images, 32)
    with torch.no_grad():
        img, txt, _ = model(pixels, oc_tok(PROMPTS))
    assert (reward.encode_images(images) - img).abs().max() < 1e-5
    assert (reward.encode_texts(PROMPTS) - txt).abs().max() < 1e-5
    score = (img @ txt.T).diagonal()
    assert (out["reward"] - score).abs().max() < 1e-5
    assert torch.equal(out["reward"], out["hps_cosine"])
    assert out["reward"].shape == (3,) and out["reward"].dtype == torch.float32
    assert reward.model.visual.transformer.resblocks[0].attn.num_heads == 2
    assert reward.model.transformer.resblocks[0].attn.num_heads == 2


def test_hps_tokenisation_is_open_clips(open_clip_model, hps_dir):
    """No tokenizer files needed: open_clip's tokenizer and bundled vocabulary, truncation included."""
    expected = open_clip_model[1](OC_PROMPTS)
    ids = build_hps(str(hps_dir / "HPS_v2.1_compressed.pt")).tokenize(OC_PROMPTS)["input_ids"]
    assert torch.equal(ids, expected)
    assert ids[-1, -1] == 49407  # the long prompt is truncated, end-of-text kept


def test_hps_shape_config_is_open_clips_vit_h_14():
    """The architecture read from the release's tensor shapes is open_clip's ``ViT-H-14`` (built on meta)."""
    open_clip = pytest.importorskip("open_clip")
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    ref = open_clip.get_model_config("ViT-H-14")
    with torch.device("meta"):
        sd = open_clip.CLIP(**ref).state_dict()
    cfg = open_clip_cfg(sd)
    assert cfg["embed_dim"] == ref["embed_dim"]
    assert CLIPVisionCfg(**cfg["vision_cfg"]) == CLIPVisionCfg(**ref["vision_cfg"])
    assert CLIPTextCfg(**cfg["text_cfg"]) == CLIPTextCfg(**ref["text_cfg"])


def test_hps_without_open_clip_fails_in_one_line(hps_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "open_clip", None)  # import open_clip raises ImportError
    with pytest.raises(ImportError) as err:
        build_hps(str(hps_dir))
    assert str(err.value) == "reward 'hps-v2.1' needs open_clip: pip install open_clip_torch (or .[hps])"
    with pytest.raises(ValueError) as err:  # a missing path is still reported first, without open_clip
        build_hps(None)
    _single_line_error(err, "--weights PATH")


# ---------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("name", ["clip", "pickscore", "hps-v2.1"])
def test_missing_weights_errors(name, tmp_path):
    with pytest.raises(ValueError) as err:
        BUILDERS[name](None)
    _single_line_error(err, name, "--weights PATH", "reward_weights")
    with pytest.raises(FileNotFoundError) as err:
        BUILDERS[name](str(tmp_path / "nowhere"))
    _single_line_error(err, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as err:  # an empty folder
        BUILDERS[name](str(tmp_path))
    _single_line_error(err, str(tmp_path))


def test_corrupt_files_errors(clip_dir, hps_dir, tmp_path):
    pt = tmp_path / "hps" / "HPS_v2.1_compressed.pt"
    pt.parent.mkdir()
    data = (hps_dir / "HPS_v2.1_compressed.pt").read_bytes()
    pt.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        build_hps(str(pt))
    _single_line_error(err, str(pt), "corrupt")
    folder = tmp_path / "clip"
    folder.mkdir()
    for name in ("config.json", "vocab.json", "merges.txt"):
        (folder / name).write_bytes((clip_dir / name).read_bytes())
    data = (clip_dir / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError) as err:
        build_clip(str(folder))
    _single_line_error(err, str(folder / "model.safetensors"), "corrupt")


class _RunsCodeWhenUnpickled:
    """Unpickling this calls ``Path.touch(marker)``: a harmless stand-in for malicious code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_wrong_architecture_errors(open_clip_model, clip_dir, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"state_dict": torch.nn.Linear(4, 4).state_dict()}, other)
    with pytest.raises(ValueError) as err:
        build_hps(str(other))
    _single_line_error(err, str(other), "not an open_clip CLIP checkpoint")
    pickled = tmp_path / "pickled.pt"
    marker = tmp_path / "code-ran"
    torch.save({"state_dict": _RunsCodeWhenUnpickled(marker)}, pickled)
    with pytest.raises(ValueError) as err:
        build_hps(str(pickled))
    _single_line_error(err, str(pickled))
    assert not marker.exists()  # weights_only loading never ran the pickled call
    layer_scale = tmp_path / "ls.pt"  # an open_clip variant we would mis-load: layer scale tensors
    sd = dict(open_clip_model[0].state_dict())
    sd["transformer.resblocks.0.ls_1.gamma"] = torch.ones(128)
    torch.save(sd, layer_scale)
    with pytest.raises(ValueError) as err:
        build_hps(str(layer_scale))
    _single_line_error(err, str(layer_scale), "unexpected tensors", "ls_1.gamma")
    folder = tmp_path / "notclip"  # a CLIP config whose weights are from another model
    folder.mkdir()
    for name in ("config.json", "vocab.json", "merges.txt"):
        (folder / name).write_bytes((clip_dir / name).read_bytes())
    from safetensors.torch import save_file

    save_file(torch.nn.Linear(4, 4).state_dict(), str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        build_clip(str(folder))
    _single_line_error(err, str(folder / "model.safetensors"), "missing")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        build_clip(str(folder))
    _single_line_error(err, str(folder / "config.json"), "'bert'")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["clip", "pickscore", "hps-v2.1"])
def test_rewards_on_cuda_match_cpu(name, request):
    fixture = {"clip": "clip_dir", "pickscore": "pick_dir", "hps-v2.1": "hps_dir"}[name]
    folder = request.getfixturevalue(fixture)
    images, prompts = _images(4, 40, 36, seed=7), [*PROMPTS, "x"]
    cpu = BUILDERS[name](str(folder))(images, prompts)
    reward = BUILDERS[name](str(folder), device="cuda")
    for imgs in (images, images.cuda()):  # images may arrive on either device
        out = reward(imgs, prompts)
        assert set(out) == set(cpu)
        for key, value in out.items():
            assert value.device.type == "cpu" and value.dtype == torch.float32
            assert torch.allclose(value, cpu[key], atol=1e-4), (key, value, cpu[key])
