"""What a person sees of a guarded run: taste against prompt-following over the run, with the chosen
checkpoint marked, and the same validation images before and at a few checkpoints."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from .choice import Choice
from .trail import Trail, TrailPoint


def weight_path(trail: Trail) -> list[tuple[int, float]]:
    """``(iteration, picks weight)`` of each full-strength checkpoint that recorded the weight training
    used up to it, in training order (empty for a trail written before the weight was recorded)."""
    full = sorted((p for p in trail.points if p.strength == 1.0 and p.iteration), key=lambda p: p.iteration)
    return [(p.iteration, p.picks_weight) for p in full if p.picks_weight is not None]


def trade_plot(trail: Trail, choice: Choice, out_png: str | os.PathLike[str], width: float = 4.6,
               height: float = 3.4, others: Sequence[Trail] = ()) -> None:
    """Taste gain (personal reward, up) against the fall of prompt-following (right), one dot per
    checkpoint joined in training order, lower strengths as hollow dots, the limit as a shaded band's
    edge and the chosen point ringed; beside it, when the trail recorded it, the weight of the picks over
    the run (the guard's steering, or a flat line at a fixed weight). ``others``: the runs at the other
    picks weights the guard tried and did not keep, in grey. Agg canvas only: the user's matplotlib
    backend is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    base = trail.base
    full = sorted((p for p in trail.points if p.strength == 1.0), key=lambda p: p.iteration)
    weaker = [p for p in trail.points if p.strength != 1.0]

    def xy(p: TrailPoint) -> tuple[float, float]:
        return trail.fall(p), p.taste - base.taste

    path = weight_path(trail)
    fig = Figure(figsize=(width * (1.6 if path else 1.0), height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    if path:
        ax, wax = fig.subplots(1, 2, width_ratios=[1.6, 1.0])
        _weight_axes(wax, path, choice, [weight_path(t) for t in others])
    else:
        ax = fig.add_subplot()
    xs, ys = zip(*(xy(p) for p in full), strict=True)
    other_xs = []
    for other in others:
        points = sorted((p for p in other.points if p.strength == 1.0), key=lambda p: p.iteration)
        ox = [other.fall(p) for p in points]
        other_xs += ox
        weights = {p.picks_weight for p in points if p.picks_weight is not None}
        name = f"weight {weights.pop():g}" if len(weights) == 1 else "another weight"
        ax.plot(ox, [p.taste - other.base.taste for p in points], "--o", color="#9ca3af", ms=3, lw=1,
                label=f"{name} (not kept)")
    right = max(max(xs), *other_xs, trail.limit) * 1.15 + 1e-3
    left = min(min(xs), 0.0) - 0.1 * right
    ax.axvspan(left, trail.limit, color="#4ade80", alpha=0.12, lw=0)
    ax.axvline(trail.limit, color="#16a34a", lw=1, ls="--")
    ax.text(trail.limit, 0.98, " limit", transform=ax.get_xaxis_transform(), va="top", fontsize=7,
            color="#16a34a")
    kept = {p.picks_weight for p in full if p.picks_weight is not None}
    label = (f"checkpoints measured (weight {kept.pop():g}, kept)" if others and len(kept) == 1
             else "checkpoints measured")
    ax.plot(xs, ys, "-o", color="#2563eb", ms=4, lw=1.2, label=label)
    for p in full:
        if p.iteration:
            ax.annotate(str(p.iteration), xy(p), textcoords="offset points", xytext=(4, 3), fontsize=7)
    if weaker:
        wx, wy = zip(*(xy(p) for p in weaker), strict=True)
        ax.plot(wx, wy, "o", mfc="none", color="#7c3aed", ms=5, label="lower strength")
    if choice.point is None:
        ax.plot([0.0], [0.0], "o", mfc="none", mec="#dc2626", ms=13, mew=2, label="chosen: the base model")
    elif math.isfinite(choice.point.taste):
        cx, cy = xy(choice.point)
        ax.plot([cx], [cy], "o", mfc="none", mec="#dc2626", ms=13, mew=2, label="chosen")
    else:  # a strength taken without measuring it: no place on the plot
        ax.plot([], [], "o", mfc="none", mec="#dc2626", ms=13, mew=2,
                label=f"taken: {choice.point.label} (not measured)")
    ax.set_xlim(left, right)
    ax.set_xlabel("prompt-following lost (guard fall; numbers: iteration)", fontsize=8)
    ax.set_ylabel("your taste gained (personal reward)", fontsize=8)
    ax.set_title("taste against prompt-following", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.margins(y=0.12)
    ax.legend(fontsize=7, loc="best")
    fig.savefig(out_png)


def _weight_axes(ax: Any, path: list[tuple[int, float]], choice: Choice,
                 others: Sequence[list[tuple[int, float]]] = ()) -> None:
    """The picks weight each stretch of training used: a step from the start to each checkpoint; the
    runs not kept at other weights in grey."""
    iterations = [0, *(it for it, _ in path)]
    weights = [w for _, w in path]
    for other in (o for o in others if o):
        ax.stairs([w for _, w in other], [0, *(it for it, _ in other)], color="#9ca3af", lw=1.2, ls="--",
                  baseline=None)
        weights_seen = [w for _, w in other]
        ax.text(other[-1][0], weights_seen[-1], " not kept", color="#6b7280", fontsize=7, va="bottom",
                ha="right")
    ax.stairs(weights, iterations, color="#ea580c", lw=1.6, baseline=None)
    ax.plot([it for it, _ in path], weights, "o", color="#ea580c", ms=3)
    if choice.point is not None and choice.point.iteration:
        ax.axvline(choice.point.iteration, color="#dc2626", lw=1, ls=":")
        ax.text(choice.point.iteration, 0.02, "chosen ", color="#dc2626", fontsize=7, ha="right",
                transform=ax.get_xaxis_transform())
    steered = max(weights) - min(weights) > 1e-9
    tried = any(others)
    ax.set_ylim(0.0, max(1.0, max(weights) * 1.1))
    ax.set_xlim(0, iterations[-1] * 1.04)
    ax.set_xlabel("training iteration", fontsize=8)
    ax.set_ylabel("weight of your picks", fontsize=8)
    ax.set_title("the guard steered the weight" if steered else
                 "the guard tried each weight" if tried else "the weight was fixed", fontsize=9)
    ax.tick_params(labelsize=7)


def shown_points(trail: Trail, choice: Choice, count: int = 3) -> list[TrailPoint]:
    """The checkpoints the before/after grid shows: the chosen one, the last one, and one between
    the base and the chosen (at most ``count``, in training order)."""
    full = sorted((p for p in trail.points if p.strength == 1.0 and p.iteration), key=lambda p: p.iteration)
    if not full:
        return []
    picked: list[TrailPoint] = []
    chosen = choice.point
    if chosen is not None:
        earlier = [p for p in full if p.iteration < chosen.iteration]
        if earlier:
            picked.append(earlier[len(earlier) // 2])
        picked.append(chosen)
    else:
        picked.append(full[len(full) // 2])
    if full[-1] not in picked:
        picked.append(full[-1])
    return sorted(picked[-count:], key=lambda p: (p.iteration, p.strength))
