"""Run logging: a crash-safe metrics CSV, TensorBoard scalars, curve plots, image grids, progress bar.

The CSV is the record a resumed run trusts: each row is fsynced, a row cut short by a kill is
dropped, and rows past the resumed checkpoint are removed atomically. Plots and grids are written
atomically too, so a viewer never sees half a PNG.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from ..utils.atomic import atomic_write_bytes, atomic_write_text

__all__ = [
    "MetricsCsv",
    "TensorBoardLogger",
    "make_progress",
    "plot_curves",
    "read_csv",
    "save_image_grid",
]


def _cell(value: Any) -> str:
    """One CSV cell: numbers to 6 significant digits, ``None`` empty, tensors/numpy scalars unwrapped."""
    if value is None:
        return ""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _complete_text(path: Path) -> str:
    """The file's text up to its last newline: a row half-written when the process died is dropped."""
    text = path.read_text(encoding="utf-8")
    return text if text.endswith("\n") else text[: text.rfind("\n") + 1]


def _csv_lines(values: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def _with_columns(text: str, columns: Sequence[str]) -> str:
    """The table ``text`` under the header ``columns`` (a superset of its own), cells kept by name
    and new columns empty, so a run folder of an earlier version resumes with no data lost."""
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    return "".join(_csv_lines(r) for r in [list(columns), *[
        [dict(zip(header, row, strict=True)).get(col, "") for col in columns] for row in body]])


class MetricsCsv:
    """Append-only metrics table with a fixed header, flushed and fsynced per row."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = tuple(columns)
        if not self.columns or len(set(self.columns)) != len(self.columns):
            raise ValueError(f"{self.path}: columns must be non-empty and unique, got {list(self.columns)}")
        if self.path.is_file() and self.path.stat().st_size > 0:
            text = _complete_text(self.path)
            header = next(csv.reader(io.StringIO(text)), [])
            if tuple(header) != self.columns and header and set(header) < set(self.columns):
                text = _with_columns(text, self.columns)  # a run of an earlier version: add the new ones
            elif tuple(header) != self.columns:
                raise ValueError(f"{self.path}: existing header {header} differs from the expected "
                                 f"{list(self.columns)}; start a new run folder or keep the same metrics")
            if text != self.path.read_text(encoding="utf-8"):
                atomic_write_text(self.path, text)  # drop a torn last row before appending after it
        else:
            atomic_write_text(self.path, _csv_lines(self.columns))

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one row; absent columns stay empty, unknown keys raise ``ValueError``."""
        unknown = [key for key in row if key not in self.columns]
        if unknown:
            raise ValueError(f"{self.path.name}: unknown column(s) {', '.join(map(str, unknown))}; "
                             f"known: {', '.join(self.columns)}")
        line = _csv_lines([_cell(row.get(col)) for col in self.columns])
        # Opened per row, so a file rewritten by truncate_after is never written through a stale handle.
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, iteration: int, column: str = "iteration") -> None:
        """Keep rows with ``column <= iteration`` (resume from a checkpoint), rewriting atomically."""
        if column not in self.columns:
            raise ValueError(f"{self.path.name}: no {column!r} column to truncate by")
        index = self.columns.index(column)
        rows = list(csv.reader(io.StringIO(_complete_text(self.path))))[1:]
        kept = [r for r in rows if len(r) == len(self.columns) and _at_most(r[index], iteration)]
        atomic_write_text(self.path, "".join(_csv_lines(r) for r in [list(self.columns), *kept]))

    def rows(self) -> list[dict[str, str]]:
        return read_csv(self.path)


def _at_most(cell: str, limit: int) -> bool:
    try:
        return float(cell) <= limit
    except ValueError:
        return False


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """All complete rows as dicts of strings (empty string for a missing value)."""
    reader = csv.DictReader(io.StringIO(_complete_text(Path(path))), restval="")
    return [{k: v for k, v in row.items() if k is not None} for row in reader]


TENSORBOARD_MISSING = ("note: tensorboard is not installed, so this run writes no TensorBoard events "
                       "(metrics.csv has every figure): pip install tensorboard")


