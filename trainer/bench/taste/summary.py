"""``taste.json``'s figures: per tree count, the taste gain against the oracle frontier and the change
in prompt-following against the guard's limit, as means over seeds with 95% intervals.

Pure functions over the per-seed results. The keys the first version wrote stay (``oracle_*`` is now
the frontier; ``modes.reward`` the default method at the largest tree count), and ``by_trees`` adds per
tree count ``frontier_gain``, ``share_of_frontier``, ``guard_change``, ``guard_limit`` and ``chosen``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ..common.stats import mean_ci95, sign_flip_test

TARGETS = {25: 0.5, 50: 0.8}
"""The share of the frontier the method must reach by labelled-tree count (the issue's targets)."""


def estimate(values: Sequence[float]) -> dict[str, Any]:
    """Mean, 95% t half-width and the per-seed values."""
    e = mean_ci95(list(values))
    return {"mean": e.mean, "ci95": e.ci95, "per_seed": list(values)}


def target_for(trees: int) -> float | None:
    """The share of the frontier required at this many trees (the nearest target at or below it)."""
    below = [n for n in TARGETS if n <= trees]
    return TARGETS[max(below)] if below else None


def reading(mean: float, half: float) -> str:
    """A target's word: 'met' when the 95% interval of its margin lies above 0, 'not met' below 0,
    'met on the mean' / 'short on the mean' when it straddles 0."""
    if math.isnan(half):
        return "met on the mean" if mean >= 0 else "short on the mean"
    if mean - half > 0:
        return "met"
    if mean + half < 0:
        return "not met"
    return "met on the mean" if mean >= 0 else "short on the mean"


MARGINS = (0.0, 0.5, 1.0)
"""Margins (standard errors of the measured fall) the sensitivity table re-chooses with."""


def rechosen(run: dict[str, Any], margin: float) -> dict[str, Any]:
    """The point the guard would have chosen with ``margin``, from the validation figures a method run
    stored for every point, with that point's test figures."""
    from ...guard.choice import choose
    from ...guard.trail import Trail, TrailPoint

    fields = TrailPoint.__dataclass_fields__
    points = run["points"]
    trail = Trail(run["limit"], 0.0, [TrailPoint(**{k: p[k] for k in fields if k in p}) for p in points])
    point = choose(trail, margin).point
    if point is None:
        return points[0]
    return next(p for p in points if (p["iteration"], p["strength"]) == (point.iteration, point.strength))


def sensitivity(results: Sequence[Any], n: int, frontier: Sequence[float]) -> dict[str, Any]:
    """Per margin: the taste gain, its share of the frontier and the change of prompt-following on the
    test pairs, had the guard chosen with that margin (the runs are the same; only the choice differs)."""
    out = {}
    for margin in MARGINS:
        picked = [rechosen(r.reward[n], margin) for r in results]
        gains = [p["test_taste"] - r.taste_before for p, r in zip(picked, results, strict=True)]
        guard = [p["test_scene"] - r.scene_before for p, r in zip(picked, results, strict=True)]
        mean_frontier = statistics.fmean(frontier)
        out[f"{margin:g}"] = {"taste_gain": estimate(gains), "guard_change": estimate(guard),
                              "share_of_frontier": statistics.fmean(gains) / mean_frontier
                              if mean_frontier > 0 else math.nan}
    return out


def best_on_test(run: dict[str, Any], taste_before: float, scene_before: float) -> float:
    """The most taste any point of a method run gained on the test pairs whose test fall of
    prompt-following stayed within the limit: what the run offered, had the choice read the test pairs."""
    ok = [p["test_taste"] - taste_before for p in run["points"]
          if p["test_scene"] - scene_before >= -run["limit"]]
    return max([0.0, *ok])


def exchange_rate(points: Sequence[dict[str, Any]], taste: str, scene: str, base: dict[str, Any]) -> float:
    """Taste gained per unit of prompt-following lost along a run's points: the slope through the origin
    of gain against fall (points that lost nothing left out). A reward that leads training where the taste
    lies gains more taste for the same fall."""
    pairs = [(p[taste] - base[taste], base[scene] - p[scene]) for p in points if p["iteration"] > 0
             and base[scene] - p[scene] > 1e-3]
    if not pairs:
        return math.nan
    return sum(g * f for g, f in pairs) / sum(f * f for _, f in pairs)


def split(results: Sequence[Any], n: int, frontier: Sequence[float]) -> dict[str, Any]:
    """With every point measured on the test pairs: the share of the frontier the run offered at its best
    point within the limit (what the reward led training to) and the share the guard's choice kept (what
    choosing on validation pairs lost), and the taste per unit of fall of the method's points against the
    frontier's (the frontier measures its trail on the test pairs)."""
    offered = [best_on_test(r.reward[n], r.taste_before, r.scene_before) for r in results]
    chosen = [r.reward[n]["taste"] - r.taste_before for r in results]
    mean_frontier = statistics.fmean(frontier)
    method_rates = [exchange_rate(r.reward[n]["points"], "test_taste", "test_scene", r.reward[n]["points"][0])
                    for r in results]
    oracle_rates = []
    for r in results:
        best = max(r.frontier.values(), key=lambda f: f["gain"])
        pts = best.get("points") or []
        oracle_rates.append(exchange_rate(pts, "taste", "guard", pts[0]) if pts else math.nan)
    finite = [(m, o) for m, o in zip(method_rates, oracle_rates, strict=True)
              if math.isfinite(m * o) and o > 0]
    return {"offered": estimate(offered), "chosen": estimate(chosen),
            "offered_share": statistics.fmean(offered) / mean_frontier if mean_frontier > 0 else math.nan,
            "chosen_share": statistics.fmean(chosen) / mean_frontier if mean_frontier > 0 else math.nan,
            "method_rate": estimate([m for m, _ in finite]) if finite else None,
            "oracle_rate": estimate([o for _, o in finite]) if finite else None}


def by_trees(results: Sequence[Any], n: int) -> dict[str, Any]:
    """The figures at ``n`` labelled trees, paired per seed with that seed's frontier."""
    gains = [r.reward[n]["taste"] - r.taste_before for r in results]
    frontier = [max(f["gain"] for f in r.frontier.values()) for r in results]
    guard = [r.reward[n]["scene"] - r.scene_before for r in results]
    limit = results[0].reward[n]["limit"]
    mean_frontier = statistics.fmean(frontier)
    share = statistics.fmean(gains) / mean_frontier if mean_frontier > 0 else math.nan
    row: dict[str, Any] = {
        "trees": n, "taste_gain": estimate(gains), "frontier_gain": estimate(frontier),
        "share_of_frontier": share, "guard_change": estimate(guard), "guard_limit": limit,
        "held_out_pair_accuracy": statistics.fmean(r.reward[n]["accuracy"] for r in results),
        "chosen": [{"seed": r.seed, **r.reward[n]["chosen"]} for r in results]}
    if all("on_policy" in r.reward[n] for r in results):
        row["on_policy_pair_accuracy"] = statistics.fmean(r.reward[n]["on_policy"]["accuracy"]
                                                          for r in results)
    if all("test_taste" in r.reward[n]["points"][0] for r in results):
        row["margins"] = sensitivity(results, n, frontier)
    if all("costs" in r.reward[n] for r in results):
        row["costs"] = {k: statistics.fmean(r.reward[n]["costs"][k] for r in results)
                        for k in results[0].reward[n]["costs"]}
    if all(all("test_taste" in p for p in r.reward[n]["points"]) for r in results):
        row["split"] = split(results, n, frontier)
    target = target_for(n)
    if target is not None:
        margins = [g - target * f for g, f in zip(gains, frontier, strict=True)]
        m = estimate(margins)
        row["target"] = {"share": target, "margin": m, "exact_p": sign_flip_test(margins),
                         "reading": reading(m["mean"], m["ci95"])}
    row["past_limit"] = {"runs": sum(c < -limit for c in guard), "of": len(guard)}
    rounds = [r.reward[n].get("rounds") for r in results]
    if all(rounds):
        second = [r[1] for r in rounds]
        row["rounds"] = {
            "first_trees": rounds[0][0]["trees"], "second_trees": second[0]["trees"],
            "first_reward_on_policy_accuracy": statistics.fmean(s["first_reward_accuracy"] for s in second),
            "first_reward_base_accuracy": statistics.fmean(s["first_reward_accuracy_on_base_trees"]
                                                           for s in second),
            "first_round_taste_gain": estimate([r0[0]["taste"] - res.taste_before
                                                for r0, res in zip(rounds, results, strict=True)])}
    held = [c + limit for c in guard]  # >= 0 when the fall is within the limit
    h = estimate(held)
    low, high = h["mean"] - h["ci95"], h["mean"] + h["ci95"]
    interval = ("interval within the limit" if low >= 0 else "interval past the limit" if high < 0
                else "interval reaches past the limit")
    row["guard_held"] = {"margin": h, "reading": "held" if h["mean"] >= 0 else "not held",
                         "interval": interval if math.isfinite(h["ci95"]) else "one seed"}
    return row


def _arm_order(name: str) -> tuple[int, float]:
    """Frontier arms in order: the fixed weights by weight, then ``steered``."""
    try:
        return 0, float(name)
    except ValueError:
        return 1, 0.0


def summarise(results: Sequence[Any], budget: Any, taste: str) -> dict[str, Any]:
    """``taste.json`` of one taste."""
    counts = sorted(set.intersection(*(set(r.reward) for r in results)))
    frontier = [max(f["gain"] for f in r.frontier.values()) for r in results]
    weights = sorted(results[0].frontier, key=_arm_order)
    out: dict[str, Any] = {
        "taste": taste, "trees": budget.trees, "seeds": [r.seed for r in results], "budget": asdict(budget),
        "oracle_gain_mean": statistics.fmean(frontier), "oracle_gain_ci95": mean_ci95(frontier).ci95,
        "oracle_scene_after": statistics.fmean(r.oracle["scene"] for r in results),
        "frontier": {"gain": estimate(frontier),
                     "by_weight": {w: estimate([r.frontier[w]["gain"] for r in results]) for w in weights},
                     "scene_change": estimate([r.oracle["scene"] - r.scene_before for r in results])},
        "by_trees": {str(n): by_trees(results, n) for n in counts}, "modes": {}}
    if counts:
        last = counts[-1]
        gains = [r.reward[last]["taste"] - r.taste_before for r in results]
        scene = [r.reward[last]["scene"] - r.scene_before for r in results]
        halves = [g - 0.5 * f for g, f in zip(gains, frontier, strict=True)]
        out["modes"]["reward"] = {
            "mode": "reward", "taste_before": statistics.fmean(r.taste_before for r in results),
            "taste_after": statistics.fmean(r.reward[last]["taste"] for r in results),
            "taste_gain_mean": statistics.fmean(gains), "taste_gain_ci95": mean_ci95(gains).ci95,
            "taste_gain_per_seed": gains, "oracle_gain_mean": statistics.fmean(frontier),
            "share_of_oracle": out["by_trees"][str(last)]["share_of_frontier"],
            "over_half_oracle_mean": statistics.fmean(halves),
            "over_half_oracle_ci95": mean_ci95(halves).ci95,
            "scene_before": statistics.fmean(r.scene_before for r in results),
            "scene_after": statistics.fmean(r.reward[last]["scene"] for r in results),
            "scene_change_mean": statistics.fmean(scene), "scene_change_ci95": mean_ci95(scene).ci95,
            "gain_by_trees": {str(n): out["by_trees"][str(n)]["taste_gain"]["mean"] for n in counts},
            "held_out_pair_accuracy": {str(n): out["by_trees"][str(n)]["held_out_pair_accuracy"]
                                       for n in counts}}
    return out


def _pm(e: dict[str, Any], digits: int = 3) -> str:
    half = e["ci95"]
    return f"{e['mean']:+.{digits}f}" + (f" ± {half:.{digits}f}" if math.isfinite(half) else "")


def format_summary(summary: dict[str, Any]) -> str:
    """What the command prints for one taste."""
    f = summary["frontier"]
    lines = [f"taste {summary['taste']}: seeds {summary['seeds']}; oracle frontier {_pm(f['gain'])} ("
             + ", ".join(f"weight {w}: {_pm(e)}" for w, e in f["by_weight"].items()) + ")"]
    for n, row in summary["by_trees"].items():
        text = (f"  {n:>4} trees: taste {_pm(row['taste_gain'])} = {row['share_of_frontier']:.0%} of the "
                f"frontier; prompt-following {_pm(row['guard_change'])} (limit -{row['guard_limit']:.3f}: "
                f"{row['guard_held']['reading']}; past it in {row['past_limit']['runs']} of "
                f"{row['past_limit']['of']} runs); pair accuracy {row['held_out_pair_accuracy']:.2f}")
        if "on_policy_pair_accuracy" in row:
            text += f" on base trees, {row['on_policy_pair_accuracy']:.2f} on the trained model's"
        if "rounds" in row:
            r = row["rounds"]
            text += (f"; round 1 on {r['first_trees']} trees: taste {_pm(r['first_round_taste_gain'])}, its "
                     f"reward's pair accuracy {r['first_reward_on_policy_accuracy']:.2f} on the trained "
                     f"model's trees, {r['first_reward_base_accuracy']:.2f} on the base model's")
        if "target" in row:
            t = row["target"]
            text += f"; target {t['share']:.0%}: {t['reading']} (margin {_pm(t['margin'])})"
        if "split" in row:
            sp = row["split"]
            text += (f"; offered {sp['offered_share']:.0%} of the frontier at its best test point, the "
                     f"choice kept {sp['chosen_share']:.0%}")
        if "costs" in row:
            c = row["costs"]
            guard = c.get("guard_seconds", math.nan)
            text += (f"; cost {c['seconds']:.0f} s ({guard:.0f} s of it the guard's measurements), "
                     f"{c['training_images']:.0f} training and {c['guard_images']:.0f} guard images")
        lines.append(text)
    return "\n".join(lines)
