"""``treerpo bench taste-sets`` (trainer/bench/taste/pair_sets.py): the further seed sets it measures on and
how it places the validation and test sets among them."""

from __future__ import annotations

import pytest

from dynamic_treerpo.trainer.bench.taste import pair_sets as ps
from dynamic_treerpo.trainer.cli import main

PROMPTS = ("two red circles", "a blue square on the left", "a green triangle at the top")


def test_further_sets_cycle_the_prompts_at_seeds_of_their_own() -> None:
    sets = ps.extra_sets(PROMPTS, 5, 2)
    assert list(sets) == ["seed set 4001", "seed set 4002"]
    first, second = sets.values()
    assert [p.prompt for p in first] == [*PROMPTS, *PROMPTS[:2]]
    assert not {p.seed for p in first} & {p.seed for p in second}
    with pytest.raises(ValueError, match="--sets must be at least 1"):
        ps.extra_sets(PROMPTS, 5, 0)


def test_the_validation_and_test_sets_are_placed_among_the_further_ones() -> None:
    falls = {ps.VALIDATION: -0.08, ps.TEST: -0.05, "a": -0.06, "b": -0.07, "c": -0.05}
    s = ps.between_sets(falls, stated_se=0.011)
    assert s["others_mean"] == pytest.approx(-0.06) and s["others_sd"] == pytest.approx(0.01)
    assert s["validation_away"] == pytest.approx(-2.0) and s["test_away"] == pytest.approx(1.0)
    line = ps.sets_line(falls, s)
    assert "validation set -0.0800 (-2.0 sd from the further sets' mean -0.0600)" in line
    assert "standard deviation 0.0100 against the guard's stated standard error 0.0110" in line
    with pytest.raises(ValueError, match="at least 2 further sets"):
        ps.between_sets({ps.VALIDATION: 0.0, ps.TEST: 0.0, "a": 0.0}, 0.01)


def test_the_command_refuses_too_few_sets_and_an_unknown_taste_before_training(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "taste-sets", "--taste", "deep_shades", "--sets", "1", "--out", str(tmp_path)]) == 2
    assert "--sets must be at least 2" in capsys.readouterr().err
    assert main(["bench", "taste-sets", "--taste", "no_such_taste", "--out", str(tmp_path)]) == 2
    assert "no_such_taste" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written
