"""No lost work: a run killed with SIGKILL at several points resumes to the LoRA of an
uninterrupted run; non-finite updates are skipped and counted, too many in a row stop the run
with its checkpoint intact; a full disk is one line and keeps the previous checkpoint; workflow
files of any shape are read without an uncaught exception."""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from dynamic_treerpo.trainer.cli import main
from dynamic_treerpo.trainer.comfyui_host.workflow_format import read_workflow, ui_to_api
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.training.checkpoint import load_latest
from dynamic_treerpo.trainer.training.loop import TrainingStopped
from dynamic_treerpo.trainer.training.run import run_training

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]  # the `treerpo` command

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.prompts_per_iteration=2", "data.eval_pairs=4", "data.eval_every=100", "sampling.eval_steps=2",
         "tree.steps=5", "tree.depth=2", "lora.rank=4", "lora.alpha=8.0", "checkpoint_every=1"]


def cli_args(out: Path, *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--no-progress", *[a for s in [*SMALL, *extra] for a in ("--set", s)]]


def launch(out: Path, *extra: str, resume: bool = False) -> subprocess.Popen:
    cmd = [*TREERPO, *cli_args(out, *extra), *(["--resume"] if resume else [])]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def final_lora(run: Path, iteration: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"iter_{iteration:06d}" / "weights.safetensors")


def saved_iteration(run: Path) -> int:
    pointer = run / "checkpoints" / "latest.json"
    return json.loads(pointer.read_text())["iteration"] if pointer.is_file() else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    job = launch(run, "iterations=4")
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-3000:]
    return run


def test_sigkill_at_several_points_then_resume_gives_the_uninterrupted_lora(uninterrupted, tmp_path) -> None:
    """Killed while loading (no checkpoint yet), in the middle of an iteration, and right as a
    checkpoint lands (writes in flight); each time ``--resume`` picks up from what was saved."""
    run = tmp_path / "run"
    kills = [
        lambda: time.sleep(1.0),  # still starting: nothing saved yet
        lambda: wait_for(lambda: saved_iteration(run) >= 1, extra=0.4),  # during iteration 2
        lambda: wait_for(lambda: saved_iteration(run) >= 3),  # as checkpoint 3 is written
    ]
    killed = 0
    for i, moment in enumerate(kills):
        job = launch(run, "iterations=4", resume=i > 0)
        moment()
        if job.poll() is None:
            job.send_signal(signal.SIGKILL)
            killed += 1
        job.communicate(timeout=60)
        assert job.returncode != 0 or saved_iteration(run) == 4
    assert killed == len(kills)  # each launch was still running when it was killed
    job = launch(run, "iterations=4", resume=True)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-3000:]
    a, b = final_lora(uninterrupted, 4), final_lora(run, 4)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    rows = {name: list(csv.DictReader((r / "metrics.csv").open())) for name, r in
            (("a", uninterrupted), ("b", run))}
    # no lost or doubled rows
    assert [r["iteration"] for r in rows["b"]] == [r["iteration"] for r in rows["a"]]
    assert [r["reward_mean"] for r in rows["b"]] == [r["reward_mean"] for r in rows["a"]]
    assert (run / "lora" / "comfyui_lora.safetensors").is_file()


def wait_for(condition, extra: float = 0.0, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(extra)


@pytest.fixture
def poisoned_rewards(monkeypatch):
    """Rewards turn NaN for the training calls listed in ``bad`` (call 0 is the baseline evaluation)."""
    from dynamic_treerpo.trainer.rewards import mix

    calls = {"n": 0, "bad": set()}
    original = mix.RewardMix.__call__

    def call(self, images, prompts):
        out = original(self, images, prompts)
        if calls["n"] in calls["bad"]:
            out = {**out, "reward": torch.full_like(out["reward"], float("nan"))}
        calls["n"] += 1
        return out

    monkeypatch.setattr(mix.RewardMix, "__call__", call)
    return calls


def test_a_non_finite_iteration_is_skipped_counted_and_the_run_goes_on(poisoned_rewards, tmp_path) -> None:
    poisoned_rewards["bad"] = {2}  # iteration 2
    run = tmp_path / "run"
    run_training(load_config(TrainConfig, None, [*SMALL, "iterations=2"]), run, progress=False)
    before, after = final_lora(run, 1), final_lora(run, 2)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the skipped updates changed nothing
    run_training(load_config(TrainConfig, None, [*SMALL, "iterations=3"]), run, resume=True, progress=False)
    rows = list(csv.DictReader((run / "metrics.csv").open()))[1:]
    assert [int(r["skipped_updates"]) for r in rows] == [0, 2, 0]
    assert not all(torch.equal(after[k], final_lora(run, 3)[k]) for k in after)  # training went on


def test_too_many_non_finite_updates_in_a_row_stop_with_a_usable_checkpoint(poisoned_rewards,
                                                                           tmp_path) -> None:
    poisoned_rewards["bad"] = set(range(2, 100))  # from iteration 2 on
    run = tmp_path / "run"
    config = load_config(TrainConfig, None, [*SMALL, "iterations=6", "optim.max_skipped_in_a_row=4"])
    with pytest.raises(TrainingStopped, match="4 optimizer updates in a row had a non-finite loss"):
        run_training(config, run, progress=False)
    latest = load_latest(run / "checkpoints")
    assert latest is not None and latest.iteration == 2  # iteration 3 stopped the run (2 x 2 updates)
    assert all(torch.isfinite(v).all() for v in latest.weights.values())
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert rows[-1]["iteration"] == "3" and rows[-1]["skipped_updates"] == "2"


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, capsys) -> None:
    import safetensors.torch

    real_save = safetensors.torch.save_file

    def full_disk(tensors, filename, metadata=None):
        if "iter_000002" in str(filename):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filename))
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    run = tmp_path / "run"
    code = main(cli_args(run, "iterations=3"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("treerpo train: error: No space left on device: ") and "iter_000002" in err[0]
    assert saved_iteration(run) == 1 and load_latest(run / "checkpoints").iteration == 1
    assert not list((run / "checkpoints").rglob("*.tmp*"))  # no half-written file left behind
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    assert main([*cli_args(run, "iterations=3"), "--resume"]) == 0
    assert saved_iteration(run) == 3


# ------------------------------------------------------------------------------ fuzzing
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) |
                    st.text(max_size=8), lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.sampled_from(["nodes", "links", "id", "type", "inputs", "outputs",
                                                     "widgets_values", "mode", "link", "name", "class_type",
                                                     "prompt", "1", "2"]), inner, max_size=5), max_leaves=25)
