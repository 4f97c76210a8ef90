"""``treerpo bench taste-order``: does measuring the last checkpoint first choose what measuring every
checkpoint chose? Replayed on stored runs, without training.

Why: the guard's measurements, not the training, are most of what training from picks costs
(``taste-cost``). Runs made before ``guard.measure: backward`` measured every checkpoint, and their
``taste.json`` keeps every point, so the backward order (``trainer/guard/order.py``) can be replayed on
them exactly: it measures a subset of those points, in its own order, and chooses among them with the
guard's own :func:`~...guard.choice.choose`. A run is not replayable when the backward order's strength
search would have worked on another checkpoint than the stored run's (its points were never measured).
Pure functions over ``taste.json`` contents.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...guard.choice import Choice, choose, tastiest_past_limit
from ...guard.order import next_to_measure
from ...guard.trail import Trail, TrailPoint

_FIELDS = ("iteration", "strength", "taste", "guard", "guard_se")


def stored_trail(run: dict[str, Any]) -> Trail:
    """A stored method run's trail (every point it measured on the validation pairs)."""
    points = [TrailPoint(**{k: p[k] for k in _FIELDS}) for p in run["points"]]
    return Trail(run["limit"], 0.0, points)


def _key(choice: Choice) -> tuple[int, float] | None:
    return None if choice.point is None else (choice.point.iteration, choice.point.strength)


def replay(run: dict[str, Any], margin: float) -> dict[str, Any] | None:
    """One stored run replayed with the backward order: whether it chooses the point measuring every
    checkpoint chooses, and how many measurements each order makes (None: not replayable)."""
    full = stored_trail(run)
    kept = sorted({p.iteration for p in full.points if p.iteration > 0})
    sub = Trail(full.limit, 0.0, [full.base])
    while (it := next_to_measure(sub, kept, margin)) is not None:
        point = full.find(it, 1.0)
        if point is None:
            return None
        sub.points.append(point)
    searched, wanted = tastiest_past_limit(full, margin), tastiest_past_limit(sub, margin)
    if wanted is not None:
        if searched is None or searched.iteration != wanted.iteration:
            return None
        sub.points += [p for p in full.points if p.strength != 1.0]
    return {"same": _key(choose(sub, margin)) == _key(choose(full, margin)),
            "every": len(full.points) - 1, "backward": len(sub.points) - 1}


def replay_runs(runs: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Every method run (each seed and tree count) of stored ``taste.json`` contents, replayed."""
    out = {"runs": 0, "same": 0, "not_replayable": 0, "every": 0, "backward": 0}
    for data in runs:
        margin = float(data["budget"]["margin"])
        for seed in data["per_seed"]:
            for run in seed["reward"].values():
                out["runs"] += 1
                r = replay(run, margin)
                if r is None:
                    out["not_replayable"] += 1
                    continue
                out["same"] += r["same"]
                out["every"] += r["every"]
                out["backward"] += r["backward"]
    return out


def load_runs(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """The ``taste.json`` of every taste in ``folders``."""
    return [json.loads(p.read_text(encoding="utf-8"))
            for f in folders for p in sorted(f.glob("*/taste.json"))]


def order_line(counts: dict[str, int]) -> str:
    """What the replay found, in one line."""
    replayed = counts["runs"] - counts["not_replayable"]
    saved = 1.0 - counts["backward"] / counts["every"] if counts["every"] else float("nan")
    return (f"the backward order chose the point measuring every checkpoint chose in {counts['same']} of "
            f"{replayed} replayed runs ({counts['not_replayable']} of {counts['runs']} not replayable), with "
            f"{counts['backward']} measurements against {counts['every']} ({saved:.0%} fewer)")
