"""The cost and split tables of the taste page, from stored summaries: what each run cost, where it ran,
and where the gain went when every point was measured on the test pairs."""

from __future__ import annotations

from typing import Any

from dynamic_treerpo.trainer.bench.taste.family_page import extra_tables, where_it_ran


def _summary(extra: list[str], split: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {
        "frontier_gain": {"mean": 0.2},
        "costs": {"seconds": 100.0, "guard_seconds": 60.0, "training_images": 3072.0, "guard_images": 5120.0}}
    if split:
        row["split"] = {"offered": {"mean": 0.18}, "offered_share": 0.9, "chosen": {"mean": 0.14},
                        "chosen_share": 0.7, "method_rate": {"mean": 8.0}, "oracle_rate": {"mean": 10.0}}
    return {"taste": "lower_objects", "extra": extra, "by_trees": {"50": row}}


def test_the_cost_table_says_the_seconds_ran_beside_other_runs_when_they_had_one_thread() -> None:
    assert "one CPU thread each, with other runs beside it" in where_it_ran([_summary(["threads=1"])])
    assert where_it_ran([_summary([])]) == "on this machine's CPU cores"
    lines = extra_tables([_summary(["threads=1"], split=False)])
    assert any("one CPU thread each" in line for line in lines)
    assert "| lower_objects | 50 | 100 | 60 | 3072 | 5120 |" in lines
    assert not any("Where the gain went" in line for line in lines)


def test_the_split_row_tells_what_the_reward_lost_from_what_the_choice_lost() -> None:
    lines = extra_tables([_summary([])])
    # offered 90% of the frontier: 10% lost to the reward; the choice kept 70%: 20% lost to the choice
    assert "| lower_objects | 50 | +0.200 | +0.180 (90%) | +0.140 (70%) | 10% | 20% | 8.0 / 10.0 |" in lines
