"""The pretraining script reproduces its weights from a seed, stage by stage (tiny step counts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dynamic_treerpo.trainer.embedded import pretrain as pre
from dynamic_treerpo.trainer.embedded.captions import EXACT, CaptionNoise

TINY = {"steps": 3, "refine_steps": 2, "noisy_steps": 2, "batch": 4, "warmup": 1}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "transformer" / "diffusion_pytorch_model.safetensors")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_three_stages_are_reproducible_and_resumable_from_a_saved_stage(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    pre.pretrain(tmp_path / "a", snapshot_every=100, **TINY)  # snapshots: each stage's output
    pre.pretrain(tmp_path / "b", **TINY)
    full = _weights(tmp_path / "a")
    assert _same(full, _weights(tmp_path / "b"))
    assert not _same(full, _weights(tmp_path / "a" / "stage2"))  # stage 3 trained
    # stage 3 alone, from the saved stage-2 output, gives the same weights
    pre.pretrain(tmp_path / "c", init=tmp_path / "a" / "stage2", from_stage=3, **TINY)
    assert _same(full, _weights(tmp_path / "c"))


def test_stage_three_reads_noisy_captions_and_the_others_exact_ones(monkeypatch, tmp_path: Path) -> None:
    seen: list[CaptionNoise] = []
    real = pre.train_stage

    def spy(*args, **kwargs):
        seen.append(args[-1] if len(args) > 11 else kwargs.get("noise", EXACT))
        return real(*args, **kwargs)

    monkeypatch.setattr(pre, "train_stage", spy)
    noise = CaptionNoise(0.5, 0.25, 1.0)
    pre.pretrain(tmp_path / "w", noise=noise, **TINY)
    assert seen == [EXACT, EXACT, noise]


def test_a_bad_start_stage_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start at stage 2 or 3"):
        pre.pretrain(tmp_path / "x", init=tmp_path, from_stage=1, **TINY)
