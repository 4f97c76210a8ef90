"""A pilot choosing the picks weight from each run's first checkpoint (trainer/bench/taste/pilot.py and
the ablation row built on it): the projection by hand, the choice replayed on the published runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.taste import ablation as ab
from dynamic_treerpo.trainer.bench.taste.pilot import (
    pilot_cost,
    pilot_index,
    pilot_point,
    projected_gain,
    run_projection,
)
from dynamic_treerpo.trainer.bench.taste.storage import reload

DATA = Path(__file__).resolve().parents[1] / "docs" / "data" / "taste"
TASTES = ("central_objects", "deep_shades", "larger_objects", "lower_objects", "warm_shades")


def test_a_run_that_stays_inside_the_limit_projects_its_straight_line_to_the_end() -> None:
    assert projected_gain(0.5, 0.002, 0.005, 0.02, 1.0, 6, 24) == pytest.approx(2.0)
    assert projected_gain(0.5, -0.01, 0.005, 0.02, 1.0, 6, 24) == pytest.approx(2.0)  # the fall rose


def test_a_run_that_would_cross_the_limit_projects_the_gain_at_the_crossing() -> None:
    # room 0.02 - 1 x 0.005 = 0.015; the line reaches it at 0.015 / 0.01 = 1.5 times the pilot's gain
    assert projected_gain(0.4, 0.01, 0.005, 0.02, 1.0, 6, 24) == pytest.approx(0.6)
    assert projected_gain(0.4, 0.01, 0.005, 0.02, 0.0, 6, 24) == pytest.approx(0.8)  # no margin
    assert projected_gain(0.4, 0.03, 0.025, 0.02, 1.0, 6, 24) == 0.0  # the margin already took the limit


def test_the_pilot_keeps_the_most_projected_gain_and_the_first_weight_on_ties() -> None:
    assert pilot_index([0.2, 0.5]) == 1
    assert pilot_index([0.5, 0.5]) == 0
    with pytest.raises(ValueError, match="every weight"):
        pilot_index([0.2, math.nan])
    with pytest.raises(ValueError, match="a pilot of 30 iterations"):
        projected_gain(0.1, 0.0, 0.0, 0.02, 1.0, 30, 24)
    assert pilot_cost(2, 6, 24) == 1.25 and pilot_cost(3, 12, 24) == 2.0


def test_on_the_published_runs_the_row_keeps_per_run_the_weight_its_projection_says() -> None:
    """The row replayed by hand on the stored table (0.3) and weight arm (0.5): the pilot checkpoint is
    the first one (6 of 24 iterations), each seed keeps the stored run of the weight projected higher,
    and both choices (pilot and whole runs) are exercised."""
    default = [reload(DATA / "taste_table" / t) for t in TASTES]
    other = [reload(DATA / "taste_weight_0.5" / t) for t in TASTES]
    row = ab.pilot_choice_row(default, [other], "50")
    assert row["at"] == 6 and row["cost"] == 1.25 and row["runs"] == 25
    expected = []
    for t in TASTES:
        low, high = (json.loads((DATA / arm / t / "taste.json").read_text(encoding="utf-8"))
                     for arm in ("taste_table", "taste_weight_0.5"))
        for a, b in zip(low["per_seed"], high["per_seed"], strict=True):
            ra, rb = a["reward"]["50"], b["reward"]["50"]
            assert pilot_point(ra, 6) is not None and pilot_point(rb, 6) is not None
            pa, pb = (run_projection(r, 6, 24, 1.0) for r in (ra, rb))
            expected.append(1 if pb > pa else 0)
    assert row["taken"] == [expected.count(0), expected.count(1)]
    assert 0 < row["taken"][1] < 25 and 0 < row["agree"] < 25
    assert row["against_whole_runs"]["runs"] == 25
