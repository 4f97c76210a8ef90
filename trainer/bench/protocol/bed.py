"""The protocol's test bed and budget: the overrides it adds to the base config (the embedded default's
task, the smoke run's small sizes), the budget the command line changes, and which clock counts seconds.

Kept apart from the runs so that the command line and the tests read the bed without loading a trainer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from ...config.schema import TrainConfig
from ...training.build import resolve_device
from .results import Budget, Clock

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
test pairs (more would make evaluation, which no budget charges, a large share of the main part's
wall time). A given config (FLUX, SD3) is taken as written."""
TASKS = {
    "scene": (),
    # a taste that no shipped reward measures, mixed half and half with the scene reward as a guard:
    # it learns faster than the scene reward alone, which at a CPU's budget is what lets the recipes be
    # told apart (the gains each bed reaches: docs/results-protocol.md, docs/algorithm.md)
    "taste": ("reward=scene:0.5,function:0.5",
              "reward_weights={function: dynamic_treerpo.trainer.bench.taste.hidden_tastes:larger_objects}"),
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
