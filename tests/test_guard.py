"""The guard (trainer/guard, trainer/training/guarded.py): a limit a person sets on how much
prompt-following training from picks may trade for taste, checkpoints measured on validation pairs,
the choice among them, and taking another one without training again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dynamic_treerpo.trainer.config.errors import ConfigError
from dynamic_treerpo.trainer.config.files import load_config
from dynamic_treerpo.trainer.config.schema import GuardConfig, TrainConfig
from dynamic_treerpo.trainer.embedded.policy import EmbeddedPolicy
from dynamic_treerpo.trainer.guard.choice import allowed, choose, take
from dynamic_treerpo.trainer.guard.levels import KEEP_LEVELS, SCENE_SPREAD, guard_limit
from dynamic_treerpo.trainer.guard.terms import guard_spec
from dynamic_treerpo.trainer.guard.trail import Trail, TrailPoint, paired_se, scaled_lora
from dynamic_treerpo.trainer.lora.adapters import lora_state_dict
from dynamic_treerpo.trainer.preferences.store import PickStore
from dynamic_treerpo.trainer.training.from_picks import model_id, store_trees
from dynamic_treerpo.trainer.training.guarded import (
    guard_trainer,
    guarded,
    load_guard,
    save_guard,
    separate_validation_pairs,
    write_figures,
)
from dynamic_treerpo.trainer.training.loop import Trainer

TINY = ["tree.steps=5", "tree.depth=2", "tree.trees_per_prompt=1", "sampling.eval_steps=3", "lora.rank=4",
        "data.prompts_per_iteration=2", "data.eval_pairs=4", "guard.pairs=6", "guard.checkpoints=2"]
ORACLE = ["reward=function:0.5,scene:0.5",
          "reward_weights={function: dynamic_treerpo.trainer.bench.taste.hidden_tastes:lower_objects}"]


def _trail(limit: float = 0.02, *points: tuple[int, float, float, float, float]) -> Trail:
    trail = Trail(limit, 0.2, [TrailPoint(0, 1.0, 0.0, 0.5)])
    trail.points += [TrailPoint(*p) for p in points]
    return trail


# ---------------------------------------------------------------------- the limit in words
def test_the_words_are_falls_of_the_scene_reward_and_a_share_of_another_guard_s_spread() -> None:
    assert [guard_limit(k, ["scene"], 0.5) for k in ("strictly", "closely", "loosely")] == [0.01, 0.02, 0.05]
    # PickScore with a spread of 0.93 over the base's images: "closely" is the same share of it
    assert guard_limit("closely", ["pickscore"], 0.93) == pytest.approx(0.02 / SCENE_SPREAD * 0.93)
    assert guard_limit("loosely", ["scene"], 0.5, explicit=0.003) == 0.003
    with pytest.raises(ValueError, match="same score"):
        guard_limit("closely", ["clip"], 0.0)
    with pytest.raises(ValueError, match=r"guard\.keep must be one of strictly, closely, loosely, off"):
        GuardConfig(keep="tightly")
    assert set(KEEP_LEVELS) == {"strictly", "closely", "loosely"}


def test_the_guard_applies_to_picks_with_another_term_unless_off() -> None:
    def config(*extra: str) -> TrainConfig:
        return load_config(TrainConfig, None, ["data.picks=somewhere", *extra])

    assert guarded(config("reward=picks:0.5,scene:0.5"))
    assert not guarded(config("reward=picks:0.5,scene:0.5", "guard.keep=off"))
    assert not guarded(config("reward=picks:1"))
    assert not guarded(config("reward=scene"))
    assert guard_spec("picks:0.5,scene:0.3,ocr:0.2", "picks") == "scene:0.6,ocr:0.4"
    with pytest.raises(ValueError, match="no term besides 'picks'"):
        guard_spec("picks:1", "picks")


# ---------------------------------------------------------------------- the choice
def test_the_choice_is_the_most_taste_within_the_limit() -> None:
    trail = _trail(0.02, (4, 1.0, 0.3, 0.49), (8, 1.0, 0.6, 0.47), (12, 1.0, 0.9, 0.40),
                   (12, 0.5, 0.7, 0.485))
    choice = choose(trail)
    assert (choice.point.iteration, choice.point.strength) == (12, 0.5)
    assert choice.within_limit and "iteration 12 at strength 0.5" in choice.reason
    assert "0.015" in choice.reason  # the fall it allowed


def test_a_margin_of_standard_errors_keeps_a_noisy_point_out() -> None:
    trail = _trail(0.02, (4, 1.0, 0.3, 0.49, 0.004), (8, 1.0, 0.6, 0.485, 0.01))
    assert choose(trail).point.iteration == 8
    assert choose(trail, margin=1.0).point.iteration == 4  # 0.015 + 0.01 is past 0.02
    assert not allowed(trail, trail.points[2], margin=1.0)


def test_the_choice_says_how_often_its_true_fall_is_past_the_limit() -> None:
    from dynamic_treerpo.trainer.guard.choice import past_limit_chance, risk_words

    assert past_limit_chance(0.02, 0.01, 0.02) == pytest.approx(0.5)  # measured at the limit: a coin
    assert past_limit_chance(0.01, 0.01, 0.02) == pytest.approx(0.1587, abs=1e-4)  # one SE inside
    assert past_limit_chance(0.03, 0.0, 0.02) == 1.0 and past_limit_chance(0.01, 0.0, 0.02) == 0.0
    assert risk_words(0.1587) == "about 1 run in 6" and risk_words(0.001) == "under 1 run in 100"
    assert risk_words(0.5) == "about even" and risk_words(0.7) == "likely"
    trail = _trail(0.02, (4, 1.0, 0.3, 0.49, 0.004), (8, 1.0, 0.6, 0.485, 0.005))
    assert choose(trail).reason.endswith("(its true fall is past the limit in about 1 run in 6)")


def test_no_checkpoint_within_the_limit_returns_the_base_model_with_one_line() -> None:
    trail = _trail(0.01, (4, 1.0, 0.3, 0.47), (8, 1.0, 0.6, 0.45))
    choice = choose(trail)
    assert choice.point is None and not choice.within_limit
    assert "no checkpoint kept prompt-following within the limit" in choice.reason
    assert "0.03 at iteration 4" in choice.reason and "\n" not in choice.reason
    flat = _trail(0.05, (4, 1.0, -0.1, 0.5))
    assert choose(flat).point is None and "raised your taste" in choose(flat).reason


def test_taking_another_checkpoint_or_strength_needs_no_measurement() -> None:
    trail = _trail(0.02, (4, 1.0, 0.3, 0.49), (8, 1.0, 0.6, 0.45))
    assert take(trail, 8, 1.0).point == trail.points[2]
    assert not take(trail, 8, 1.0).within_limit
    unmeasured = take(trail, 8, 0.3)
    assert unmeasured.point.strength == 0.3 and "not measured" in unmeasured.reason
    assert take(trail, 4, 0.0).point is None
    with pytest.raises(ValueError, match="no checkpoint at iteration 5: this run kept 4, 8"):
        take(trail, 5, 1.0)


def test_paired_standard_error_and_lora_strength() -> None:
    base = torch.tensor([0.5, 0.4, 0.6, 0.3])
    assert paired_se(base + 0.1, base) == pytest.approx(0.0, abs=1e-7)  # float32 sums
    diff = torch.tensor([0.1, -0.1, 0.2, 0.0])
    assert paired_se(base + diff, base) == pytest.approx(float(diff.double().std() / 2), rel=1e-6)
    state = {"a.lora_A.weight": torch.ones(2, 3), "a.lora_B.weight": torch.ones(3, 2)}
    half = scaled_lora(state, 0.5)
    assert torch.equal(half["a.lora_A.weight"], state["a.lora_A.weight"])
    assert torch.equal(half["a.lora_B.weight"], torch.full((3, 2), 0.5))


# ---------------------------------------------------------------------- a guarded run
@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory):
    config = load_config(TrainConfig, None, [*TINY, *ORACLE, "seed=3", "guard.keep=loosely", "iterations=4",
                                             "guard.measure=every"])  # every checkpoint on the trail
    trainer = Trainer(config)
    pairs = separate_validation_pairs(config, trainer.eval_pairs)
    lines: list[str] = []
    tracker = guard_trainer(trainer, pairs, taste="function", log=lines.append)
    result = tracker.run(0, 4)
    return trainer, pairs, result, lines, tmp_path_factory.mktemp("guard")


def test_a_guarded_run_measures_the_base_and_its_checkpoints_on_pairs_it_never_trains_on(guarded_run) -> None:
    trainer, pairs, result, lines, _ = guarded_run
    test_prompts = {p.prompt for p in trainer.eval_pairs}
    assert len(pairs) == 6 and not test_prompts & {p.prompt for p in pairs}
    drawn = {p for it in range(4) for p in trainer.prompts.prompts(it, 2)}
    assert not drawn & {p.prompt for p in pairs}
    iterations = [p.iteration for p in result.trail.points if p.strength == 1.0]
    assert iterations == [0, 2, 4]
    assert sorted(result.snapshots) == [2, 4]
    assert result.trail.limit == 0.05 and result.base_guard.shape == (6,)
    assert lines[-1] == (f"guard: chose {result.choice.reason}" if result.choice.point is not None
                         else f"guard: {result.choice.reason}")


def test_the_policy_carries_the_chosen_checkpoint_and_another_can_be_taken(guarded_run) -> None:
    trainer, _, result, _, _ = guarded_run
    transformer = trainer.policy.transformer

    def live() -> dict[str, torch.Tensor]:
        """The model's LoRA, on the CPU where the kept checkpoints are (the model may be on a GPU)."""
        return {k: v.cpu() for k, v in lora_state_dict(transformer).items()}

    point = result.choice.point
    expected = result.weights(0, 0.0) if point is None else result.weights(point.iteration, point.strength)
    assert all(torch.equal(v, expected[k]) for k, v in live().items())
    other = result.take(2, 0.5)
    result.apply(transformer, other)
    taken = live()
    assert all(torch.allclose(v, result.weights(2, 0.5)[k]) for k, v in taken.items())
    assert any(not torch.equal(v, result.snapshots[2][k]) for k, v in taken.items() if "lora_B" in k)


