"""The default method that chooses the picks weight, assembled from stored runs at fixed weights.

Why: the guard keeps, per run, the weight whose chosen point gained the most personal reward on the
validation pairs (``trainer/guard/weights.py``), a figure each fixed-weight run already stores. So a
``bench taste`` run at one weight and ``bench taste-weight`` runs at another, made at one commit on the
same seeds, picks and frontier, give per seed and tree count exactly the run the default would keep: the
same ``choose_weight``, applied to the stored gains. This makes the default's table from runs already
made instead of training every run twice again (``bench taste-check`` runs the default afresh on one
seed to check that it repeats both stored runs; the results page says where). Pure functions over
``taste.json`` contents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...guard.weights import choose_weight
from .ablation import method_weights
from .budget import SeedResult, TasteBudget
from .storage import seed_results, stored_budget

# Budget fields that may differ between the runs combined: the weight, and which trees and seeds ran.
_FREE = ("picks_weight", "picks_weights", "trees", "at", "seeds", "first_seed")


def _fixed_weight(data: dict[str, Any]) -> float:
    weights = method_weights(data["budget"])
    if len(weights) != 1:
        raise ValueError(f"{data['taste']}: a run that already chose among weights {weights} cannot be "
                         "combined")
    return float(weights[0])


def _same_setup(runs: Sequence[dict[str, Any]]) -> None:
    """Refuse in one line runs of other tastes, budgets, options or code."""
    first = runs[0]
    fixed = {k: v for k, v in first["budget"].items() if k not in _FREE}
    for data in runs[1:]:
        if data["taste"] != first["taste"]:
            raise ValueError(f"runs of two tastes: {first['taste']} and {data['taste']}")
        other = {k: v for k, v in data["budget"].items() if k not in _FREE}
        if other != fixed:
            changed = sorted(k for k in set(fixed) | set(other) if fixed.get(k) != other.get(k))
            raise ValueError(f"{data['taste']}: runs with other budgets ({', '.join(changed)})")
        if list(data.get("extra", [])) != list(first.get("extra", [])):
            raise ValueError(f"{data['taste']}: runs with other --set options")
    codes = {(c or {}).get("code") for data in runs for c in (r.get("code") for r in data["per_seed"])}
    if len(codes) != 1 or None in codes:
        raise ValueError(f"{first['taste']}: runs of more than one code version ({sorted(map(str, codes))}): "
                         "combine runs of one commit")


def _by_weight(runs: Sequence[dict[str, Any]]) -> dict[float, dict[int, SeedResult]]:
    """Per weight, per seed: the seed's method runs over every tree count the weight's runs hold."""
    out: dict[float, dict[int, SeedResult]] = {}
    for data in runs:
        seeds = out.setdefault(_fixed_weight(data), {})
        for result in seed_results(data):
            held = seeds.setdefault(result.seed, replace(result, reward={}))
            for n, run in result.reward.items():
                if n in held.reward:
                    raise ValueError(f"{data['taste']}: seed {result.seed} at {n} trees is in two runs of "
                                     "one weight")
                held.reward[n] = run
    return out


def kept_weight(result: SeedResult, n: int) -> float:
    """The weight a combined seed kept at ``n`` trees."""
    return float(result.reward[n]["weights"]["kept"])


def combine_weights(runs: Sequence[dict[str, Any]]) -> tuple[TasteBudget, list[SeedResult]]:
    """One taste's runs at fixed weights (``taste.json`` contents; the first run's weight is tried first,
    as the default tries 0.3 first) as the default that chooses among those weights: the seeds and tree
    counts every weight has, each taking the run :func:`choose_weight` keeps, with the choice recorded as
    the default records it (``weights``). The frontier is the first run's."""
    if not runs:
        raise ValueError("no runs to combine")
    _same_setup(runs)
    by_weight = _by_weight(runs)
    if len(by_weight) < 2:
        raise ValueError(f"{runs[0]['taste']}: runs at one weight only ({sorted(by_weight)}): nothing to "
                         "choose")
    weights = list(by_weight)
    seeds = sorted(set.intersection(*(set(s) for s in by_weight.values())))
    counts = sorted(set.intersection(*(set(r.reward) for s in by_weight.values() for r in s.values()
                                       if r.seed in seeds))) if seeds else []
    if not seeds or not counts:
        raise ValueError(f"{runs[0]['taste']}: no seed and tree count that every weight ran")
    results = []
    for seed in seeds:
        first = by_weight[weights[0]][seed]
        if any(by_weight[w][seed].frontier != first.frontier for w in weights):
            raise ValueError(f"{runs[0]['taste']}: seed {seed} has another frontier in one run: combine runs "
                             "made on one frontier (--frontier-from)")
        reward = {}
        for n in counts:
            each = [by_weight[w][seed].reward[n] for w in weights]
            choice = choose_weight(weights, [float(r["chosen"]["validation_taste_gain"]) for r in each])
            reward[n] = {**each[choice.index], "weights": choice.to_json()}
        results.append(replace(first, reward=reward))
    budget = replace(stored_budget(runs[0]), picks_weight=weights[0], picks_weights=tuple(weights),
                     trees=counts[-1], at=tuple(counts), seeds=len(seeds), first_seed=seeds[0])
    return budget, results
