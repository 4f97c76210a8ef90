"""ImageReward on transformers 5 against the reference package's own scores.

The fixture (tests/fixtures/imagereward_tiny) is a tiny random ImageReward in the official file layout,
with the scores that image-reward 1.5 computed for it (scripts/make_imagereward_fixture.py, run with the
reference stack). Scores must agree within 1e-4; they agree to ~1e-5 on CPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from dynamic_treerpo.trainer.rewards.imagereward import build, load_tokenizer, preprocess

FIXTURE = Path(__file__).parent / "fixtures" / "imagereward_tiny"
TOL = 1e-4


def _image(name: str) -> torch.Tensor:
    """A fixture PNG as [3, H, W] in [0, 1] (exact 8-bit levels, the pixels the reference read)."""
    arr = np.asarray(Image.open(FIXTURE / name).convert("RGB"))
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reward():
    return build(str(FIXTURE))


def test_scores_match_reference(reward, expected) -> None:
    scores = torch.tensor(expected["scores"])
    assert scores.std() > 0.5, "fixture too flat to tell a wrong model from a right one"
    prompts = expected["prompts"]
    for name, row in zip(expected["images"], scores, strict=True):
        img = _image(name)  # 224x224, a down-scaled 256x320 and an up-scaled 180x150
        out = reward(img[None].expand(len(prompts), -1, -1, -1), prompts)
        assert out["reward"].dtype == torch.float32 and out["reward"].device.type == "cpu"
        assert out["reward"].shape == (len(prompts),)
        assert torch.allclose(out["reward"], row, atol=TOL, rtol=0), (name, out["reward"], row)


def test_batch_of_different_images_and_prompts(reward, expected) -> None:
    names = [n for n in expected["images"] if n.endswith("_224.png")]
    images = torch.stack([_image(n) for n in names] * 2)
    picks = [0, 1, 3, 2]  # prompt index per row
    out = reward(images, [expected["prompts"][j] for j in picks])["reward"]
    want = [expected["scores"][expected["images"].index(names[i % 2])][j] for i, j in enumerate(picks)]
    assert torch.allclose(out, torch.tensor(want), atol=TOL, rtol=0)


def test_float_images_score_as_their_8bit_version(reward, expected) -> None:
    """The reference only sees 8-bit PIL images; off-grid floats are scored as their rounded levels."""
    img = _image(expected["images"][0])
    noisy = (img + (torch.rand(img.shape, generator=torch.Generator().manual_seed(0)) - 0.5) * 0.9 / 255)
    out = reward(noisy[None].clamp(0, 1), expected["prompts"][:1])["reward"]
    assert abs(out.item() - expected["scores"][0][0]) < TOL


def test_tokenizer_matches_reference(expected) -> None:
    """Lower-casing, accent stripping, word pieces, [UNK], truncation to 35 and padding as BLIP's."""
    rows = json.loads((FIXTURE / "med_config.json").read_text())["vocab_size"]
    tok = load_tokenizer(FIXTURE / "vocab.txt", rows)
    got = tok(expected["prompts"], padding="max_length", truncation=True, max_length=35)
    assert got["input_ids"] == expected["input_ids"]
    assert got["attention_mask"] == expected["attention_mask"]


