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


def _template_summary(taste: str) -> dict[str, Any]:
    """A template run as ``summarise`` stores it: 3 seeds at 12 trees, gains 0.1 of a frontier of 0.2."""
    from dataclasses import asdict, replace

    from dynamic_treerpo.trainer.bench.taste.budget import QUICK, SeedResult
    from dynamic_treerpo.trainer.bench.taste.summary import summarise

    budget = replace(QUICK, trees=12, seeds=3, at=(), template=True, frontier_weights=(0.5,))
    results = []
    for seed in range(3):
        base = {"iteration": 0, "strength": 1.0, "taste": 0.0, "guard": 0.4, "guard_se": 0.0}
        point = {**base, "iteration": 2, "taste": 1.0, "guard": 0.39, "guard_se": 0.005}
        method = {"taste": 0.6, "scene": 0.39, "accuracy": 0.8, "held_out_pairs": 34.0, "limit": 0.02,
                  "points": [base, point],
                  "costs": {"seconds": 98.0, "guard_seconds": 40.0, "training_images": 1.0,
                            "guard_images": 1.0},
                  "chosen": {"iteration": 2, "strength": 1.0, "reason": "r", "validation_taste_gain": 1.0,
                             "validation_scene_fall": 0.01}}
        arm = {"weight": 0.5, "gain": 0.2, "scene_change": -0.01, "iteration": 2, "strength": 1.0,
               "limit": 0.02, "taste": 0.7, "scene": 0.39, "points": []}
        results.append(SeedResult(seed, 0.5, 0.4, {"taste": 0.7, "scene": 0.39, "weight": 0.5},
                                  {"0.5": arm}, {12: method}))
    out = summarise(results, budget, taste)
    out["per_seed"] = [asdict(r) for r in results]
    return out


def test_the_template_section_gives_a_row_per_taste_and_names_the_old_budget_only_when_run() -> None:
    from dynamic_treerpo.trainer.bench.taste.family_page import template_markdown

    section = template_markdown([_template_summary("lower_objects")], "treerpo bench taste --template")
    assert "| lower_objects | +0.200 (+0.200 to +0.200) | +0.100 (+0.100 to +0.100) | 50% |" in section
    assert "| 98 |" in section and "0.5.0's template budget" not in section
    assert "Every taste and seed pooled: 50% of the frontier" in section
    assert "past the limit: 0 of 3, where the risk the node states expected" in section
    old = _template_summary("lower_objects")
    section = template_markdown([_template_summary("lower_objects")], "cmd", [old])
    assert "0.5.0's template budget: gain, share, seconds |" in section
    assert "50% of its own frontier" in section
    assert "`--arm`" not in section


def test_an_arm_under_the_template_row_is_paired_per_run_with_its_images() -> None:
    """``--arm`` with ``--section template`` (or family): the other method's runs of the same picks,
    paired per run, with the images each run scored beside its share (the default's in brackets)."""
    from dynamic_treerpo.trainer.bench.taste.family_page import template_markdown

    two = _template_summary("lower_objects")
    two["budget"]["picks_weights"] = [0.3, 0.5]
    one = _template_summary("lower_objects")
    for run, trainings in ((one, 1), (two, 2)):
        run["by_trees"]["12"]["costs"] = {"training_images": 1536.0 * trainings, "guard_images": 4608.0}
    section = template_markdown([one], "cmd", arms={"two trainings": [two]})
    assert "| two trainings | 3 (lower_objects) | 50% (50% to 50%) | 50% | +0% (+0% to +0%) |" in section
    assert section.rstrip().splitlines()[-2].endswith("| 7 680 (6 144) |")
    from dynamic_treerpo.trainer.bench.taste.page import overall_lines

    printed = overall_lines([one], {"two trainings": [two]})  # what --report prints: at the runs' 12 trees
    assert any(line.startswith("| two trainings | 3 (lower_objects) |") for line in printed)


def test_runs_that_differ_only_in_their_taste_are_written_as_one_loop() -> None:
    from dynamic_treerpo.trainer.bench.taste.page_parts import as_loop, run_commands

    runs = [f"treerpo bench taste --tastes {t} --seeds 1 --out runs/f --resume" for t in ("a", "b", "c")]
    assert as_loop(runs) == ["for t in a b c; do", "  treerpo bench taste --tastes $t --seeds 1 --out runs/f "
                             "--resume", "done"]
    assert as_loop(runs[:2]) == runs[:2]  # two stay as they are
    mixed = [*runs[:2], "treerpo bench taste --tastes c --seeds 3 --out runs/f --resume"]
    assert as_loop(mixed) == mixed
    summaries = [{"command": r} for r in runs]
    assert run_commands(summaries, "treerpo bench taste --report")[-1] == "treerpo bench taste --report"
    assert run_commands(summaries, runs[0]) == as_loop(runs)  # a report that repeats a run adds no line
