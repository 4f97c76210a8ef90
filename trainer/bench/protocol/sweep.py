"""The learning-rate sweep and what the protocol fixes from it before any test run.

All of it is measured on *validation* prompt/seed pairs, which share no prompt with the test pairs
every reported figure is measured on (trainer/training/evaluate.py, ``validation_pairs``):

- **Rates.** Each main arm is swept over the grid; when its best rate is the lowest (highest) swept,
  it is swept again at half (double) that rate, up to ``max_extensions`` times, so that the chosen
  rate lies inside the swept range and not at an edge where a better one could lie beyond.
- **Target** of the time-to-target measures: ``fraction`` (one half) of the median, over the main
  arms at their chosen rates, of the validation gain (validation reward at the end of the sweep
  minus before training). A test run reaches it when its test reward is at least its own test
  reward before training plus that gain.
- **Equal seconds**: MixGRPO's time for the image budget, from its sweep iterations.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

Row = dict[str, Any]


def best_rate(rows: Sequence[Row]) -> float:
    """The rate with the highest validation reward (ties: the smaller rate)."""
    if not rows:
        raise ValueError("best_rate needs at least one sweep row")
    return max(rows, key=lambda r: (r["validation_reward"], -r["lr"]))["lr"]


def best_rates(rows: Sequence[Row]) -> dict[str, float]:
    """Per arm, :func:`best_rate` of its rows."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    return {arm: best_rate([r for r in rows if r["arm"] == arm]) for arm in arms}


def sweep_arm(arm: str, lrs: Sequence[float], run_one: Callable[[float], Row], max_extensions: int,
              log: Callable[[str], None] = print) -> list[Row]:
    """``run_one`` at every rate of ``lrs``, then at half the lowest (double the highest) rate while
    the best is the lowest (highest) swept, at most ``max_extensions`` more rates. Each row gets
    ``arm`` and ``extension`` (0 for the grid, then 1, 2, ...)."""
    rows = [{**run_one(lr), "arm": arm, "lr": lr, "extension": 0} for lr in sorted(lrs)]
    for extension in range(1, max_extensions + 1):
        rates = sorted(r["lr"] for r in rows)
        best = best_rate(rows)
        if len(rates) > 1 and rates[0] < best < rates[-1]:
            break
        lr = rates[0] / 2 if best == rates[0] else rates[-1] * 2
        log(f"sweep {arm}: best rate {best:g} is at the edge of {', '.join(f'{r:g}' for r in rates)}; "
            f"extending to {lr:g}")
        rows.append({**run_one(lr), "arm": arm, "lr": lr, "extension": extension})
    return rows


def grid(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Per arm: every swept rate (ascending), the chosen one, and whether it lies inside the range."""
    out = {}
    for arm, chosen in best_rates(rows).items():
        rates = sorted(r["lr"] for r in rows if r["arm"] == arm)
        out[arm] = {"rates": rates, "chosen": chosen, "inside": rates[0] < chosen < rates[-1]}
    return out


def chosen_rows(rows: Sequence[Row]) -> dict[str, Row]:
    """Per arm, its sweep row at the chosen rate."""
    rates = best_rates(rows)
    return {arm: next(r for r in rows if r["arm"] == arm and r["lr"] == lr) for arm, lr in rates.items()}


TARGET_RULE = ("target gain = {fraction:g} x the median, over the main arms at their chosen rates, of the "
               "validation gain (validation reward at the end of the sweep minus before training); a test "
               "run reaches the target when its test reward is at least its own test reward before "
               "training plus that gain")


def target(rows: Sequence[Row], fraction: float = 0.5) -> dict[str, Any]:
    """The time-to-target threshold, fixed from the sweep's validation rewards (see the module)."""
    gains = {arm: r["validation_reward"] - r["validation_base"] for arm, r in chosen_rows(rows).items()}
    if not gains:
        raise ValueError("the sweep has no rows: there is no target")
    gain = fraction * statistics.median(gains.values())
    return {"gain": gain, "fraction": fraction, "validation_gains": gains, "usable": gain > 0,
            "rule": TARGET_RULE.format(fraction=fraction)}


def seconds_budget(given: float | None, rows: Sequence[Row], iterations: int, clock: str) -> float:
    """The equal-seconds budget: as given, or MixGRPO's time for the image budget (``iterations``
    times the median of its sweep rows' median iteration time, on ``clock``)."""
    if given is not None:
        return given
    times = [r[f"median_{clock}_s"] for r in rows if r["arm"] == "mixgrpo"]
    if not times:
        raise ValueError("without a MixGRPO arm the equal-seconds budget must be given (--seconds)")
    return iterations * statistics.median(times)


def iteration_seconds(rows: Sequence[Row], clock: str) -> dict[str, float]:
    """Per arm, the median iteration time of its sweep rows (for the time estimate)."""
    arms = dict.fromkeys(r["arm"] for r in rows)
    return {arm: statistics.median(r[f"median_{clock}_s"] for r in rows if r["arm"] == arm) for arm in arms}


def wall_per_clock(rows: Sequence[Row], clock: str) -> float:
    """Wall seconds per ``clock`` second over the sweep (1 for the wall clock)."""
    clock_s = sum(r[f"median_{clock}_s"] for r in rows)
    wall_s = sum(r["median_wall_s"] for r in rows)
    return wall_s / clock_s if clock_s > 0 and math.isfinite(clock_s) else 1.0


def evaluation_seconds(rows: Sequence[Row]) -> float:
    """Wall seconds of one held-out evaluation, the median over the sweep's runs (0 when the sweep did
    not measure it)."""
    times = [r["eval_wall_s"] for r in rows if "eval_wall_s" in r]
    return statistics.median(times) if times else 0.0