def test_preprocess_matches_torchvision_on_pil() -> None:
    """The reference transform (torchvision Resize(224, bicubic) + CenterCrop on PIL, CLIP Normalize):
    identical pixels for wide, tall (Pillow's vertical-first case), up- and down-scaled images."""
    transforms = pytest.importorskip("torchvision.transforms")
    ref = transforms.Compose([
        transforms.Resize(224, interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(224), transforms.ToTensor(),
        transforms.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ])
    sizes = [(224, 224), (256, 320), (180, 150), (600, 300), (230, 517), (97, 1000)]
    if int(PIL.__version__.split(".")[0]) >= 13:  # older Pillow always resamples columns first
        sizes.append((700, 300))
    rng = np.random.default_rng(0)
    for h, w in sizes:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = ref(Image.fromarray(arr))
        got = preprocess(torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255, 224)[0]
        assert (got - want).abs().max() < 1e-5, (h, w)


def test_bad_calls_are_one_line_errors(reward) -> None:
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        reward(torch.rand(2, 3, 224, 224), ["a cat"])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        reward(torch.rand(3, 224, 224), ["a cat"])


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ir"
    shutil.copytree(FIXTURE, dst)
    return dst


def test_tokenizer_subfolder_and_checkpoint_path(tmp_path, expected) -> None:
    root = _copy(tmp_path)
    (root / "tokenizer").mkdir()
    (root / "vocab.txt").rename(root / "tokenizer" / "vocab.txt")
    fn = build(root / "ImageReward.pt")
    out = fn(_image(expected["images"][1])[None], expected["prompts"][2:3])["reward"]
    assert abs(out.item() - expected["scores"][1][2]) < TOL


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_weights_none() -> None:
    with pytest.raises(ValueError) as exc:
        build(None)
    msg = _one_line(exc)
    assert "--weights" in msg and "reward_weights" in msg and "THUDM/ImageReward" in msg


@pytest.mark.parametrize(("missing", "hub"), [
    ("ImageReward.pt", "THUDM/ImageReward"), ("med_config.json", "THUDM/ImageReward"),
    ("vocab.txt", "bert-base-uncased"),
])
def test_missing_file(tmp_path, missing, hub) -> None:
    root = _copy(tmp_path)
    (root / missing).unlink()
    with pytest.raises(FileNotFoundError) as exc:
        build(root)
    msg = _one_line(exc)
    assert missing in msg and hub in msg


def test_missing_folder(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as exc:
        build(tmp_path / "nowhere")
    assert "nowhere" in _one_line(exc) and "ImageReward.pt" in str(exc.value)


def test_truncated_checkpoint(tmp_path) -> None:
    root = _copy(tmp_path)
    data = (root / "ImageReward.pt").read_bytes()
    (root / "ImageReward.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as exc:
        build(root)
    msg = _one_line(exc)
    assert "ImageReward.pt" in msg and "re-download" in msg


def _edit_checkpoint(root: Path, edit) -> None:
    state = torch.load(root / "ImageReward.pt", weights_only=True)
    edit(state)
    torch.save(state, root / "ImageReward.pt")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.update({"blip.itm_head.weight": torch.zeros(2, 32)}),
     "unexpected key 'blip.itm_head.weight'"),
    (lambda s: s.update({"blip.visual_encoder.head.weight": torch.zeros(2)}),
     "unexpected key 'blip.visual_encoder.head.weight'"),
    (lambda s: s.update({"blip.text_encoder.pooler.dense.weight": torch.zeros(2)}),
     "unexpected key 'blip.text_encoder.pooler.dense.weight'"),
    (lambda s: s.pop("blip.text_encoder.encoder.layer.1.crossattention.self.key.weight"),
     "missing key 'blip.text_encoder.encoder.layer.1.crossattention.self.key.weight'"),
    (lambda s: s.pop("blip.visual_encoder.blocks.1.attn.proj.bias"),
     "missing key 'blip.visual_encoder.blocks.1.attn.proj.bias'"),
    (lambda s: s.pop("mlp.layers.7.weight"), "missing key 'mlp.layers.7.weight'"),
])
def test_wrong_keys(tmp_path, edit, message) -> None:
    root = _copy(tmp_path)
    _edit_checkpoint(root, edit)
    with pytest.raises(ValueError) as exc:
        build(root)
    msg = _one_line(exc)
    assert message in msg and "not an ImageReward checkpoint" in msg


def test_not_a_state_dict(tmp_path) -> None:
    root = _copy(tmp_path)
    torch.save([torch.zeros(1)], root / "ImageReward.pt")
    with pytest.raises(ValueError, match="not an ImageReward checkpoint") as exc:
        build(root)
    _one_line(exc)


def test_config_that_does_not_fit_the_checkpoint(tmp_path) -> None:
    root = _copy(tmp_path)
    cfg = json.loads((root / "med_config.json").read_text())
    cfg["hidden_size"] = 48
    cfg["num_attention_heads"] = 3
    (root / "med_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "med_config.json" in _one_line(exc)
    (root / "med_config.json").write_text("{not json")
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "med_config.json" in _one_line(exc)


def test_wrong_vocab(tmp_path) -> None:
    root = _copy(tmp_path)
    with (root / "vocab.txt").open("a", encoding="utf-8") as f:
        f.write("extra\n")
    with pytest.raises(ValueError) as exc:
        build(root)
    msg = _one_line(exc)
    assert "vocab.txt" in msg and "bert-base-uncased" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scores_match_reference_on_cuda(expected, monkeypatch) -> None:
    """Exact-arithmetic check: cuDNN's default TF32 convolutions move this deliberately sensitive tiny
    model's scores by ~3e-3 (the patch embedding), so the test turns them off."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    fn = build(str(FIXTURE), device="cuda")
    prompts = expected["prompts"]
    for name, row in zip(expected["images"], expected["scores"], strict=True):
        img = _image(name).cuda()
        out = fn(img[None].expand(len(prompts), -1, -1, -1), prompts)["reward"]
        assert out.device.type == "cpu"
        assert torch.allclose(out, torch.tensor(row), atol=TOL, rtol=0), (name, out, row)
