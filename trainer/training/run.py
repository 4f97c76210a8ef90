"""A training run on disk: run folder, metrics, TensorBoard, samples, plots, checkpoints, exports.

``run_training`` is what ``treerpo train`` calls. A run folder is never overwritten: starting a
run where one exists needs ``--resume``, which continues from the newest checkpoint (and on an
already finished run only re-writes the final artefacts).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch import Tensor

from ..config.files import ConfigError, load_config, save_config
from ..config.schema import TrainConfig
from ..guard.terms import spec_at
from ..guard.tracker import GuardedResult, GuardedTraining
from ..rewards.registry import PICKS
from ..utils.atomic import atomic_write_text
from .checkpoint import load_latest, save_checkpoint
from .distributed import Dist, barrier, setup, teardown
from .factory import make_trainer
from .guarded import (
    guard_trainer,
    guarded,
    load_guard,
    resumed_guard,
    save_guard,
    save_progress,
    separate_validation_pairs,
    write_figures,
)
from .logs import (
    MetricsCsv,
    TensorBoardLogger,
    finite_numbers,
    make_progress,
    plot_curves,
    read_csv,
    save_image_grid,
)
from .loop import COLUMNS, SAMPLE_PAIRS, Trainer
from .weighted import train_each_weight

SUMMARY_KEYS = ("eval_reward", "eval_exact", "eval_colour", "eval_shape", "eval_position",
                "eval_count", "drift")


def save_resolved_config(config: TrainConfig, run_dir: Path) -> None:
    save_config(config, run_dir / "config.yaml")


def checkpoint(trainer: Trainer, run_dir: Path, iteration: int, wall_s: float) -> None:
    """Every rank gathers (FSDP shards are collected), rank 0 writes."""
    trained, optimizer = trainer.trained_state(), trainer.optimizer_state()
    if trainer.dist.is_main:
        save_checkpoint(run_dir / "checkpoints", iteration, trained, optimizer,
                        {**trainer.state(), "wall_s": wall_s})


def resume_point(trainer: Trainer, run_dir: Path) -> tuple[int, float]:
    """Restore the newest checkpoint; returns ``(iterations done, wall seconds so far)``."""
    ckpt = load_latest(run_dir / "checkpoints")
    if ckpt is None:
        return 0, 0.0
    trainer.restore(ckpt.weights, ckpt.optimizer, ckpt.state)
    return ckpt.iteration, float(ckpt.state.get("wall_s", 0.0))


def resolve_config(config_path: str | None, overrides: list[str], run_dir: Path,
                   resume: bool) -> TrainConfig:
    """On resume the run folder's saved config wins (``--set`` may still extend ``iterations``)."""
    saved = run_dir / "config.yaml"
    if resume and saved.is_file():
        return load_config(TrainConfig, saved, overrides)
    return load_config(TrainConfig, config_path, overrides)


def _eval_row(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in SUMMARY_KEYS if k in metrics}


def run_training(config: TrainConfig, run_dir: str | Path, resume: bool = False,
                 progress: bool = True) -> dict[str, Any]:
    """Train per ``config`` into ``run_dir``; returns the summary (also ``summary.json``).

    Under ``torchrun`` every rank runs this; rank 0 alone writes the run folder (every rank reads
    the checkpoint to resume, so the folder must be on storage all nodes share)."""
    d = setup(config.distributed)
    try:
        return _run(config, Path(run_dir), resume, progress, d)
    finally:
        teardown(d)


def _run(config: TrainConfig, run_dir: Path, resume: bool, progress: bool, d: Dist) -> dict[str, Any]:
    """One run into ``run_dir``: its folder opened, its iterations trained, its final artefacts written
    (under the guard with several picks weights: a run per weight, one kept)."""
    if guarded(config) and len(config.guard.weights) > 1:
        return _run_weights(config, run_dir, resume, progress, d)
    if guarded(config) and config.guard.weights:  # one weight: the picks train at it
        config = at_weight(config, config.guard.weights[0])
    run = _open_run(config, run_dir, resume, d)
    final_images = _train_iterations(run, config, run_dir, progress)
    return _finish_run(run, config, run_dir, final_images)


@dataclass
class _OpenRun:
    """A run as :func:`_open_run` leaves it to train: its trainer, where it stands, what it writes to."""

    d: Dist
    trainer: Trainer
    done: int  # iterations already trained (a resumed run)
    wall: float  # seconds of training so far
    metrics: MetricsCsv | None  # rank 0 alone writes the metrics
    guard: GuardedTraining | None

    @property
    def main(self) -> bool:
        return self.d.is_main