def test_a_guarded_run_saves_and_reads_back_with_its_figures(guarded_run) -> None:
    from PIL import Image

    _, _, result, _, folder = guarded_run
    save_guard(result, folder / "guard")
    again = load_guard(folder / "guard")
    assert again.trail.to_json() == result.trail.to_json()
    assert again.choice == result.choice
    assert sorted(again.snapshots) == sorted(result.snapshots)
    assert all(torch.equal(again.snapshots[2][k], v) for k, v in result.snapshots[2].items())
    data = json.loads((folder / "guard" / "trail.json").read_text())
    assert data["choice"]["reason"] == result.choice.reason
    files = write_figures(result, folder / "figures")
    for path in files.values():
        with Image.open(path) as image:
            assert image.size[0] > 200 and image.size[1] > 150
    with Image.open(files["before_after"]) as image:  # the base and at least one checkpoint, 4 images a row
        assert image.size[1] > 2 * 64 * 2


def test_a_limit_no_checkpoint_meets_returns_the_base_model(tmp_path: Path) -> None:
    config = load_config(TrainConfig, None, [*TINY, *ORACLE, "seed=4", "guard.limit=-0.0", "iterations=2",
                                             "optim.lr=0.05"])
    trainer = Trainer(config)
    tracker = guard_trainer(trainer, separate_validation_pairs(config, trainer.eval_pairs), taste="function",
                            log=lambda _: None)
    tracker.config = GuardConfig(limit=0.0, checkpoints=2, pairs=6, margin=1000.0)
    result = tracker.run(0, 2)
    assert result.choice.point is None and not result.choice.within_limit
    assert all(float(v.abs().max()) == 0.0 for k, v in lora_state_dict(trainer.policy.transformer).items()
               if "lora_B" in k)


