"""A Python function as the reward (``reward: function``), and the benchmarks' tastes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamic_treerpo.trainer.bench.taste.hidden_tastes import (
    TASTES,
    central_objects,
    deep_shades,
    larger_objects,
)
from dynamic_treerpo.trainer.rewards.mix import RewardMix
from dynamic_treerpo.trainer.rewards.registry import get_reward

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = "dynamic_treerpo.trainer.bench.taste.hidden_tastes"  # the benchmarks' tastes, as a spec names them


def _scene(size: int, centre: tuple[int, int], value: float = 0.9) -> torch.Tensor:
    """A dark 64x64 picture with one square of ``size`` pixels at ``centre``."""
    image = torch.full((3, 64, 64), 0.1)
    y, x = centre
    image[0, y - size // 2: y + size // 2, x - size // 2: x + size // 2] = value
    return image


def test_tastes_prefer_what_they_say() -> None:
    small, big = _scene(8, (32, 32)), _scene(24, (32, 32))
    corner, middle = _scene(10, (10, 10)), _scene(10, (32, 32))
    bright, deep = _scene(12, (32, 32), 0.95), _scene(12, (32, 32), 0.5)
    empty = torch.full((3, 64, 64), 0.1)
    assert float(larger_objects(torch.stack([small, big])).diff()) > 0
    assert float(central_objects(torch.stack([corner, middle])).diff()) > 0
    assert float(deep_shades(torch.stack([bright, deep])).diff()) > 0
    for taste in TASTES.values():
        scores = taste(torch.stack([empty, small, big, corner, deep]))
        assert scores.shape == (5,) and float(scores.min()) >= 0 and float(scores.max()) <= 1
        assert float(scores[0]) == 0.0  # nothing drawn, nothing liked


def test_a_module_function_is_a_reward_and_mixes() -> None:
    reward = get_reward("function", "dynamic_treerpo.trainer.bench.taste.hidden_tastes:larger_objects")
    images = torch.stack([_scene(8, (32, 32)), _scene(24, (32, 32))])
    assert torch.allclose(reward(images, ["a", "b"])["reward"], larger_objects(images))
    mix = RewardMix("scene:0.5,function:0.5",
                    {"function": "dynamic_treerpo.trainer.bench.taste.hidden_tastes:central_objects"})
    out = mix(images, ["a red square", "a red square"])
    assert {"reward_scene", "reward_function"} <= set(out)


def test_the_tastes_old_module_path_still_resolves() -> None:
    """Saved configs, the docs and the stored docs/data/protocol.json name the tastes by their path before
    they moved (``bench.tastes``): the function reward's alias resolves it to the same functions."""
    from dynamic_treerpo.trainer.rewards.function import MOVED_MODULES, load_function

    old = "dynamic_treerpo.trainer.bench.tastes"
    assert MOVED_MODULES[old] == HIDDEN
    assert f"{old}:larger_objects" in (ROOT / "docs" / "data" / "protocol.json").read_text(encoding="utf-8")
    assert load_function(f"{old}:larger_objects") is larger_objects
    images = torch.stack([_scene(8, (32, 32)), _scene(24, (32, 32))])
    reward = get_reward("function", f"{old}:central_objects")
    assert torch.equal(reward(images, ["a", "b"])["reward"], central_objects(images))
    with pytest.raises(ValueError, match=f"reward function '{old}:nope': {old} has no function 'nope'"):
        get_reward("function", f"{old}:nope")


def test_a_file_function_is_a_reward(tmp_path: Path) -> None:
    file = tmp_path / "taste.py"
    file.write_text("def redness(images, prompts):\n    return images[:, 0].mean(dim=(1, 2))\n")
    reward = get_reward("function", f"{file}:redness")
    images = torch.stack([_scene(8, (32, 32)), _scene(24, (32, 32))])
    assert torch.allclose(reward(images, ["a", "b"])["reward"], images[:, 0].mean(dim=(1, 2)))


@pytest.mark.parametrize(("spec", "message"), [
    (None, "MODULE:FUNCTION or FILE.py:FUNCTION"),
    ("no_colon_here", "expected MODULE:FUNCTION"),
    ("missing_module_xyz:f", "cannot import 'missing_module_xyz'"),
    ("dynamic_treerpo.trainer.bench.taste.hidden_tastes:nope", "has no function 'nope'"),
    ("/no/such/file.py:f", "reward function file not found"),
])
def test_bad_function_specs_are_one_line(spec: str | None, message: str) -> None:
    with pytest.raises((ValueError, ImportError, FileNotFoundError)) as err:
        get_reward("function", spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_function_giving_the_wrong_scores_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "bad.py"
    file.write_text("def one(images, prompts):\n    return [0.5]\n"
                    "def nan(images, prompts):\n    return [float('nan')] * len(prompts)\n")
    images = torch.stack([_scene(8, (32, 32))] * 2)
    with pytest.raises(ValueError, match="returned 1 scores for 2 images"):
        get_reward("function", f"{file}:one")(images, ["a", "b"])
    with pytest.raises(ValueError, match="not a finite number"):
        get_reward("function", f"{file}:nan")(images, ["a", "b"])


def test_training_on_a_function_reward_from_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynamic_treerpo.trainer", "train", "--out", str(tmp_path / "run"),
         "--set", "iterations=1", "--set", "data.prompts_per_iteration=2", "--set", "data.eval_pairs=4",
         "--set", "sampling.eval_steps=2", "--set", "tree.steps=5", "--set", "tree.depth=2",
         "--set", "reward=scene:0.5,function:0.5",
         "--set", f"reward_weights={{function: {HIDDEN}:larger_objects}}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "lora" / "comfyui_lora.safetensors").is_file()