SEED = ["INT", {"control_after_generate": True}]
DEFINITIONS = {"KSampler": {"input": {"required": {"model": ["MODEL"], "seed": SEED, "steps": ["INT", {}]}},
                            "output": ["LATENT"], "output_name": ["LATENT"]},
               "SaveImage": {"input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {}]}},
                             "output": [], "output_name": []}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=JSON)
def test_workflow_reading_of_anything_raises_only_one_line_errors(data, tmp_path) -> None:
    file = tmp_path / "w.json"
    file.write_text(json.dumps(data))
    try:
        workflow = read_workflow(file)
        if isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list):
            ui_to_api(workflow, DEFINITIONS)
    except ValueError as err:
        assert "\n" not in str(err).strip()


class Payload:
    """A pickle that would create a file when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("damage", ["truncated LoRA", "malicious optimizer pickle"])
def test_a_damaged_newest_checkpoint_is_detected_and_the_previous_one_used(damage, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    run_training(load_config(TrainConfig, None, [*SMALL, "iterations=2"]), run, progress=False)
    newest = run / "checkpoints" / "iter_000002"
    marker = tmp_path / "payload_ran"
    if damage == "truncated LoRA":
        data = (newest / "weights.safetensors").read_bytes()
        (newest / "weights.safetensors").write_bytes(data[: len(data) // 2])
    else:
        import pickle

        (newest / "optimizer.pt").write_bytes(pickle.dumps({"state": Payload(marker)}))
    latest = load_latest(run / "checkpoints")
    assert latest is not None and latest.iteration == 1
    assert "iter_000002 is unreadable" in capsys.readouterr().err
    assert not marker.exists()
    summary = run_training(load_config(TrainConfig, None, [*SMALL, "iterations=3"]), run, resume=True,
                           progress=False)
    assert summary["iterations"] == 3
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["iteration"] for r in rows] == ["0", "1", "2", "3"]  # iteration 2 redone, not doubled


OVERRIDE = st.tuples(st.sampled_from(["iterations", "tree.depth", "lora.rank", "optim.lr", "model.kind",
                                      "reward", "data.prompts", "strategy", "loss.clip.mode", "tree",
                                      "distributed.timeout_s", "window.schedule", "nope", ""]),
                     st.sampled_from(["=", ""]),
                     st.one_of(st.integers(-5, 50).map(str), st.text(max_size=10),
                               st.sampled_from(["[1, 2", "{a: 1}", "null", "1e-3", "-0.5", "true"])))


@settings(max_examples=300, deadline=None)
@given(st.lists(OVERRIDE.map("".join), max_size=4))
def test_config_overrides_of_anything_raise_only_one_line_errors(overrides: list[str]) -> None:
    try:
        load_config(TrainConfig, None, overrides)
    except (ValueError, TypeError) as err:
        assert str(err).strip() and "\n" not in str(err).strip()


def test_a_checkpoint_of_an_earlier_version_with_lora_safetensors_still_loads(tmp_path: Path) -> None:
    """Checkpoints named their weights file ``lora.safetensors`` before full fine-tuning shared it."""
    from dynamic_treerpo.trainer.training.checkpoint import save_checkpoint

    weights = {"a.lora_A.weight": torch.arange(6.0).reshape(2, 3)}
    folder = save_checkpoint(tmp_path, 3, weights, {"state": {}}, {"clip_ema": 0.5})
    (folder / "weights.safetensors").rename(folder / "lora.safetensors")
    loaded = load_latest(tmp_path)
    assert loaded.iteration == 3
    assert torch.equal(loaded.weights["a.lora_A.weight"], weights["a.lora_A.weight"])
