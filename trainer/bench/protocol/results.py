"""What ``protocol.json`` holds: the budget, every run's measurements at the fixed checkpoints
(and, for a main arm's run, after every iteration until it reached the target), the sweep and
what was fixed from it, and which parts of the protocol ran. The report reads these alone
(``treerpo bench report``), so nothing here imports the trainer.

The file is versioned (``format``): a file of another format is refused in one line, since its
numbers were measured another way (Welch tests, evaluations every few iterations). Format 2 files
written before times to target were resolved per iteration still load: their runs have no
``target_gain``, and the report reads their times as measurements on the checkpoint grid.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ...utils.atomic import atomic_write_text
from ..common.stats import MAX_EXACT_SEEDS, seeds_for_exact
from . import sweep as sweeping
from .arms import PUBLISHED, Arm

FORMAT = 2  # protocol.json's layout; `treerpo bench report` reads only this one
Clock = Literal["auto", "cpu", "wall"]
Part = Literal["main", "ablations", "all"]
PARTS: tuple[Part, ...] = ("main", "ablations", "all")
"""``main``: the sweep and the main arms as published; ``ablations``: the ablation arms and the clip
treatments, continuing a finished main part; ``all``: both in one command (``--quick``, CI's)."""
PRIMARY_CLAIMS = 6
"""The primary family's size (claims.primary_tests: convergence per sample and per second, final
reward at equal images and at equal seconds, iteration time against 0.6x and 0.5x); it sets the
default number of seeds."""


@dataclass(frozen=True)
class Budget:
    """How much the protocol trains. ``seconds`` None: the equal-seconds budget is the time MixGRPO
    needs for ``images`` (its median sweep iteration), the paper's main baseline."""

    # sized for the main part (sweep and every main arm at the default seeds) to fit the wall time of
    # plan.MAIN_PART_MINUTES on 2 CPU cores (the committed run's part times: docs/results-protocol.md); the
    # command prints its own estimate after the sweep and warns above it. 5 iterations of 64 images, 2
    # checkpoints per budget (the times to target come from the per-iteration evaluations), a 3-iteration
    # sweep; the first target is half its median gain (a larger one costs more evaluations: runs that do
    # not reach it are evaluated after every iteration)
    images: int = 320
    seconds: float | None = None
    # the fewest with which the exact test can reach the primary family's Holm threshold
    seeds: int = seeds_for_exact(PRIMARY_CLAIMS)
    first_seed: int = 0
    checkpoints: int = 2
    lrs: tuple[float, ...] = (4e-4, 8e-4, 1.6e-3, 3.2e-3)
    max_extensions: int = 1
    sweep_iterations: int = 3
    sweep_seed: int = 1000
    validation_seed: int = 777
    target_fraction: float = 0.5  # the first gain: its time is mostly the cost of the first iterations
    convergence_fraction: float = 1.0  # the convergence target, which most arms need several iterations for
    clock: Clock = "auto"
    max_iterations_factor: int = 4  # a fast arm's equal-seconds run stops at this many x the images'

    def __post_init__(self) -> None:
        if min(self.images, self.seeds, self.checkpoints, self.sweep_iterations) < 1:
            raise ValueError("images, seeds, checkpoints and sweep_iterations must be >= 1")
        if self.seeds < 2:
            raise ValueError(f"paired tests need at least 2 seeds, got {self.seeds}")
        if self.seeds > MAX_EXACT_SEEDS:  # refused before anything trains, not when the report is made
            raise ValueError(f"the exact sign-flip test enumerates 2**seeds sign patterns: at most "
                             f"{MAX_EXACT_SEEDS} seeds, got {self.seeds}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if not self.lrs or min(self.lrs) <= 0:
            raise ValueError("lrs must be one or more positive learning rates")
        if self.max_extensions < 0 or not 0 < self.target_fraction <= 1:
            raise ValueError("max_extensions must be >= 0 and target_fraction in (0, 1]")
        if not self.target_fraction < self.convergence_fraction <= 2:
            raise ValueError("convergence_fraction must be above target_fraction and at most 2")
        if self.clock not in ("auto", "cpu", "wall"):
            raise ValueError(f"clock must be auto, cpu or wall, got {self.clock!r}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Budget:
        return cls(**{**data, "lrs": tuple(data["lrs"])})


def checkpoints(total: float, count: int) -> list[float]:
    """``count`` evenly spaced checkpoints of a budget: ``total * k / count`` for k = 1..count."""
    return [total * k / count for k in range(1, count + 1)]


def seconds_key(clock: str) -> str:
    """The point field of ``clock``'s seconds (``cpu_s`` or ``wall_s``)."""
    return f"{clock}_s"


@dataclass
class Run:
    """One arm, treatment and seed: the held-out reward at each checkpoint, and its costs."""

    arm: str
    seed: int
    lr: float
    images_per_iteration: int
    treatment: str = PUBLISHED.name
    points: list[dict[str, float]] = field(default_factory=list)  # iteration, images, cpu_s, wall_s, reward
    image_marks: list[int] = field(default_factory=list)  # per image checkpoint: its point's index
    second_marks: list[int] = field(default_factory=list)  # per seconds checkpoint: its point's index
    iteration_wall_s: list[float] = field(default_factory=list)
    iteration_cpu_s: list[float] = field(default_factory=list)
    rollout_nfe: list[int] = field(default_factory=list)
    clip_frac: list[float] = field(default_factory=list)
    seconds_reached: bool = True
    # evaluated after every iteration until the reward reached base + this gain (None: at the
    # checkpoints only, so a time to target is resolved to the checkpoint grid)
    target_gain: float | None = None
    # the machine's 1-minute load average when the run started and ended (None: not recorded)
    load: list[float] | None = None

    @property
    def base(self) -> float:
        """The held-out reward before training."""
        return self.points[0]["reward"]

    def marks(self, axis: str) -> list[int]:
        return self.image_marks if axis == "images" else self.second_marks

    def reward_at(self, axis: str, k: int = -1) -> float:
        """The held-out reward at checkpoint ``k`` of ``axis`` (images or seconds); -1: the budget."""
        return self.points[self.marks(axis)[k]]["reward"]

    @property
    def at_images(self) -> float:
        return self.reward_at("images")

    @property
    def at_seconds(self) -> float:
        return self.reward_at("seconds")

    @property
    def ema_at_images(self) -> float | None:
        """The reward of the weights' average at the image budget, for recipes that evaluate one."""
        return self.points[self.image_marks[-1]].get("reward_ema")

    def iteration_s(self, clock: str) -> list[float]:
        return self.iteration_cpu_s if clock == "cpu" else self.iteration_wall_s

    def per_iteration(self, gain: float) -> bool:
        """Whether every iteration was evaluated until the reward reached base + ``gain`` (the run
        watched for this gain or a larger one), so that its time to it is not the checkpoints'."""
        return self.target_gain is not None and gain <= self.target_gain + 1e-12

    def time_to(self, gain: float, axis: str, clock: str) -> float | None:
        """Images (or ``clock`` seconds) spent at the first evaluation whose reward is at least this
        run's base plus ``gain``: among every iteration's when the run was evaluated after each until
        it got there, else among the checkpoints of ``axis``; None when none is (it may lie past the
        budget: :func:`.survival.capped` censors it there)."""
        key = "images" if axis == "images" else seconds_key(clock)
        points = self.points if self.per_iteration(gain) else [self.points[m] for m in self.marks(axis)]
        hit = next((p for p in points if p["reward"] >= self.base + gain), None)
        return None if hit is None else hit[key]



@dataclass
class ProtocolResult:
    """Everything the protocol measured and fixed; ``protocol.json`` (``stage``: ``sweep`` once the
    rates and the target are fixed, ``runs`` while test runs go on, ``done``)."""

    budget: Budget
    base_overrides: list[str]
    config: str | None
    clock: str
    seconds: float
    images_per_iteration: int
    sweep: list[dict[str, Any]]
    lrs: dict[str, float]
    target: dict[str, Any]
    arms: list[Arm]
    treatments: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)  # threads, OMP_WAIT_POLICY, device
    stage: str = "sweep"
    wall_s: float = 0.0  # the whole protocol, sweep included
    command: str = "treerpo bench protocol"  # what made it (one line per part), for the results page
    parts: list[str] = field(default_factory=lambda: ["main"])  # the parts started, in order
    part_wall_s: dict[str, float] = field(default_factory=dict)  # per part (the main part's: sweep included)
    code: list[dict[str, Any]] = field(default_factory=list)  # per part: the code version (common.provenance)
    # the second target, fixed from the sweep with the first (None: a file from before it existed)
    convergence: dict[str, Any] | None = None
    clip_sweep: list[dict[str, Any]] = field(default_factory=list)  # the ablation part's fixed clip bounds

    @property
    def images_limit(self) -> float:
        """The images every run has scored at the image budget (whole iterations)."""
        return float(math.ceil(self.budget.images / self.images_per_iteration) * self.images_per_iteration)

    @property
    def checkpoints(self) -> dict[str, list[float]]:
        return {"images": checkpoints(self.budget.images, self.budget.checkpoints),
                "seconds": checkpoints(self.seconds, self.budget.checkpoints)}

    @property
    def grid(self) -> dict[str, dict[str, Any]]:
        return sweeping.grid(self.sweep)

    def at_convergence(self) -> ProtocolResult | None:
        """This result with the convergence target as its target (what the time-to-target code reads),
        or None when it has none."""
        return None if self.convergence is None else replace(self, target=self.convergence)

    def watched_gain(self) -> float | None:
        """The largest usable target gain: a main arm's run is evaluated every iteration until it
        reaches it (None: no usable target)."""
        gains = [t["gain"] for t in (self.target, self.convergence) if t is not None and t["usable"]]
        return max(gains) if gains else None

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    @property
    def baselines(self) -> list[str]:
        """The main arms that are not the tree, in protocol order: the claims are tested against each."""
        return [a.name for a in self.arms if a.role == "main" and not a.is_tree]

    def treatment_status(self, treatment: str, arm: str) -> str:
        """``trained``, ``reused`` (the published runs: the treatment changes nothing for this arm),
        ``skipped: <why>`` or ``not run``."""
        if treatment == PUBLISHED.name:
            return "trained"
        record = next((t for t in self.treatments if t["name"] == treatment), None)
        return "not run" if record is None else record["arms"].get(arm, "not run")

    def runs_of(self, arm: str, treatment: str = PUBLISHED.name) -> list[Run]:
        """The runs of ``arm`` under ``treatment``, by seed (empty when it did not run)."""
        status = self.treatment_status(treatment, arm)
        if status == "reused":
            treatment = PUBLISHED.name
        elif status != "trained":
            return []
        runs = (r for r in self.runs if r.arm == arm and r.treatment == treatment)
        return sorted(runs, key=lambda r: r.seed)

    def arms_trained_under(self, treatment: str) -> list[str]:
        """The arms a treatment trains (not reused from the published runs, not skipped)."""
        record = next((t for t in self.treatments if t["name"] == treatment), {"arms": {}})
        return [arm for arm, status in record["arms"].items() if status == "trained"]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "stage": self.stage, "command": self.command, "wall_s": self.wall_s,
                "budget": asdict(self.budget), "base_overrides": self.base_overrides, "config": self.config,
                "clock": self.clock, "seconds": self.seconds,
                "images_per_iteration": self.images_per_iteration,
                "checkpoints": self.checkpoints, "sweep": self.sweep, "lrs": self.lrs, "grid": self.grid,
                "target": self.target, "arms": [asdict(a) for a in self.arms], "treatments": self.treatments,
                "skipped": self.skipped, "environment": self.environment, "parts": self.parts,
                "part_wall_s": self.part_wall_s, "code": self.code, "convergence": self.convergence,
                "clip_sweep": self.clip_sweep,
                "runs": [asdict(r) for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProtocolResult:
        found = data.get("format", 1) if isinstance(data, dict) else None
        if found != FORMAT:
            raise ValueError(f"protocol.json has format {found}, this treerpo reads format {FORMAT}: run "
                             "`treerpo bench protocol` again (paired seeds, fixed checkpoints)")
        arms = [Arm(**{**a, "overrides": tuple(a["overrides"])}) for a in data["arms"]]
        return cls(Budget.from_json(data["budget"]), data["base_overrides"], data["config"], data["clock"],
                   data["seconds"], data["images_per_iteration"], data["sweep"], data["lrs"], data["target"],
                   arms, data["treatments"], [Run(**r) for r in data["runs"]], data["skipped"],
                   data["environment"], data["stage"], data["wall_s"], data["command"],
                   data.get("parts") or _parts_of(arms, data["treatments"]), data.get("part_wall_s", {}),
                   data.get("code", []), data.get("convergence"), data.get("clip_sweep", []))


def _parts_of(arms: list[Arm], treatments: list[dict[str, Any]]) -> list[str]:
    """The parts of a file written before the protocol had parts: one command ran everything."""
    return ["all"] if treatments or any(a.role == "ablation" for a in arms) else ["main"]


def save(result: ProtocolResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "protocol.json", json.dumps(result.to_json(), indent=1) + "\n")


def load(out: Path) -> ProtocolResult:
    """``out/protocol.json``; a missing or old file is a one-line error."""
    path = out / "protocol.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `treerpo bench protocol --out {out}` first")
    try:
        return ProtocolResult.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a protocol.json this treerpo wrote "
                         f"({type(err).__name__}: {err})") from None