def test_headless_training_from_picks_under_the_guard_writes_its_choice_and_figures(tmp_path: Path,
                                                                                      capsys) -> None:
    from dynamic_treerpo.trainer.training.run import format_summary, run_training

    folder = tmp_path / "picks"
    config = load_config(TrainConfig, None, [*TINY, "iterations=2"])
    trainer = Trainer(config, EmbeddedPolicy.from_pretrained(), evaluation=False)
    store = PickStore(folder, create=True)
    prompts = ["a red circle at the top", "a blue square", "two green triangles",
               "a yellow circle on the left"]
    ids = store_trees(trainer.policy, store, prompts, [0, 1, 2, 3], trainer.plan(0),
                      model_id(trainer.policy, "embedded"))
    for tree_id in ids:
        lowest = store.load_images(tree_id).mean(dim=(1, 2, 3)).argsort().tolist()
        store.save_picks(tree_id, liked=lowest[:2], disliked=lowest[-1:])
    run = load_config(TrainConfig, None, [*TINY, "iterations=2", "reward=picks:0.5,scene:0.5",
                                          f"data.picks={folder}", "guard.keep=loosely",
                                          "guard.weights=[0.3, 0.5]"])
    summary = run_training(run, tmp_path / "run", progress=False)
    guard = summary["guard"]
    assert guard["limit"] == 0.05 and guard["points"] >= 2  # the base and at least the last checkpoint
    assert (tmp_path / "run" / "guard" / "trade.png").is_file()
    assert (tmp_path / "run" / "guard" / "before_after.png").is_file()
    assert "guard (a fall of at most 0.0500)" in format_summary(summary)
    # asked for two weights (0.5.0's default), the guard trained the picks at 0.3 and at 0.5, each in its
    # own folder, and kept one run's
    weights = summary["weights"]
    assert weights["runs"] == ["weight_0.3", "weight_0.5"] and weights["kept"] in (0.3, 0.5)
    kept = tmp_path / "run" / f"weight_{weights['kept']:g}"
    assert (kept / "config.yaml").read_text().count(f"picks:{weights['kept']:g}") == 1
    top = tmp_path / "run" / "guard"
    assert load_guard(kept / "guard").trail.to_json() == load_guard(top).trail.to_json()
    light = load_guard(kept / "guard", snapshots=False)  # the measurements without the LoRA files
    assert light.snapshots == {} and load_guard(kept / "guard").snapshots
    assert light.trail.to_json() == load_guard(top).trail.to_json()
    assert "at weights 0.3 and 0.5" in weights["line"] and weights["line"] in format_summary(summary)
    with pytest.raises(ConfigError, match="already holds a run; add --resume"):
        run_training(run, tmp_path / "run", progress=False)
    again = run_training(run, tmp_path / "run", resume=True, progress=False)  # finished: re-written only
    assert again["weights"] == weights and again["guard"] == guard
    assert math.isfinite(summary["eval_reward"]["final"])

    # another checkpoint at half strength, without training: `treerpo take`
    from dynamic_treerpo.trainer.cli import main

    assert main(["take", str(tmp_path / "run"), "--iteration", "1", "--strength", "0.5",
                 "--out", str(tmp_path / "taken")]) == 0
    kept = load_guard(tmp_path / "run" / "guard").snapshots[1]
    comfy = load_file(str(tmp_path / "taken" / "comfyui_lora.safetensors"))
    up = {k: v for k, v in comfy.items() if k.endswith("lora_up.weight")}
    assert up and all(torch.allclose(v, 0.5 * kept[k.replace("diffusion_model.", "").replace(
        "lora_up.weight", "lora_B.weight")]) for k, v in up.items())
    assert (tmp_path / "taken" / "kohya_lora.safetensors").is_file()
    assert (tmp_path / "taken" / "trade.png").is_file()
    capsys.readouterr()
    assert main(["take", str(tmp_path / "run"), "--iteration", "9"]) == 2
    expected = "treerpo take: error: no checkpoint at iteration 9: this run kept 1, 2"
    assert capsys.readouterr().err.strip() == expected
    assert main(["take", str(tmp_path / "picks"), "--iteration", "1"]) == 2
    assert "has no guarded run to take a checkpoint from" in capsys.readouterr().err