def _open_run(config: TrainConfig, run_dir: Path, resume: bool, d: Dist) -> _OpenRun:
    """The run folder checked and created, the trainer built (and resumed), the config saved, the guard
    started and, on a fresh run, the base model evaluated."""
    metrics_path = run_dir / "metrics.csv"
    if metrics_path.exists() and not resume:
        raise ConfigError(f"run folder {run_dir} already holds a run; add --resume to continue it "
                          "or choose another --out")
    barrier(d)  # every rank has looked before rank 0 creates anything
    main = d.is_main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    trainer = make_trainer(config, dist=d)
    done, wall = resume_point(trainer, run_dir) if resume else (0, 0.0)
    metrics = MetricsCsv(metrics_path, COLUMNS) if main else None
    if main:
        save_resolved_config(config, run_dir)
    guard = start_guard(trainer, run_dir / "guard", done, config) if guarded(config) else None
    if done == 0:
        base, images = trainer.evaluate()
        if metrics is not None:
            metrics.truncate_after(-1)
            metrics.append({"iteration": 0, "strategy": config.strategy, **_eval_row(base), "wall_s": 0.0})
            save_image_grid(images[:SAMPLE_PAIRS], run_dir / "samples" / "before.png", nrow=4,
                            captions=[p.prompt for p in trainer.eval_pairs[:SAMPLE_PAIRS]])
    elif metrics is not None:
        metrics.truncate_after(done)
    return _OpenRun(d, trainer, done, wall, metrics, guard)


def _train_iterations(run: _OpenRun, config: TrainConfig, run_dir: Path, progress: bool) -> Tensor | None:
    """The iterations left, each logged, evaluated, checkpointed and measured by the guard when due;
    returns the last evaluation's images (None when no iteration was left)."""
    trainer, metrics, guard, main = run.trainer, run.metrics, run.guard, run.main
    with TensorBoardLogger(run_dir / "tensorboard", enabled=main) as board:
        bar = make_progress(config.iterations, initial=min(run.done, config.iterations),
                            desc=config.strategy, disable=not (progress and main))
        final_images = None
        for it in range(run.done, config.iterations):
            row = trainer.step(it)
            run.wall += row["iteration_s"]
            row["wall_s"] = run.wall
            last = it + 1 == config.iterations
            if (it + 1) % config.data.eval_every == 0 or last:
                scores, final_images = trainer.evaluate()
                row.update(_eval_row(scores))
            if metrics is not None:
                metrics.append(row)
            board.log(it + 1, finite_numbers(row))
            trainer.check_progress(it + 1)  # too many non-finite updates in a row: stop here
            if (it + 1) % config.checkpoint_every == 0 or last:
                checkpoint(trainer, run_dir, it + 1, run.wall)
            if guard is not None and guard.is_checkpoint(it + 1, config.iterations):
                guard.checkpoint(it + 1)
                if main:
                    save_progress(guard.trail, guard.snapshots, guard.images, guard.base_guard,
                                  run_dir / "guard")
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}",
                            eval=f"{row.get('eval_reward', float('nan')):.3f}",
                            s_it=f"{row['iteration_s']:.2f}")
        bar.close()
    return final_images


def _finish_run(run: _OpenRun, config: TrainConfig, run_dir: Path, final_images: Tensor | None
                ) -> dict[str, Any]:
    """The guard's choice loaded, the LoRA exported, samples, plots and ``summary.json`` written (rank
    0); returns the summary (``{}`` on the other ranks)."""
    trainer, guard, main, d = run.trainer, run.guard, run.main, run.d
    guard_files: dict[str, Path] = {}
    chosen: dict[str, float] | None = None
    if guard is not None:  # the chosen checkpoint is what the run exports and shows
        result = guard.finish()
        scores, final_images = trainer.evaluate()
        chosen = _eval_row(scores)
        if main:
            save_guard(result, run_dir / "guard")
            guard_files = write_figures(result, run_dir / "guard")
    if final_images is None:
        scores, final_images = trainer.evaluate()
    files = trainer.export(run_dir / "lora")  # every rank: gathering FSDP shards is collective
    if not main:
        barrier(d)
        return {}
    save_image_grid(final_images[:SAMPLE_PAIRS], run_dir / "samples" / "after.png", nrow=4,
                    captions=[p.prompt for p in trainer.eval_pairs[:SAMPLE_PAIRS]])
    metrics_path = run_dir / "metrics.csv"
    rows = read_csv(metrics_path)
    plot_curves(rows, run_dir / "plots" / "reward.png",
                ys=(("reward_mean", "eval_reward"), "eval_exact", ("loss", "grpo_loss", "prm_loss"),
                    "clip_frac"), title=f"{config.strategy} on the embedded default")
    summary = _summary(rows, config, files, chosen)
    if guard is not None:
        summary["guard"] = guard_summary(run_dir / "guard", guard_files)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    barrier(d)  # the others leave once the run folder is complete
    return summary


WEIGHT_RUN = "weight_{:g}"
"""The folder of each picks weight's run inside a run folder that tried several."""


