"""scripts/guard_steps.py: the two-phase standard error and its report (the study itself trains: not here)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("guard_steps", REPO / "scripts" / "guard_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
