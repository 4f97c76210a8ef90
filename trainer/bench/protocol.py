"""``treerpo bench protocol``: every recipe as published, like for like, at its own best learning
rate, over several seeds, on two budgets; and the paper's dynamic parts switched off one at a time.

Why this shape (docs/results.md says it for readers):

- **Arms.** Dynamic-TreeRPO runs twice, with the Euler tail (paired with MixGRPO, which has it) and
  with the DPM-Solver++(2M) tail (paired with MixGRPO-Flash, which has it). Every baseline trains
  with its own published loss (``baseline_loss: published``) and sampler.
- **Learning rates.** The same grid is swept for every arm on a short budget and one seed, and the
  best rate is chosen on *validation* prompt/seed pairs (``validation_seed``), apart from the test
  pairs every reported figure is measured on.
- **Budgets.** Each run trains until it has scored ``images`` images (equal images, the paper's
  Figure 1 axis) *and* spent ``seconds`` training seconds (equal seconds); the held-out reward is
  measured at both points and every ``eval_every`` iterations. Evaluation time is not charged.
- **Seeds.** Every arm runs seeds ``first_seed ..``; figures are means with 95% intervals, and each
  comparison a Welch test (:mod:`.stats`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..config.files import load_config
from ..config.schema import TrainConfig
from ..core.flow import make_sigmas
from ..training.loop import Trainer, iteration_plan
from ..utils.atomic import atomic_write_text

Role = Literal["main", "ablation"]


@dataclass(frozen=True)
class Arm:
    """One row of the protocol: a strategy with its sampler tail and config overrides."""

    name: str
    strategy: str
    tail: str
    overrides: tuple[str, ...] = ()
    role: Role = "main"
    knob: str = ""

    @property
    def is_tree(self) -> bool:
        return self.strategy == "dynamic_treerpo"


TREE = "dynamic_treerpo"  # the default config: the DPM-Solver++(2M) tail
TREE_EULER = "dynamic_treerpo_euler"
MAIN_ARMS = (
    Arm(TREE, "dynamic_treerpo", "dpm2m"),
    Arm(TREE_EULER, "dynamic_treerpo", "euler", ("tree.tail=euler",)),
    Arm("mixgrpo", "mixgrpo", "euler", ("strategy=mixgrpo",)),
    Arm("mixgrpo_flash", "mixgrpo_flash", "dpm2m", ("strategy=mixgrpo_flash",)),
    Arm("dancegrpo", "dancegrpo", "none (SDE to the end)", ("strategy=dancegrpo",)),
    Arm("flow_grpo", "flow_grpo", "none (SDE to the end)", ("strategy=flow_grpo",)),
    Arm("flow_grpo_fast", "flow_grpo_fast", "euler", ("strategy=flow_grpo_fast",)),
    Arm("branchgrpo", "branchgrpo", "none (SDE to the end)", ("strategy=branchgrpo",)),
)
LIKE_FOR_LIKE = ((TREE_EULER, "mixgrpo"), (TREE, "mixgrpo_flash"))
# the corrected spec's capping clip: element-mean log-probabilities, no spread rescale, bounds at
# which 5-20% of the edges clip at the default learning rate (measured: 4-20% over 5 iterations)
CAPPING = ("clip_spread.enabled=false", "loss.clip.eps_low=1e-6", "loss.clip.eps_high=1e-5")
ABLATION_ARMS = (
    Arm("no LayerTuning", "dynamic_treerpo", "dpm2m", ("loss.prm_lambda=0.0",), "ablation", "LayerTuning-RL"),
    Arm("LayerTuning weight tanh", "dynamic_treerpo", "dpm2m", ("loss.prm_weight=tanh",), "ablation",
        "LayerTuning-RL"),
    Arm("capping dynamic clip", "dynamic_treerpo", "dpm2m", CAPPING, "ablation", "dynamic clipping"),
    Arm("capping fixed clip", "dynamic_treerpo", "dpm2m",
        (*CAPPING, "loss.clip.mode=fixed", "loss.clip.fixed=1e-5"), "ablation", "dynamic clipping"),
    Arm("no clip", "dynamic_treerpo", "dpm2m", ("loss.clip.mode=none",), "ablation", "dynamic clipping"),
    Arm("no depth-wise noise", "dynamic_treerpo", "dpm2m", ("tree.noise_growth=0.0",), "ablation",
        "depth-wise noise"),
    Arm("fixed window", "dynamic_treerpo", "dpm2m", ("window.schedule=fixed",), "ablation",
        "sliding window"),
)


@dataclass(frozen=True)
class Budget:
    """How much the protocol trains. ``seconds`` None: the equal-seconds budget is the time MixGRPO
    needs for ``images`` (its median iteration time in the sweep), the paper's main baseline."""

    images: int = 1536
    seconds: float | None = None
    seeds: int = 5
    first_seed: int = 0
    eval_every: int = 6
    lrs: tuple[float, ...] = (4e-4, 8e-4, 1.6e-3, 3.2e-3)
    sweep_iterations: int = 10
    sweep_seed: int = 1000
    validation_seed: int = 777
    max_iterations_factor: int = 4  # a fast arm's equal-seconds run stops at this many x the images'

    def __post_init__(self) -> None:
        if self.images < 1 or self.seeds < 1 or self.eval_every < 1 or self.sweep_iterations < 1:
            raise ValueError("images, seeds, eval_every and sweep_iterations must be >= 1")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if not self.lrs or min(self.lrs) <= 0:
            raise ValueError("lrs must be one or more positive learning rates")


