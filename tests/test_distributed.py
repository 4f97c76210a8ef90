"""Data-parallel training with ``torchrun`` on CPU (gloo): the same LoRA as one process, FSDP full
fine-tuning with a consolidated checkpoint, and a killed rank that fails the run quickly and
resumes (at another world size too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]  # the `treerpo` command

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["data.prompts_per_iteration=4", "data.eval_pairs=4", "data.eval_every=100", "sampling.eval_steps=2",
         "tree.steps=5", "tree.depth=2", "lora.rank=4", "lora.alpha=8.0", "threads=1",
         "distributed.backend=gloo", "distributed.timeout_s=60"]


def train(out: Path, procs: int, *extra: str, resume: bool = False, wait: bool = True,
          timeout: float = 600) -> subprocess.Popen | subprocess.CompletedProcess:
    sets = [a for s in [*SMALL, *extra] for a in ("--set", s)]
    args = ["train", "--out", str(out), *sets, *(["--resume"] if resume else []), "--no-progress"]
    if procs == 1:
        cmd = [*TREERPO, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_port", str(_free_port()), "-m", "dynamic_treerpo.trainer", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lora_at(run: Path, iteration: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"iter_{iteration:06d}" / "weights.safetensors")


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 3-iteration LoRA run in one process and in two (one checkpoint per iteration)."""
    root = tmp_path_factory.mktemp("dist")
    out = {}
    for name, procs in (("single", 1), ("two", 2)):
        done = train(root / name, procs, "iterations=3", "checkpoint_every=1")
        assert done.returncode == 0, done.stderr[-3000:]
        out[name] = root / name
    return out


def test_two_processes_train_the_lora_of_one_process(runs) -> None:
    single, two = lora_at(runs["single"], 3), lora_at(runs["two"], 3)
    moved = max(float(v.abs().max()) for k, v in single.items() if "lora_B" in k)
    assert moved > 1e-3  # the LoRA trained: the comparison is not of two zero tensors
    assert max_diff(single, two) <= 1e-5


def test_rank_0_alone_writes_and_logs_the_whole_batch(runs) -> None:
    import csv

    rows = {name: list(csv.DictReader((run / "metrics.csv").open())) for name, run in runs.items()}
    assert len(rows["two"]) == len(rows["single"]) == 4  # the baseline evaluation + 3 iterations
    for a, b in zip(rows["single"][1:], rows["two"][1:], strict=True):
        assert int(a["scored_images"]) == int(b["scored_images"]) == 16  # 4 prompts x 4 leaves
        assert abs(float(a["reward_mean"]) - float(b["reward_mean"])) < 1e-4
        assert int(a["nfe_rollout"]) == int(b["nfe_rollout"])
    assert (runs["two"] / "lora" / "comfyui_lora.safetensors").is_file()
    assert len(list((runs["two"] / "tensorboard").glob("events.*"))) == 1


def test_prompts_that_do_not_split_evenly_fail_in_one_line(tmp_path) -> None:
    done = train(tmp_path / "uneven", 2, "iterations=1", "data.prompts_per_iteration=3")
    assert done.returncode != 0
    assert "must be a multiple of the number of processes (2)" in done.stderr


def test_fsdp_full_finetuning_saves_a_consolidated_checkpoint(tmp_path) -> None:
    """2 processes fully fine-tune (FSDP2): every weight ends where one process puts it; the
    checkpoint holds them unsharded, a single process resumes from it, and the exported
    transformer loads with diffusers."""
    full = ("checkpoint_every=1", "lora.enabled=false", "optim.lr=1e-3")
    run, alone = tmp_path / "fsdp", tmp_path / "alone"
    for folder, procs in ((run, 2), (alone, 1)):
        done = train(folder, procs, "iterations=2", *full)
        assert done.returncode == 0, done.stderr[-3000:]
    from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy

    base = EmbeddedPolicy.from_pretrained(None).transformer.state_dict()
    saved = lora_at(run, 2)
    assert saved.keys() == base.keys()
    assert all(saved[k].shape == base[k].shape for k in base)  # whole tensors, not shards
    assert max_diff(saved, base) > 1e-3
    assert max_diff(saved, lora_at(alone, 2)) <= 1e-5
    resumed = train(run, 1, "iterations=3", *full, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run / "checkpoints" / "iter_000003").is_dir()
    from diffusers import FluxTransformer2DModel

    exported = FluxTransformer2DModel.from_pretrained(run / "lora" / "transformer")
    assert max_diff(exported.state_dict(), lora_at(run, 3)) == 0.0


def _worker_pids(launcher: int) -> dict[int, int]:
    """``{RANK: pid}`` of the workers ``torchrun`` started (children of the launcher)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != launcher:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for item in env:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = int(stat.parent.name)
    return out


def test_a_killed_rank_ends_the_run_quickly_and_resume_continues(tmp_path, runs) -> None:
    run = tmp_path / "killed"
    job = train(run, 2, "iterations=3", "checkpoint_every=1", wait=False)
    pointer = run / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 300
    while not pointer.is_file() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert pointer.is_file(), job.communicate()[1][-3000:]
    workers = _worker_pids(job.pid)
    assert set(workers) == {0, 1}, workers
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = job.communicate(timeout=120)
    assert job.returncode != 0
    assert time.monotonic() - killed_at < 90  # no hang: the launcher stops the other rank
    assert "Signal 9 (SIGKILL)" in stderr or "SIGKILL" in stderr, stderr[-2000:]
    saved = json.loads(pointer.read_text())["iteration"]
    assert 1 <= saved < 3
    # resume in ONE process: the checkpoint is world-size independent
    done = train(run, 1, "iterations=3", "checkpoint_every=1", resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert max_diff(lora_at(run, 3), lora_at(runs["single"], 3)) <= 1e-5
