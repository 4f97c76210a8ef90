"""``treerpo bench compare``: every strategy on the same budget, the table's numbers from the runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.benchmark import Curve, check_same_images, summarise
from dynamic_treerpo.trainer.cli import main
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig

SMALL = ["data.prompts_per_iteration=2", "data.eval_pairs=4", "sampling.eval_steps=2", "lora.rank=4",
         "tree.steps=6", "tree.depth=3", "mixgrpo.steps=6", "dancegrpo.steps=6"]


def curve(strategy: str, seed: int, points, nfe: int, images: int = 16, s: float = 1.0) -> Curve:
    return Curve(strategy, seed, list(points), [s, s, s], [nfe] * 3, [images] * 3)


def test_summary_times_to_the_best_baseline_and_ratios() -> None:
    curves = [curve("dynamic_treerpo", 0, [(0, 0.40), (2, 0.47), (4, 0.52)], 100, s=0.5),
              curve("mixgrpo", 0, [(0, 0.40), (3, 0.45), (6, 0.48)], 200),
              curve("dancegrpo", 0, [(0, 0.40), (3, 0.42), (6, 0.44)], 400, s=2.0)]
    rows = {r["strategy"]: r for r in summarise(curves)}
    assert rows["mixgrpo"]["final_eval_reward"] == 0.48  # the best baseline
    assert rows["dynamic_treerpo"]["time_to_best_baseline_s"] == 4  # first point at or above 0.48
    assert rows["dancegrpo"]["time_to_best_baseline_s"] is None
    assert rows["dynamic_treerpo"]["nfe_vs_mixgrpo"] == 0.5 and rows["dancegrpo"]["nfe_vs_mixgrpo"] == 2
    assert rows["dynamic_treerpo"]["iteration_s_vs_mixgrpo"] == 0.5


def test_strategies_scoring_different_image_counts_are_refused() -> None:
    config = load_config(TrainConfig, None, [*SMALL, "mixgrpo.group_size=6"])
    with pytest.raises(ValueError, match="different numbers of images per prompt"):
        check_same_images(config)


def test_bench_compare_writes_rows_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    args = ["bench", "compare", "--budget-seconds", "1", "--eval-every", "2", "--out", str(out)]
    assert main([*args, *[a for s in SMALL for a in ("--set", s)]]) == 0
    rows = json.loads((out / "bench.json").read_text())
    assert {r["strategy"] for r in rows} == {"dynamic_treerpo", "mixgrpo", "mixgrpo_flash", "dancegrpo"}
    for row in rows:
        assert {"strategy", "rollout_nfe_per_image", "median_iteration_s", "final_eval_reward",
                "time_to_best_baseline_s"} <= set(row)
        assert row["iterations"] >= 1 and row["median_iteration_s"] > 0
    by = {r["strategy"]: r for r in rows}
    # the tree shares prefixes: fewer forwards per scored image than MixGRPO at the same steps
    assert by["dynamic_treerpo"]["rollout_nfe_per_image"] < by["mixgrpo"]["rollout_nfe_per_image"]
    assert (out / "reward_vs_time.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("strategy")
    assert "best baseline's final held-out reward" in printed


def test_ablate_trains_each_variant_and_compares_with_the_default(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.bench.ablate import VARIANTS, Variant, ablate, format_ablation

    knobs = {v.knob for v in VARIANTS}
    assert {"noise growth beta", "depth and branching", "LayerTuning weight lambda", "reward sensitivity eta",
            "dynamic clipping", "node value", "PRM target"} <= knobs
    chosen = (Variant("default", ()), Variant("node value", ("loss.node_value=mean",)))
    rows = ablate(None, SMALL, 1.0, 1, tmp_path, eval_every=2, variants=chosen)
    assert [r["variant"] for r in rows] == ["default", "loss.node_value=mean"]
    assert rows[0]["vs_default"] == 0.0 and rows[1]["iterations"] >= 1
    assert json.loads((tmp_path / "ablate.json").read_text()) == rows
    assert format_ablation(rows).splitlines()[0].startswith("knob")


def test_sampler_measures_overhead_and_memory_at_16_and_64_leaves(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.bench.sampler import format_sampler, sampler

    result = sampler(None, ["lora.rank=4"], tmp_path)
    o = result["overhead"]
    assert o["leaves"] == 16 and 0 < o["model_s"] < o["rollout_s"]
    assert abs(o["overhead_s"] - (o["rollout_s"] - o["model_s"])) < 1e-9
    assert [m["leaves"] for m in result["memory"]] == [16, 64]
    assert all(m["peak_above_start_mb"] >= 0 and m["held_before_mb"] > 0 for m in result["memory"])
    assert "sampler overhead" in format_sampler(result)