class TensorBoardLogger:
    """Scalars to TensorBoard; flushed on every call so a crash loses nothing already logged.

    TensorBoard is an extra (``pip install dynamic-treerpo[tensorboard]``): without it the run says so
    in one line and logs to metrics.csv only.
    """

    def __init__(self, log_dir: str | os.PathLike[str], enabled: bool = True) -> None:
        """``enabled`` False (a data-parallel rank other than 0): logs nothing, writes no file."""
        self.log_dir = Path(log_dir)
        self._writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # an extra: the nodes never need it, so ComfyUI environments lack it
            print(TENSORBOARD_MISSING, file=sys.stderr)
            return
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log every numeric value at ``step``; ``None``, strings and other values are skipped."""
        if self._writer is None:
            return
        for name, value in metrics.items():
            number = _number(value)
            if number is not None:
                self._writer.add_scalar(name, number, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(value: Any) -> float | None:
    if isinstance(value, Tensor):
        value = value.item() if value.numel() == 1 else None
    elif hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _points(rows: Sequence[Mapping[str, str]], x: str, y: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        try:
            px, py = float(row.get(x) or "nan"), float(row.get(y) or "nan")
        except ValueError:
            continue
        if math.isfinite(px) and math.isfinite(py):
            xs.append(px)
            ys.append(py)
    return xs, ys


def finite_numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric values of a metrics row (what TensorBoard and histories keep)."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def plot_curves(rows: Sequence[Mapping[str, str]], out_png: str | os.PathLike[str], x: str = "iteration",
                ys: Sequence[str | Sequence[str]] = ("reward_mean", "eval_reward"), title: str = "") -> None:
    """Plot columns of :func:`read_csv` rows against ``x``, one subplot per entry of ``ys``.

    An entry may be a tuple of columns to share a subplot. Empty or non-numeric cells are skipped.
    Uses the Agg canvas directly, never pyplot, so the user's matplotlib backend is left alone.
    The image is 800 px wide and 260 px high per subplot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [(y,) if isinstance(y, str) else tuple(y) for y in ys] or [()]
    fig = Figure(figsize=(8.0, 2.6 * len(groups)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0]
    for ax, group in zip(axes, groups, strict=True):
        drawn = 0
        for y in group:
            px, py = _points(rows, x, y)
            if px:
                ax.plot(px, py, label=y, marker="o" if len(px) < 40 else None, markersize=3, linewidth=1.2)
                drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_ylabel(group[0] if len(group) == 1 else "value")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel(x)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)  # fixed size whatever the user's rcParams say
    atomic_write_bytes(out_png, buf.getvalue())


def _wrap(text: str, width: int, measure: Any, max_lines: int = 2) -> list[str]:
    """Greedy word wrap to ``width`` pixels; the last line is cut with '...' if text remains."""
    lines: list[str] = []
    words = text.split()
    while words and len(lines) < max_lines:
        line = words.pop(0)
        while measure(line) > width and len(line) > 1:  # a single over-long word: split it
            cut = len(line) - 1
            while cut > 1 and measure(line[:cut]) > width:
                cut -= 1
            words.insert(0, line[cut:])
            line = line[:cut]
        while words and measure(f"{line} {words[0]}") <= width:
            line = f"{line} {words.pop(0)}"
        lines.append(line)
    if words and lines:
        last = lines[-1]
        while last and measure(last + "...") > width:
            last = last[:-1]
        lines[-1] = last + "..."
    return lines


def save_image_grid(images: Tensor, out_png: str | os.PathLike[str], nrow: int = 8, padding: int = 2,
                    captions: Sequence[str] | None = None, scale: int = 2,
                    font_size: int | None = None) -> None:
    """Save ``[N, 3, H, W]`` images in ``[0, 1]`` (clamped) as a PNG grid, ``nrow`` per row.

    Cells are upscaled ``scale`` times with nearest neighbour so tiny (64 px) samples stay
    readable; captions (one per image, up to two lines) go under each cell, in Pillow's default
    font (at ``font_size`` pixels when given: a grid shown shrunk on a node needs larger type).
    Without captions the
    size is ``cols * W * scale + (cols + 1) * padding`` by ``rows * H * scale + (rows + 1) * padding``.
    """
    from PIL import Image, ImageDraw, ImageFont

    if images.ndim == 3:
        images = images.unsqueeze(0)
    if images.ndim != 4 or images.shape[1] not in (1, 3) or images.shape[0] == 0:
        raise ValueError(f"expected images of shape [N, 3, H, W] with N > 0, got {list(images.shape)}")
    if captions is not None and len(captions) != images.shape[0]:
        raise ValueError(f"got {len(captions)} captions for {images.shape[0]} images")
    if nrow < 1 or scale < 1 or padding < 0:
        raise ValueError(f"need nrow >= 1, scale >= 1, padding >= 0; got {nrow}, {scale}, {padding}")
    pixels = images.detach().float().cpu().nan_to_num(0.0).clamp(0.0, 1.0).expand(-1, 3, -1, -1)
    pixels = (pixels * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    n, h, w = pixels.shape[0], pixels.shape[1] * scale, pixels.shape[2] * scale
    cols, rows = min(nrow, n), -(-n // min(nrow, n))

    font = ImageFont.load_default() if font_size is None else ImageFont.load_default(size=font_size)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = probe.textbbox((0, 0), "Ag", font=font)[3] + 2
    wrapped = [_wrap(str(c), w, lambda s: probe.textlength(s, font=font)) for c in captions or []]
    caption_h = max((len(lines) for lines in wrapped), default=0) * line_h
    caption_h += 2 if caption_h else 0

    sheet = Image.new("RGB", (cols * w + (cols + 1) * padding,
                              rows * (h + caption_h) + (rows + 1) * padding), "white")
    draw = ImageDraw.Draw(sheet)
    for i in range(n):
        left = padding + (i % cols) * (w + padding)
        top = padding + (i // cols) * (h + caption_h + padding)
        cell = Image.fromarray(pixels[i])
        sheet.paste(cell.resize((w, h), Image.Resampling.NEAREST) if scale > 1 else cell, (left, top))
        for j, line in enumerate(wrapped[i] if wrapped else []):
            draw.text((left, top + h + 1 + j * line_h), line, fill="black", font=font)
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    atomic_write_bytes(out_png, buf.getvalue())


def make_progress(total: int, initial: int = 0, desc: str = "train", disable: bool = False) -> tqdm:
    """A tqdm bar that resumes at ``initial`` and adapts to terminal width."""
    return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True,
                smoothing=0.1, unit="it")
