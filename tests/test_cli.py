"""The ``treerpo`` / ``python -m dynamic_treerpo.trainer`` command line."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]  # the `treerpo` command

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TREERPO, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_nfe_json_rows_match_the_closed_form() -> None:
    out = _run("nfe", "--T", "25", "--l", "10", "--d", "4", "--b", "2", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["strategy"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"dancegrpo", "mixgrpo", "mixgrpo_shared_trunk", "mixgrpo_flash",
                         "dynamic_treerpo", "flow_grpo", "flow_grpo_fast", "branchgrpo", "diffusionnft",
                         "awm", "dgpo"}
    assert rows["diffusionnft"]["train_nfe"] == rows["diffusionnft"]["closed_form_train_nfe"] == 16 * 24 * 3
    for row in rows.values():
        assert {"strategy", "rollout_nfe", "train_nfe", "scored_images", "rollout_nfe_per_image",
                "closed_form_rollout_nfe"} <= set(row)
        assert row["rollout_nfe"] == row["closed_form_rollout_nfe"]
        assert row["scored_images"] == 16
    assert rows["dynamic_treerpo"]["rollout_nfe_per_image"] == 201 / 16
    assert rows["mixgrpo"]["rollout_nfe_per_image"] == 25


def test_nfe_table_and_options() -> None:
    out = _run("nfe", "--T", "12", "--l", "3", "--d", "3", "--b", "3", "--M", "2", "--G", "8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["strategy", "images"]
    tree = next(line for line in lines if line.startswith("dynamic_treerpo")).split()
    assert tree[1] == "54" and tree[2] == tree[3]  # 2 * 3^3 images; counted == closed form


def test_bad_input_is_one_line_and_exit_2() -> None:
    out = _run("nfe", "--T", "8", "--l", "9")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "window_start=9 out of range" in out.stderr


def test_console_script_is_registered() -> None:
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("treerpo") == "dynamic_treerpo.trainer.cli:main"


def _write_scene_folder(folder: Path, prompts: list[str]) -> None:
    import numpy as np
    from PIL import Image

    from dynamic_treerpo.trainer.embedded.scenes import layout, parse_prompt, render

    folder.mkdir()
    for i, prompt in enumerate(prompts):
        image = render(layout(parse_prompt(prompt), np.random.default_rng(i)))
        Image.fromarray((np.asarray(image).transpose(1, 2, 0) * 255).round().astype(np.uint8)).save(
            folder / f"{i:02d}.png")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "99_noise.png")


def test_score_prints_each_image_and_the_mean(tmp_path: Path) -> None:
    prompts = ["two red circles", "a blue square on the left and a green triangle on the right"]
    _write_scene_folder(tmp_path / "images", prompts)
    (tmp_path / "prompts.txt").write_text("\n".join([*prompts, "a yellow circle"]) + "\n")
    out = _run("score", "--reward", "scene", "--images", str(tmp_path / "images"),
               "--prompts", str(tmp_path / "prompts.txt"))
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.strip().splitlines()]
    assert rows[0] == ["image", "scene"]
    scores = {name: float(value) for name, value in rows[1:]}
    assert list(scores) == ["00.png", "01.png", "99_noise.png", "mean"]
    assert scores["00.png"] >= 0.95 and scores["01.png"] >= 0.95  # clean renders
    assert scores["99_noise.png"] <= 0.1
    assert scores["mean"] == pytest.approx(sum(list(scores.values())[:3]) / 3, abs=2e-4)


def test_score_with_the_ocr_reward_reads_rendered_words(tmp_path: Path) -> None:
    from PIL import Image, ImageDraw, ImageFont

    folder = tmp_path / "words"
    folder.mkdir()
    words = ["OPEN", "COFFEE"]
    for i, word in enumerate(words):
        image = Image.new("RGB", (256, 96), "white")
        ImageDraw.Draw(image).text((16, 20), word, fill="black", font=ImageFont.load_default(size=48))
        image.save(folder / f"{i}.png")
    # the second prompt asks for another word than the image shows
    (tmp_path / "p.txt").write_text('a sign that says "OPEN"\na mug that says "TEA"\n')
    out = _run("score", "--reward", "ocr", "--images", str(folder), "--prompts", str(tmp_path / "p.txt"))
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.strip().splitlines()]
    assert rows[0] == ["image", "ocr"]
    assert float(rows[1][1]) == 1.0 and float(rows[2][1]) <= 0.5
    assert float(rows[3][1]) == pytest.approx((float(rows[1][1]) + float(rows[2][1])) / 2, abs=1e-4)


def test_score_bad_input_is_one_line(tmp_path: Path) -> None:
    _write_scene_folder(tmp_path / "images", ["two red circles"])
    one = tmp_path / "one.txt"
    one.write_text("two red circles\n")
    cases = [
        (["--reward", "scene", "--images", str(tmp_path / "images"), "--prompts", str(one)],
         "2 images in"),
        (["--reward", "scene,hps", "--images", str(tmp_path / "images"), "--prompts", str(one)],
         "unknown reward 'hps'"),
        (["--reward", "scene", "--images", str(tmp_path / "none"), "--prompts", str(one)],
         "image folder not found"),
        (["--reward", "hps-v2.1", "--images", str(tmp_path / "images"), "--prompts", str(one)],
         "reward 'hps-v2.1' needs its weights: give a local PATH"),
        (["--reward", "scene", "--weights", str(tmp_path), "--images", str(tmp_path / "images"),
          "--prompts", str(one)], "has no reward to go to"),
        (["--reward", "scene:-1", "--images", str(tmp_path / "images"), "--prompts", str(one)],
         "reward weight of 'scene' must be > 0"),
    ]
    for args, message in cases:
        out = _run("score", *args)
        assert out.returncode == 2
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr
