"""The ablation table, the decomposition and the risk count of ``bench taste``, from stored runs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.taste import ablation as ab
from dynamic_treerpo.trainer.bench.taste.budget import QUICK, SeedResult
from dynamic_treerpo.trainer.bench.taste.page import markdown
from dynamic_treerpo.trainer.bench.taste.page_parts import calibration_words
from dynamic_treerpo.trainer.bench.taste.summary import summarise

BUDGET = replace(QUICK, seeds=3, trees=50, at=(), frontier_weights=(0.3, 0.5), frontier_steer=False, rounds=1,
                 picks_weights=())  # the method at one fixed weight (picks_weight), as 0.4.0's table


def _seed(seed: int, gain: float, fall: float, margin0_gain: float, frontier: dict[str, float],
          on_policy: float = 0.7, validation_gain: float = 1.0) -> SeedResult:
    """A seed as run_seed stores it, with taste_before 0.5 and scene_before 0.4: the method at 50 trees
    chose a checkpoint of ``gain`` and scene change ``fall``; with margin 0 it would have taken one of
    ``margin0_gain`` (a point closer to the limit)."""
    base = {"iteration": 0, "strength": 1.0, "taste": 0.0, "guard": 0.4, "guard_se": 0.0,
            "test_taste": 0.5, "test_scene": 0.4}
    safe = {**base, "iteration": 1, "taste": 1.0, "guard": 0.395, "guard_se": 0.01,
            "test_taste": 0.5 + gain, "test_scene": 0.4 + fall}
    edge = {**base, "iteration": 2, "taste": 2.0, "guard": 0.385, "guard_se": 0.01,
            "test_taste": 0.5 + margin0_gain, "test_scene": 0.4 + fall - 0.01}
    method = {"taste": 0.5 + gain, "scene": 0.4 + fall, "accuracy": 0.8, "held_out_pairs": 10.0,
              "limit": 0.02, "points": [base, safe, edge], "on_policy": {"trees": 8, "accuracy": on_policy},
              "chosen": {"iteration": 1, "strength": 1.0, "reason": "r",
                         "validation_taste_gain": validation_gain, "validation_scene_fall": 0.005}}
    arms = {w: {"weight": float(w), "gain": g, "scene_change": -0.015, "iteration": 2, "strength": 1.0,
                "limit": 0.02, "taste": 0.5 + g, "scene": 0.385, "points": []} for w, g in frontier.items()}
    best = max(arms.values(), key=lambda a: a["gain"])
    oracle = {"taste": best["taste"], "scene": best["scene"], "weight": best["weight"]}
    return SeedResult(seed, 0.5, 0.4, oracle, arms, {50: method})


def _summary(taste: str, gains: list[float], falls: list[float], mistakes: float = 0.15,
             validation: list[float] | None = None, weight: float = 0.3) -> dict:
    validation = validation or [1.0] * len(gains)
    results = [_seed(s, g, f, g + 0.02, {"0.3": 0.15, "0.5": 0.2}, validation_gain=v) for s, (g, f, v) in
               enumerate(zip(gains, falls, validation, strict=True))]
    out = summarise(results, replace(BUDGET, mistakes=mistakes, picks_weight=weight), taste)
    from dataclasses import asdict
    out["per_seed"] = [asdict(r) for r in results]
    return out


def test_the_decomposition_splits_the_gap_to_the_frontier() -> None:
    main = _summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.01, -0.01])
    clean = _summary("lower_objects", [0.13, 0.13, 0.13], [-0.01, -0.01, -0.01], mistakes=0.0)
    part = ab.decomposition(main, "50", clean)
    assert part["frontier"] == pytest.approx(0.2) and part["oracle_at_method_weight"] == pytest.approx(0.15)
    assert part["method"] == pytest.approx(0.1) and part["method_margin_0"] == pytest.approx(0.12)
    lost = part["lost"]
    assert lost["weight"] == pytest.approx(0.05) and lost["reward_and_validation"] == pytest.approx(0.03)
    assert lost["margin"] == pytest.approx(0.02)
    assert sum(lost.values()) == pytest.approx(part["frontier"] - part["method"])  # the whole gap
    assert part["method_error_free"] == pytest.approx(0.13) and part["picks_mistakes"] == pytest.approx(0.03)
    assert part["base_accuracy"] == pytest.approx(0.8) and part["on_policy_accuracy"] == pytest.approx(0.7)
    assert math.isnan(ab.decomposition(main, "50")["method_error_free"])
    # a method that tries 0.3 and 0.5 is set against the oracle's best of those two weights, per seed
    main["budget"]["picks_weights"] = [0.3, 0.5]
    assert ab.decomposition(main, "50", clean)["oracle_at_method_weight"] == pytest.approx(0.2)


def test_an_arm_is_paired_per_taste_and_seed_with_the_default() -> None:
    default = [_summary("lower_objects", [0.1, 0.12, 0.08], [-0.01] * 3),
               _summary("warm_shades", [0.1, 0.1, 0.1], [-0.01] * 3)]
    better = [_summary("lower_objects", [0.14, 0.15, 0.13], [-0.01, -0.03, -0.01]),
              _summary("warm_shades", [0.12, 0.13, 0.12], [-0.01] * 3)]
    row = ab.arm_row(default, better, "50")
    assert row["runs"] == 6 and row["tastes"] == ["lower_objects", "warm_shades"]
    assert row["difference"]["mean"] == pytest.approx(
        (0.04 + 0.03 + 0.05 + 0.02 + 0.03 + 0.02) / 6 / 0.2)
    assert ab.verdict(row) == "better" and row["exact_p"] == pytest.approx(2 / 2 ** 6)
    assert row["past_limit"] == 1 and row["default_past_limit"] == 0
    one = ab.arm_row(default, better[1:], "50")  # an arm run on one taste: only its runs are paired
    assert one["runs"] == 3 and one["tastes"] == ["warm_shades"]
    same = ab.arm_row(default, default, "50")
    assert ab.verdict(same) == "inconclusive" or same["difference"]["mean"] == 0.0
    assert ab.arm_row(default, better, "25") == {"runs": 0}


def test_the_page_gives_the_pooled_share_the_risk_count_the_decomposition_and_the_ablations() -> None:
    default = [_summary("lower_objects", [0.1, 0.12, 0.08], [-0.01, -0.025, -0.01]),
               _summary("warm_shades", [0.1, 0.1, 0.1], [-0.01] * 3)]
    clean = [_summary("lower_objects", [0.13] * 3, [-0.01] * 3, mistakes=0.0)]
    assert ab.risk_count(default) == {"past": 1, "runs": 6}
    text = markdown(default, None, "treerpo bench taste", {"error-free picks": clean})
    assert "**1 of 6**" in text and "50 trees 50% (" in text
    assert "| lower_objects | +0.200 | +0.150 (75%) | +0.120 (60%) | +0.100 (50%) |" in text
    assert "| error-free picks | 3 (lower_objects) | 65%" in text


def test_the_readme_block_gives_each_taste_the_pooled_share_the_risk_and_each_arm() -> None:
    from dynamic_treerpo.trainer.bench.taste.readme import BEGIN, END, readme_block, with_readme_block

    main = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.03, -0.01]),
            _summary("warm_shades", [0.2, 0.2, 0.2], [-0.01, -0.01, -0.01])]
    arm = [_summary("lower_objects", [0.15, 0.16, 0.14], [-0.01, -0.01, -0.01])]
    block = readme_block(main, {"two rounds": arm})
    assert block.startswith(BEGIN) and block.endswith(END)
    # the frontier is 0.2 on every seed: 50% and 100% of it, the 80% target read per seed
    assert "| lower_objects (against the prompt) | +0.200 | 50% (not met) | -0.017 |" in block
    assert "| warm_shades (against the prompt) | +0.200 | 100% (met) | -0.010 |" in block
    assert "50 trees 75% (" in block  # the six runs pooled
    assert "went past the limit: 1 of 6." in block  # lower_objects seed 1 fell 0.03 against 0.02
    assert "- two rounds, at 50 trees against the default on the same 3 runs: +25 points (" in block
    readme = f"# x\n\nbefore\n{BEGIN}\nold figures\n{END}\nafter\n"
    new = with_readme_block(readme, block)
    assert "old figures" not in new and new.startswith("# x\n\nbefore\n") and new.endswith("\nafter\n")
    with pytest.raises(ValueError, match="no taste block"):
        with_readme_block("# x\n", block)


def test_the_stated_risk_is_summed_over_runs_and_set_beside_the_runs_that_went_past() -> None:
    main = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.03, -0.01])]
    stated = ab.stated_risk(main)
    # each chosen checkpoint fell 0.005 on validation with a standard error of 0.01, limit 0.02:
    # P(Z > 1.5) = 0.0668 per run
    assert stated["runs"] == 3 and stated["past"] == 1
    assert stated["expected"] == pytest.approx(3 * 0.0668, abs=1e-3)
    assert stated["p_at_least"] == pytest.approx(1 - (1 - 0.0668) ** 3, abs=1e-3)  # one or more of three
    # on the test pairs (as many as the validation pairs) the measured fall has a noise of its own:
    # the standard error grows by sqrt(2), P(Z > 0.015 / 0.01414) = 0.1444 per run
    assert stated["expected_on_test"] == pytest.approx(3 * 0.1444, abs=1e-3)
    assert stated["p_at_least_on_test"] == pytest.approx(1 - (1 - 0.1444) ** 3, abs=1e-3)
    # test falls 0.01, 0.03, 0.01 against the validation fall 0.005, in units of 0.01 * sqrt(2)
    surprise = [0.005 / 0.014142, 0.025 / 0.014142, 0.005 / 0.014142]
    calibration = stated["calibration"]
    assert calibration["n"] == 3 and calibration["mean"] == pytest.approx(sum(surprise) / 3, abs=1e-3)
    assert calibration["sd"] == pytest.approx(0.8165, abs=1e-3)


def test_error_calibration_needs_two_runs_and_its_sentence_says_what_right_looks_like() -> None:
    assert math.isnan(ab.error_calibration([0.4])["sd"])
    assert calibration_words(ab.error_calibration([0.4])) == ""
    words = calibration_words(ab.error_calibration([1.0, -1.0]))
    assert "mean +0.00, standard deviation 1.41 over 2 runs" in words


def test_runs_that_share_both_pair_sets_are_said_to_share_one_draw() -> None:
    # the helper's runs all measure the base at 0.4 on validation and on test: the template's case
    runs = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.03, -0.01])]
    assert ab.stated_risk(runs)["calibration"]["shared"]
    assert "share one draw" in calibration_words(ab.stated_risk(runs)["calibration"])
    # a run whose validation set differs (its own prompts: the named table's case) breaks the sharing
    runs[0]["per_seed"][1]["reward"][50]["points"][0]["guard"] = 0.41
    assert not ab.stated_risk(runs)["calibration"]["shared"]
    assert "share one draw" not in calibration_words(ab.stated_risk(runs)["calibration"])
    assert not ab.shares_both_sets(runs[:0])


def test_the_fall_gap_compares_every_checkpoint_on_validation_and_test_pairs() -> None:
    gap = ab.fall_gap(_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.01, -0.01]))
    # per seed two checkpoints: validation falls 0.005 and 0.015, test falls 0.01 and 0.02
    assert gap["points"] == 6
    assert gap["validation"] == pytest.approx(0.01) and gap["test"] == pytest.approx(0.015)
    assert gap["gap"] == pytest.approx(0.005) and gap["gap_sd"] == pytest.approx(0.0, abs=1e-9)
    page = markdown([_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01, -0.03, -0.01])], None, "cmd")
    assert "expects 0.2 of those 3 runs past the limit" in page and "1 went past on the test pairs" in page
    # seed 1 fell 0.02 further on the test pairs than the others, at both checkpoints
    assert "| lower_objects | 6 | +0.0100 | +0.0217 | +0.0117 (0.0103) |" in page


def test_the_guard_choosing_the_weight_reads_only_its_own_validation_figures() -> None:
    """Per run, the weight whose chosen point gained most personal reward on validation pairs (the
    default on ties), however the hidden taste came out: seed 0 takes 0.5 (2.0 against 1.0, and it did
    better on the test pairs), seed 1 keeps 0.3 (0.5 gained less on validation), seed 2 ties and keeps
    0.3 although 0.5 did better on the test pairs: the choice never reads them."""
    default = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01] * 3)]
    heavier = [_summary("lower_objects", [0.15, 0.05, 0.2], [-0.01] * 3, validation=[2.0, 0.5, 1.0],
                        weight=0.5)]
    row = ab.guard_choice_row(default, [heavier], "50")
    assert row["taken"] == [2, 1] and row["runs"] == 3
    assert row["share"]["mean"] == pytest.approx((0.75 + 0.5 + 0.5) / 3)  # seed 2 ties: the default
    assert row["difference"]["mean"] == pytest.approx(0.25 / 3)
    assert ab.guard_choice_row(default, [[]], "50")["runs"] == 0  # a weight not run: nothing compared
    text = markdown(default, None, "treerpo bench taste", {"picks weight 0.5": heavier})
    assert "| the guard also chooses the weight (0.3 or 0.5: one training each) | 3 (lower_objects) |" in text


def test_a_default_that_chose_among_weights_gets_no_choice_row() -> None:
    """0.5.0's default kept one of two trainings (0.3 and 0.5): its run is no run at 0.3, so the guard
    choosing between it and an arm at 0.4 would be a third training under the name of two. With such a
    default the choice is made among the arms at one weight each and paired against it; a fixed-weight
    default takes part in the choice itself."""
    two_trainings = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01] * 3)]
    two_trainings[0]["budget"]["picks_weights"] = [0.3, 0.5]
    at_04 = [_summary("lower_objects", [0.15, 0.05, 0.2], [-0.01] * 3, validation=[2.0, 0.5, 1.0],
                      weight=0.4)]
    at_03 = [_summary("lower_objects", [0.1, 0.1, 0.1], [-0.01] * 3)]
    rows = ab.ablation_rows(two_trainings, {"at 0.4": at_04, "at 0.3": at_03}, "50", pilot=True)
    choice = "the guard chooses the weight (0.4 or 0.3: one training each)"
    assert list(rows) == ["at 0.4", "at 0.3", choice]
    # per seed the larger validation gain: 0.4 (2.0), 0.3 (1.0 against 0.5), 0.4 (1.0 ties, the first)
    assert rows[choice]["taken"] == [2, 1]
    assert rows[choice]["share"]["mean"] == pytest.approx((0.75 + 0.5 + 1.0) / 3)
    assert rows[choice]["difference"]["mean"] == pytest.approx((0.25 + 0.0 + 0.5) / 3)
    assert list(ab.ablation_rows(two_trainings, {"at 0.4": at_04}, "50")) == ["at 0.4"]
    rows = ab.ablation_rows(at_03, {"at 0.4": at_04}, "50")
    assert list(rows) == ["at 0.4", "the guard also chooses the weight (0.3 or 0.4: one training each)"]


def test_two_tables_keep_their_own_sections_and_grids(tmp_path: Path) -> None:
    """The shipped default's table and 0.4.x's table at the fixed weight 0.3 are two sections of one page:
    writing one leaves the other as it was, and each copies its grid under its own name."""
    from dynamic_treerpo.trainer.bench.taste.page import FIXED_SECTION, SECTION, sections_of, write_docs

    docs = tmp_path / "docs" / "results-taste.md"
    docs.parent.mkdir()
    runs = {}
    for name, gain in (("shipped", 0.1), ("fixed", 0.05)):
        out = tmp_path / name / "lower_objects"
        out.mkdir(parents=True)
        (out / "before_after.png").write_bytes(name.encode())
        runs[name] = ([_summary("lower_objects", [gain] * 3, [-0.01] * 3)], [out])
    write_docs(*runs["shipped"], docs, "treerpo bench taste")
    write_docs(*runs["fixed"], docs, "treerpo bench taste --section 'fixed 0.3'", key=FIXED_SECTION)
    shipped, fixed = sections_of(docs.read_text(), SECTION), sections_of(docs.read_text(), FIXED_SECTION)
    assert len(shipped) == len(fixed) == 1 and "## 0.4.x's table" in fixed[0]
    assert "images/results-taste_lower_objects.png" in shipped[0]
    assert "images/results-taste_fixed-0.3_lower_objects.png" in fixed[0]
    images = docs.parent / "images"
    assert (images / "results-taste_lower_objects.png").read_bytes() == b"shipped"
    assert (images / "results-taste_fixed-0.3_lower_objects.png").read_bytes() == b"fixed"
    write_docs(*runs["shipped"], docs, "treerpo bench taste")  # the other section is kept
    assert sections_of(docs.read_text(), FIXED_SECTION) == fixed
    with pytest.raises(ValueError, match="no table section 'family'"):
        write_docs(*runs["shipped"], docs, "cmd", key="family")