QUICK = Budget(images=32, seconds=None, seeds=2, eval_every=1, lrs=(1e-3, 2e-3), sweep_iterations=1)
QUICK_OVERRIDES = ("data.prompts_per_iteration=2", "data.eval_pairs=4", "sampling.eval_steps=2",
                   "lora.rank=4")


@dataclass
class Run:
    """One arm and seed: held-out rewards along the run and its costs."""

    arm: str
    seed: int
    lr: float
    images_per_iteration: int
    points: list[dict[str, float]] = field(default_factory=list)  # iteration, images, seconds, reward
    iteration_s: list[float] = field(default_factory=list)
    rollout_nfe: list[int] = field(default_factory=list)
    at_images: float = math.nan  # held-out reward at the equal-images budget
    at_seconds: float = math.nan  # ... at the first iteration at or past the equal-seconds budget
    seconds_reached: bool = True

    def reaching(self, target: float, axis: str, limit: float) -> float | None:
        """``axis`` (images or seconds) where the held-out reward first reached ``target`` within
        ``limit`` (None: never)."""
        return next((p[axis] for p in self.points if p[axis] <= limit + 1e-9 and p["reward"] >= target),
                    None)

    def first_reaching(self, target: float, axis: str, limit: float) -> float:
        """:meth:`reaching`, censored at ``limit`` when it never did."""
        hit = self.reaching(target, axis, limit)
        return limit if hit is None else hit


def images_per_iteration(config: TrainConfig) -> int:
    """Scored images of one iteration: prompts x leaves per prompt."""
    sigmas = make_sigmas(config.sampling.schedule, config.strategy_config.steps, config.sampling.shift)
    return config.data.prompts_per_iteration * iteration_plan(config, sigmas, 0).leaves_per_prompt


def check_same_images(configs: dict[str, TrainConfig]) -> int:
    """Images per iteration of every arm; different counts would not be a fair comparison."""
    counts = {name: images_per_iteration(c) for name, c in configs.items()}
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{k} {v}" for k, v in counts.items())
        raise ValueError(f"the arms score different numbers of images per iteration ({listed}): set each "
                         "baseline's group size (branchgrpo.splits) to the tree's leaves")
    return next(iter(counts.values()))


def train_run(config: TrainConfig, arm: str, budget: Budget, seconds: float | None,
              evaluate_every: int | None = None) -> Run:
    """Train ``config`` to both budgets, measuring the held-out reward along the way."""
    per_iteration = images_per_iteration(config)
    target_iterations = math.ceil(budget.images / per_iteration)
    cap = target_iterations * budget.max_iterations_factor
    every = evaluate_every or budget.eval_every
    trainer = Trainer(config)
    run = Run(arm, config.seed, config.optim.lr, per_iteration)

    def measure(iteration: int, spent: float) -> float:
        reward = trainer.evaluate()[0]["eval_reward"]
        run.points.append({"iteration": iteration, "images": iteration * per_iteration,
                           "seconds": spent, "reward": reward})
        return reward

    measure(0, 0.0)
    spent, iteration = 0.0, 0
    while iteration < target_iterations or (seconds is not None and spent < seconds and iteration < cap):
        row = trainer.step(iteration)
        iteration += 1
        spent += row["iteration_s"]
        run.iteration_s.append(row["iteration_s"])
        run.rollout_nfe.append(int(row["nfe_rollout"]))
        crossed = seconds is not None and math.isnan(run.at_seconds) and spent >= seconds
        if iteration % every == 0 or iteration == target_iterations or crossed:
            reward = measure(iteration, spent)
            if iteration == target_iterations:
                run.at_images = reward
            if crossed:
                run.at_seconds = reward
    if seconds is not None and math.isnan(run.at_seconds):  # stopped by the cap
        if run.points[-1]["iteration"] != iteration:
            measure(iteration, spent)
        run.at_seconds, run.seconds_reached = run.points[-1]["reward"], False
    return run


def arm_config(base: Sequence[str], arm: Arm, config_path: str | None, lr: float | None = None,
               seed: int | None = None, validation_seed: int | None = None) -> TrainConfig:
    """The config of ``arm`` on top of the protocol's base overrides."""
    extra = [*base, *arm.overrides]
    if lr is not None:
        extra.append(f"optim.lr={lr}")
    if seed is not None:
        extra.append(f"seed={seed}")
    if validation_seed is not None:
        extra.append(f"data.eval_seed={validation_seed}")
    return load_config(TrainConfig, config_path, extra)


