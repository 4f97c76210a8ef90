"""What each lever of learning from picks gives, and where the rest of the frontier goes.

Pure functions over ``taste.json`` summaries. An **arm** is a run of ``treerpo bench taste`` with one
lever changed (``--rounds 2``, the first version's guard, error-free picks, ...) on the same tastes and
seeds as the default run, usually with ``--frontier-from`` so that both share the frontier. The arm is
paired per taste and seed with the default: each run's gain as a share of its own frontier, and the
difference of the shares, as means with 95% t intervals and the exact sign-flip p value.

The **decomposition** splits, per taste, the gap from the frontier to the default method into: the
weight (the frontier's best arm against the oracle at the method's own picks weight), the personal reward
and its measurement on validation pairs (that oracle against the method chosen with margin 0), and the
margin (margin 0 against the default margin); with error-free picks and the reward's pair accuracy on the
trained model's trees against base trees beside them, so that the next step is chosen by measurement.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from ..common.stats import at_least_chance, mean_ci95, sign_flip_test


def _seed_values(summary: dict[str, Any], values: Sequence[float]) -> dict[int, float]:
    return dict(zip(summary["seeds"], values, strict=True))


def run_shares(summary: dict[str, Any], n: str) -> dict[tuple[str, int], dict[str, float]]:
    """Per (taste, seed) at ``n`` labelled trees: the gain, the frontier, the share and the prompt-following
    change on the test pairs, and the limit."""
    row = summary["by_trees"][n]
    gains = _seed_values(summary, row["taste_gain"]["per_seed"])
    frontier = _seed_values(summary, row["frontier_gain"]["per_seed"])
    guard = _seed_values(summary, row["guard_change"]["per_seed"])
    out = {}
    for seed, gain in gains.items():
        f = frontier[seed]
        share = gain / f if f > 0 else math.nan
        out[(summary["taste"], seed)] = {"gain": gain, "frontier": f, "share": share, "guard": guard[seed],
                                         "limit": row["guard_limit"]}
    return out


def _estimate(values: Sequence[float]) -> dict[str, Any]:
    e = mean_ci95(list(values))
    return {"mean": e.mean, "ci95": e.ci95, "n": len(values)}


def _chosen_gains(summaries: Sequence[dict[str, Any]], n: str) -> dict[tuple[str, int], float]:
    """Per (taste, seed) at ``n`` trees: the personal reward's gain on validation pairs at the point the
    guard chose (0 where it kept the base model): what the guard itself can see, never the hidden taste."""
    return {(s["taste"], c["seed"]): float(c.get("validation_taste_gain", 0.0))
            for s in summaries if n in s["by_trees"] for c in s["by_trees"][n].get("chosen", [])}


def _paired(mine: dict[tuple[str, int], dict[str, float]], base: dict[tuple[str, int], dict[str, float]]
            ) -> dict[str, Any]:
    keys = sorted(k for k in mine if k in base and math.isfinite(mine[k]["share"])
                  and math.isfinite(base[k]["share"]))
    if not keys:
        return {"runs": 0}
    diffs = [mine[k]["share"] - base[k]["share"] for k in keys]
    return {"runs": len(keys), "tastes": sorted({k[0] for k in keys}),
            "share": _estimate([mine[k]["share"] for k in keys]),
            "default_share": _estimate([base[k]["share"] for k in keys]),
            "difference": _estimate(diffs), "exact_p": sign_flip_test(diffs) if len(diffs) > 1 else math.nan,
            "past_limit": sum(mine[k]["guard"] < -mine[k]["limit"] for k in keys),
            "default_past_limit": sum(base[k]["guard"] < -base[k]["limit"] for k in keys)}


def _shares(summaries: Sequence[dict[str, Any]], n: str) -> dict[tuple[str, int], dict[str, float]]:
    return {k: v for s in summaries if n in s["by_trees"] for k, v in run_shares(s, n).items()}


def arm_row(default: Sequence[dict[str, Any]], arm: Sequence[dict[str, Any]], n: str) -> dict[str, Any]:
    """One arm against the default on the runs both have (tastes x seeds) at ``n`` trees: each one's share
    of the frontier, the paired difference (arm minus default) with its exact sign-flip p, and the runs
    past the limit."""
    return _paired(_shares(arm, n), _shares(default, n))


def guard_choice_row(default: Sequence[dict[str, Any]], others: Sequence[Sequence[dict[str, Any]]], n: str,
                     against: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The guard choosing the picks weight too: per run, of the default and ``others`` (the same picks
    trained at other weights), the one whose chosen point gained most personal reward on the validation
    pairs, each already within the limit there (the default on ties). It reads only what the method
    sees, and costs one training per weight. Paired against the default like an arm (or against
    ``against``: a default that is no run at one weight); ``taken`` counts how often each run set was
    taken."""
    sets = [default, *others]
    runs = [_shares(runs_set, n) for runs_set in sets]
    gains = [_chosen_gains(runs_set, n) for runs_set in sets]
    mine: dict[tuple[str, int], dict[str, float]] = {}
    taken = [0] * len(runs)
    for key in runs[0]:
        have = [i for i, r in enumerate(runs) if key in r and key in gains[i]]
        if len(have) < len(runs):
            continue  # a run missing from one weight: not compared
        best = max(have, key=lambda i: (gains[i][key], -i))
        taken[best] += 1
        mine[key] = runs[best][key]
    base = runs[0] if against is None else _shares(against, n)
    return {**_paired(mine, base), "taken": taken}


