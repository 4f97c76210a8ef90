"""The ``treerpo`` / ``python -m trainer`` command line."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_nfe_json_rows_match_the_closed_form() -> None:
    out = _run("nfe", "--T", "25", "--l", "10", "--d", "4", "--b", "2", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["strategy"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"dancegrpo", "mixgrpo", "mixgrpo_shared_trunk", "mixgrpo_flash",
                         "dynamic_treerpo"}
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
    assert scripts.get("treerpo") == "trainer.cli:main"
