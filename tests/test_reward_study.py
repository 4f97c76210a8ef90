"""``treerpo bench taste-rewards``: the heads screened against hidden tastes on one pool, with no RL."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynamic_treerpo.trainer.bench.taste.person import SimulatedPerson
from dynamic_treerpo.trainer.bench.taste.reward_study import (
    QUICK,
    RewardStudyBudget,
    cell,
    person_picks,
    rank_correlation,
)
from dynamic_treerpo.trainer.preferences.pairs import tree_pairs
from dynamic_treerpo.trainer.preferences.records import Picks

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]


def test_the_quick_study_writes_every_per_seed_value_and_its_table(tmp_path: Path) -> None:
    out = subprocess.run([*TREERPO, "bench", "taste-rewards", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "rewards.json").read_text())
    rows = result["rows"]
    heads, tastes = QUICK.heads, QUICK.tastes
    assert len(rows) == len(tastes) * QUICK.seeds * len(QUICK.at) * len(heads)
    assert all(0.0 <= r["accuracy"] <= 1.0 and -1.0 <= r["spearman"] <= 1.0 and -1.0 <= r["across"] <= 1.0
               for r in rows)
    cells = result["summary"]["cells"]["content"]
    assert set(cells) == set(heads) and set(cells["kernel"]) == {str(n) for n in QUICK.at}
    pooled = cells["quadratic"]["8"]["accuracy"]["pooled"]
    assert set(pooled) == {"named", "family"} and pooled["family"]["tastes"] == 1
    assert "pair accuracy against the hidden taste: content backbone, 4 labelled trees" in out.stdout
    assert "family (over tastes)" in out.stdout
    across = "Spearman correlation across every test leaf against the hidden taste: content backbone, 8"
    assert across in out.stdout
    assert result["command"].startswith("treerpo bench taste-rewards ") and "--quick" in result["command"]
    assert not any(p.name == "pool" for p in tmp_path.rglob("*"))  # the pool's trees are not kept


def test_the_study_refuses_an_unknown_taste_or_head_and_a_budget_without_linear(tmp_path: Path) -> None:
    out = subprocess.run([*TREERPO, "bench", "taste-rewards", "--quick", "--tastes", "no_such_taste",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and not (tmp_path / "o" / "rewards.json").exists()
    with pytest.raises(ValueError, match="must include linear"):
        RewardStudyBudget(heads=("quadratic",))
    with pytest.raises(ValueError, match="unknown head 'forest'; expected linear, quadratic"):
        RewardStudyBudget(heads=("linear", "forest"))
    with pytest.raises(ValueError, match="at least the largest labelled count"):
        RewardStudyBudget(candidates=10)


def test_the_person_picks_from_the_taste_scores_as_from_the_images() -> None:
    scores = {"a": torch.tensor([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4])}
    budget = RewardStudyBudget()
    person = SimulatedPerson(lambda images, prompts: scores["a"], 2, 1, budget.mistakes)
    liked, disliked = person.pick(torch.zeros(8, 3, 4, 4), "p", random.Random(1))
    assert person_picks(scores, ["a"], 0, budget)["a"] == tree_pairs(Picks(tuple(liked), tuple(disliked)), 8)


def test_the_rank_correlation_and_the_pooled_rows() -> None:
    rho = rank_correlation(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 30.0, 20.0]))
    assert rho == pytest.approx(0.5)
    assert math.isnan(rank_correlation(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0])))
    rows = [{"taste": t, "seed": s, "accuracy": v} for t, s, v in
            [("larger_objects", 0, 0.8), ("larger_objects", 1, 0.9), ("family_00", 0, 0.6),
             ("family_00", 1, 0.7)]]
    linear = [{**r, "accuracy": r["accuracy"] - 0.1} for r in rows]
    out = cell(rows, "accuracy", linear)
    assert out["per_taste"]["family_00"]["vs_linear"]["difference"] == pytest.approx(0.1)
    assert out["pooled"]["named"]["value"]["values"] == [0.8, 0.9]
    assert out["pooled"]["family"]["over_tastes"]["vs_linear"] is None  # one taste: nothing to pair over
