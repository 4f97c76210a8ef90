"""``treerpo bench protocol``: the arms and clip treatments, the fixed checkpoints, the whole protocol
on stand-in runs (the target fixed before any test run, the grid extended, the families adjusted), the
report from protocol.json alone, and quick runs of every arm (embedded) and of a tiny random FLUX."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dynamic_treerpo.trainer.bench import protocol
from dynamic_treerpo.trainer.bench.arms import (
    ABLATION_ARMS,
    LIKE_FOR_LIKE,
    MAIN_ARMS,
    TREATMENTS,
    TREE,
    TREE_EULER,
    Arm,
    arm_config,
    check_same_images,
    images_per_iteration,
    matching_images,
    matching_steps,
    runnable_arms,
    select_arms,
    treatment_problem,
)
from dynamic_treerpo.trainer.bench.claims import all_tests
from dynamic_treerpo.trainer.bench.report import summary_rows, write_report
from dynamic_treerpo.trainer.bench.results import FORMAT, Budget, Run, load
from dynamic_treerpo.trainer.cli import main
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import TrainConfig
from dynamic_treerpo.trainer.core.strategies import STRATEGIES

THREADS = ("--set", "threads=1")


# ----------------------------------------------------------------------------- arms
def test_every_strategy_is_an_arm_and_pairs_share_their_tail() -> None:
    assert set(STRATEGIES) <= {a.strategy for a in MAIN_ARMS}
    assert "diffusionnft" in {a.strategy for a in MAIN_ARMS}
    tails = {a.name: a.tail for a in MAIN_ARMS}
    assert all(tails[tree] == tails[base] for tree, base in LIKE_FOR_LIKE)
    known = runnable_arms((*MAIN_ARMS, *ABLATION_ARMS), lambda _: None)
    configs = {a.name: arm_config([], a, None) for a in known}
    assert configs["mixgrpo"].uses_published_loss and not configs[TREE].uses_published_loss
    assert configs[TREE_EULER].tree.tail == "euler" and configs[TREE].tree.tail == "dpm2m"
    assert check_same_images(configs) == 64 * 8  # every arm scores the same images per iteration
    assert all(a.is_tree and a.overrides for a in ABLATION_ARMS)


def test_unknown_strategies_are_skipped_and_unknown_names_refused() -> None:
    lines: list[str] = []
    future = Arm("future", "not_a_strategy", "euler", ("strategy=not_a_strategy",))
    assert runnable_arms([MAIN_ARMS[0], future], lines.append) == [MAIN_ARMS[0]]
    assert lines == ["skipping arm future: this trainer has no strategy 'not_a_strategy'"]
    assert [a.name for a in select_arms("mixgrpo, dynamic_treerpo")] == [TREE, "mixgrpo"]  # protocol order
    with pytest.raises(ValueError, match="unknown arm 'mixgrpoo' in --arms; the arms are: dynamic_treerpo"):
        select_arms("mixgrpoo")


def test_baselines_are_given_the_trees_steps_and_images_per_iteration() -> None:
    base = ["data.prompts_per_iteration=2", "tree.depth=2", "tree.steps=8"]  # 4 images per prompt, 8 steps

    def build(arm: Arm) -> TrainConfig:
        return arm_config(base, arm, None)

    for arm in runnable_arms(MAIN_ARMS, lambda _: None):
        matched = matching_images(matching_steps(arm, 8, build), 8, build)
        config = build(matched)
        assert (config.strategy_config.steps, images_per_iteration(config)) == (8, 8), arm.name
    mix = matching_images(matching_steps(MAIN_ARMS[2], 8, build), 8, build)
    assert mix.overrides[-2:] == ("mixgrpo.steps=8", "mixgrpo.group_size=4")
    assert matching_steps(MAIN_ARMS[0], 8, build) == MAIN_ARMS[0]  # the tree is the reference
    small = load_config(TrainConfig, None, ["mixgrpo.group_size=6", "strategy=mixgrpo"])
    with pytest.raises(ValueError, match="different numbers of images per iteration"):
        check_same_images({"tree": TrainConfig(), "mixgrpo": small})


def test_clip_treatments() -> None:
    rescale, none = TREATMENTS
    tree, mix = MAIN_ARMS[0], MAIN_ARMS[2]
    assert arm_config([], tree, None, treatment=rescale).effective_clip_spread.enabled
    assert not arm_config([], tree, None, treatment=none).effective_clip_spread.enabled
    assert treatment_problem(arm_config([], tree, None, treatment=none), tree, none) is None
    # a published baseline cannot take the rescale today: the config turns it off
    problem = treatment_problem(arm_config([], mix, None, treatment=rescale), mix, rescale)
    if problem is not None:
        assert "cannot take the clip-spread rescale" in problem
    assert treatment_problem(arm_config([], mix, None, treatment=none), mix, none) is None


# ----------------------------------------------------------------------------- fixed checkpoints
class FakeTrainer:
    """Advances a fake clock by ``iteration_s`` wall (twice that in CPU) per step; the reward rises
    with the iterations done."""

    ema = None  # no average of the weights to evaluate beside the live ones

    def __init__(self, clock: SimpleNamespace, iteration_s: float, images: int) -> None:
        self.clock, self.iteration_s, self.images, self.done = clock, iteration_s, images, 0

    def step(self, iteration: int) -> dict[str, float]:
        assert iteration == self.done
        self.clock.wall += self.iteration_s
        self.clock.cpu += 2 * self.iteration_s
        self.done += 1
        return {"scored_images": self.images, "nfe_rollout": 10, "clip_frac": 0.0}

    def evaluate(self, average: bool | None = None) -> tuple[dict[str, float], None]:
        return {"eval_reward": 0.4 + 0.01 * self.done}, None


def test_every_arm_is_measured_at_the_same_fixed_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(cpu=0.0, wall=0.0)
    monkeypatch.setattr(protocol, "time", SimpleNamespace(process_time=lambda: clock.cpu,
                                                          perf_counter=lambda: clock.wall))
    config = load_config(TrainConfig, None, ["data.prompts_per_iteration=1"])  # 8 images per iteration
    budget = Budget(images=64, seeds=2, checkpoints=4)
    image_cps, second_cps = protocol.checkpoints(64, 4), protocol.checkpoints(8.0, 4)
    assert (image_cps, second_cps) == ([16, 32, 48, 64], [2.0, 4.0, 6.0, 8.0])
    for iteration_s in (0.25, 0.5, 1.5):  # a fast, a middling and a slow arm
        clock.cpu = clock.wall = 0.0
        run = protocol.train_run(FakeTrainer(clock, iteration_s, 8), config, "arm", budget, 8.0, "cpu")
        assert len(run.image_marks) == len(run.second_marks) == 4 and run.seconds_reached
        axes = ((run.image_marks, image_cps, "images"), (run.second_marks, second_cps, "cpu_s"))
        for marks, cps, key in axes:
            for mark, checkpoint in zip(marks, cps, strict=True):
                point = run.points[mark]
                before = point[key] - (8 if key == "images" else 2 * iteration_s)
                assert point[key] >= checkpoint > before - 1e-9  # the first iteration at or past it
                assert point["reward"] == pytest.approx(0.4 + 0.01 * point["iteration"])
        # evaluated before training and at checkpoints only: never more than 2 x 4 + 1 times
        assert set(range(1, len(run.points))) == set(run.image_marks) | set(run.second_marks)
        assert len(run.points) <= 9 and run.points[0]["iteration"] == 0
        assert run.iteration_wall_s == [iteration_s] * len(run.iteration_wall_s)
        assert run.iteration_cpu_s == [2 * iteration_s] * len(run.iteration_cpu_s)
    # an arm too slow for the seconds budget within its cap: the rest measured at its end
    clock.cpu = clock.wall = 0.0
    capped = protocol.train_run(FakeTrainer(clock, 0.1, 8), config, "arm", budget, 1000.0, "cpu")
    assert not capped.seconds_reached and len(capped.iteration_wall_s) == 8 * budget.max_iterations_factor
    assert capped.second_marks[-1] == len(capped.points) - 1


# ----------------------------------------------------------------------------- the protocol on stand-in runs
GAINS = {TREE: 0.06, TREE_EULER: 0.05, "mixgrpo": 0.02, "mixgrpo_flash": 0.03, "flow_grpo_fast": 0.04}
PEAKS = {"mixgrpo": 1e-4}  # below the grid: the sweep must extend it twice


def _stand_in_run(arm: str, seed: int, lr: float, treatment: str, budget: Budget, seconds: float) -> Run:
    """One point per checkpoint serving both budgets; the tree learns fastest. Seeds differ by arm (the
    noise's phase, the images a checkpoint overshoots by), so paired differences vary over seeds, as
    real ones do (identical ones get the sign-flip test, which 3 seeds cannot pass)."""
    tree = arm in (TREE, TREE_EULER)
    slope = 0.03 if tree else 0.004
    phase = seed if tree else 2 * seed
    n = budget.checkpoints
    points = [{"iteration": 0, "images": 0.0, "cpu_s": 0.0, "wall_s": 0.0, "reward": 0.45}]
    for k in range(1, n + 1):
        points.append({"iteration": k, "images": 16.0 * k + 0.25 * seed * k, "cpu_s": seconds * k / n,
                       "wall_s": seconds * k / n / 2, "reward": 0.45 + slope * k + 0.001 * ((phase + k) % 3)})
    iteration_s = 1.0 if arm in (TREE, TREE_EULER) else 2.0 + 0.01 * seed
    return Run(arm, seed, lr, 16, treatment, points, list(range(1, n + 1)), list(range(1, n + 1)),
               [iteration_s / 2] * n, [iteration_s] * n, [100] * n, [0.0] * n)


def test_the_protocol_fixes_rates_and_target_from_validation_before_any_test_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "protocol"
    budget = Budget(images=64, seeds=3, checkpoints=4, lrs=(4e-4, 8e-4, 1.6e-3), sweep_iterations=2)
    calls: list[tuple] = []

    def sweep_run(config, arm, budget, clock, test_seed):
        assert config.data.eval_seed == budget.validation_seed != test_seed == 12345
        calls.append(("sweep", arm.name, config.optim.lr))
        peak = PEAKS.get(arm.name, 8e-4)
        reward = 0.45 + GAINS.get(arm.name, 0.01) - 0.005 * abs(math.log2(config.optim.lr / peak))
        return {"validation_reward": reward, "validation_base": 0.45, "median_cpu_s": 2.0,
                "median_wall_s": 1.0, "test_prompts_in_validation": 0}

    def full_run(config, arm, budget, seconds, clock, treatment):
        saved = json.loads((out / "protocol.json").read_text())
        if not any(c[0] == "test" for c in calls):  # the first test run: the target is on disk already
            assert saved["stage"] == "sweep" and saved["runs"] == []
            assert saved["target"]["gain"] == pytest.approx(0.5 * 0.04)  # half the median validation gain
            assert saved["target"]["best_baseline"] == "flow_grpo_fast"
            assert saved["lrs"]["mixgrpo"] == pytest.approx(1e-4)
        assert config.data.eval_seed == 12345  # test runs measure on the test pairs
        calls.append(("test", arm.name, treatment.name, config.seed))
        return _stand_in_run(arm.name, config.seed, config.optim.lr, treatment.name, budget, seconds)

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(protocol, "sweep_run", sweep_run)
    monkeypatch.setattr(protocol, "full_run", full_run)
    arms = select_arms(",".join([*GAINS, "no LayerTuning", "no clip", "capping dynamic clip",
                                 "capping fixed clip"]))
    lines: list[str] = []
    result = protocol.run_protocol(budget, ["data.prompts_per_iteration=2"], None, arms, lines.append, out)
    plan = next(i for i, line in enumerate(lines) if line.startswith("plan: "))
    assert lines[plan].startswith("plan: sweep 5 arms x 3 rates (+ up to 15 runs extending the grid)")
    assert not any(line.startswith("sweep ") for line in lines[:plan])  # printed before anything trains
    assert any("OMP_WAIT_POLICY=PASSIVE" in line for line in lines[:plan])  # 2 threads, spinning
    assert any(line.startswith("expected: ") for line in lines)
    # the grid was extended for mixgrpo (best at its lowest rate) until its best was inside
    assert result.grid["mixgrpo"]["rates"] == pytest.approx([5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3])
    assert all(g["inside"] for g in result.grid.values())
    assert result.lrs["no clip"] == result.lrs[TREE] == 8e-4  # ablations take the tree's rate
    # seconds: MixGRPO's median CPU iteration time x the image budget's iterations (64 / 16)
    assert (result.clock, result.seconds) == ("cpu", 4 * 2.0)
    # treatments: the tree keeps its published runs under rescale-all and trains again under none
    statuses = {t["name"]: t["arms"] for t in result.treatments}
    assert statuses["rescale-all"][TREE] == "reused" and statuses["none"][TREE] == "trained"
    assert statuses["none"]["mixgrpo"] == "reused"
    assert statuses["rescale-all"]["mixgrpo"] in ("trained", statuses["rescale-all"]["mixgrpo"])
    assert ("test", TREE_EULER, "none", 2) in calls
    assert {c[3] for c in calls if c[0] == "test"} == {0, 1, 2}

    saved = load(out)
    assert saved.stage == "runs" and len(saved.runs) == len(result.runs)
    tests = all_tests(result)
    primary = [t for t in tests if t.family == "primary"]
    assert {t.group for t in primary} >= {"faster convergence per sample", "faster convergence per second",
                                          "higher final reward", "about 50% training efficiency",
                                          "LayerTuning-RL helps"}
    assert all(t.p_adjusted >= t.p_value for t in tests if t.comparison is not None)
    assert all(t.p_exact_adjusted >= t.p_exact for t in tests if t.comparison is not None)
    by = {t.key: t for t in tests}
    # the t test alone would call these met; with 3 seeds the exact test cannot go below 0.25, so the
    # verdict that needs both is inconclusive (tests/test_bench_exact.py: met at 10 seeds)
    for key in (f"reward:images:{TREE}:flow_grpo_fast:published", f"efficiency:{TREE_EULER}:mixgrpo"):
        assert by[key].p_adjusted < 0.05 and by[key].p_exact == 0.25 and by[key].verdict == "inconclusive"
    assert by[f"time:images:{TREE}:flow_grpo_fast"].verdict == "descriptive"  # grid-resolved: no verdict
    assert any(t.family == "secondary" and t.group == "clip treatment none" for t in tests)

    docs = tmp_path / "docs" / "results.md"
    docs.parent.mkdir()
    kept = ("<!-- bench taste t, picks 0.2: begin -->\nthe taste figures\n"
            "<!-- bench taste t, picks 0.2: end -->")
    docs.write_text(f"# old page\n\n{kept}\n")
    data = write_report(result, tmp_path / "report", docs)
    text = docs.read_text()
    assert "# old page" not in text and text.rstrip().endswith(kept)  # the taste section is carried over
    for needle in ("Holm-adjusted within each family", "held-out reward at the image budget",
                   "exact sign-flip (permutation) test", "Holm p, exact", "tested against 0.5x",
                   "its half-width",
                   "## The paper's claims on this test bed (primary family)",
                   "### Like for like (secondary family)", "under each clip treatment", "restricted mean",
                   "**0.0001: ", "Every chosen rate is inside its range",
                   "fixed from the sweep before any test run",
                   "CPU seconds of the training process", "k/4 of it: images 16, 32, 48, 64"):
        assert needle in text, needle
    rows = {(r["arm"], r["treatment"]): r for r in data["arms"]}
    assert rows[(TREE, "published")]["samples_to_target_reached"] == 3
    assert rows[(TREE, "none")]["seeds"] == [0, 1, 2]
    assert (tmp_path / "docs" / "images" / "protocol_reward_vs_seconds.png").stat().st_size > 1000


def test_report_refuses_an_old_protocol_json_in_one_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "protocol.json").write_text(json.dumps({"budget": {}, "runs": []}))
    assert main(["bench", "report", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"format 1, this treerpo reads format {FORMAT}" in err
    assert main(["bench", "report", "--out", str(tmp_path / "none")]) == 2
    assert "not found: run `treerpo bench protocol" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real quick runs
def test_protocol_quick_runs_every_arm_and_writes_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, docs = tmp_path / "protocol", tmp_path / "docs" / "results.md"
    assert main(["bench", "protocol", "--quick", *THREADS, "--out", str(out), "--docs", str(docs)]) == 0
    printed = capsys.readouterr().out
    assert "plan: sweep" in printed and "faster convergence per sample:" in printed
    saved = json.loads((out / "protocol.json").read_text())
    assert saved["format"] == FORMAT and saved["stage"] == "done"
    ran = [a.name for a in runnable_arms((*MAIN_ARMS, *ABLATION_ARMS), lambda _: None)]
    assert [a["name"] for a in saved["arms"]] == ran
    assert {r["arm"] for r in saved["sweep"]} == {a.name for a in MAIN_ARMS if a.name in ran}
    assert all(r["test_prompts_in_validation"] == 0 for r in saved["sweep"])
    assert saved["checkpoints"]["images"] == [8.0, 16.0] and len(saved["checkpoints"]["seconds"]) == 2
    for run in saved["runs"]:  # every arm measured at the same checkpoints of both budgets
        assert len(run["image_marks"]) == len(run["second_marks"]) == 2
        assert len(run["iteration_cpu_s"]) == len(run["iteration_wall_s"]) >= 2
    data = json.loads((out / "bench.json").read_text())
    published = [r for r in data["arms"] if r["treatment"] == "published"]
    assert [r["arm"] for r in published] == ran
    assert all(r["seeds"] == [0, 1] and math.isfinite(r["final_eval_reward_ci95"]) for r in published)
    by = {r["arm"]: r for r in published}
    assert by[TREE]["rollout_nfe_per_image"] < by["mixgrpo_flash"]["rollout_nfe_per_image"]
    assert {t["family"] for t in data["tests"]} == {"primary", "secondary"}
    text = docs.read_text()
    for section in ("## Protocol", "## Learning-rate sweep", "### Like for like", "## The paper's claims"):
        assert section in text
    for claim in ("faster convergence per sample", "faster convergence per second", "higher final reward",
                  "about 50% training efficiency", "LayerTuning-RL helps", "dynamic clipping helps"):
        assert claim in text
    assert (docs.parent / "images" / "protocol_reward_vs_images.png").stat().st_size > 1000
    # the report rebuilds from protocol.json alone
    (out / "bench.json").unlink()
    assert main(["bench", "report", "--out", str(out)]) == 0
    assert json.loads((out / "bench.json").read_text()) == data
    # killed after a run of its second seed: --resume runs only the missing ones, to the same figures
    cut = dict(saved, stage="runs", runs=saved["runs"][: len(saved["runs"]) // 2 + 1])
    (out / "protocol.json").write_text(json.dumps(cut))
    capsys.readouterr()
    assert main(["bench", "protocol", "--quick", *THREADS, "--out", str(out), "--resume"]) == 0
    resumed = json.loads((out / "protocol.json").read_text())
    assert "resuming: the sweep's rates and target kept" in capsys.readouterr().out
    assert resumed["stage"] == "done" and resumed["sweep"] == saved["sweep"]
    key = lambda r: (r["arm"], r["treatment"], r["seed"])  # noqa: E731
    assert sorted(map(key, resumed["runs"])) == sorted(map(key, saved["runs"]))
    def at_images(run: dict) -> float:  # the image budget's figure (the seconds budget's depends on load)
        return run["points"][run["image_marks"][-1]]["reward"]

    before = {key(r): at_images(r) for r in saved["runs"]}
    assert all(at_images(r) == pytest.approx(before[key(r)], abs=1e-6) for r in resumed["runs"])
    again = ["bench", "protocol", "--quick", *THREADS, "--seeds", "3", "--out", str(out), "--resume"]
    assert main(again) == 2
    assert "cannot resume: the budget differs" in capsys.readouterr().err


def test_protocol_quick_on_a_tiny_flux_with_a_clip_reward(tmp_path: Path) -> None:
    """The same command on a FLUX config with a model reward: what a GPU user runs, on random weights."""
    from tests.test_diffusers_models import flux_pipeline
    from tests.tiny_models import tiny_clip_reward

    flux, clip = tmp_path / "flux", tiny_clip_reward(tmp_path / "clip")
    flux_pipeline().save_pretrained(flux)
    config = tmp_path / "tiny_flux.yaml"
    config.write_text(f"""threads: 1
reward: clip
reward_weights:
  clip: {clip}
model:
  kind: flux
  path: {flux}
  dtype: float32
  device: cpu
  height: 64
  width: 64
lora:
  targets: [to_q, to_k, to_v, to_out.0]
tree:
  steps: 4
  depth: 2
  tail: euler
""")
    out = tmp_path / "protocol"
    assert main(["bench", "protocol", str(config), "--quick", "--arms", f"{TREE_EULER},mixgrpo",
                 "--out", str(out), "--docs", str(tmp_path / "results.md")]) == 0
    saved = load(out)
    assert saved.config == str(config) and saved.clock == "cpu"
    assert {r.arm for r in saved.runs} == {TREE_EULER, "mixgrpo"}
    assert saved.images_per_iteration == 4  # one prompt x the tree's 4 leaves; MixGRPO's group matched
    # the config sets the tree's steps only: MixGRPO is given the same steps and the tree's group size
    assert saved.arm("mixgrpo").overrides[-2:] == ("mixgrpo.steps=4", "mixgrpo.group_size=4")
    rows = summary_rows(saved)
    assert all(math.isfinite(r["final_eval_reward_mean"]) for r in rows)
    assert f"# Results: the paper's claims on `{config}`" in (tmp_path / "results.md").read_text()


def test_sampler_measures_overhead_and_memory_at_16_and_64_leaves(tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.bench.sampler import format_sampler, sampler

    result = sampler(None, ["lora.rank=4"], tmp_path)
    o = result["overhead"]
    assert o["leaves"] == 16 and 0 < o["model_s"] < o["rollout_s"]
    assert abs(o["overhead_s"] - (o["rollout_s"] - o["model_s"])) < 1e-9
    assert [m["leaves"] for m in result["memory"]] == [16, 64]
    assert all(m["peak_above_start_mb"] >= 0 and m["held_before_mb"] > 0 for m in result["memory"])
    assert "sampler overhead" in format_sampler(result)
