"""OCR reward for text rendering: how closely the text read from an image matches the quoted text
of its prompt (the task of Flow-GRPO's OCR experiments), using RapidOCR's PP-OCRv4 ONNX models.

Target: the prompt's text inside double quotes, straight ``"..."`` or curly ``“...”``; several
quoted spans are joined with a space (``a sign that says "OPEN" and "LATE"`` -> ``OPEN LATE``).
A prompt without quoted text is a ValueError naming the prompt: it is almost always a prompt-file
mistake, and scoring it 0 would silently train on noise.

Reading: the full detect -> recognise pipeline (generated images put text anywhere), no angle
classifier unless the weights folder holds one (generated text is upright, and it costs time).
Detected lines are joined with spaces in reading order (top-to-bottom, then left-to-right).

Normalisation, applied to both texts before comparing: Unicode NFKC (the recogniser's alphabet
includes full-width forms), case-folding, and removal of ALL whitespace -- PP-OCR often drops or
invents the space between words in one box, and the same text split over two lines must match.
Punctuation is kept: it is part of what the prompt asks to render.

    reward    = max(0, 1 - levenshtein(read, target) / len(target))   (normalised strings)
    ocr_exact = 1.0 if read == target else 0.0

Unlike Flow-GRPO, reading a substring of the target earns no full credit, and extra text is
penalised as insertions (otherwise an empty read or a wall of letters would be rewarded).

Weights: ``None`` uses the models shipped inside the ``rapidocr-onnxruntime`` wheel (Apache-2.0).
A folder may hold other PaddleOCR ONNX exports (e.g. the English PP-OCR models from RapidOCR's
model list); files are recognised by a ``det``/``rec``/``cls`` word in the name, split on ``_-.``:
    *det*.onnx   text detector (required, exactly one), e.g. ``en_PP-OCRv3_det_infer.onnx``
    *rec*.onnx   text recogniser (required, exactly one), e.g. ``en_PP-OCRv4_rec_infer.onnx``
    *cls*.onnx   optional 0/180-degree classifier; when present it is used
    *dict*.txt or *keys*.txt   the recogniser's character list, one per line; needed only when
                 the rec model has no embedded ``character`` metadata
The engine runs on CPU with onnxruntime whatever ``device`` is (images are copied to the host).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

INSTALL_HINT = (
    "pip install --no-deps rapidocr-onnxruntime==1.4.4 && "
    "pip install onnxruntime opencv-python-headless pyclipper shapely pyyaml pillow"
)
MODELS_HINT = "https://rapidai.github.io/RapidOCRDocs/ (model list)"
# PaddleOCR's own detector default: images up to 960 px are detected at native size, larger ones
# shrink. RapidOCR's default ("min side at least 736") upscales every 512 px image: several times the
# time on CPU, and more errors on wide images in our checks.
DET_LIMIT_TYPE, DET_LIMIT_SIDE = "max", 960
TEXT_SCORE = 0.5  # recognitions below this confidence are dropped (RapidOCR's default)
_QUOTED = re.compile(r'["“”]([^"“”]*)["“”]')
_ROLES = ("det", "rec", "cls")


# ---------------------------------------------------------------- text


def extract_target(prompt: str) -> str:
    """The text a prompt asks to render: its double-quoted spans joined with a space."""
    spans = [s.strip() for s in _QUOTED.findall(prompt)]
    target = " ".join(s for s in spans if s)
    if not normalise_text(target):
        shown = prompt if len(prompt) <= 80 else prompt[:77] + "..."
        raise ValueError(f'ocr reward: prompt has no text in double quotes to render: "{shown}"')
    return target


def normalise_text(text: str) -> str:
    """NFKC, case-folded, all whitespace removed (see the module docstring for why)."""
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insert, delete, substitute), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_score(read: str, target: str) -> float:
    """max(0, 1 - edit distance / target length) on normalised texts; target must be non-empty."""
    r, t = normalise_text(read), normalise_text(target)
    if not t:
        raise ValueError("ocr reward: empty target text")
    return max(0.0, 1.0 - edit_distance(r, t) / len(t))


def reading_order(boxes: Sequence[Any], texts: Sequence[str]) -> str:
    """Join box texts top-to-bottom, left-to-right; boxes are 4x2 corner arrays (x, y).

    A box joins the current line when its vertical centre lies within half a box height of the
    line's centre, so slightly tilted or uneven boxes of one line stay together.
    """
    items = []
    for box, text in zip(boxes, texts, strict=True):
        pts = np.asarray(box, dtype=np.float64).reshape(-1, 2)
        top, bottom = pts[:, 1].min(), pts[:, 1].max()
        items.append(((top + bottom) / 2, max(bottom - top, 1.0), pts[:, 0].min(), text))
    items.sort(key=lambda it: (it[0], it[2]))
    lines: list[list[tuple[float, float, float, str]]] = []
    for it in items:
        if lines:
            line = lines[-1]
            cy = sum(x[0] for x in line) / len(line)
            if abs(it[0] - cy) <= 0.5 * min(it[1], min(x[1] for x in line)):
                line.append(it)
                continue
        lines.append([it])
    return " ".join(it[3] for line in lines for it in sorted(line, key=lambda x: x[2]))


# ---------------------------------------------------------------- weights


def _role_files(folder: Path) -> dict[str, Path]:
    """det/rec(/cls/keys) files of a user folder; a missing or ambiguous one is a one-line error."""
    found: dict[str, list[Path]] = {r: [] for r in (*_ROLES, "keys")}
    for p in sorted(folder.iterdir()):
        words = set(re.split(r"[_\-.]+", p.stem.lower()))
        suffix = p.suffix.lower()
        for role in _ROLES:
            if suffix == ".onnx" and role in words:
                found[role].append(p)
        if suffix == ".txt" and words & {"dict", "keys"}:
            found["keys"].append(p)
    for role, pattern in (("det", "*det*.onnx"), ("rec", "*rec*.onnx")):
        if not found[role]:
            raise FileNotFoundError(
                f"ocr reward: no {pattern} in {folder}; give a folder with PaddleOCR det/rec ONNX "
                f"files (from {MODELS_HINT}) or omit the weights to use the models shipped with rapidocr"
            )
    out = {}
    for role, paths in found.items():
        if len(paths) > 1:
            names = ", ".join(p.name for p in paths)
            raise ValueError(f"ocr reward: several {role} files in {folder} ({names}); keep one")
        if paths:
            out[role] = paths[0]
    return out


def _check_model(path: Path, role: str, out_rank: int) -> bool:
    """Open one ONNX file; True if it embeds a character list. Wrong files fail in one line."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own pybind types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"ocr reward: cannot load {role} model {path}: {first}") from None
    shape = sess.get_outputs()[0].shape
    if len(shape) != out_rank:
        raise ValueError(
            f"ocr reward: {path} does not look like a PaddleOCR {role} model "
            f"(output rank {len(shape)}, expected {out_rank}); check the det/rec/cls names"
        )
    return "character" in sess.get_modelmeta().custom_metadata_map


