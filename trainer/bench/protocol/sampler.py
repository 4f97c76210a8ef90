"""``treerpo bench sampler``: what the tree sampler costs beyond its model calls, and how the memory
of a training iteration grows with the tree.

- Overhead: one rollout timed end to end against the time spent inside the model's velocity calls;
  the rest is the sampler's own work (noise, SDE steps, bookkeeping of nodes and edges).
- Memory: one training iteration per tree size in a fresh process, its peak resident memory (CPU)
  or peak allocated memory (CUDA) above what the process held just before it. A sampling thread
  reads the resident size every 5 ms, since the process-wide peak would include model loading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ...config.files import load_config
from ...config.schema import TrainConfig
from ...core.tree import rollout
from ...training.loop import Trainer
from ...training.plans import iteration_plan, iteration_seeds

LEAVES = {16: ("tree.depth=4", "tree.branching=2"), 64: ("tree.depth=6", "tree.branching=2")}


def rollout_overhead(config: TrainConfig, repeats: int = 3) -> dict[str, Any]:
    """The best of ``repeats`` rollouts: wall seconds, seconds inside the model, the difference."""
    trainer = Trainer(config, evaluation=False)
    policy = trainer.policy
    policy.eval()
    inside = [0.0]

    def timed(x: torch.Tensor, sigma: torch.Tensor, cond: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = policy.velocity(x, sigma, cond)
        inside[0] += time.perf_counter() - start
        return out

    prompts = trainer.prompts.prompts(0, config.data.prompts_per_iteration)
    seeds = iteration_seeds(config.seed, 0, len(prompts))
    plan = iteration_plan(config, trainer.sigmas, 0)
    best: dict[str, Any] | None = None
    with torch.no_grad():
        cond = policy.encode(prompts)
        for _ in range(repeats):
            inside[0] = 0.0
            start = time.perf_counter()
            tree = rollout(timed, cond, plan, seeds, policy.latent_shape, max_batch=config.max_batch,
                           device=trainer.device)
            wall = time.perf_counter() - start
            row = {"leaves": int(tree.leaf_node.numel()), "model_forwards": int(tree.nfe),
                   "rollout_s": wall, "model_s": inside[0], "overhead_s": wall - inside[0],
                   "overhead_fraction": (wall - inside[0]) / wall}
            if best is None or row["rollout_s"] < best["rollout_s"]:
                best = row
    assert best is not None
    return best


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def iteration_memory(config: TrainConfig) -> dict[str, Any]:
    """Peak memory of one training iteration above the memory held just before it."""
    trainer = Trainer(config, evaluation=False)
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    peak, running = [before], [True]

    def watch() -> None:
        while running[0]:
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.005)

    thread = None if cuda else threading.Thread(target=watch, daemon=True)
    if thread is not None:
        thread.start()
    start = time.perf_counter()
    row = trainer.step(0)
    seconds = time.perf_counter() - start
    running[0] = False
    if thread is not None:
        thread.join()
    top = torch.cuda.max_memory_allocated() if cuda else peak[0]
    return {"leaves": int(row["scored_images"]), "device": trainer.device.type, "iteration_s": seconds,
            "peak_above_start_mb": (top - before) / 2**20, "held_before_mb": before / 2**20,
            "max_batch": config.max_batch}


def sampler(config_path: str | None, overrides: list[str], out: Path) -> dict[str, Any]:
    """Overhead of a 16-leaf rollout, and the memory of a training iteration at 16 and 64 leaves
    (each in its own process); written to ``sampler.json``."""
    one = ["data.prompts_per_iteration=1", "strategy=dynamic_treerpo"]
    base = load_config(TrainConfig, config_path, [*overrides, *one, *LEAVES[16]])
    result: dict[str, Any] = {"overhead": rollout_overhead(base), "memory": []}
    for leaves, knobs in LEAVES.items():
        args = [*overrides, *one, *knobs]
        command = [sys.executable, "-m", __name__, json.dumps([config_path, args])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"memory measurement at {leaves} leaves failed: {done.stderr.strip()[-500:]}")
        result["memory"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    from ...utils.atomic import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sampler.json", json.dumps(result, indent=2) + "\n")
    return result


def format_sampler(result: dict[str, Any]) -> str:
    o = result["overhead"]
    lines = [f"rollout of {o['leaves']} leaves: {o['rollout_s'] * 1000:.1f} ms, of which model calls "
             f"{o['model_s'] * 1000:.1f} ms ({o['model_forwards']} forwards); sampler overhead "
             f"{o['overhead_s'] * 1000:.1f} ms = {100 * o['overhead_fraction']:.1f}%"]
    for m in result["memory"]:
        lines.append(f"training iteration, {m['leaves']:>3} leaves: peak {m['peak_above_start_mb']:.1f} MB "
                     f"above the {m['held_before_mb']:.0f} MB held before ({m['device']}, "
                     f"max_batch {m['max_batch']}, {m['iteration_s']:.2f} s)")
    return "\n".join(lines)


if __name__ == "__main__":  # one memory measurement, in a fresh process (see ``sampler``)
    path, args = json.loads(sys.argv[1])
    print(json.dumps(iteration_memory(load_config(TrainConfig, path, args))))
