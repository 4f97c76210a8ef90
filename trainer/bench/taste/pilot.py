"""Could a short pilot choose the picks weight instead of a whole training at each weight?

Why: the default trains the same picks at 0.3 and at 0.5 and keeps the run whose chosen point gained the
most personal reward on validation pairs: about 6 points of the frontier more than 0.3 alone, at twice
the training. A pilot would train each weight for the first checkpoint's iterations only, choose, and
train the chosen weight on to the end: 1 + (weights - 1) x pilot / iterations of one training (1.25x for
two weights and a pilot of a quarter of the run).

The stored fixed-weight runs answer it without training: a run is deterministic, so the pilot at a
weight is the first checkpoint of that weight's stored run, and the run the pilot continues is that
stored run itself. The pilot sees what the guard sees at that checkpoint (the personal reward's gain and
the fall of prompt-following on the validation pairs, with its standard error) and projects each run to
its end on a straight line from the base: the gain grows with the iterations until the fall reaches the
limit less the margin, where the guard's choice would stop (:func:`projected_gain`). Pure functions over
``taste.json`` summaries; the ablation table renders the row (``ablation.pilot_choice_row``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def projected_gain(gain: float, fall: float, se: float, limit: float, margin: float, at: int,
                   total: int) -> float:
    """A run's personal-reward gain at its end, projected from its checkpoint after ``at`` of ``total``
    iterations: ``gain * total / at`` on a straight line, or, where the line's fall reaches ``limit -
    margin * se`` first, the gain at that crossing (a fall that did not rise projects no crossing)."""
    if at <= 0 or total < at:
        raise ValueError(f"a pilot of {at} iterations in a run of {total}")
    end = gain * total / at
    if fall <= 0:
        return end
    room = max(0.0, limit - margin * se)
    return min(end, gain * room / fall)


def pilot_point(run: dict[str, Any], at: int) -> dict[str, Any] | None:
    """The stored run's checkpoint after ``at`` iterations at full strength (None: not stored)."""
    return next((p for p in run["points"] if p["iteration"] == at and p["strength"] == 1.0), None)


def run_projection(run: dict[str, Any], at: int, total: int, margin: float) -> float:
    """The projected end gain of one stored method run from its pilot checkpoint (NaN: not stored)."""
    point = pilot_point(run, at)
    if point is None:
        return math.nan
    base = run["points"][0]
    return projected_gain(point["taste"] - base["taste"], base["guard"] - point["guard"], point["guard_se"],
                          run["limit"], margin, at, total)


def pilot_index(projections: Sequence[float]) -> int:
    """The weight the pilot keeps: the most projected gain, the first weight on ties."""
    if not projections or any(not math.isfinite(p) for p in projections):
        raise ValueError("a pilot needs every weight's checkpoint")
    return max(range(len(projections)), key=lambda i: (projections[i], -i))


def pilot_cost(weights: int, at: int, total: int) -> float:
    """The training a pilot costs, as a multiple of one training at one weight."""
    return 1.0 + (weights - 1) * at / total
