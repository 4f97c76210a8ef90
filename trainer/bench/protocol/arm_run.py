"""One run of one arm: trained to its budgets and measured on held-out pairs at the fixed checkpoints
(a test run), or for a few iterations on validation pairs (a sweep run).

The seconds are counted around each training iteration alone, so evaluation is never charged to a
budget; the machine's load is recorded beside, so a disturbed run shows on the page.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ...config.schema import TrainConfig
from ...training.build import resolve_device
from ...training.evaluate import PromptSource, validation_pairs
from ...training.loop import Trainer
from .arms import PUBLISHED, Arm, Treatment, images_per_iteration
from .results import Budget, Run, checkpoints, seconds_key


def train_run(trainer: Trainer, config: TrainConfig, arm: str, budget: Budget, seconds: float | None,
              clock: str, treatment: str = PUBLISHED.name, target_gain: float | None = None) -> Run:
    """Train to the image budget and (when ``seconds`` is given) the seconds budget on ``clock``,
    measuring the held-out reward before training and at every checkpoint of both. With
    ``target_gain``, also after every iteration until the reward has reached the base plus that
    gain, so the time to target is the first iteration's at it, not the first checkpoint's.
    Evaluation time is not charged to either budget."""
    per_iteration = images_per_iteration(config)
    image_points = checkpoints(budget.images, budget.checkpoints)
    second_points = checkpoints(seconds, budget.checkpoints) if seconds is not None else []
    cap = math.ceil(budget.images / per_iteration) * budget.max_iterations_factor
    run = Run(arm, config.seed, config.optim.lr, per_iteration, treatment, target_gain=target_gain)
    spent = {"iteration": 0, "images": 0.0, "cpu_s": 0.0, "wall_s": 0.0}

    def measure(average: bool = False) -> int:
        # every arm is compared on its live weights; where the recipe evaluates an average of its
        # weights (Flow-GRPO, DiffusionNFT, AWM, DGPO), that figure is kept beside at the image budget,
        # where the report reads it (docs/algorithm.md, "Baselines")
        metrics = trainer.evaluate(average=False)[0]
        point = {**spent, "reward": metrics["eval_reward"],  # and each term of a reward mix
                 **{k.removeprefix("eval_"): v for k, v in metrics.items() if k.startswith("eval_reward_")}}
        if trainer.ema is not None and average:
            point["reward_ema"] = trainer.evaluate(average=True)[0]["eval_reward"]
        run.points.append(point)
        return len(run.points) - 1

    measure()
    goal = None if target_gain is None else run.base + target_gain  # None: not (or no longer) watched
    while len(run.image_marks) < len(image_points) or (len(run.second_marks) < len(second_points)
                                                       and spent["iteration"] < cap):
        cpu, wall = time.process_time(), time.perf_counter()
        row = trainer.step(int(spent["iteration"]))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        spent = {"iteration": spent["iteration"] + 1,
                 "images": spent["images"] + float(row.get("scored_images") or per_iteration),
                 "cpu_s": spent["cpu_s"] + cpu, "wall_s": spent["wall_s"] + wall}
        run.iteration_cpu_s.append(cpu)
        run.iteration_wall_s.append(wall)
        run.rollout_nfe.append(int(row["nfe_rollout"]))
        run.clip_frac.append(float(row.get("clip_frac") or 0.0))
        due_images = sum(1 for c in image_points[len(run.image_marks):] if spent["images"] >= c - 1e-9)
        due_seconds = sum(1 for c in second_points[len(run.second_marks):] if spent[seconds_key(clock)] >= c)
        if due_images or due_seconds or goal is not None:
            index = measure(average=len(run.image_marks) + due_images == len(image_points) and due_images > 0)
            run.image_marks += [index] * due_images
            run.second_marks += [index] * due_seconds
            if goal is not None and run.points[index]["reward"] >= goal:
                goal = None  # reached: the checkpoints only from here
    if len(run.second_marks) < len(second_points):  # stopped by the cap: the rest measured at its end
        index = len(run.points) - 1 if run.points[-1]["iteration"] == spent["iteration"] else measure()
        run.second_marks += [index] * (len(second_points) - len(run.second_marks))
        run.seconds_reached = False
    return run


def sweep_run(config: TrainConfig, arm: Arm, budget: Budget, clock: str, test_seed: int) -> dict[str, Any]:
    """One sweep run: ``sweep_iterations`` iterations, the reward on the validation pairs (which
    share no prompt with the test pairs of ``test_seed``) before and after; its training leaves out
    both sets."""
    d = config.data
    trainer = Trainer(config, evaluation=False)  # the held-out set is the validation one, given here
    validation, test = validation_pairs(d.prompts, d.eval_prompts, d.eval_pairs, budget.validation_seed,
                                        test_seed)
    trainer.eval_pairs = validation
    trainer.prompts = PromptSource(d.prompts, config.seed, exclude=[p.prompt for p in (*validation, *test)])
    short = replace(budget, images=budget.sweep_iterations * images_per_iteration(config), checkpoints=1)
    began = time.perf_counter()
    run = train_run(trainer, config, arm.name, short, None, clock)
    evaluating = time.perf_counter() - began - sum(run.iteration_wall_s)
    del trainer
    release_memory()
    shared = {p.prompt for p in validation} & {p.prompt for p in test}
    return {"validation_reward": run.at_images, "validation_base": run.base,
            "median_cpu_s": statistics.median(run.iteration_cpu_s),
            "median_wall_s": statistics.median(run.iteration_wall_s),
            "eval_wall_s": max(0.0, evaluating) / len(run.points),  # one evaluation, for the estimate
            "test_prompts_in_validation": len(shared)}


def full_run(config: TrainConfig, arm: Arm, budget: Budget, seconds: float, clock: str,
             treatment: Treatment, target_gain: float | None = None) -> Run:
    """One test run: both budgets, measured on the test pairs (the config's held-out set); with
    ``target_gain``, after every iteration until it is reached too."""
    try:
        started = machine_load()
        run = train_run(Trainer(config), config, arm.name, budget, seconds, clock, treatment.name,
                        target_gain)
        run.load = [started, machine_load()]
        return run
    finally:
        release_memory()


def machine_load() -> float:
    """The 1-minute load average (NaN where the system has none): a disturbed run shows here."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.nan


def release_memory() -> None:
    """Free the finished run's model before the next one loads (a FLUX transformer twice over does not
    fit on most GPUs; peft's hooks keep reference cycles that only the collector breaks)."""
    if torch.cuda.is_available():  # on the CPU the next run's allocations reuse the memory anyway
        gc.collect()
        torch.cuda.empty_cache()


def environment(config: TrainConfig, clock: str, log: Callable[[str], None]) -> dict[str, Any]:
    """What the seconds depend on, for protocol.json; a line when CPU seconds would count spinning.
    With more than one thread, OpenMP's waiting threads spin (busy) by default: when another process
    competes for the cores, that spinning is CPU time of this process, many times the work itself, so
    CPU seconds are robust to other processes only with one thread or ``OMP_WAIT_POLICY=PASSIVE``."""
    policy = os.environ.get("OMP_WAIT_POLICY", "")
    device = str(resolve_device(config.model.device))
    env = {"threads": config.threads, "omp_wait_policy": policy, "device": device}
    if clock == "cpu" and config.threads > 1 and policy.upper() != "PASSIVE":
        log(f"note: CPU seconds with {config.threads} threads count OpenMP's spin-waiting when another "
            "process competes for the cores; run with OMP_WAIT_POLICY=PASSIVE (or --set threads=1) for CPU "
            "seconds that measure the work alone")
    return env
