"""Atomic writes: the target is either the old file or the new one, and no temp files linger."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from dynamic_treerpo.trainer.utils.atomic import (
    atomic_path,
    atomic_save_safetensors,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_text,
    safe_torch_load,
)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_writes_create_parents_and_replace_contents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "note.txt"
    atomic_write_text(target, "first\n")
    atomic_write_text(target, "héllo\nsecond\n")
    assert target.read_bytes() == "héllo\nsecond\n".encode()
    atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["note.txt"]


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_new_files_get_normal_permissions(tmp_path: Path) -> None:
    target = tmp_path / "w.bin"
    atomic_write_bytes(target, b"x")
    assert target.stat().st_mode & 0o777 == 0o666 & ~_current_umask()


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failure_midway_keeps_old_file_and_leaves_no_temp(tmp_path: Path, error: BaseException) -> None:
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"old contents")
    with pytest.raises(type(error)), atomic_path(target) as tmp:
        tmp.write_bytes(b"new contents, half")
        assert target.read_bytes() == b"old contents"  # nothing visible until the end
        raise error
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_failure_on_a_new_file_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError), atomic_path(tmp_path / "sub" / "x.yaml") as tmp:
        tmp.write_text("partial")
        raise ValueError("boom")
    assert list((tmp_path / "sub").iterdir()) == []


def test_temp_path_keeps_the_suffix_so_writers_can_sniff_the_format(tmp_path: Path) -> None:
    target = tmp_path / "img.png"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp != target
        Image.new("RGB", (3, 2), "red").save(tmp)  # PIL picks the format from the extension
    with Image.open(target) as img:
        assert img.format == "PNG" and img.size == (3, 2)


def test_safetensors_round_trip_with_metadata(tmp_path: Path) -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"lora.a": base.t(), "lora.b": torch.ones(2, dtype=torch.bfloat16)}  # .t() is a view
    path = tmp_path / "ckpt" / "lora.safetensors"
    atomic_save_safetensors(tensors, path, metadata={"iteration": "7"})
    loaded = load_file(path)
    assert torch.equal(loaded["lora.a"], base.t()) and loaded["lora.b"].dtype == torch.bfloat16
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"iteration": "7"}


def test_torch_state_round_trips_through_safe_load(tmp_path: Path) -> None:
    # The shape of an AdamW state_dict (building a real optimizer costs seconds of imports).
    optimizer = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]}
    state = {"optimizer": optimizer, "rng": torch.get_rng_state(), "iteration": 5}
    path = tmp_path / "state.pt"
    atomic_torch_save(state, path)
    loaded = safe_torch_load(path)
    assert loaded["iteration"] == 5 and torch.equal(loaded["rng"], state["rng"])
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], optimizer["state"][0]["exp_avg"])
    assert loaded["optimizer"]["param_groups"] == optimizer["param_groups"]


class _Exploit:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)


def test_safe_load_refuses_a_pickle_that_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"weights": torch.zeros(1), "payload": _Exploit(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):
        safe_torch_load(path)
    assert not marker.exists()
    # Control: the file really is an exploit when loaded unsafely.
    torch.load(path, weights_only=False)
    assert marker.read_text() == "pwned"
