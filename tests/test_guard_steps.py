"""treerpo bench taste-guard-steps (trainer/bench/taste/guard_steps.py): the two-phase standard error and
its report (the study itself trains: not here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dynamic_treerpo.trainer.bench.common.stats import mean_ci95
from dynamic_treerpo.trainer.bench.taste import guard_steps

REPO = Path(__file__).resolve().parents[1]


def _script():
    return guard_steps


def test_cheap_images_help_only_as_far_as_they_correlate_with_the_full_ones() -> None:
    two_phase_se = _script().two_phase_se
    plain = 0.2 / math.sqrt(512)
    assert two_phase_se(0.2, 0.0, 10, 2, 512) == (plain, 512, 0)  # uncorrelated: the plain measurement
    se, n, many = two_phase_se(0.2, 0.95, 10, 2, 512)
    assert se < 0.8 * plain and n < 512 and many > n
    assert n * 10 + many * 2 <= 512 * 10  # within the plain measurement's cost in sampling steps
    # the variance formula at the chosen sizes
    assert math.isclose(se, math.sqrt(0.04 * (1 - 0.95**2) / n + 0.95**2 * 0.04 / many))
    assert two_phase_se(0.2, 0.95, 10, 5, 512)[0] > se  # dearer cheap images help less


def test_the_report_has_a_row_per_cheap_step_count() -> None:
    two = {"rho": [0.9, 0.8], "sd_full": [0.2, 0.2], "spearman": 1.0, "bias": [0.01, 0.02]}
    five = {"rho": [0.99, 0.98], "sd_full": [0.2, 0.2], "spearman": 1.0, "bias": [0.0, 0.001]}
    run = {"taste": "t", "seed": 0, "pairs": 64, "full_steps": 10, "by_steps": {"2": two, "5": five}}
    text = _script().report([run, {**run, "seed": 1}])
    rows = [line for line in text.splitlines() if line.startswith("| 2 ") or line.startswith("| 5 ")]
    assert len(rows) == 2 and "+0.0150" in rows[0] and "0.20" in rows[0]


def test_the_page_s_table_is_what_the_stored_runs_give() -> None:
    """docs/picks.md's table of cheap steps, from docs/data/guard_steps (the study's stored runs)."""
    module = _script()
    stored = REPO / "docs" / "data" / "guard_steps"
    runs = [json.loads(p.read_text()) for p in sorted(stored.glob("*.json"))]
    assert len(runs) == 3
    page = (REPO / "docs" / "picks.md").read_text(encoding="utf-8")
    points = sum(len(r["points"]) for r in runs)
    assert f"mean over {points} points" in page
    for line in module.report(runs).splitlines()[3:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        steps, spearman, rho, ratio = cells[0], cells[3], cells[4], cells[5]
        bias = mean_ci95([b for r in runs for b in r["by_steps"][steps]["bias"]])
        low, high = bias.mean - bias.ci95, bias.mean + bias.ci95
        row = next(r for r in page.splitlines() if r.startswith(f"| {steps} | "))
        assert f"{bias.mean:+.3f} ({low:+.3f} to {high:+.3f})" in row
        assert f"| {spearman} | {rho} | {ratio}" in row