def sweep(arms: Sequence[Arm], base: Sequence[str], config_path: str | None, budget: Budget,
          log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every arm at every rate of ``budget.lrs``: one seed, ``sweep_iterations`` iterations, the
    reward on the validation pairs at the end."""
    rows = []
    for arm in arms:
        for lr in budget.lrs:
            config = arm_config(base, arm, config_path, lr, budget.sweep_seed, budget.validation_seed)
            per_iteration = images_per_iteration(config)
            short = replace(budget, images=budget.sweep_iterations * per_iteration, seconds=None)
            run = train_run(config, arm.name, short, None, evaluate_every=budget.sweep_iterations)
            rows.append({"arm": arm.name, "lr": lr, "validation_reward": run.at_images,
                         "validation_base": run.points[0]["reward"],
                         "median_iteration_s": statistics.median(run.iteration_s)})
            log(f"sweep {arm.name:<26} lr {lr:<8g} validation {run.at_images:.4f}")
    return rows


def best_rates(sweep_rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per arm, the rate with the highest validation reward (ties: the smaller rate)."""
    best: dict[str, tuple[float, float]] = {}
    for r in sweep_rows:
        key = (r["validation_reward"], -r["lr"])
        if r["arm"] not in best or key > (best[r["arm"]][0], -best[r["arm"]][1]):
            best[r["arm"]] = (r["validation_reward"], r["lr"])
    return {arm: lr for arm, (_, lr) in best.items()}


def seconds_budget(budget: Budget, sweep_rows: Sequence[dict[str, Any]], images_per_it: int) -> float:
    """The equal-seconds budget: as given, or MixGRPO's time for the image budget (the median of
    its sweep iterations)."""
    if budget.seconds is not None:
        return budget.seconds
    times = [r["median_iteration_s"] for r in sweep_rows if r["arm"] == "mixgrpo"]
    if not times:
        raise ValueError("without a MixGRPO arm the equal-seconds budget must be given (--seconds)")
    return math.ceil(budget.images / images_per_it) * statistics.median(times)


@dataclass
class ProtocolResult:
    budget: Budget
    base_overrides: list[str]
    seconds: float
    images_per_iteration: int
    sweep: list[dict[str, Any]]
    lrs: dict[str, float]
    arms: list[Arm]
    runs: list[Run]
    wall_s: float = 0.0  # the whole protocol, sweep included
    command: str = "treerpo bench protocol"  # what made it, for the results page

    def to_json(self) -> dict[str, Any]:
        return {"budget": asdict(self.budget), "base_overrides": self.base_overrides,
                "seconds": self.seconds, "images_per_iteration": self.images_per_iteration,
                "sweep": self.sweep, "lrs": self.lrs, "arms": [asdict(a) for a in self.arms],
                "runs": [asdict(r) for r in self.runs], "wall_s": self.wall_s, "command": self.command}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProtocolResult:
        budget = Budget(**{**data["budget"], "lrs": tuple(data["budget"]["lrs"])})
        arms = [Arm(**{**a, "overrides": tuple(a["overrides"])}) for a in data["arms"]]
        return cls(budget, data["base_overrides"], data["seconds"], data["images_per_iteration"],
                   data["sweep"], data["lrs"], arms, [Run(**r) for r in data["runs"]],
                   data.get("wall_s", 0.0), data.get("command", "treerpo bench protocol"))


def run_protocol(budget: Budget, base: Sequence[str] = (), config_path: str | None = None,
                 arms: Sequence[Arm] = MAIN_ARMS + ABLATION_ARMS,
                 log: Callable[[str], None] = print) -> ProtocolResult:
    """The whole protocol: the rate sweep of the main arms, then every arm and seed on both budgets
    (ablations at the default tree's rate). Seeds are the outer loop so that a machine slowing
    down mid-way affects every arm alike."""
    main = [a for a in arms if a.role == "main"]
    configs = {a.name: arm_config(base, a, config_path) for a in arms}
    per_iteration = check_same_images(configs)
    sweep_rows = sweep(main, base, config_path, budget, log)
    lrs = best_rates(sweep_rows)
    tree_lr = lrs.get(TREE, budget.lrs[0])
    for a in arms:
        lrs.setdefault(a.name, tree_lr)
    seconds = seconds_budget(budget, sweep_rows, per_iteration)
    log(f"rates: {lrs}; equal-seconds budget {seconds:.1f} s; {budget.images} images per run")
    runs = []
    for k in range(budget.seeds):
        seed = budget.first_seed + k
        for a in arms:
            run = train_run(arm_config(base, a, config_path, lrs[a.name], seed), a.name, budget, seconds)
            runs.append(run)
            log(f"seed {seed} {a.name:<26} images {run.at_images:.4f} seconds {run.at_seconds:.4f} "
                f"({len(run.iteration_s)} iterations, median {statistics.median(run.iteration_s):.2f} s)")
    return ProtocolResult(budget, list(base), seconds, per_iteration, sweep_rows, lrs, list(arms), runs)


def save(result: ProtocolResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "protocol.json", json.dumps(result.to_json(), indent=1) + "\n")
