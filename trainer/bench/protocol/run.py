"""``treerpo bench protocol``: every recipe as published, like for like, at its own best learning
rate, over paired seeds, on two budgets; the paper's dynamic parts switched off one at a time; the
like-for-like pairs again under two clip treatments. ``protocol.json`` holds everything the report
needs.

Why this shape (docs/results.md says it for readers):

- **Two parts.** ``--part main`` (the default): the sweep and the main arms as published, the
  primary claims' runs, sized to fit the CPU test bed's 2 cores in 150 minutes. ``--part
  ablations``: the ablation arms, each swept at its own rate first (the fixed clip at the dynamic
  clip's, with its bound swept too), and the clip treatments, continuing the same ``protocol.json``
  (its target kept). ``--part all`` (``--quick``'s default): both in one command.
- **Sweep first, on validation pairs** (:mod:`.sweep`): each main arm's rate (the grid extended
  until the chosen rate is inside it) and the time-to-target gain are fixed from validation rewards
  and written into ``protocol.json`` before any test run.
- **Budgets.** Each run trains until it has scored ``images`` images (equal images, the paper's
  Figure 1 axis) *and* spent the equal-seconds budget of training time on ``clock``: CPU seconds of
  the training process on a CPU (what another process on the machine takes does not count), wall
  seconds on a GPU (where the host's CPU time says little about the device's work).
- **Fixed checkpoints.** Every arm's rewards are compared at the same ``checkpoints`` fractions of
  the image budget and of the seconds budget (at the first iteration at or past each); each
  measurement records the images and seconds actually spent. Evaluation time is not charged.
- **Time to target, per iteration.** A main arm's run (as published) is also evaluated after every
  iteration until its reward has reached its base plus the target gain, then at the checkpoints
  only: its time to target is that of the first iteration at the target, so the checkpoint grid
  does not decide a comparison of times. An evaluation changes nothing in the training (its pairs
  and noise are its own), so the extra ones do not favour the arms that get them.
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
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

import torch

from ...config.schema import TrainConfig
from ...training.build import resolve_device
from ...training.evaluate import PromptSource, validation_pairs
from ...training.loop import Trainer
from ..common.provenance import check_resume, provenance
from ..common.stats import ALPHA, exact_floor, seeds_for_exact
from . import sweep as sweeping
from .arms import (
    ALL_ARMS,
    BEST_FIXED_CLIP,
    FIXED_CLIPS,
    LIKE_FOR_LIKE,
    PUBLISHED,
    SAME_RATE,
    TREATMENTS,
    TREE,
    Arm,
    Treatment,
    arm_config,
    best_fixed_clip_arm,
    check_same_images,
    images_per_iteration,
    matching_images,
    matching_steps,
    runnable_arms,
    treatment_problem,
)
from .results import (
    PRIMARY_CLAIMS,
    Budget,
    Clock,
    Part,
    ProtocolResult,
    Run,
    checkpoints,
    save,
    seconds_key,
)

QUICK = Budget(images=16, seeds=2, checkpoints=2, lrs=(2e-3,), max_extensions=0, sweep_iterations=1,
               max_iterations_factor=2)  # one rate: the grid's extension is tested on stand-in runs
QUICK_OVERRIDES = ("data.prompts_per_iteration=1", "data.eval_pairs=4", "sampling.eval_steps=2",
                   "lora.rank=4")
"""The smoke run (``--quick``, CI's): every arm, one prompt per iteration, two iterations, two seeds."""
QUICK_EMBEDDED = (*(f"{section}.steps=6" for section in ("tree", "mixgrpo", "dancegrpo", "flow_grpo",
                                                          "branchgrpo", "diffusionnft", "awm", "dgpo")),
                  "awm.train_timesteps=3")
"""...and on the embedded default, 6 sampling steps instead of 10 (a given config keeps its own; AWM's
buckets of noise levels then fit 3 of them)."""
PROTOCOL_OVERRIDES = ("data.prompts_per_iteration=8", "data.eval_pairs=48")
"""The protocol's test bed on the embedded default: 8 prompts per iteration (64 scored images) and 48
test pairs (64 made evaluation half of the main part's time). A given config (FLUX, SD3) is taken as
written."""
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


# --------------------------------------------------------------------------- plan and estimate
MAIN_PART_MINUTES = 150.0
"""The wall time the main part (sweep and main arms) is sized for on the CPU test bed's 2 cores; the
estimate printed after the sweep warns above it and refuses nothing."""


def like_for_like_arms() -> list[str]:
    """The arms of the like-for-like pairs: the ones the clip treatments run."""
    return list(dict.fromkeys(name for pair in LIKE_FOR_LIKE for name in pair))


def seeds_text(seeds: int) -> str | None:
    """A note when ``seeds`` are too few for the exact test to reach the primary family's Holm
    threshold (None: enough)."""
    needed = seeds_for_exact(PRIMARY_CLAIMS)
    if seeds >= needed:
        return None
    return (f"note: with {seeds} seeds the exact test's smallest p-value, {exact_floor(seeds):.3g}, times "
            f"the primary family's {PRIMARY_CLAIMS} claims is not below {ALPHA}: no primary claim can be met "
            f"or not met (that needs at least {needed} seeds)")


def plan_text(budget: Budget, arms: Sequence[Arm], per_iteration: int, treated: int = 0) -> str:
    """Before anything trains: how many runs and iterations this part will do (``arms``: its arms; a
    sweep when some are main arms; ``treated``: the arms the clip treatments may train)."""
    main = [a for a in arms if a.role == "main"]
    swept, extra = len(main) * len(budget.lrs), len(main) * budget.max_extensions
    images_its = math.ceil(budget.images / per_iteration)
    sweep = (f"sweep {len(main)} arms x {len(budget.lrs)} rates (+ up to {extra} runs extending the grid) x "
             f"{budget.sweep_iterations} iterations = {swept * budget.sweep_iterations} to "
             f"{(swept + extra) * budget.sweep_iterations} iterations; " if main else "")
    tail = f" (+ up to {budget.seeds * treated} runs of the clip treatments)" if treated else ""
    return (f"plan: {sweep}test {budget.seeds} seeds x {len(arms)} arms = {budget.seeds * len(arms)} runs"
            f"{tail}, each {images_its} iterations of {per_iteration} images (up to "
            f"{images_its * budget.max_iterations_factor} for an arm that trains on to the equal-seconds "
            f"budget) and at most {2 * budget.checkpoints + 1} evaluations at the checkpoints"
            + (" (a main arm's also after every iteration until it reaches the target)" if main else ""))


def iterations_to_target(result: ProtocolResult, arm: str, limit: int) -> int:
    """Iterations a run of ``arm`` is expected to need to reach the target, if its reward rises as in
    its sweep run (linearly to its validation gain after ``sweep_iterations``); ``limit`` when it is
    not expected to."""
    gains = result.target.get("validation_gains", {})
    gain = gains.get(arm, gains.get(TREE, 0.0))
    watched = result.watched_gain()
    if watched is None or gain <= 0:
        return limit
    return min(limit, math.ceil(result.budget.sweep_iterations * watched / gain))


def estimate_s(result: ProtocolResult, runs: dict[str, int], watched: Collection[str]) -> tuple[float, float]:
    """Wall seconds of training and of evaluation that ``runs`` (test runs per arm) are expected to
    take, from the sweep: each arm's median iteration time (the tree's for an arm not swept) for as many
    iterations as both budgets need, an evaluation at every checkpoint and, for the ``watched`` arms,
    after every iteration until the target."""
    per_arm = sweeping.iteration_seconds(result.sweep, result.clock)
    tree = per_arm.get(TREE, statistics.median(per_arm.values()))
    wall_per_clock = sweeping.wall_per_clock(result.sweep, result.clock)
    evaluation = sweeping.evaluation_seconds(result.sweep)
    images_its = math.ceil(result.budget.images / result.images_per_iteration)
    cap = images_its * result.budget.max_iterations_factor
    training = evaluating = 0.0
    for arm, count in runs.items():
        t = per_arm.get(arm, tree)
        its = max(images_its, min(cap, math.ceil(result.seconds / t) if t > 0 else cap))
        evaluations = 1 + 2 * result.budget.checkpoints
        if arm in watched:
            evaluations += iterations_to_target(result, arm, its)
        training += count * its * t * wall_per_clock
        evaluating += count * evaluations * evaluation
    return training, evaluating


def expected_text(result: ProtocolResult, runs: dict[str, int], watched: Collection[str],
                  done_s: float = 0.0, main: bool = True) -> list[str]:
    """After the sweep: the test runs' expected wall time (``done_s``: what this part has taken so
    far, the sweep), and for the main part a warning when it is expected past
    :data:`MAIN_PART_MINUTES`."""
    training, evaluating = estimate_s(result, runs, watched)
    minutes = (done_s + training + evaluating) / 60
    what = "main part (sweep and main arms)" if main else "ablation part (ablation arms and clip treatments)"
    lines = [f"expected: the {what} about {minutes:.0f} min of wall time: {done_s / 60:.0f} min so far, "
             f"{training / 60:.0f} min of training in {sum(runs.values())} test runs and about "
             f"{evaluating / 60:.0f} min of evaluation (from the sweep's iteration and evaluation times)"]
    if main and minutes > MAIN_PART_MINUTES:
        lines.append(f"warning: the main part is expected to take about {minutes:.0f} min, more than the "
                     f"{MAIN_PART_MINUTES:.0f} min it is sized for on the CPU test bed; fewer --images, "
                     "--checkpoints, --lrs or --sweep-iterations shorten it (nothing is refused)")
    return lines


def _log_expected(result: ProtocolResult, extra: dict[str, int], part: str, done_s: float,
                  log: Callable[[str], None]) -> None:
    """The estimate of each part this command runs (``extra``: the clip treatments' runs per arm)."""
    seeds = result.budget.seeds
    main = {a.name: seeds for a in result.arms if a.role == "main"}
    watched = set(main)
    if part in ("main", "all"):
        for line in expected_text(result, main, watched, done_s, main=True):
            log(line)
    if part in ("ablations", "all"):
        rest = {a.name: seeds for a in result.arms if a.role == "ablation"}
        for name, count in extra.items():
            rest[name] = rest.get(name, 0) + count
        for line in expected_text(result, rest, (), done_s if part == "ablations" else 0.0, main=False):
            log(line)


# --------------------------------------------------------------------------- the whole protocol
def _prepare_arms(arms: Sequence[Arm], base: Sequence[str], config_path: str | None,
                  log: Callable[[str], None], reference: Arm | None = None,
                  ) -> tuple[list[Arm], dict[str, str], dict[str, TrainConfig]]:
    """The arms that can run here, each scoring the reference's images per iteration (the tree's, or
    ``reference``: a saved protocol's tree), the skipped ones with why, their configs."""
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
    if reference is None and any(a.role == "ablation" for a in kept) and TREE not in {a.name for a in kept}:
        log(f"adding arm {TREE}: the ablations take its rate and are compared with it")
        kept.insert(0, next(a for a in ALL_ARMS if a.name == TREE))
    if not kept:
        raise ValueError("no arm can run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))

    def build(arm: Arm) -> TrainConfig:
        return arm_config(base, arm, config_path)

    config = build(reference or next((a for a in kept if a.is_tree), kept[0]))
    steps, images = config.strategy_config.steps, images_per_iteration(config)
    matched = [matching_images(matching_steps(a, steps, build), images, build) for a in kept]
    return matched, skipped, {a.name: build(a) for a in matched}


def _effective(config: TrainConfig) -> TrainConfig:
    """``config`` with the clip-spread rescale it actually uses (a published baseline ignores the
    ``clip_spread`` section), so two configs that train alike compare equal."""
    return replace(config, clip_spread=config.effective_clip_spread)


def _plan_treatments(result: ProtocolResult, base: Sequence[str], config_path: str | None,
                     log: Callable[[str], None]) -> dict[str, int]:
    """Per extra treatment and like-for-like arm: trained, reused (the treatment changes nothing for
    it) or skipped with why. Returns the extra runs per arm."""
    extra: dict[str, int] = {}
    present = {a.name for a in result.arms}
    for t in TREATMENTS:
        record: dict[str, str] = {}
        for name in (n for n in like_for_like_arms() if n in present):
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


def _check_setup(previous: ProtocolResult, budget: Budget, base: Sequence[str],
                 config_path: str | None) -> None:
    """A saved protocol continues only under the same budget, bed and config (one line otherwise)."""
    def plain(budget: Budget) -> Any:  # as protocol.json holds it (tuples as lists)
        return json.loads(json.dumps(asdict(budget)))

    for what, old, new in (("budget", plain(previous.budget), plain(budget)),
                           ("test bed overrides", list(previous.base_overrides), list(base)),
                           ("config", previous.config, config_path)):
        if old != new:
            raise ValueError(f"cannot resume: the {what} differs from the saved protocol.json's "
                             f"({old} there, {new} now); give the same options or a new --out")


def _role(name: str) -> str:
    return next((a.role for a in ALL_ARMS if a.name == name), "main")


def _check_arms(previous: ProtocolResult, arms: Sequence[Arm], roles: Collection[str]) -> None:
    """The saved arms of ``roles`` (run or skipped) are the ones chosen now."""
    saved = {a.name for a in previous.arms if a.role in roles and a.name != BEST_FIXED_CLIP}  # derived
    saved |= {name for name in previous.skipped if _role(name) in roles}
    chosen = {a.name for a in arms if a.role in roles}
    if "main" in roles and any(a.role == "ablation" for a in arms if a.role in roles):
        chosen.add(TREE)  # run_protocol adds it for the ablations
    if saved != chosen:
        raise ValueError(f"cannot resume: the arms differ from the saved protocol.json's ({sorted(saved)})")


def main_part(result: ProtocolResult) -> Part:
    """How the saved protocol ran its main arms: ``all`` (in one command with the ablations) or ``main``."""
    return "all" if "all" in result.parts else "main"


def check_resumable(previous: ProtocolResult, budget: Budget, base: Sequence[str], config_path: str | None,
                    arms: Sequence[Arm], part: Part = "all") -> None:
    """A saved protocol continues only under the same budget, bed, arms and part (one line otherwise)."""
    if previous.stage == "sweep" and not previous.lrs:
        raise ValueError("the saved protocol.json has no finished sweep: start again without --resume")
    _check_setup(previous, budget, base, config_path)
    if part != main_part(previous):
        raise ValueError(f"cannot resume: the saved protocol.json ran --part {main_part(previous)}; resume "
                         "it with that")
    if "ablations" in previous.parts:
        raise ValueError("cannot resume the main part: it is finished and the ablation part has started; "
                         "continue that one with --part ablations --resume")
    _check_arms(previous, arms, ("main",) if part == "main" else ("main", "ablation"))


def run_protocol(budget: Budget, base: Sequence[str] = (), config_path: str | None = None,
                 arms: Sequence[Arm] = ALL_ARMS, log: Callable[[str], None] = print,
                 out: Path | None = None, resume: ProtocolResult | None = None,
                 part: Part = "all", command: str | None = None) -> ProtocolResult:
    """The sweep of the main arms on validation pairs (rates, target, seconds budget: written to
    ``out/protocol.json`` before any test run), then every main arm and seed on both budgets; with
    ``part`` "all" also the ablations (each swept on validation after the main arms) and the like-for-like
    arms under
    the clip treatments (``part`` "main": those follow with :func:`run_ablations`).
    ``protocol.json`` is rewritten after every run. ``resume``: that saved protocol continues (its
    sweep, rates and target kept; finished runs not run again). ``command``: the command line of a
    new protocol, saved with it from its first write (a stopped run's file names it; a resumed one
    keeps its own)."""
    if part not in ("main", "all"):
        raise ValueError(f"run_protocol runs the main part or all of it, not {part!r}")
    began = time.perf_counter()
    code = provenance()
    if resume is not None:
        check_resumable(resume, budget, base, config_path, arms, part)
        stamp_code(resume, part, code)
        log(f"resuming: the sweep's rates and target kept, {len(resume.runs)} test runs done")
        return _test_runs(resume, out, log, part, began)
    chosen = [a for a in arms if part == "all" or a.role == "main"]
    if part == "main" and len(chosen) < len(arms):
        log("part main: the sweep and the main arms; the ablation arms and the clip treatments follow with "
            "--part ablations and the same --out")
    chosen, skipped, configs = _prepare_arms(chosen, base, config_path, log)
    per_iteration = check_same_images(configs)
    main = [a for a in chosen if a.role == "main"]
    if not main:
        raise ValueError("no main arm to sweep: choose at least one (--arms)")
    if budget.seconds is None and "mixgrpo" not in {a.name for a in main}:
        raise ValueError("without the mixgrpo arm the equal-seconds budget must be given (--seconds)")
    reference = next((a for a in chosen if a.is_tree), chosen[0])
    clock = resolve_clock(budget.clock, configs[reference.name])
    test_seed = configs[reference.name].data.eval_seed
    env = environment(configs[reference.name], clock, log)
    treated = len({a.name for a in chosen} & set(like_for_like_arms())) if part == "all" else 0
    log(plan_text(budget, chosen, per_iteration, treated))
    note = seeds_text(budget.seeds)
    if note is not None:
        log(note)

    rows: list[dict[str, Any]] = []
    for arm in main:
        rows += sweep_rates(arm, budget, lambda lr, arm=arm: sweep_run(
            arm_config(base, arm, config_path, lr, budget.sweep_seed, budget.validation_seed), arm, budget,
            clock, test_seed), log)
    lrs = sweeping.best_rates(rows)
    for a in chosen:
        lrs.setdefault(a.name, lrs.get(TREE, budget.lrs[0]))
    target = sweeping.target(rows, budget.target_fraction)
    convergence = sweeping.target(rows, budget.convergence_fraction)
    seconds = sweeping.seconds_budget(budget.seconds, rows, math.ceil(budget.images / per_iteration), clock)
    result = ProtocolResult(budget, list(base), config_path, clock, seconds, per_iteration, rows, lrs, target,
                            list(chosen), skipped=skipped, environment=env, parts=[part],
                            convergence=convergence)
    result.command = command or result.command
    stamp_code(result, part, code, fresh=True)
    ablations = [a for a in result.arms if a.role == "ablation"]
    if ablations:  # part "all": the ablation arms' own sweep, after the main arms' (target and seconds fixed)
        swept_rows, clips, swept, rates = sweep_ablations(result, ablations, base, config_path, log)
        result.sweep += swept_rows
        result.clip_sweep = clips
        result.lrs.update(rates)
        result.arms = [*(a for a in result.arms if a.role != "ablation"), *swept]
    extra = _plan_treatments(result, base, config_path, log) if part == "all" else {}
    if out is not None:
        save(result, out)  # the rates and the target, before any test run
    log(f"rates {lrs}; target gains {target['gain']:+.4f} (first gain) and {convergence['gain']:+.4f} "
        f"(convergence); equal-seconds budget {seconds:.1f} {clock} s; "
        f"{budget.images} images per run")
    _log_expected(result, extra, part, time.perf_counter() - began, log)
    return _test_runs(result, out, log, part, began)


def run_ablations(saved: ProtocolResult, budget: Budget, base: Sequence[str] = (),
                  config_path: str | None = None, arms: Sequence[Arm] = ALL_ARMS,
                  log: Callable[[str], None] = print, out: Path | None = None,
                  resume: bool = False) -> ProtocolResult:
    """The ablation part: the ablation arms of ``arms`` (each at its own rate, swept on validation first:
    :func:`sweep_ablations`) and the
    like-for-like arms under the clip treatments (each at its own rate), continuing ``saved``, whose
    main part has finished; ``resume``: continue an ablation part already started."""
    began = time.perf_counter()
    _check_setup(saved, budget, base, config_path)
    stamp_code(saved, "ablations", provenance())
    if main_part(saved) == "all":
        raise ValueError("this protocol ran every part in one command (--part all): resume it with --part "
                         "all --resume")
    if "ablations" in saved.parts:
        if not resume:
            raise ValueError("the ablation part of this protocol has started: continue it with --resume, or "
                             "give a new --out")
        _check_arms(saved, arms, ("ablation",))
        log(f"resuming the ablation part: {len(saved.runs)} test runs done")
        return _test_runs(saved, out, log, "ablations", began)
    if saved.stage != "done":
        raise ValueError("the main part of this protocol has not finished: resume it first (--resume)")
    if TREE not in saved.lrs:
        raise ValueError(f"the ablations take the rate of {TREE} and are compared with it: the main part did "
                         "not run it")
    wanted = [a for a in arms if a.role == "ablation"]
    if not wanted:
        raise ValueError("no ablation arm chosen (--arms)")
    kept, skipped, configs = _prepare_arms(wanted, base, config_path, log, reference=saved.arm(TREE))
    images = check_same_images({**configs, TREE: arm_config(base, saved.arm(TREE), config_path)})
    if images != saved.images_per_iteration:
        raise ValueError(f"the ablation arms score {images} images per iteration, the main part's "
                         f"{saved.images_per_iteration}")
    log(plan_text(budget, kept, images, len({a.name for a in saved.arms} & set(like_for_like_arms()))))
    rows, clips, kept, rates = sweep_ablations(saved, kept, base, config_path, log)
    saved.sweep += rows
    saved.clip_sweep = clips
    saved.lrs.update(rates)
    saved.arms += kept
    saved.skipped.update(skipped)
    saved.parts.append("ablations")
    extra = _plan_treatments(saved, base, config_path, log)
    saved.stage = "runs"
    if out is not None:
        save(saved, out)
    _log_expected(saved, extra, "ablations", 0.0, log)
    return _test_runs(saved, out, log, "ablations", began)


def stamp_code(result: ProtocolResult, part: str, code: dict[str, Any], fresh: bool = False) -> None:
    """Record the code version ``part`` runs with, refused (one line) when it differs from the version
    that made the parts already in ``result``, or when those recorded none: a published protocol comes from
    one code version. ``fresh``: ``result`` was made by this command."""
    if not fresh and not result.code:
        raise ValueError("the saved protocol.json recorded no code version (it was made before 0.3.1): a "
                         "published protocol comes from one code version, so start again without --resume")
    check_resume(result.code, code, Path("protocol.json"))
    if not any(c.get("part") == part and c["code"] == code["code"] and c.get("machine") == code.get("machine")
               for c in result.code):  # a part resumed on another kind of machine records that one too
        result.code.append({"part": part, **code})


Rows = list[dict[str, Any]]


def sweep_rates(arm: Arm, budget: Budget, validate: Callable[[float], dict[str, Any]],
                log: Callable[[str], None]) -> Rows:
    """``arm`` swept over the budget's rates (``validate``: one sweep run at a rate), each row logged."""
    def one(lr: float) -> dict[str, Any]:
        row = validate(lr)
        log(f"sweep {arm.name:<26} lr {lr:<8g} validation {row['validation_reward']:.4f} "
            f"(before {row['validation_base']:.4f})")
        return row
    return sweeping.sweep_arm(arm.name, budget.lrs, one, budget.max_extensions, log)


def sweep_ablations(saved: ProtocolResult, kept: list[Arm], base: Sequence[str], config_path: str | None,
                    log: Callable[[str], None]) -> tuple[Rows, Rows, list[Arm], dict[str, float]]:
    """The ablation part's sweep on validation pairs, as the main part's: each ablation arm's own rate
    (those of ``SAME_RATE`` take their partner's); then, where both capping clips run, the fixed clip's
    bound at the dynamic clip's rate, whose best becomes the arm ``capping best fixed clip``. Returns the
    sweep rows, the clip rows, the arms (with that one) and their rates."""
    b = saved.budget
    test_seed = arm_config(base, saved.arm(TREE), config_path).data.eval_seed

    def validation(arm: Arm, lr: float) -> dict[str, Any]:
        config = arm_config(base, arm, config_path, lr, b.sweep_seed, b.validation_seed)
        return sweep_run(config, arm, b, saved.clock, test_seed)

    swept = [a for a in kept if a.name not in SAME_RATE]
    clipped = {"capping dynamic clip", "capping fixed clip"} <= {a.name for a in kept}
    log(f"plan: sweep {len(swept)} ablation arms x {len(b.lrs)} rates on validation"
        + (f" (+ up to {len(swept) * b.max_extensions} runs extending the grid)" if b.max_extensions else "")
        + (f", then the fixed clip at {len(FIXED_CLIPS)} bounds" if clipped else ""))
    rows: Rows = []
    for arm in swept:
        rows += sweep_rates(arm, b, lambda lr, arm=arm: validation(arm, lr), log)
    rates = sweeping.best_rates(rows)
    for arm in kept:
        if arm.name in SAME_RATE:
            rates[arm.name] = rates.get(SAME_RATE[arm.name], saved.lrs[TREE])
    clips: Rows = []
    if clipped:
        lr = rates["capping dynamic clip"]
        for clip in FIXED_CLIPS:
            row = {**validation(best_fixed_clip_arm(clip), lr), "clip": clip, "lr": lr}
            clips.append(row)
            log(f"sweep fixed clip {clip:<8g} at lr {lr:g}: validation {row['validation_reward']:.4f}")
        best = max(clips, key=lambda r: (r["validation_reward"], -r["clip"]))["clip"]
        where = next(i for i, a in enumerate(kept) if a.name == "capping fixed clip") + 1
        kept = [*kept[:where], best_fixed_clip_arm(best), *kept[where:]]
        rates[BEST_FIXED_CLIP] = lr
        log(f"the best fixed clip on validation: {best:g} (arm {BEST_FIXED_CLIP!r}, at lr {lr:g})")
    return rows, clips, kept, rates


def _jobs(result: ProtocolResult, part: str) -> list[tuple[Arm, Treatment]]:
    """What ``part`` runs at each seed: its arms as published, and (ablations, all) the like-for-like
    arms that a clip treatment trains."""
    roles = {"main": ("main",), "ablations": ("ablation",)}.get(part, ("main", "ablation"))
    jobs = [(a, PUBLISHED) for a in result.arms if a.role in roles]
    if part != "main":
        jobs += [(result.arm(name), t) for t in TREATMENTS for name in result.arms_trained_under(t.name)]
    return jobs


def target_for(result: ProtocolResult, arm: Arm, treatment: Treatment) -> float | None:
    """The gain a run is evaluated every iteration until it reaches: a main arm's run as published
    (the times to target compare those), when there is a target; None otherwise."""
    watched = result.watched_gain()
    usable = watched is not None and arm.role == "main" and treatment is PUBLISHED
    return float(watched) if usable else None


def _test_runs(result: ProtocolResult, out: Path | None, log: Callable[[str], None], part: str,
               began: float) -> ProtocolResult:
    """Every run of ``part`` at every seed, skipping those ``result`` holds already. The protocol's
    and the part's wall time grow by this command's (``began``: when it started)."""
    budget, base, config_path = result.budget, result.base_overrides, result.config
    total, so_far = result.wall_s, result.part_wall_s.get(part, 0.0)

    def stamp() -> None:
        elapsed = time.perf_counter() - began
        result.wall_s, result.part_wall_s[part] = total + elapsed, so_far + elapsed

    result.stage = "runs"
    done = {(r.arm, r.treatment, r.seed) for r in result.runs}
    for k in range(budget.seeds):
        seed = budget.first_seed + k
        for arm, treatment in _jobs(result, part):
            if (arm.name, treatment.name, seed) in done:
                continue
            config = arm_config(base, arm, config_path, result.lrs[arm.name], seed, treatment=treatment)
            run = full_run(config, arm, budget, result.seconds, result.clock, treatment,
                           target_for(result, arm, treatment))
            result.runs.append(run)
            label = arm.name if treatment is PUBLISHED else f"{arm.name} [{treatment.name}]"
            log(f"seed {seed} {label:<34} images {run.at_images:.4f} seconds {run.at_seconds:.4f} "
                f"({len(run.iteration_wall_s)} iterations, median "
                f"{statistics.median(run.iteration_s(result.clock)):.2f} {result.clock} s)")
            if out is not None:  # after every run: a killed protocol resumes from here
                stamp()
                save(result, out)
    result.stage = "done"
    stamp()
    if out is not None:  # finished: the next part may start from it
        save(result, out)
    return result