def at_weight(config: TrainConfig, weight: float) -> TrainConfig:
    """``config`` training the picks at ``weight`` alone (the other terms share the rest as written)."""
    return replace(config, reward=spec_at(config.reward, PICKS, weight),
                   guard=replace(config.guard, weights=(weight,)))


def _run_weights(config: TrainConfig, run_dir: Path, resume: bool, progress: bool, d: Dist) -> dict[str, Any]:
    """A run per picks weight of ``guard.weights`` in ``run_dir/weight_<w>``, each resumable on its own;
    the run whose chosen checkpoint gained the most personal reward on the validation pairs is kept: its
    LoRA, guard figures and samples are copied to ``run_dir`` itself, and the summary says why."""
    folders = [run_dir / WEIGHT_RUN.format(w) for w in config.guard.weights]
    started = [f for f in [run_dir, *folders] if (f / "metrics.csv").exists()]
    if started and not resume:
        raise ConfigError(f"run folder {run_dir} already holds a run; add --resume to continue it "
                          "or choose another --out")
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_resolved_config(config, run_dir)
    runs: list[dict[str, Any]] = []

    def train(i: int, weight: float) -> GuardedResult | None:
        runs.append(_run(at_weight(config, weight), folders[i], resume, progress, d))
        if not d.is_main:  # rank 0 alone reads the run folders
            return None
        return load_guard(folders[i] / "guard", config.guard.margin, snapshots=False)

    measured = train_each_weight(config.guard.weights, train)
    if measured is None:
        return {}
    choice, results = measured
    kept = folders[choice.index]
    for part in ("lora", "guard", "samples", "plots"):
        if (kept / part).is_dir():
            shutil.copytree(kept / part, run_dir / part, dirs_exist_ok=True)
    write_figures(results[choice.index], run_dir / "guard",
                  others=[r.trail for i, r in enumerate(results) if i != choice.index])
    summary = {**runs[choice.index], "weights": {**choice.to_json(), "line": choice.line(),
                                                 "runs": [f.name for f in folders]}}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def start_guard(trainer: Trainer, folder: Path, done: int, config: TrainConfig) -> GuardedTraining:
    """The guard of a headless run: validation pairs of their own prompts (never a test prompt, never
    trained on), the base measured once (a resumed run continues the measurements it saved)."""
    previous = resumed_guard(folder, done, config.guard.margin)
    tracker = guard_trainer(trainer, separate_validation_pairs(config, trainer.eval_pairs),
                            log=lambda line: print(line, file=sys.stderr), previous=previous)
    if previous is None:
        tracker.begin()
    return tracker


def guard_summary(folder: Path, files: dict[str, Path]) -> dict[str, Any]:
    data = json.loads((folder / "trail.json").read_text(encoding="utf-8"))
    return {"limit": data["limit"], "choice": data.get("choice"), "points": len(data["points"]),
            "figures": {k: str(v.relative_to(folder.parent)) for k, v in files.items()}}


def _summary(rows: list[dict[str, str]], config: TrainConfig, files: dict[str, Path],
             chosen: dict[str, float] | None = None) -> dict[str, Any]:
    """Base and final held-out figures; under the guard the final ones are the chosen checkpoint's."""
    evals = [r for r in rows if r.get("eval_reward")]
    base, final = evals[0], dict(evals[-1])
    if chosen is not None:
        final.update({k: str(v) for k, v in chosen.items()})
    out: dict[str, Any] = {"strategy": config.strategy, "iterations": int(final["iteration"]),
                           "eval_pairs": config.data.eval_pairs,
                           "wall_s": float(rows[-1]["wall_s"] or 0.0),
                           "lora": {k: str(v.name) for k, v in files.items()}}
    for key in SUMMARY_KEYS:
        if base.get(key) and final.get(key):
            b, f = float(base[key]), float(final[key])
            out[key] = {"base": b, "final": f, "delta": f - b}
    return out


def format_summary(summary: dict[str, Any]) -> str:
    guard = summary.get("guard")
    lines = [f"{summary['strategy']}: {summary['iterations']} iterations, "
             f"{summary['wall_s']:.0f} s of training, {summary['eval_pairs']} held-out prompt/seed pairs"]
    for key in SUMMARY_KEYS:
        if key in summary:
            v = summary[key]
            lines.append(f"  {key:<13} base {v['base']:.4f} -> final {v['final']:.4f} ({v['delta']:+.4f})")
    if guard is not None and guard.get("choice"):
        lines.append(f"  guard (a fall of at most {guard['limit']:.4f}): {guard['choice']['reason']}")
    if summary.get("weights"):
        weights = summary["weights"]
        lines.append(f"  guard: {weights['line']} (each run in {', '.join(weights['runs'])})")
    return "\n".join(lines)
