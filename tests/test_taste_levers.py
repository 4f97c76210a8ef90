"""treerpo bench taste-levers' table: each arm's taste gain against the oracle frontier and, paired per seed,
against the default, with the runs whose prompt-following fell past the limit."""

from __future__ import annotations

import json

from dynamic_treerpo.trainer import cli
from dynamic_treerpo.trainer.bench.taste import levers as levers_module


def _script():
    """The levers' study and its command line (``levers.main``: ``treerpo bench taste-levers``)."""

    class Levers:
        TWO_ROUNDS = levers_module.TWO_ROUNDS

        @staticmethod
        def main(argv: list[str]) -> int:
            return cli.main(["bench", "taste-levers", *argv])

    return Levers


def _run(default: float, first: float, frontier: float, fall: float) -> dict:
    arm = {"limit": 0.02, "chosen": {}, "picks_weights": []}
    return {"before": {"taste": 0.5, "scene": 0.45},
            "frontier": {"0.3": {"gain": frontier}, "steered": {"gain": frontier / 2}},
            "arms": {"default (512 pairs, bisect)": {**arm, "taste_gain": default, "scene_change": -fall},
                     "first version (128 pairs, line)": {**arm, "taste_gain": first, "scene_change": 0.0}}}


def test_the_levers_table_pairs_each_arm_with_the_default_and_counts_falls_past_the_limit(tmp_path, capsys):
    levers = _script()
    for seed, (default, first, fall) in enumerate([(0.10, 0.05, 0.01), (0.20, 0.10, 0.03)]):
        run = _run(default, first, 0.2, fall)
        if seed == 0:  # a two-round run: the first reward's accuracy on the trained model's trees
            second = {"first_reward_accuracy": 0.6, "first_reward_accuracy_on_base_trees": 0.8}
            default_arm = run["arms"]["default (512 pairs, bisect)"]
            run["arms"][levers.TWO_ROUNDS] = {**default_arm, "rounds": [{}, second]}
        (tmp_path / f"lower_objects_{seed}.json").write_text(json.dumps(run))
    assert levers.main(["--report", "--out", str(tmp_path), "--tastes", "lower_objects", "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "| lower_objects | default (512 pairs, bisect) | 2 | +0.150 (" in text
    assert "| 75% |  | " in text and "| 1 of 2 |" in text  # 0.15 of a 0.2 frontier; seed 1 fell 0.03
    assert "| lower_objects | first version (128 pairs, line) | 2 | +0.075 (" in text
    assert "| 38% | -0.075 (" in text  # paired with the default, seed by seed
    assert "| lower_objects | oracle frontier | 2 | +0.200 (+0.200 to +0.200) | 100% |" in text
    assert "| first version (128 pairs, line) | 2 | +38% (" in text and "| -38% (" in text
    assert "| lower_objects | default, two rounds of picks | 1 | +0.100 | 50% | +0.000 |" in text
    assert "trained model's trees at 0.60, on more of the base model's trees at 0.80" in text
