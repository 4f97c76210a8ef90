"""treerpo bench taste-weight: the default method at another picks weight on a bench taste run's frontier,
with that run's budget, options and code, so the arm pairs with it seed by seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]


def test_the_weight_arm_trains_the_method_at_its_weight_on_the_runs_frontier(tmp_path: Path) -> None:
    table, arm = tmp_path / "table", tmp_path / "arm"
    made = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--tastes", "lower_objects", "--seeds", "1",
                           "--out", str(table)], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-2000:]
    out = subprocess.run([*TREERPO, "bench", "taste-weight", "--tastes",
                          "lower_objects", "--seeds", "1", "--trees", "3", "--weight", "0.5",
                          "--frontier-from", str(table), "--out", str(arm)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    source = json.loads((table / "lower_objects" / "taste.json").read_text())
    mine = json.loads((arm / "lower_objects" / "taste.json").read_text())
    assert mine["budget"]["picks_weight"] == 0.5 and source["budget"]["picks_weight"] == 0.3
    assert mine["budget"]["trees"] == 3 and mine["budget"]["rounds"] == source["budget"]["rounds"]
    assert mine["extra"] == source["extra"] and mine["extra"]  # --quick's options, carried over
    assert mine["per_seed"][0]["frontier"] == source["per_seed"][0]["frontier"]  # not trained again
    assert mine["per_seed"][0]["code"] == source["per_seed"][0]["code"]
    assert "3" in mine["by_trees"] and "lower_objects: 1 seeds" in out.stdout
    again = subprocess.run([*TREERPO, "bench", "taste", "--quick", "--tastes", "lower_objects", "--report",
                            "--out", str(table), "--arm", f"picks weight 0.5={arm}"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
