"""``treerpo bench protocol``: every recipe as published, like for like, at its own best learning
rate, over paired seeds, on two budgets; the paper's dynamic parts switched off one at a time; the
like-for-like pairs again under two clip treatments. ``protocol.json`` holds everything the report
needs.

Why this shape (docs/results-protocol.md says it for readers):

- **Two parts.** ``--part main`` (the default): the sweep and the main arms as published, the
  primary claims' runs, sized to fit the CPU test bed's 2 cores in :data:`.plan.MAIN_PART_MINUTES`. ``--part
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

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...config.schema import TrainConfig
from ..common.provenance import provenance
from . import sweep as sweeping
from .arm_run import environment, full_run, sweep_run
from .arms import (
    ALL_ARMS,
    BEST_FIXED_CLIP,
    FIXED_CLIPS,
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
from .bed import resolve_clock
from .plan import like_for_like_arms, log_expected, plan_text, seeds_text
from .results import Budget, Part, ProtocolResult, save
from .resume import check_arms, check_resumable, check_setup, main_part, stamp_code


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
        return run_part(resume, out, log, part, began)
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
    log_expected(result, extra, part, time.perf_counter() - began, log)
    return run_part(result, out, log, part, began)


def run_ablations(saved: ProtocolResult, budget: Budget, base: Sequence[str] = (),
                  config_path: str | None = None, arms: Sequence[Arm] = ALL_ARMS,
                  log: Callable[[str], None] = print, out: Path | None = None,
                  resume: bool = False) -> ProtocolResult:
    """The ablation part: the ablation arms of ``arms`` (each at its own rate, swept on validation first:
    :func:`sweep_ablations`) and the
    like-for-like arms under the clip treatments (each at its own rate), continuing ``saved``, whose
    main part has finished; ``resume``: continue an ablation part already started."""
    began = time.perf_counter()
    check_setup(saved, budget, base, config_path)
    stamp_code(saved, "ablations", provenance())
    if main_part(saved) == "all":
        raise ValueError("this protocol ran every part in one command (--part all): resume it with --part "
                         "all --resume")
    if "ablations" in saved.parts:
        if not resume:
            raise ValueError("the ablation part of this protocol has started: continue it with --resume, or "
                             "give a new --out")
        check_arms(saved, arms, ("ablation",))
        log(f"resuming the ablation part: {len(saved.runs)} test runs done")
        return run_part(saved, out, log, "ablations", began)
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
    log_expected(saved, extra, "ablations", 0.0, log)
    return run_part(saved, out, log, "ablations", began)



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


def run_part(result: ProtocolResult, out: Path | None, log: Callable[[str], None], part: str,
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
