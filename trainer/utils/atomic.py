"""Atomic file writes: a crash or kill at any moment leaves either the old file or the new one.

Every writer goes to a temporary file in the target's folder (same file system, so ``os.replace``
is atomic), which is fsynced before the rename; the folder is fsynced after it so the rename
itself survives a power loss. A killed process can leave a stray ``.<name>.<hex>.tmp<suffix>``
file behind, never a half-written target.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "atomic_path",
    "atomic_save_safetensors",
    "atomic_torch_save",
    "atomic_write_bytes",
    "atomic_write_text",
    "load_state_dict_file",
    "one_line",
    "safe_torch_load",
]


def _fsync_file(path: Path) -> None:
    # Windows can only fsync a handle opened for writing; POSIX is happy with read-only.
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Persist a rename; best effort, since Windows and some network file systems cannot."""
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reserve_temp(path: Path) -> Path:
    """Create an empty temp file beside ``path``, keeping its suffix so format sniffing works.

    ``os.open`` with mode 0o666 lets the umask decide permissions, as a plain ``open`` would
    (``tempfile.mkstemp`` would make every checkpoint private, 0o600).
    """
    while True:
        tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return tmp


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces ``path``, on any exception it is removed.

    Parent folders are created. The target is untouched until the body finished without error.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _reserve_temp(target)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` atomically; bytes are written as-is, so line endings are the same everywhere."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_save_safetensors(tensors: Mapping[str, Tensor], path: str | os.PathLike[str],
                            metadata: Mapping[str, str] | None = None) -> None:
    """Save tensors (e.g. LoRA weights) as safetensors atomically; non-contiguous views are compacted."""
    from safetensors.torch import save_file

    flat = {name: t.detach().contiguous() for name, t in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(flat, str(tmp), metadata=dict(metadata) if metadata is not None else None)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` atomically, for optimizer and RNG state that safetensors cannot hold.

    Save only tensors, numbers, strings and containers, so :func:`safe_torch_load` can read it.
    """
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def safe_torch_load(path: str | os.PathLike[str], mmap: bool = False) -> Any:
    """Load a ``torch.save`` file onto the CPU without running pickled code (``weights_only``).

    A file that tries to build arbitrary objects raises ``pickle.UnpicklingError`` instead.
    ``mmap`` keeps a multi-GB file out of RAM until each tensor is read (zip-format files only).
    """
    return torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message squeezed to one short line, for wrapping library errors."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_state_dict_file(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """A flat ``{name: tensor}`` dict from a third-party ``.pt``/``.bin`` checkpoint, safely.

    Accepts a bare state dict or one under ``"state_dict"`` (training checkpoints); strips the
    ``module.`` prefix DataParallel adds. Truncated or foreign files are a one-line ValueError.
    """
    try:
        try:
            obj = safe_torch_load(path, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            obj = safe_torch_load(path)  # legacy (non-zip) format
    except Exception as exc:
        raise ValueError(f"cannot read checkpoint {path} (corrupt, truncated or not a plain tensor "
                         f"checkpoint): {one_line(exc)}") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"checkpoint {path} does not hold a state dict of tensors")
    return {str(k).removeprefix("module."): v for k, v in obj.items()}
