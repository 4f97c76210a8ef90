"""Run logging: metrics CSV (append, resume, torn rows), TensorBoard, plots, image grids, progress."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dynamic_treerpo.trainer.training.logs import (
    MetricsCsv,
    TensorBoardLogger,
    make_progress,
    plot_curves,
    read_csv,
    save_image_grid,
)

COLUMNS = ("iteration", "reward_mean", "eval_reward", "note")


def test_append_formats_values_and_leaves_missing_cells_empty(tmp_path: Path) -> None:
    log = MetricsCsv(tmp_path / "run" / "metrics.csv", COLUMNS)
    log.append({"iteration": 1, "reward_mean": 0.123456789, "note": "a, b"})
    log.append({"iteration": np.int64(2), "reward_mean": torch.tensor(2.5), "eval_reward": np.float32(0.25)})
    log.append({"iteration": 3, "reward_mean": None, "eval_reward": float("nan"), "note": True})
    assert read_csv(log.path) == [
        {"iteration": "1", "reward_mean": "0.123457", "eval_reward": "", "note": "a, b"},
        {"iteration": "2", "reward_mean": "2.5", "eval_reward": "0.25", "note": ""},
        {"iteration": "3", "reward_mean": "", "eval_reward": "nan", "note": "1"},
    ]
    assert log.path.read_text().splitlines()[0] == ",".join(COLUMNS)


def test_unknown_keys_are_named(tmp_path: Path) -> None:
    log = MetricsCsv(tmp_path / "m.csv", COLUMNS)
    with pytest.raises(ValueError, match="unknown column\\(s\\) rewrad_mean") as info:
        log.append({"iteration": 1, "rewrad_mean": 0.5})
    assert "\n" not in str(info.value)
    assert read_csv(log.path) == []  # nothing half-written


def test_reopening_appends_and_a_different_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    MetricsCsv(path, COLUMNS).append({"iteration": 1})
    MetricsCsv(path, COLUMNS).append({"iteration": 2})
    assert [r["iteration"] for r in read_csv(path)] == ["1", "2"]
    with pytest.raises(ValueError, match="existing header") as info:
        MetricsCsv(path, ("iteration", "loss"))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError):
        MetricsCsv(tmp_path / "dup.csv", ("a", "a"))


def test_truncate_after_keeps_rows_up_to_the_resumed_iteration(tmp_path: Path) -> None:
    log = MetricsCsv(tmp_path / "m.csv", COLUMNS)
    for i in range(1, 6):
        log.append({"iteration": i, "reward_mean": i / 10})
    log.truncate_after(3)
    log.append({"iteration": 4, "reward_mean": 9})
    assert [(r["iteration"], r["reward_mean"]) for r in read_csv(log.path)] == \
        [("1", "0.1"), ("2", "0.2"), ("3", "0.3"), ("4", "9")]
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]
    with pytest.raises(ValueError, match="'step'"):
        log.truncate_after(1, column="step")


def test_a_row_torn_by_a_crash_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    MetricsCsv(path, COLUMNS).append({"iteration": 1, "reward_mean": 0.5})
    with open(path, "a") as f:
        f.write("2,0.7")  # the process died mid-row
    assert [r["iteration"] for r in read_csv(path)] == ["1"]
    MetricsCsv(path, COLUMNS).append({"iteration": 2, "reward_mean": 0.75})
    assert [(r["iteration"], r["reward_mean"]) for r in read_csv(path)] == [("1", "0.5"), ("2", "0.75")]


def test_tensorboard_writes_scalars_and_skips_non_numbers(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLogger(tmp_path / "tb") as tb:
        tb.log(1, {"reward": 0.5, "loss": torch.tensor(2.0), "note": "x", "eval": None, "n": np.int64(3)})
        tb.log(2, {"reward": 0.75})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "n", "reward"]
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 0.5), (2, 0.75)]


def test_missing_tensorboard_is_said_in_one_line_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    with TensorBoardLogger(tmp_path / "tb") as tb:
        tb.log(1, {"reward": 0.5})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install tensorboard" in err and "metrics.csv" in err
    assert not (tmp_path / "tb").exists()


def _png(path: Path) -> tuple[int, int]:
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG"
        return img.size


def test_plot_curves_one_panel_per_group_skipping_gaps(tmp_path: Path) -> None:
    rows = [{"iteration": str(i), "reward_mean": str(i * 0.1), "eval_reward": "0.5" if i % 3 == 0 else ""}
            for i in range(1, 10)]
    rows.append({"iteration": "10", "reward_mean": "oops", "eval_reward": ""})
    out = tmp_path / "plots" / "curves.png"
    plot_curves(rows, out, title="run a")
    assert _png(out) == (800, 520)
    plot_curves(rows, out, ys=[("reward_mean", "eval_reward")])
    assert _png(out) == (800, 260)
    plot_curves([], out, ys=["loss", "kl", "clip_frac"])  # nothing logged yet: still a valid image
    assert _png(out) == (800, 780)
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]


def test_image_grid_layout_clamping_and_padding(tmp_path: Path) -> None:
    images = torch.zeros(5, 3, 8, 8)
    images[0, 0] = 2.0  # red after clamping
    images[1] = -1.0  # black after clamping
    images[2, 2] = float("nan")  # black, not an error
    out = tmp_path / "grid.png"
    save_image_grid(images, out, nrow=3, padding=2, scale=2)
    assert _png(out) == (3 * 16 + 4 * 2, 2 * 16 + 3 * 2)
    with Image.open(out) as img:
        rgb = img.convert("RGB")
        assert rgb.getpixel((2, 2)) == (255, 0, 0) and rgb.getpixel((17, 17)) == (255, 0, 0)
        assert rgb.getpixel((20, 2)) == (0, 0, 0)
        assert rgb.getpixel((0, 0)) == (255, 255, 255)  # padding
        assert rgb.getpixel((50, 30)) == (255, 255, 255)  # the empty sixth cell


def test_image_grid_captions_stay_under_their_cell(tmp_path: Path) -> None:
    images = torch.rand(2, 3, 16, 16)
    out = tmp_path / "captioned.png"
    captions = ["a photo of a cat wearing a very long hat " * 4, "x" * 200]
    save_image_grid(images, out, nrow=2, padding=4, scale=2, captions=captions)
    width, height = _png(out)
    assert width == 2 * 32 + 3 * 4 and height > 32 + 2 * 4
    with Image.open(out) as img:
        gray = np.asarray(img.convert("L"))
    caption_band = gray[4 + 32 :, :]
    assert (caption_band[:, :4] == 255).all() and (caption_band[:, 36:40] == 255).all()  # gutters clear
    assert (caption_band[:, 4:36] < 128).any() and (caption_band[:, 40:72] < 128).any()  # text drawn


def test_image_grid_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 captions for 3 images"):
        save_image_grid(torch.rand(3, 3, 4, 4), tmp_path / "g.png", captions=["a", "b"])
    with pytest.raises(ValueError, match="shape"):
        save_image_grid(torch.rand(3, 4, 4, 4), tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()


def test_make_progress_resumes_at_initial(capsys: pytest.CaptureFixture[str]) -> None:
    bar = make_progress(100, initial=40, desc="train")
    bar.update(2)
    bar.close()
    shown = capsys.readouterr().err
    assert "train:" in shown and "42/100" in shown
    quiet = make_progress(10, disable=True)
    quiet.update(1)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_a_metrics_table_of_an_earlier_version_gains_new_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    MetricsCsv(path, ("iteration", "reward_mean")).append({"iteration": 1, "reward_mean": 0.5})
    log = MetricsCsv(path, ("iteration", "reward_mean", "prm_weight"))
    log.append({"iteration": 2, "reward_mean": 0.75, "prm_weight": 0.25})
    assert path.read_text().splitlines() == ["iteration,reward_mean,prm_weight", "1,0.5,", "2,0.75,0.25"]
    with pytest.raises(ValueError, match="differs from the expected"):
        MetricsCsv(path, ("iteration", "other"))  # not an earlier layout: refused, file untouched
    assert path.read_text().splitlines()[0] == "iteration,reward_mean,prm_weight"