def _engine_kwargs(weights: str | None) -> dict[str, Any]:
    threads = max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    kw: dict[str, Any] = {
        "text_score": TEXT_SCORE,
        "use_cls": False,
        "det_limit_type": DET_LIMIT_TYPE,
        "det_limit_side_len": DET_LIMIT_SIDE,
        "intra_op_num_threads": threads,  # follow torch's budget instead of grabbing every core
        "inter_op_num_threads": 1,
    }
    if weights is None:
        return kw
    folder = Path(weights).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"ocr reward: weights folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"ocr reward: weights must be a folder of det/rec ONNX files, got file {folder}")
    files = _role_files(folder)
    _check_model(files["det"], "det", 4)
    if not _check_model(files["rec"], "rec", 3) and "keys" not in files:
        raise FileNotFoundError(
            f"ocr reward: {files['rec'].name} has no embedded character list; put its dictionary "
            f"(*dict*.txt or *keys*.txt, e.g. en_dict.txt from PaddleOCR) in {folder}"
        )
    kw["det_model_path"] = str(files["det"])
    kw["rec_model_path"] = str(files["rec"])
    if "keys" in files:
        kw["rec_keys_path"] = str(files["keys"])
    if "cls" in files:
        _check_model(files["cls"], "cls", 2)
        kw["cls_model_path"] = str(files["cls"])
        kw["use_cls"] = True
    return kw


# ---------------------------------------------------------------- reward


def to_bgr_uint8(images: torch.Tensor) -> list[np.ndarray]:
    """[B, 3, H, W] floats in [0, 1] (RGB) -> B contiguous HxWx3 uint8 BGR arrays.

    PaddleOCR models were trained on cv2.imread (BGR) input, and RapidOCR passes arrays through
    unchanged (it converts only PIL/file inputs), so the channel flip is ours to do.
    """
    x = torch.nan_to_num(images.detach().to("cpu", torch.float32), nan=0.0).clamp(0.0, 1.0)
    arr = (x * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [np.ascontiguousarray(a[..., ::-1]) for a in arr]


class OcrReward:
    """Holds one RapidOCR engine (models load once); call it as ``fn(images, prompts)``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def read(self, images: torch.Tensor) -> list[str]:
        """The text read from each image, lines in reading order joined with spaces."""
        out = []
        for img in to_bgr_uint8(images):
            result, _ = self.engine(img)
            if not result:
                out.append("")
                continue
            out.append(reading_order([r[0] for r in result], [r[1] for r in result]))
        return out

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"ocr reward: expected images [B, 3, H, W], got {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"ocr reward: {images.shape[0]} images but {len(prompts)} prompts")
        targets = [normalise_text(extract_target(p)) for p in prompts]  # fail before any OCR work
        reads = [normalise_text(t) for t in self.read(images)]
        reward = [text_score(r, t) for r, t in zip(reads, targets, strict=True)]
        exact = [float(r == t) for r, t in zip(reads, targets, strict=True)]
        return {
            "reward": torch.tensor(reward, dtype=torch.float32),
            "ocr_exact": torch.tensor(exact, dtype=torch.float32),
        }


def build(weights: str | None = None, device: str | torch.device = "cpu") -> OcrReward:
    """Load the OCR engine once. ``weights``: None (models shipped in the rapidocr wheel) or a
    folder of PaddleOCR ONNX files (see module docstring). ``device`` is accepted for the common
    reward interface; the OCR runs on CPU."""
    del device
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as exc:
        raise ImportError(f"ocr reward needs rapidocr-onnxruntime ({exc}); install: {INSTALL_HINT}") from None
    kw = _engine_kwargs(weights)
    try:
        engine = RapidOCR(**kw)
    except Exception as exc:  # an onnxruntime/rapidocr failure the checks above did not foresee
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"ocr reward: cannot start RapidOCR with weights {weights}: {first}") from None
    return OcrReward(engine)
