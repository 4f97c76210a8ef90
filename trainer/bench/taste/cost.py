"""``treerpo bench taste-cost``: what training from picks costs a person, as the node runs it, in one run of
the command: seconds (wall and CPU), the training steps' seconds and the guard's measurements' seconds
beside them, and the images each drew.

Why a command and not a timed test: a time depends on the machine and on what else runs there, so it is
printed beside the runs it is compared with, on one machine in one run, never asserted. The runs:

- the shipped default on the template's picks (its 12 trees of 3 prompts, every one labelled by the
  simulated person), at the shipped budget;
- the default measuring each checkpoint as it is kept (``guard.measure: every``, the order before
  ``backward``);
- one training at one picks weight with the same guard: what "one training" costs (the default may cost at
  most 1.25 times this);
- 0.5.0's default, training once per weight of 0.3 and 0.5 with the same budget;
- the small run: 2 rounds of 4 prompts on 9 labelled trees, ``closely``, with the default, with each
  checkpoint measured as it is kept, and with 0.5.0's two trainings (the figure a person waits for on a
  CPU before anything else).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...config.picks_budget import PICKS_BUDGET, PicksBudget
from .as_node import folder_with, guard_images, train_as_node, training_images
from .person import SimulatedPerson, load_taste
from .trees import template_trees

TWO_WEIGHTS = (0.3, 0.5)
SMALL = {"iterations": 2, "prompts_per_iteration": 4}
SMALL_TREES = 9


@dataclass(frozen=True)
class Case:
    """One configuration timed: its name, the budget, how many of the template's trees it trains on."""

    name: str
    budget: PicksBudget
    trees: int


def cases(budget: PicksBudget = PICKS_BUDGET) -> list[Case]:
    """The runs the command times, the shipped default first."""
    one = replace(budget, weights=budget.weights[:1])
    small = replace(budget, **SMALL)
    out = [Case("the default", budget, budget.template.trees)]
    if budget.measure != "every":
        out.append(Case("the default, each checkpoint measured as it is kept (guard.measure: every)",
                        replace(budget, measure="every"), budget.template.trees))
    if len(budget.weights) > 1:
        out.append(Case(f"one training at {budget.weights[0]:g}", one, budget.template.trees))
    if tuple(budget.weights) != TWO_WEIGHTS:
        out.append(Case("0.5.0's default: one training per weight of 0.3 and 0.5",
                        replace(budget, weights=TWO_WEIGHTS), budget.template.trees))
    out.append(Case("small run (2 rounds of 4 prompts, 9 trees): the default", small, SMALL_TREES))
    if budget.measure != "every":
        out.append(Case("small run: each checkpoint measured as it is kept", replace(small, measure="every"),
                        SMALL_TREES))
    if tuple(budget.weights) != TWO_WEIGHTS:
        out.append(Case("small run: 0.5.0's two trainings", replace(small, weights=TWO_WEIGHTS), SMALL_TREES))
    return out


def time_case(case: Case, store: Any, ids: list[str], work: Path, seed: int) -> dict[str, Any]:
    """Train the case as the node does and return its costs."""
    folder = folder_with(store, ids[: case.trees], work / case.name.replace(" ", "_")[:40])
    _, state, costs = train_as_node(case.budget, folder, seed, work)
    return {"case": case.name, "weights": list(case.budget.weights), "trees": case.trees,
            **costs, "training_images": training_images(state), "guard_images": guard_images(state),
            "kept": state.picks_weights.weight if state.picks_weights else None}


def run_cost(taste: str = "larger_objects", seed: int = 0, budget: PicksBudget = PICKS_BUDGET
             ) -> list[dict[str, Any]]:
    """Every case of :func:`cases` on the template's trees labelled for ``taste``, in order."""
    from ...config.files import load_config
    from ...config.schema import TrainConfig

    _, function = load_taste(taste)
    person = SimulatedPerson(function)
    shift = load_config(TrainConfig, None, []).sampling.shift  # the embedded loader's, as the template has it
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store, ids = template_trees(seed, work / "trees", person, shift)
        for case in cases(budget):
            rows.append(time_case(case, store, ids, work, seed))
    return rows


def format_costs(rows: list[dict[str, Any]]) -> str:
    """The comparison table, each run's seconds against the first (the default)."""
    one = next((r for r in rows if r["case"].startswith("one training")), rows[0])
    lines = ["| run | picks weights | trees | wall s | CPU s | training s | guard s | training images | "
             "guard images | against one training |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["seconds"] / one["seconds"] if not r["case"].startswith("small") else float("nan")
        lines.append(f"| {r['case']} | {', '.join(f'{w:g}' for w in r['weights'])} | {r['trees']} | "
                     f"{r['seconds']:.0f} | {r['cpu_seconds']:.0f} | {r['training_seconds']:.0f} | "
                     f"{r['guard_seconds']:.0f} | {r['training_images']} | {r['guard_images']} | "
                     + ("" if ratio != ratio else f"{ratio:.2f}x") + " |")
    return "\n".join(lines)
