"""OCR reward: target extraction and edit-distance arithmetic as pure functions, then the real
PP-OCRv4 models (shipped in the rapidocr wheel) reading words rendered with PIL."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from dynamic_treerpo.trainer.rewards.ocr import (
    INSTALL_HINT,
    build,
    edit_distance,
    extract_target,
    normalise_text,
    reading_order,
    text_score,
    to_bgr_uint8,
)

# ---------------------------------------------------------------- pure functions


def test_extract_target_straight_curly_and_several_spans() -> None:
    assert extract_target('a sign that says "OPEN LATE"') == "OPEN LATE"
    assert extract_target("a neon sign reading “Café 24”, night") == "Café 24"
    assert extract_target('a poster: "BIG" and "SALE" in red') == "BIG SALE"
    assert extract_target('Joe\'s diner sign, "  EAT  " on it') == "EAT"


@pytest.mark.parametrize("prompt", ["a cat on a sofa", 'a blank sign ""', 'a sign that says "OPEN'])
def test_prompt_without_quoted_text_is_a_one_line_error(prompt: str) -> None:
    with pytest.raises(ValueError, match="no text in double quotes") as err:
        extract_target(prompt)
    assert prompt in str(err.value) and "\n" not in str(err.value)


def test_normalise_text_folds_case_width_and_whitespace() -> None:
    assert normalise_text("  Open\tLATE \n") == "openlate"
    fullwidth_open = "\uff2f\uff30\uff25\uff2e\uff01"  # full-width forms the recogniser may emit
    assert normalise_text(fullwidth_open) == "open!"
    assert normalise_text("a-b.c") == "a-b.c"  # punctuation is kept


def test_edit_distance_known_values() -> None:
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("sitting", "kitten") == 3
    assert edit_distance("", "abc") == edit_distance("abc", "") == 3
    assert edit_distance("flaw", "lawn") == 2
    assert edit_distance("same", "same") == 0


def test_text_score_arithmetic() -> None:
    assert text_score("OPEN LATE", "open late") == 1.0
    assert text_score("openlate", "OPEN LATE") == 1.0  # dropped space: not an error
    assert text_score("help", "hello") == pytest.approx(1 - 2 / 5)
    assert text_score("HELLO", "hello world") == pytest.approx(1 - 5 / 10)
    assert text_score("", "hello") == 0.0
    assert text_score("a much longer wrong text", "hi") == 0.0  # clamped, never negative
    assert text_score("hello hello", "hello") == 0.0  # extra text is penalised, not ignored


def test_reading_order_top_to_bottom_then_left_to_right() -> None:
    def box(x0: float, y0: float, x1: float, y1: float) -> list[list[float]]:
        return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]

    boxes = [box(120, 62, 200, 98), box(10, 10, 90, 40), box(10, 60, 100, 100), box(100, 12, 180, 42)]
    texts = ["D", "A", "C", "B"]
    assert reading_order(boxes, texts) == "A B C D"
    assert reading_order([], []) == ""


def test_to_bgr_uint8_flips_channels_and_rounds() -> None:
    img = torch.zeros(1, 3, 2, 3)
    img[0, 0] = 1.0  # pure red in RGB
    img[0, 1, 0, 0] = 0.5
    img[0, 2, 1, 2] = float("nan")
    (arr,) = to_bgr_uint8(img)
    assert arr.shape == (2, 3, 3) and arr.dtype == np.uint8 and arr.flags.c_contiguous
    assert (arr[..., 2] == 255).all() and arr[0, 0, 1] == 128 and arr[1, 2, 0] == 0


# ---------------------------------------------------------------- real OCR


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:  # no DejaVu on this system: Pillow's built-in scalable font
        return ImageFont.load_default(size=size)


def render(lines: list[str], w: int = 256, h: int = 256, size: int = 40) -> torch.Tensor:
    """Black text lines centred on white, as a [3, H, W] float tensor in [0, 1]."""
    im = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(im)
    font = _font(size)
    step = int(size * 1.5)
    y0 = (h - step * len(lines)) / 2
    for i, line in enumerate(lines):
        left, top, right, _ = draw.textbbox((0, 0), line, font=font)
        draw.text(((w - (right - left)) / 2 - left, y0 + i * step - top), line, font=font, fill="black")
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 255.0


@pytest.fixture(scope="module")
def ocr():
    return build(None)


def test_matching_text_scores_high_and_others_low(ocr) -> None:
    images = torch.stack(
        [render(["OPEN LATE"]), render(["hello"]), render(["Coffee"]), render(["OPEN", "LATE"])]
    )
    prompts = [
        'a shop sign that says "OPEN LATE"',
        "a greeting card with “hello” written on it",
        'a mug with "Coffee"',
        'a door sign with "OPEN LATE" on two lines',
    ]
    out = ocr(images, prompts)
    assert set(out) == {"reward", "ocr_exact"}
    assert out["reward"].dtype == torch.float32 and out["reward"].shape == (4,)
    assert (out["reward"] >= 0.9).all(), (out, ocr.read(images))
    assert out["ocr_exact"].tolist() == [1.0, 1.0, 1.0, 1.0], ocr.read(images)
    swapped = ocr(images, ['"SUNSET"', '"garden"', '"RIVER"', '"station"'])  # other words, same images
    assert (swapped["reward"] < 0.5).all(), swapped
    assert swapped["ocr_exact"].sum() == 0


def test_blank_image_scores_zero(ocr) -> None:
    out = ocr(torch.ones(2, 3, 128, 128), ['"OPEN"', '"hello world"'])
    assert out["reward"].tolist() == [0.0, 0.0] and out["ocr_exact"].tolist() == [0.0, 0.0]


def test_partial_match_scores_in_between(ocr) -> None:
    # The image reads "HELLO"; the prompt wants "HELLO WORLD": distance 5 over 10 letters.
    images = torch.stack([render(["HELLO"], 512, 128, 48)])
    assert normalise_text(ocr.read(images)[0]) == "hello"
    out = ocr(images, ['a banner reading "HELLO WORLD"'])
    assert out["reward"].item() == pytest.approx(0.5) and out["ocr_exact"].item() == 0.0


def test_bad_calls_are_one_line_errors(ocr) -> None:
    images = torch.stack([render(["hello"])])
    with pytest.raises(ValueError, match="a cat without quotes") as err:
        ocr(images, ["a cat without quotes"])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="1 images but 2 prompts"):
        ocr(images, ['"a"', '"b"'])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        ocr(images[0], ['"hello"'])


# ---------------------------------------------------------------- weights folders


def _shipped() -> dict[str, Path]:
    import rapidocr_onnxruntime

    models = Path(rapidocr_onnxruntime.__file__).parent / "models"
    return {role: next(models.glob(f"*_{role}_infer.onnx")) for role in ("det", "rec", "cls")}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_weights_folder_with_paddleocr_names_is_used(tmp_path: Path) -> None:
    for role, src in _shipped().items():
        (tmp_path / f"en_PP-OCRv4_{role}_infer.onnx").symlink_to(src)
    (tmp_path / "README.txt").write_text("not a dictionary")
    fn = build(str(tmp_path))
    assert fn.engine.use_cls  # a cls file in the folder turns the angle classifier on
    assert fn(torch.stack([render(["STOP"])]), ['"STOP"'])["reward"].item() == 1.0


def test_bad_weights_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        build(str(tmp_path / "nowhere"))
    _one_line(err)
    with pytest.raises(FileNotFoundError, match=r"no \*det\*\.onnx") as err:
        build(str(tmp_path))
    _one_line(err)
    (tmp_path / "det.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "rec.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(ValueError, match="cannot load det model") as err:
        build(str(tmp_path))
    _one_line(err)
    with pytest.raises(ValueError, match="must be a folder"):
        build(str(tmp_path / "det.onnx"))
    shipped = _shipped()
    (tmp_path / "det.onnx").unlink()
    (tmp_path / "rec.onnx").unlink()
    (tmp_path / "det.onnx").symlink_to(shipped["rec"])  # swapped roles
    (tmp_path / "rec.onnx").symlink_to(shipped["det"])
    with pytest.raises(ValueError, match="does not look like a PaddleOCR det model") as err:
        build(str(tmp_path))
    _one_line(err)
    (tmp_path / "other_det.onnx").symlink_to(shipped["det"])
    with pytest.raises(ValueError, match="several det files") as err:
        build(str(tmp_path))
    _one_line(err)


def test_missing_rapidocr_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # makes the import fail
    with pytest.raises(ImportError) as err:
        build(None)
    assert INSTALL_HINT in _one_line(err)
    assert "pip install --no-deps rapidocr-onnxruntime==1.4.4" in INSTALL_HINT
