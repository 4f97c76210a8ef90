"""``treerpo bench taste-cost``'s runs and table (trainer/bench/taste/cost.py): what it times beside the
default, and each run's seconds against one training. The seconds themselves are printed, never asserted."""

from __future__ import annotations

from dataclasses import replace

from dynamic_treerpo.trainer.bench.taste.cost import SMALL, SMALL_TREES, cases, format_costs
from dynamic_treerpo.trainer.config.picks_budget import PICKS_BUDGET


def test_it_times_the_default_beside_each_checkpoint_measured_and_one_training() -> None:
    names = {c.name: c for c in cases()}
    default = names["the default"]
    assert default.budget == PICKS_BUDGET and default.trees == PICKS_BUDGET.template.trees == 12
    every = next(c for n, c in names.items() if n.startswith("the default, each checkpoint"))
    assert every.budget == replace(PICKS_BUDGET, measure="every")
    # since 0.6 the default is one training (at 0.4): 0.5.0's two trainings are timed beside it
    assert PICKS_BUDGET.weights == (0.4,) and not any(n.startswith("one training") for n in names)
    old = names["0.5.0's default: one training per weight of 0.3 and 0.5"]
    assert old.budget == replace(PICKS_BUDGET, weights=(0.3, 0.5))
    assert names["small run: 0.5.0's two trainings"].budget.weights == (0.3, 0.5)
    # a default of two weights is timed beside one training at its first
    two = {c.name: c for c in cases(replace(PICKS_BUDGET, weights=(0.3, 0.5)))}
    assert two["one training at 0.3"].budget.weights == (0.3,) and not any("0.5.0" in n for n in two)
    small = [c for n, c in names.items() if n.startswith("small run")]
    assert {c.budget.measure for c in small} == {"backward", "every"}
    assert all(c.trees == SMALL_TREES and c.budget.iterations == SMALL["iterations"] for c in small)


def test_the_table_sets_each_run_against_one_training() -> None:
    row = {"weights": [0.3], "trees": 12, "cpu_seconds": 1.0, "training_seconds": 1.0, "guard_seconds": 1.0,
           "training_images": 10, "guard_images": 20}
    rows = [{**row, "case": "the default", "seconds": 150.0, "weights": [0.3, 0.5]},
            {**row, "case": "one training at 0.3", "seconds": 60.0},
            {**row, "case": "small run: the default", "seconds": 40.0}]
    lines = format_costs(rows).splitlines()
    assert lines[2].endswith("| 2.50x |") and lines[3].endswith("| 1.00x |") and lines[4].endswith("|  |")