def _method_runs(summaries: Sequence[dict[str, Any]], n: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (taste, seed): the stored method run at ``n`` trees (its trail, limit and choice); a reloaded
    summary keys its tree counts by number, a stored one by text."""
    out = {}
    for s in summaries:
        for seed in s["per_seed"]:
            runs = {str(k): v for k, v in seed.get("reward", {}).items()}
            if n in runs:
                out[(s["taste"], seed["seed"])] = runs[n]
    return out


def pilot_choice_row(default: Sequence[dict[str, Any]], others: Sequence[Sequence[dict[str, Any]]], n: str
                     ) -> dict[str, Any]:
    """A pilot chooses the weight (``pilot.py``): per run, of the default and ``others`` (the same picks
    at other weights), the one whose first checkpoint projects the most personal-reward gain at the end
    within the limit. Paired against the default like an arm, and against the guard choosing from whole
    runs (``against_whole_runs``); ``at`` and ``cost`` say the pilot's iterations and its training as a
    multiple of one training."""
    from .pilot import pilot_cost, pilot_index, run_projection

    budget = default[0]["budget"]
    total = int(budget["iterations"])
    at = max(1, math.ceil(total / int(budget["checkpoints"])))
    sets = [default, *others]
    runs = [_shares(runs_set, n) for runs_set in sets]
    trails = [_method_runs(runs_set, n) for runs_set in sets]
    gains = [_chosen_gains(runs_set, n) for runs_set in sets]
    mine: dict[tuple[str, int], dict[str, float]] = {}
    whole: dict[tuple[str, int], dict[str, float]] = {}
    taken, agree = [0] * len(runs), 0
    for key in runs[0]:
        if not all(key in r and key in t and key in g for r, t, g in zip(runs, trails, gains, strict=True)):
            continue
        projections = [run_projection(t[key], at, total, float(budget["margin"])) for t in trails]
        if not all(math.isfinite(p) for p in projections):
            continue
        best = pilot_index(projections)
        kept = max(range(len(runs)), key=lambda i: (gains[i][key], -i))
        taken[best] += 1
        agree += best == kept
        mine[key], whole[key] = runs[best][key], runs[kept][key]
    return {**_paired(mine, runs[0]), "taken": taken, "agree": agree, "at": at,
            "against_whole_runs": _paired(mine, whole), "cost": pilot_cost(len(sets), at, total)}


def images_per_run(summaries: Sequence[dict[str, Any]], n: str) -> float:
    """The images a run at ``n`` trees scored, training and the guard's measurements together, as a mean
    over every run (each taste weighted by its seeds); NaN where a run stored no costs."""
    total, runs = 0.0, 0
    for s in summaries:
        costs = s["by_trees"].get(n, {}).get("costs")
        if costs is None:
            return math.nan
        k = len(s["seeds"])
        total, runs = total + k * (costs["training_images"] + costs["guard_images"]), runs + k
    return total / runs if runs else math.nan


def _with_images(row: dict[str, Any], trained: Sequence[Sequence[dict[str, Any]]],
                 default: Sequence[dict[str, Any]], n: str) -> dict[str, Any]:
    """A choice row with what it cost: every training it chose among, beside the default's images."""
    return {**row, "images": sum(images_per_run(runs, n) for runs in trained),
            "default_images": images_per_run(default, n)}


def ablation_rows(default: Sequence[dict[str, Any]], arms: dict[str, list[dict[str, Any]]], n: str,
                  pilot: bool = False) -> dict[str, dict[str, Any]]:
    """Every arm against the default at ``n`` trees, and where arms trained the same picks at other
    weights, the guard choosing among those weights too (:func:`guard_choice_row`) and, with ``pilot``,
    a pilot choosing them (:func:`pilot_choice_row`). Only runs that trained at one fixed weight take part
    in those choices: a default that itself chose among weights (0.5.0's two trainings) is no run at its
    ``picks_weight``, so there the choice is made among the arms' weights (the first arm at each) and
    paired against that default, with no pilot row."""
    rows = {name: {**arm_row(default, arm, n), "images": images_per_run(arm, n),
                   "default_images": images_per_run(default, n)} for name, arm in arms.items()}
    own = method_weights(default[0]["budget"]) if default else []
    fixed = [arm for arm in arms.values() if arm and len(method_weights(arm[0]["budget"])) == 1]
    if len(own) > 1:
        by_weight: dict[float, Sequence[dict[str, Any]]] = {}
        for arm in fixed:
            by_weight.setdefault(method_weights(arm[0]["budget"])[0], arm)
        if len(by_weight) > 1:
            first, *rest = by_weight.values()
            weights = " or ".join(f"{w:g}" for w in by_weight)
            rows[f"the guard chooses the weight ({weights}: one training each)"] = _with_images(
                guard_choice_row(first, rest, n, against=default), [first, *rest], default, n)
        return rows
    others = [arm for arm in fixed if method_weights(arm[0]["budget"]) != own]
    if own and others:
        tried = [own[0], *(method_weights(arm[0]["budget"])[0] for arm in others)]
        weights = " or ".join(f"{w:g}" for w in tried)
        rows[f"the guard also chooses the weight ({weights}: one training each)"] = _with_images(
            guard_choice_row(default, others, n), [default, *others], default, n)
        if pilot:
            row = pilot_choice_row(default, others, n)
            rows[f"a pilot of {row['at']} iterations chooses the weight ({weights}: {row['cost']:.3g}x one "
                 "training)"] = row
    return rows


def verdict(row: dict[str, Any]) -> str:
    """'better' / 'worse' when the difference's 95% interval excludes 0, else 'inconclusive'."""
    d = row["difference"]
    if not math.isfinite(d["ci95"]):
        return "one run: no verdict"
    if d["mean"] - d["ci95"] > 0:
        return "better"
    if d["mean"] + d["ci95"] < 0:
        return "worse"
    return "inconclusive"


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def method_weights(budget: dict[str, Any]) -> list[float]:
    """The picks weights a stored run's method trained at: ``picks_weights`` (the guard kept one run),
    or its one fixed ``picks_weight`` (a run written before 0.5.0, or ``--picks-weights W``)."""
    return list(budget.get("picks_weights") or [budget["picks_weight"]])


def oracle_at_method_weights(summary: dict[str, Any]) -> float:
    """The oracle at the picks weights the method trains at, as a mean over seeds: at its one fixed
    weight, or per seed the best of the weights the guard tries (the oracle chooses among them too)."""
    budget, by_weight = summary["budget"], summary["frontier"]["by_weight"]
    names = [f"{w:g}" for w in method_weights(budget)]
    if not all(w in by_weight for w in names):
        return math.nan
    per_seed = zip(*(by_weight[w]["per_seed"] for w in names), strict=True)
    return _mean([max(values) for values in per_seed])


def decomposition(summary: dict[str, Any], n: str, clean: dict[str, Any] | None = None) -> dict[str, Any]:
    """One taste at ``n`` trees, as means over its seeds: the frontier, the oracle at the method's picks
    weight, the method chosen with margin 0 and with the default margin, the method on error-free picks
    (``clean``: a run with ``--mistakes 0``), and the reward's pair accuracy on base and trained trees."""
    row = summary["by_trees"][n]
    out: dict[str, Any] = {
        "taste": summary["taste"], "trees": int(n), "seeds": len(summary["seeds"]),
        "frontier": row["frontier_gain"]["mean"],
        "oracle_at_method_weight": oracle_at_method_weights(summary),
        "method_margin_0": row.get("margins", {}).get("0", {}).get("taste_gain", {}).get("mean", math.nan),
        "method": row["taste_gain"]["mean"],
        "base_accuracy": row["held_out_pair_accuracy"],
        "on_policy_accuracy": row.get("on_policy_pair_accuracy", math.nan)}
    clean_row = (clean or {}).get("by_trees", {}).get(n)
    out["method_error_free"] = clean_row["taste_gain"]["mean"] if clean_row else math.nan
    f = out["frontier"]
    out["lost"] = {
        "weight": f - out["oracle_at_method_weight"],
        "reward_and_validation": out["oracle_at_method_weight"] - out["method_margin_0"],
        "margin": out["method_margin_0"] - out["method"]}
    out["picks_mistakes"] = out["method_error_free"] - out["method"]
    return out


def _pct(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "n/a"


def _ci_pct(e: dict[str, Any]) -> str:
    if not math.isfinite(e["ci95"]):
        return f"{e['mean']:+.0%}"
    return f"{e['mean']:+.0%} ({e['mean'] - e['ci95']:+.0%} to {e['mean'] + e['ci95']:+.0%})"


def _images(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ") if math.isfinite(value) else "n/a"


def arm_lines(rows: dict[str, dict[str, Any]], n: str) -> list[str]:
    """The ablation table: one row per arm against the default at ``n`` trees, with the images each run
    scored (training and the guard's measurements) where the runs stored them."""
    costs = any(math.isfinite(row.get("images", math.nan)) for row in rows.values())
    lines = [f"| arm (at {n} labelled trees) | runs | share of the frontier (95% CI) | the default's, same "
             "runs | arm minus default (95% CI) | exact p | verdict | runs past the limit (default) |"
             + (" images scored per run (default) |" if costs else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if costs else "")]
    for name, row in rows.items():
        cost = (f" {_images(row.get('images', math.nan))} ({_images(row.get('default_images', math.nan))}) |"
                if costs else "")
        if not row["runs"]:
            lines.append(f"| {name} | 0 | not run | | | | | |" + (" |" if costs else ""))
            continue
        s, d = row["share"], row["default_share"]
        share = f"{s['mean']:.0%}" + (f" ({s['mean'] - s['ci95']:.0%} to {s['mean'] + s['ci95']:.0%})"
                                      if math.isfinite(s["ci95"]) else "")
        lines.append(f"| {name} | {row['runs']} ({', '.join(row['tastes'])}) | {share} | {d['mean']:.0%} | "
                     f"{_ci_pct(row['difference'])} | {row['exact_p']:.3g} | {verdict(row)} | "
                     f"{row['past_limit']} ({row['default_past_limit']}) |" + cost)
    return lines


def decomposition_lines(parts: Sequence[dict[str, Any]]) -> list[str]:
    """The decomposition table, a row per taste, gains in the taste's own units and as shares of its
    frontier."""
    lines = ["| taste | frontier | oracle at the method's weight | method, margin 0 | method (default) | "
             "lost to the weight | lost to the reward and its validation | lost to the margin | "
             "error-free picks | reward's pair accuracy: base trees / trained model's |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in parts:
        f = p["frontier"]

        def share(x: float, f: float = f) -> str:
            return f"{x:+.3f} ({_pct(x / f)})" if f > 0 and math.isfinite(x) else "n/a"

        lost = p["lost"]
        lines.append(
            f"| {p['taste']} | {f:+.3f} | {share(p['oracle_at_method_weight'])} | "
            f"{share(p['method_margin_0'])} | {share(p['method'])} | {share(lost['weight'])} | "
            f"{share(lost['reward_and_validation'])} | "
            f"{share(lost['margin'])} | {share(p['method_error_free'])} | {p['base_accuracy']:.2f} / "
            + (f"{p['on_policy_accuracy']:.2f} |" if math.isfinite(p["on_policy_accuracy"]) else "n/a |"))
    return lines


def risk_count(summaries: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Over every taste, seed and tree count: the runs whose held-out fall went past the limit."""
    past = sum(row["past_limit"]["runs"] for s in summaries for row in s["by_trees"].values())
    runs = sum(row["past_limit"]["of"] for s in summaries for row in s["by_trees"].values())
    return {"past": past, "runs": runs}


def pooled_share(summaries: Sequence[dict[str, Any]], n: str) -> dict[str, Any]:
    """Every taste and seed at ``n`` trees: each run's share of its own frontier, mean with 95% CI."""
    shares = [v["share"] for s in summaries if n in s["by_trees"] for v in run_shares(s, n).values()
              if math.isfinite(v["share"])]
    return _estimate(shares) if shares else {"mean": math.nan, "ci95": math.nan, "n": 0}


def _chosen_point(run: dict[str, Any]) -> dict[str, Any] | None:
    """The stored point the guard chose in a method run (None: it returned the base model)."""
    chosen = run["chosen"]
    if not chosen["iteration"]:
        return None
    return next((p for p in run["points"]
                 if (p["iteration"], p["strength"]) == (chosen["iteration"], chosen["strength"])), None)


def stated_risk(summaries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The runs past the limit that the node's stated risk expects (the sum over every run of its chosen
    checkpoint's chance, from its validation fall and standard error) against those that went past on
    the test pairs, and ``p_at_least``: the chance of that many or more if every stated chance were
    right (a small one says the guard understates its risk).

    The stated chance is the true fall's; the count is of falls measured on the test pairs, which have a
    noise of their own. ``expected_on_test`` and ``p_at_least_on_test`` add it (the test measurement's
    standard error taken as the validation one's, scaled by the square root of the pairs' ratio): what
    the count should be if the stated risk were right, with nothing blamed on the guard that the test
    pairs' own draw explains."""
    from ...guard.choice import past_limit_chance

    chances, on_test, surprise = [], [], []
    for s in summaries:
        b = s["budget"]
        widen = math.sqrt(1.0 + b["validation_pairs"] / b["eval_pairs"])
        for seed in s["per_seed"]:
            for run in seed["reward"].values():
                point = _chosen_point(run)
                if point is None:
                    chances.append(0.0)
                    on_test.append(0.0)
                    continue
                fall, se = run["points"][0]["guard"] - point["guard"], point["guard_se"]
                chances.append(past_limit_chance(fall, se, run["limit"]))
                on_test.append(past_limit_chance(fall, se * widen, run["limit"]))
                if se > 0:
                    surprise.append(((seed["scene_before"] - run["scene"]) - fall) / (se * widen))
    past = risk_count(summaries)["past"]
    return {"expected": sum(chances), "past": past, "runs": len(chances),
            "p_at_least": at_least_chance(chances, past), "expected_on_test": sum(on_test),
            "p_at_least_on_test": at_least_chance(on_test, past),
            "calibration": error_calibration(surprise, shares_both_sets(summaries))}


def error_calibration(surprise: Sequence[float], shared: bool = False) -> dict[str, Any]:
    """How well the guard's standard error states its error, from each chosen checkpoint's test fall
    minus its validation fall in units of that difference's stated spread: mean 0 and standard deviation
    1 when it is right. A larger deviation says the error is understated; a positive mean says choosing
    the tastiest point within the limit favours points whose validation fall came out low.

    ``shared``: every run validated on the same pairs and was tested on the same pairs (the template's
    few prompts at fixed seeds; one seed's trees for every taste), so their differences share one draw of
    the two sets and are not independent; where the runs move the images alike (the template's), a
    deviation below 1 shows it."""
    if len(surprise) < 2:
        return {"n": len(surprise), "mean": math.nan, "sd": math.nan, "shared": shared}
    return {"n": len(surprise), "mean": statistics.fmean(surprise), "sd": statistics.stdev(surprise),
            "shared": shared}


def shares_both_sets(summaries: Sequence[dict[str, Any]]) -> bool:
    """Whether every method run measured the same base model on the same validation pairs and the same
    test pairs: one validation base value and one test base value over every run (the pairs themselves
    are not stored; the base model's scores on them are, to every digit)."""
    validation = {run["points"][0]["guard"] for s in summaries for seed in s["per_seed"]
                  for run in seed["reward"].values() if run["points"]}
    test = {seed["scene_before"] for s in summaries for seed in s["per_seed"]}
    runs = sum(len(seed["reward"]) for s in summaries for seed in s["per_seed"])
    return runs > 1 and len(validation) == 1 and len(test) == 1


def fall_gap(summary: dict[str, Any]) -> dict[str, Any]:
    """Every checkpoint and strength of a taste's method runs measured on both pair sets: the mean fall
    of prompt-following on the validation pairs (what the guard chooses on) and on the test pairs, and
    the mean of their difference (test minus validation) with its standard deviation."""
    validation, test = [], []
    for seed in summary["per_seed"]:
        for run in seed["reward"].values():
            base = run["points"][0]
            for p in run["points"][1:]:
                if "test_scene" in p and "test_scene" in base:
                    validation.append(base["guard"] - p["guard"])
                    test.append(base["test_scene"] - p["test_scene"])
    gaps = [t - v for t, v in zip(test, validation, strict=True)]
    return {"taste": summary["taste"], "points": len(gaps), "validation": _mean(validation),
            "test": _mean(test), "gap": _mean(gaps),
            "gap_sd": statistics.stdev(gaps) if len(gaps) > 1 else math.nan}


def fall_gap_lines(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """The table of :func:`fall_gap`, a row per taste."""
    lines = ["| taste | checkpoints measured on both | validation fall | test fall | "
             "test minus validation (sd) |", "|---|---|---|---|---|"]
    for g in map(fall_gap, summaries):
        if g["points"]:
            lines.append(f"| {g['taste']} | {g['points']} | {g['validation']:+.4f} | {g['test']:+.4f} | "
                         f"{g['gap']:+.4f} ({g['gap_sd']:.4f}) |")
    return lines
