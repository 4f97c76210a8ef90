"""``treerpo bench protocol``: the statistics, the report's figures from the runs, and a quick run
of every arm (the smoke run CI affords)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from dynamic_treerpo.trainer.bench.protocol import (
    ABLATION_ARMS,
    LIKE_FOR_LIKE,
    MAIN_ARMS,
    TREE,
    TREE_EULER,
    Budget,
    ProtocolResult,
    Run,
    arm_config,
    best_rates,
    check_same_images,
)
from dynamic_treerpo.trainer.bench.report import claims, summary_rows
from dynamic_treerpo.trainer.bench.stats import mean_ci95, ratio_verdict, verdict, welch
from dynamic_treerpo.trainer.cli import main
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.core.strategies import STRATEGIES


def test_welch_matches_scipy_and_its_interval_matches_its_p_value() -> None:
    a, b = [0.50, 0.52, 0.49, 0.51, 0.53], [0.47, 0.50, 0.48, 0.46, 0.49]
    c = welch(a, b)
    assert c.p_value == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert c.difference == pytest.approx(0.03) and c.low < c.difference < c.high
    assert (c.low > 0) == c.significant and verdict(c) == "met"
    assert verdict(welch(b, a)) == "not met" and verdict(welch(b, a), higher_is_better=False) == "met"
    assert verdict(welch([0.5, 0.6, 0.4], [0.52, 0.41, 0.58])) == "inconclusive"
    with pytest.raises(ValueError, match="at least two values"):
        welch([1.0], [1.0, 2.0])


def test_mean_ci95_is_the_t_interval() -> None:
    e = mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    assert e.mean == 3.0 and e.ci95 == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-5)
    assert math.isnan(mean_ci95([1.0]).ci95)
    assert ratio_verdict(mean_ci95([0.40, 0.42, 0.41]), 0.6) == "met"
    assert ratio_verdict(mean_ci95([0.80, 0.82, 0.81]), 0.6) == "not met"
    assert ratio_verdict(mean_ci95([0.3, 0.9, 0.6]), 0.6) == "inconclusive"


def test_every_strategy_is_an_arm_and_pairs_share_their_tail() -> None:
    assert {a.strategy for a in MAIN_ARMS} == set(STRATEGIES)
    tails = {a.name: a.tail for a in MAIN_ARMS}
    assert all(tails[tree] == tails[base] for tree, base in LIKE_FOR_LIKE)
    configs = {a.name: arm_config([], a, None) for a in (*MAIN_ARMS, *ABLATION_ARMS)}
    assert configs["mixgrpo"].uses_published_loss and not configs[TREE].uses_published_loss
    assert configs[TREE_EULER].tree.tail == "euler" and configs[TREE].tree.tail == "dpm2m"
    assert check_same_images(configs) == 64 * 8  # every arm scores the same images per iteration
    # each ablation changes the default tree in its own overrides only
    assert all(a.is_tree and a.overrides for a in ABLATION_ARMS)


def test_arms_scoring_different_image_counts_are_refused() -> None:
    small = load_config(TrainConfig, None, ["mixgrpo.group_size=6", "strategy=mixgrpo"])
    with pytest.raises(ValueError, match="different numbers of images per iteration"):
        check_same_images({"tree": TrainConfig(), "mixgrpo": small})


def test_best_rate_is_chosen_on_validation_rewards() -> None:
    rows = [{"arm": arm, "lr": lr, "validation_reward": v}
            for arm, lr, v in (("a", 1e-3, 0.40), ("a", 2e-3, 0.45), ("b", 1e-3, 0.50), ("b", 2e-3, 0.50))]
    assert best_rates(rows) == {"a": 2e-3, "b": 1e-3}  # a tie goes to the smaller rate


def _run(arm: str, seed: int, rewards: list[float], at_seconds: float, iteration_s: float) -> Run:
    points = [{"iteration": i, "images": 64.0 * i, "seconds": iteration_s * i, "reward": r}
              for i, r in enumerate(rewards)]
    steps = len(rewards) - 1
    return Run(arm, seed, 1e-3, 64, points, [iteration_s] * steps, [100] * steps,
               at_images=rewards[-1], at_seconds=at_seconds)


def _result(runs: list[Run]) -> ProtocolResult:
    arms = [a for a in (*MAIN_ARMS, *ABLATION_ARMS) if a.name in {r.arm for r in runs}]
    rates = {a.name: 1e-3 for a in arms}
    return ProtocolResult(Budget(images=192, seeds=3), [], 3.0, 64, [], rates, arms, runs)


def test_report_targets_the_best_baseline_and_censors_seeds_that_never_reach_it() -> None:
    runs = []
    for seed in range(3):
        runs.append(_run(TREE, seed, [0.40, 0.47, 0.50 + 0.01 * seed, 0.52], 0.52, 0.5))
        runs.append(_run("mixgrpo", seed, [0.40, 0.42, 0.44, 0.46 + 0.002 * seed], 0.45, 1.0))
        runs.append(_run("dancegrpo", seed, [0.40, 0.40, 0.39, 0.38], 0.38, 2.0))
    rows = {r["arm"]: r for r in summary_rows(_result(runs))}
    target = rows[TREE]["target"]
    assert rows[TREE]["target_arm"] == "mixgrpo" and target == pytest.approx(0.462)
    # the tree first measured 0.47 >= 0.462 after one iteration of 64 images, on every seed
    assert (rows[TREE]["samples_to_target"], rows[TREE]["samples_to_target_reached"]) == (64.0, 3)
    # dancegrpo never reaches it: censored at the budget of 192 images (3 iterations)
    dance = rows["dancegrpo"]
    assert (dance["samples_to_target"], dance["samples_to_target_reached"]) == (192.0, 0)
    assert rows[TREE]["final_eval_reward_mean"] == pytest.approx(0.52)
    found = {(c.claim, c.measure.split(",")[0]): c.verdict for c in claims(_result(runs))}
    assert found[("higher final reward", "held-out reward at equal images")] == "met"
    assert [v for (claim, _), v in found.items() if claim == "faster convergence per sample"] == ["met"]


def test_protocol_quick_runs_every_arm_and_writes_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, docs = tmp_path / "protocol", tmp_path / "docs" / "results.md"
    assert main(["bench", "protocol", "--quick", "--out", str(out), "--docs", str(docs)]) == 0
    rows = json.loads((out / "bench.json").read_text())
    assert [r["arm"] for r in rows] == [a.name for a in (*MAIN_ARMS, *ABLATION_ARMS)]
    for row in rows:
        assert {"strategy", "tail", "lr", "seeds", "final_eval_reward_mean", "final_eval_reward_ci95",
                "samples_to_target", "seconds_to_target", "rollout_nfe_per_image",
                "median_iteration_s"} <= set(row)
        assert row["seeds"] == [0, 1] and math.isfinite(row["final_eval_reward_ci95"])
    by = {r["arm"]: r for r in rows}
    assert by[TREE]["rollout_nfe_per_image"] < by["mixgrpo_flash"]["rollout_nfe_per_image"]
    saved = json.loads((out / "protocol.json").read_text())
    assert {r["arm"] for r in saved["sweep"]} == {a.name for a in MAIN_ARMS}
    text = docs.read_text()
    for section in ("## Protocol", "## Learning-rate sweep", "### Like for like", "## The paper's claims"):
        assert section in text
    for claim in ("faster convergence per sample", "faster convergence per second", "higher final reward",
                  "about 50% training efficiency", "LayerTuning-RL helps", "dynamic clipping helps"):
        assert claim in text
    assert (docs.parent / "images" / "protocol_reward_vs_images.png").stat().st_size > 1000
    assert "faster convergence per sample:" in capsys.readouterr().out
    # the report rebuilds from protocol.json alone
    (out / "bench.json").unlink()
    assert main(["bench", "report", "--out", str(out)]) == 0
    assert json.loads((out / "bench.json").read_text()) == rows


def test_sampler_measures_overhead_and_memory_at_16_and_64_leaves(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.bench.sampler import format_sampler, sampler

    result = sampler(None, ["lora.rank=4"], tmp_path)
    o = result["overhead"]
    assert o["leaves"] == 16 and 0 < o["model_s"] < o["rollout_s"]
    assert abs(o["overhead_s"] - (o["rollout_s"] - o["model_s"])) < 1e-9
    assert [m["leaves"] for m in result["memory"]] == [16, 64]
    assert all(m["peak_above_start_mb"] >= 0 and m["held_before_mb"] > 0 for m in result["memory"])
    assert "sampler overhead" in format_sampler(result)
