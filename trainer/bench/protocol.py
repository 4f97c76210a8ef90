"""``treerpo bench protocol``: every recipe as published, like for like, at its own best learning
rate, over paired seeds, on two budgets; the paper's dynamic parts switched off one at a time; the
headline pairs again under two clip treatments. ``protocol.json`` holds everything the report needs.

Why this shape (docs/results.md says it for readers):

- **Sweep first, on validation pairs** (:mod:`.sweep`): each main arm's rate (the grid extended
  until the chosen rate is inside it), the time-to-target gain and the best baseline are fixed from
  validation rewards and written into ``protocol.json`` before any test run.
- **Budgets.** Each run trains until it has scored ``images`` images (equal images, the paper's
  Figure 1 axis) *and* spent the equal-seconds budget of training time on ``clock``: CPU seconds of
  the training process on a CPU (what another process on the machine takes does not count), wall
  seconds on a GPU (where the host's CPU time says little about the device's work).
- **Fixed checkpoints.** Every arm is measured at the same ``checkpoints`` fractions of the image
  budget and of the seconds budget (at the first iteration at or past each), so no arm gets more
  evaluations than another; each measurement records the images and seconds actually spent.
  Evaluation time is not charged.
- **Paired seeds.** A seed gives every arm the same prompts and LoRA initialisation; seeds are the
  outer loop, so a machine slowing down mid-way affects every arm of a seed alike.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

import torch

from ..config.schema import TrainConfig
from ..training.evaluate import PromptSource, validation_pairs
from ..training.loop import Trainer, resolve_device
from . import sweep as sweeping
from .arms import (
    ALL_ARMS,
    LIKE_FOR_LIKE,
    PUBLISHED,
    TREATMENTS,
    TREE,
    Arm,
    Treatment,
    arm_config,
    check_same_images,
    images_per_iteration,
    matching_images,
    matching_steps,
    runnable_arms,
    treatment_problem,
)
from .results import Budget, Clock, ProtocolResult, Run, checkpoints, save, seconds_key

QUICK = Budget(images=16, seeds=2, checkpoints=2, lrs=(1e-3, 2e-3), max_extensions=1, sweep_iterations=1,
               max_iterations_factor=2)
QUICK_OVERRIDES = ("data.prompts_per_iteration=1", "data.eval_pairs=4", "sampling.eval_steps=2",
                   "lora.rank=4")
"""The smoke run (``--quick``, CI's): every arm, one prompt per iteration, two iterations, two seeds."""
QUICK_EMBEDDED = tuple(f"{section}.steps=6" for section in
                       ("tree", "mixgrpo", "dancegrpo", "flow_grpo", "branchgrpo", "diffusionnft"))
"""...and on the embedded default, 6 sampling steps instead of 10 (a given config keeps its own)."""
PROTOCOL_OVERRIDES = ("data.prompts_per_iteration=8", "data.eval_pairs=64")
"""The protocol's test bed on the embedded default: 8 prompts per iteration (64 scored images) and 64
test pairs. A given config (FLUX, SD3) is taken as written."""
TASKS = {
    "scene": (),
    # a taste that no shipped reward measures, mixed half and half with the scene reward as a guard:
    # it learns several times faster than the scene reward alone (docs/results.md), which at a CPU's
    # budget is what lets the recipes be told apart
    "taste": ("reward=scene:0.5,function:0.5",
              "reward_weights={function: dynamic_treerpo.trainer.bench.tastes:larger_objects}"),
}
"""The embedded test bed's reward: the scene reward alone, or the taste task (the default)."""


def bed_overrides(quick: bool, config_path: str | None, task: str = "taste") -> tuple[str, ...]:
    """The overrides the protocol adds to the base config (before the command line's ``--set``)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    embedded = config_path is None
    if quick:
        return (*QUICK_OVERRIDES, *(QUICK_EMBEDDED if embedded else ()), *(TASKS[task] if embedded else ()))
    return (*PROTOCOL_OVERRIDES, *TASKS[task]) if embedded else ()


def budget_for(quick: bool, changes: dict[str, Any]) -> Budget:
    """The default (or quick) budget with the command line's changes (None: unchanged); ``lrs`` may be
    a comma-separated string."""
    given = {k: v for k, v in changes.items() if v is not None}
    if isinstance(given.get("lrs"), str):
        try:
            given["lrs"] = tuple(float(x) for x in given["lrs"].split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--lrs takes comma-separated numbers, got {changes['lrs']!r}") from None
    return replace(QUICK if quick else Budget(), **given)


def resolve_clock(clock: Clock, config: TrainConfig) -> Literal["cpu", "wall"]:
    """``auto``: CPU seconds when the model runs on the CPU, wall seconds on a GPU."""
    if clock != "auto":
        return clock
    return "cpu" if resolve_device(config.model.device).type == "cpu" else "wall"


def train_run(trainer: Trainer, config: TrainConfig, arm: str, budget: Budget, seconds: float | None,
              clock: str, treatment: str = PUBLISHED.name) -> Run:
    """Train to the image budget and (when ``seconds`` is given) the seconds budget on ``clock``,
    measuring the held-out reward before training and at every checkpoint of both."""
    per_iteration = images_per_iteration(config)
    image_points = checkpoints(budget.images, budget.checkpoints)
    second_points = checkpoints(seconds, budget.checkpoints) if seconds is not None else []
    cap = math.ceil(budget.images / per_iteration) * budget.max_iterations_factor
    run = Run(arm, config.seed, config.optim.lr, per_iteration, treatment)
    spent = {"iteration": 0, "images": 0.0, "cpu_s": 0.0, "wall_s": 0.0}

    def measure() -> int:
        # every arm is compared on its live weights; where the recipe evaluates an average of its
        # weights (Flow-GRPO, DiffusionNFT), that figure is kept beside (docs/algorithm.md, "Baselines")
        metrics = trainer.evaluate(average=False)[0]
        point = {**spent, "reward": metrics["eval_reward"],  # and each term of a reward mix
                 **{k.removeprefix("eval_"): v for k, v in metrics.items() if k.startswith("eval_reward_")}}
        if trainer.ema is not None:
            point["reward_ema"] = trainer.evaluate(average=True)[0]["eval_reward"]
        run.points.append(point)
        return len(run.points) - 1

    measure()
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
        if due_images or due_seconds:
            index = measure()
            run.image_marks += [index] * due_images
            run.second_marks += [index] * due_seconds
    if len(run.second_marks) < len(second_points):  # stopped by the cap: the rest measured at its end
        index = len(run.points) - 1 if run.points[-1]["iteration"] == spent["iteration"] else measure()
        run.second_marks += [index] * (len(second_points) - len(run.second_marks))
        run.seconds_reached = False
    return run


# --------------------------------------------------------------------------- the two kinds of run
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
    run = train_run(trainer, config, arm.name, short, None, clock)
    del trainer
    release_memory()
    shared = {p.prompt for p in validation} & {p.prompt for p in test}
    return {"validation_reward": run.at_images, "validation_base": run.base,
            "median_cpu_s": statistics.median(run.iteration_cpu_s),
            "median_wall_s": statistics.median(run.iteration_wall_s),
            "test_prompts_in_validation": len(shared)}


def full_run(config: TrainConfig, arm: Arm, budget: Budget, seconds: float, clock: str,
             treatment: Treatment) -> Run:
    """One test run: both budgets, measured on the test pairs (the config's held-out set)."""
    try:
        return train_run(Trainer(config), config, arm.name, budget, seconds, clock, treatment.name)
    finally:
        release_memory()


def release_memory() -> None:
    """Free the finished run's model before the next one loads (a FLUX transformer twice over does not
    fit on most GPUs; peft's hooks keep reference cycles that only the collector breaks)."""
    if torch.cuda.is_available():  # on the CPU the next run's allocations reuse the memory anyway
        gc.collect()
        torch.cuda.empty_cache()


def environment(config: TrainConfig, clock: str, log: Callable[[str], None]) -> dict[str, Any]:
    """What the seconds depend on, for protocol.json; a line when CPU seconds would count spinning.
    With more than one thread, OpenMP's waiting threads spin (busy) by default: when another process
    competes for the cores, that spinning is CPU time of this process (measured on 2 shared cores: a
    tree iteration took 20 CPU s instead of 1.7), so CPU seconds are robust to other processes only
    with one thread or ``OMP_WAIT_POLICY=PASSIVE``."""
    policy = os.environ.get("OMP_WAIT_POLICY", "")
    device = str(resolve_device(config.model.device))
    env = {"threads": config.threads, "omp_wait_policy": policy, "device": device}
    if clock == "cpu" and config.threads > 1 and policy.upper() != "PASSIVE":
        log(f"note: CPU seconds with {config.threads} threads count OpenMP's spin-waiting when another "
            "process competes for the cores; run with OMP_WAIT_POLICY=PASSIVE (or --set threads=1) for CPU "
            "seconds that measure the work alone")
    return env


# --------------------------------------------------------------------------- the whole protocol
HEADLINE_PAIRS = (*LIKE_FOR_LIKE, (TREE, "best baseline"))
"""The pairs reported under every clip treatment ("best baseline": the one fixed from the sweep)."""


def headline_arms(best: str | None) -> list[str]:
    """The arms of the headline pairs, with the best baseline named (None: no baseline ran)."""
    return list(dict.fromkeys([name for pair in LIKE_FOR_LIKE for name in pair] + ([best] if best else [])))


def plan_text(budget: Budget, arms: Sequence[Arm], per_iteration: int) -> str:
    """Before anything trains: how many runs and iterations the protocol will do."""
    main = [a for a in arms if a.role == "main"]
    swept, extra = len(main) * len(budget.lrs), len(main) * budget.max_extensions
    images_its = math.ceil(budget.images / per_iteration)
    names = {a.name for a in main}
    treated = len(names & set(headline_arms(None))) + any(not a.is_tree for a in main)
    return (f"plan: sweep {len(main)} arms x {len(budget.lrs)} rates (+ up to {extra} runs extending the "
            f"grid) x {budget.sweep_iterations} iterations = {swept * budget.sweep_iterations} to "
            f"{(swept + extra) * budget.sweep_iterations} iterations; test {budget.seeds} seeds x "
            f"{len(arms)} arms = {budget.seeds * len(arms)} runs (+ up to {budget.seeds * treated} runs of "
            f"the clip treatments), each {images_its} iterations of {per_iteration} images (up to "
            f"{images_its * budget.max_iterations_factor} for an arm that trains on to the equal-seconds "
            f"budget) and at most {2 * budget.checkpoints + 1} evaluations")


def expected_text(result: ProtocolResult, extra_runs: dict[str, int]) -> str:
    """After the sweep: the test runs' training time expected from the sweep's iteration times."""
    per_arm = sweeping.iteration_seconds(result.sweep, result.clock)
    tree = per_arm.get(TREE, statistics.median(per_arm.values()))
    images_its = math.ceil(result.budget.images / result.images_per_iteration)
    cap = images_its * result.budget.max_iterations_factor
    iterations, clock_s = 0, 0.0
    for arm in result.arms:
        t = per_arm.get(arm.name, tree)
        its = max(images_its, min(cap, math.ceil(result.seconds / t) if t > 0 else cap))
        count = result.budget.seeds + extra_runs.get(arm.name, 0)
        iterations += count * its
        clock_s += count * its * t
    wall_min = clock_s * sweeping.wall_per_clock(result.sweep, result.clock) / 60
    return (f"expected: {iterations} training iterations in the test runs, about {wall_min:.0f} min of "
            f"training (wall, from the sweep's iteration times; evaluations come on top)")


def _prepare_arms(arms: Sequence[Arm], base: Sequence[str], config_path: str | None,
                  log: Callable[[str], None]) -> tuple[list[Arm], dict[str, str], dict[str, TrainConfig]]:
    """The arms that can run here, each scoring the tree's images per iteration; the skipped ones
    with why; their configs."""
    skipped: dict[str, str] = {}
    kept = []
    for arm in runnable_arms(arms, log):
        try:  # a strategy the trainer lists but cannot configure yet is skipped, not fatal
            images_per_iteration(arm_config(base, arm, config_path))
            kept.append(arm)
        except (ValueError, NotImplementedError) as err:
            skipped[arm.name] = str(err).splitlines()[0]
            log(f"skipping arm {arm.name}: {skipped[arm.name]}")
    for arm in arms:
        if arm.name not in skipped and arm not in kept:
            skipped[arm.name] = f"this trainer has no strategy {arm.strategy!r}"
    if any(a.role == "ablation" for a in kept) and TREE not in {a.name for a in kept}:
        log(f"adding arm {TREE}: the ablations take its rate and are compared with it")
        kept.insert(0, next(a for a in ALL_ARMS if a.name == TREE))
    if not kept:
        raise ValueError("no arm can run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))

    def build(arm: Arm) -> TrainConfig:
        return arm_config(base, arm, config_path)

    reference = build(next((a for a in kept if a.is_tree), kept[0]))
    steps, images = reference.strategy_config.steps, images_per_iteration(reference)
    matched = [matching_images(matching_steps(a, steps, build), images, build) for a in kept]
    return matched, skipped, {a.name: build(a) for a in matched}


def _effective(config: TrainConfig) -> TrainConfig:
    """``config`` with the clip-spread rescale it actually uses (a published baseline ignores the
    ``clip_spread`` section), so two configs that train alike compare equal."""
    return replace(config, clip_spread=config.effective_clip_spread)


def _plan_treatments(result: ProtocolResult, base: Sequence[str], config_path: str | None,
                     log: Callable[[str], None]) -> dict[str, int]:
    """Per extra treatment and headline arm: trained, reused (the treatment changes nothing for it)
    or skipped with why. Returns the extra runs per arm."""
    best = result.target.get("best_baseline")
    extra: dict[str, int] = {}
    present = {a.name for a in result.arms}
    for t in TREATMENTS:
        record: dict[str, str] = {}
        for name in (n for n in headline_arms(best) if n in present):
            arm, lr = result.arm(name), result.lrs[name]
            config = arm_config(base, arm, config_path, lr, treatment=t)
            problem = treatment_problem(config, arm, t)
            if problem is not None:
                record[name] = f"skipped: {problem}"
                log(f"treatment {t.name}: skipping {name}: {problem}")
            elif _effective(config) == _effective(arm_config(base, arm, config_path, lr)):
                record[name] = "reused"
            else:
                record[name] = "trained"
                extra[name] = extra.get(name, 0) + result.budget.seeds
        result.treatments.append({"name": t.name, "description": t.description, "rescale": t.rescale,
                                  "overrides": {n: list(t.overrides(result.arm(n))) for n in record},
                                  "arms": record})
    return extra


def check_resumable(previous: ProtocolResult, budget: Budget, base: Sequence[str], config_path: str | None,
                    arms: Sequence[Arm]) -> None:
    """A saved protocol continues only under the same budget, bed and arms (one line otherwise)."""
    if previous.stage == "sweep" and not previous.lrs:
        raise ValueError("the saved protocol.json has no finished sweep: start again without --resume")
    def plain(budget: Budget) -> Any:  # as protocol.json holds it (tuples as lists)
        return json.loads(json.dumps(asdict(budget)))

    for what, old, new in (("budget", plain(previous.budget), plain(budget)),
                           ("test bed overrides", list(previous.base_overrides), list(base)),
                           ("config", previous.config, config_path)):
        if old != new:
            raise ValueError(f"cannot resume: the {what} differs from the saved protocol.json's "
                             f"({old} there, {new} now); give the same options or a new --out")
    saved = {a.name for a in previous.arms} | set(previous.skipped)
    if saved != {a.name for a in arms}:
        raise ValueError(f"cannot resume: the arms differ from the saved protocol.json's ({sorted(saved)})")


def run_protocol(budget: Budget, base: Sequence[str] = (), config_path: str | None = None,
                 arms: Sequence[Arm] = ALL_ARMS, log: Callable[[str], None] = print,
                 out: Path | None = None, resume: ProtocolResult | None = None) -> ProtocolResult:
    """The whole protocol: the sweep of the main arms on validation pairs (rates, target, best
    baseline, seconds budget: written to ``out/protocol.json`` before any test run), then every arm
    and seed on both budgets (ablations at the default tree's rate), then the headline arms under
    the clip treatments. ``protocol.json`` is rewritten after every seed. ``resume``: that saved
    protocol continues (its sweep, rates and target kept; finished runs not run again)."""
    start = time.perf_counter()
    if resume is not None:
        check_resumable(resume, budget, base, config_path, arms)
        log(f"resuming: the sweep's rates and target kept, {len(resume.runs)} test runs done")
        return _test_runs(resume, out, log, start - resume.wall_s)
    arms, skipped, configs = _prepare_arms(arms, base, config_path, log)
    per_iteration = check_same_images(configs)
    main = [a for a in arms if a.role == "main"]
    if budget.seconds is None and "mixgrpo" not in {a.name for a in main}:
        raise ValueError("without the mixgrpo arm the equal-seconds budget must be given (--seconds)")
    reference = next((a for a in arms if a.is_tree), arms[0])
    clock = resolve_clock(budget.clock, configs[reference.name])
    test_seed = configs[reference.name].data.eval_seed
    env = environment(configs[reference.name], clock, log)
    log(plan_text(budget, arms, per_iteration))

    rows: list[dict[str, Any]] = []
    for arm in main:
        def one(lr: float, arm: Arm = arm) -> dict[str, Any]:
            config = arm_config(base, arm, config_path, lr, budget.sweep_seed, budget.validation_seed)
            row = sweep_run(config, arm, budget, clock, test_seed)
            log(f"sweep {arm.name:<26} lr {lr:<8g} validation {row['validation_reward']:.4f} "
                f"(before {row['validation_base']:.4f})")
            return row
        rows += sweeping.sweep_arm(arm.name, budget.lrs, one, budget.max_extensions, log)
    lrs = sweeping.best_rates(rows)
    for a in arms:
        lrs.setdefault(a.name, lrs.get(TREE, budget.lrs[0]))
    target = sweeping.target(rows, budget.target_fraction)
    target["best_baseline"] = sweeping.best_baseline(rows, [a.name for a in main if not a.is_tree])
    seconds = sweeping.seconds_budget(budget.seconds, rows, math.ceil(budget.images / per_iteration), clock)
    result = ProtocolResult(budget, list(base), config_path, clock, seconds, per_iteration, rows, lrs, target,
                            list(arms), skipped=skipped, environment=env)
    extra = _plan_treatments(result, base, config_path, log)
    if out is not None:
        save(result, out)  # the rates, the target and the best baseline, before any test run
    log(f"rates {lrs}; target gain {target['gain']:+.4f}; best baseline {target['best_baseline']}; "
        f"equal-seconds budget {seconds:.1f} {clock} s; {budget.images} images per run")
    log(expected_text(result, extra))

    return _test_runs(result, out, log, start)


def _test_runs(result: ProtocolResult, out: Path | None, log: Callable[[str], None],
               start: float) -> ProtocolResult:
    """Every arm and treatment at every seed, skipping those ``result`` holds already."""
    budget, base, config_path = result.budget, result.base_overrides, result.config
    result.stage = "runs"
    done = {(r.arm, r.treatment, r.seed) for r in result.runs}
    for k in range(budget.seeds):
        seed = budget.first_seed + k
        jobs = [(a, PUBLISHED) for a in result.arms]
        jobs += [(result.arm(name), t) for t in TREATMENTS for name in result.arms_trained_under(t.name)]
        for arm, treatment in jobs:
            if (arm.name, treatment.name, seed) in done:
                continue
            config = arm_config(base, arm, config_path, result.lrs[arm.name], seed, treatment=treatment)
            run = full_run(config, arm, budget, result.seconds, result.clock, treatment)
            result.runs.append(run)
            label = arm.name if treatment is PUBLISHED else f"{arm.name} [{treatment.name}]"
            log(f"seed {seed} {label:<34} images {run.at_images:.4f} seconds {run.at_seconds:.4f} "
                f"({len(run.iteration_wall_s)} iterations, median "
                f"{statistics.median(run.iteration_s(result.clock)):.2f} {result.clock} s)")
            if out is not None:  # after every run: a killed protocol resumes from here
                result.wall_s = time.perf_counter() - start
                save(result, out)
    result.stage, result.wall_s = "done", time.perf_counter() - start
    return result
