"""``treerpo bench taste-rewards``: which personal-reward head, on which backbone, orders a hidden taste
best from the same picks; a screen with no RL training.

Why a screen: a head that orders the taste's images better gives training a truer signal, and comparing
heads through ``bench taste`` costs a training run per head, taste and seed. Here nothing trains:

- once per run the base embedded model grows one pool of trees of 8 leaves (``picking.grow_pool``): the
  same trees for every taste, seed and head;
- per seed, a seeded shuffle splits the pool into ``test`` trees and ``candidates`` (oldest first), and
  per hidden taste the simulated person (likes 2, dislikes 1, 15% mistakes) labels the first ``n``
  candidates, for each ``n`` of ``at``;
- each head (``rewards.personal.fit_any``, as training fits it) on each backbone is fitted on those picks
  and scored on the test trees against the HIDDEN taste, not against the person's noisy picks: per
  tree, the share of leaf pairs it orders as the taste does (the pairs the taste orders strictly; a tie
  of the head's counts half) and the Spearman correlation of its scores with the taste's over the
  leaves, each averaged over the test trees.

Each head is paired with the ``linear`` head of the same backbone on the same picks: per seed the
difference, with its 95% t interval and the exact sign-flip p (``common.stats``). Pooled over the named
tastes or over the generated family, a seed's value is its mean over the group's tastes; the pooled row
"over tastes" instead pairs each taste's mean over seeds, so a family of tastes nobody chose speaks as
that many tastes. ``rewards.json`` keeps every per-seed value.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...preferences.pairs import Pair, tree_pairs
from ...preferences.records import Picks
from ...rewards.personal import HEADS, FitConfig, backbone, fit_any, pair_accuracy, summary_features
from ...utils.atomic import atomic_write_text
from ..common.stats import mean_ci95, paired
from .budget import TASTE_SET
from .family import FAMILY
from .person import SimulatedPerson, load_taste
from .picking import grow_pool, taste_pairs

DEFAULT_HEADS = ("linear", "quadratic", "kernel")
DEFAULT_BACKBONES = ("content",)
METRICS = ("accuracy", "spearman", "across")


@dataclass(frozen=True)
class RewardStudyBudget:
    """How large the pool is and what is compared."""

    candidates: int = 150  # trees in the folder the person labels, oldest first
    test: int = 40  # trees whose leaves score the heads
    seeds: int = 3
    at: tuple[int, ...] = (25, 50)  # labelled-tree counts
    tastes: tuple[str, ...] = (*TASTE_SET, *FAMILY)
    heads: tuple[str, ...] = DEFAULT_HEADS
    backbones: tuple[str, ...] = DEFAULT_BACKBONES  # NAME or NAME=WEIGHTS (a CLIP backbone's weights)
    likes: int = 2
    dislikes: int = 1
    mistakes: float = 0.15
    first_seed: int = 0

    def __post_init__(self) -> None:
        if self.candidates < max(self.at, default=0):
            raise ValueError(f"candidates ({self.candidates}) must be at least the largest labelled count "
                             f"({max(self.at)})")
        if "linear" not in self.heads:
            raise ValueError("the heads must include linear: every other head is paired with it")
        unknown = [h for h in self.heads if h not in HEADS]
        if unknown:
            raise ValueError(f"--heads: unknown head {unknown[0]!r}; expected {', '.join(HEADS)}")
        if self.seeds < 2:
            raise ValueError(f"a paired comparison needs at least 2 seeds, got {self.seeds}")


QUICK = RewardStudyBudget(candidates=8, test=3, seeds=2, at=(4, 8), tastes=("larger_objects", "family_00"),
                          heads=("linear", "quadratic", "kernel", "ensemble", "ard"))
QUICK_OVERRIDES = ("tree.steps=6",)


@dataclass
class Pool:
    """The grown trees (oldest first), their leaves' taste scores by taste, features by backbone."""

    ids: list[str]
    images: dict[str, Tensor]
    prompts: dict[str, str]
    features: dict[str, dict[str, Tensor]]  # backbone -> tree -> [leaves, D]
    summary: dict[str, int]  # backbone -> summary features the linear head keeps


def backbone_features(spec: str) -> tuple[str, Callable[[Tensor], Tensor]]:
    """``(name, features)`` of a backbone spec: ``NAME`` or ``NAME=WEIGHTS``."""
    name, _, weights = spec.partition("=")
    return name, backbone(name, weights or None)


def build_pool(budget: RewardStudyBudget, folder: Path, extra: Sequence[str],
               log: Callable[[str], None]) -> Pool:
    """Grow the pool once and read every backbone's features of its leaves."""
    grown = grow_pool(budget.candidates + budget.test, folder, extra, log)
    features: dict[str, dict[str, Tensor]] = {}
    summary: dict[str, int] = {}
    for spec in budget.backbones:
        name, fn = backbone_features(spec)
        with torch.no_grad():
            features[name] = {t: fn(grown.images[t]).float().cpu() for t in grown.ids}
        summary[name] = summary_features(fn)
    return Pool(grown.ids, grown.images, grown.prompts, features, summary)


def split(ids: Sequence[str], seed: int, budget: RewardStudyBudget) -> tuple[list[str], list[str]]:
    """``(test, candidates)``: a seeded shuffle's first ``test`` trees, then the next ``candidates``
    oldest first (the folder the person labels in order), as ``bench picking`` splits its pool."""
    order = list(ids)
    random.Random(seed).shuffle(order)
    return order[: budget.test], sorted(order[budget.test: budget.test + budget.candidates])


def person_picks(scores: dict[str, Tensor], trees: Sequence[str], seed: int, budget: RewardStudyBudget
                 ) -> dict[str, list[Pair]]:
    """The simulated person's pairs on ``trees``, from the taste's scores of their leaves (the person
    sees the same scores the taste gives; a seeded generator draws the ties and the mistakes)."""
    rng = random.Random(seed * 7919 + 1)
    picks = {}
    for t in trees:
        person = SimulatedPerson(lambda _images, _prompts, s=scores[t]: s, budget.likes, budget.dislikes,
                                 budget.mistakes)
        liked, disliked = person.pick(scores[t].view(-1, 1, 1, 1), "", rng)
        picks[t] = tree_pairs(Picks(tuple(liked), tuple(disliked)), scores[t].numel())
    return picks


def rank_correlation(a: Tensor, b: Tensor) -> float:
    """Spearman's correlation of two score vectors (average ranks for ties); nan when either is constant."""
    from scipy.stats import rankdata

    ra = torch.as_tensor(rankdata(a.double().numpy()), dtype=torch.float64)
    rb = torch.as_tensor(rankdata(b.double().numpy()), dtype=torch.float64)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    norm = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / norm if norm > 0 else math.nan


def score_head(head: torch.nn.Module, features: dict[str, Tensor], scores: dict[str, Tensor],
               test: Sequence[str]) -> dict[str, float]:
    """The head's pair accuracy against the taste's order, and its mean Spearman correlation with the
    taste, over the test trees (a tree where the taste ties every leaf says nothing and is left out);
    ``across``: its Spearman correlation with the taste over every test leaf at once. Why the last: the
    picks compare siblings, which differ a little, while training moves the images further than any
    tree's leaves differ; leaves of other prompts and seeds differ more (size, count, place), so the
    order across trees asks whether the reward extrapolates as the taste does."""
    with torch.no_grad():
        scored = {t: head(features[t]) for t in test}  # once per tree, for both correlations
    accuracy, spearman = [], []
    for t in test:
        truth = taste_pairs(scores[t].tolist())
        if not truth:
            continue
        accuracy.append(pair_accuracy(head, {t: features[t]}, {t: truth}))
        rho = rank_correlation(scored[t], scores[t])
        if math.isfinite(rho):
            spearman.append(rho)
    across = (rank_correlation(torch.cat(list(scored.values())), torch.cat([scores[t] for t in test]))
              if test else math.nan)
    return {"accuracy": statistics.fmean(accuracy) if accuracy else math.nan,
            "spearman": statistics.fmean(spearman) if spearman else math.nan, "across": across}


def run_taste(pool: Pool, taste_name: str, budget: RewardStudyBudget) -> list[dict[str, Any]]:
    """Every seed, labelled count, backbone and head of one taste: one row each."""
    name, taste = load_taste(taste_name)
    with torch.no_grad():
        scores = {t: taste(pool.images[t], [pool.prompts[t]] * pool.images[t].shape[0]).float().flatten()
                  for t in pool.ids}
    rows = []
    for seed in range(budget.first_seed, budget.first_seed + budget.seeds):
        test, candidates = split(pool.ids, seed, budget)
        picks = person_picks(scores, candidates, seed, budget)
        for n in budget.at:
            labelled = candidates[:n]
            for bone, features in pool.features.items():
                for head_name in budget.heads:
                    config = FitConfig(head=head_name, seed=seed, summary=pool.summary[bone])
                    fitted = {t: features[t] for t in labelled}
                    started = time.perf_counter()
                    head = fit_any(fitted, {t: picks[t] for t in labelled}, config)
                    fit_seconds = time.perf_counter() - started
                    rows.append({"taste": name, "seed": seed, "trees": n, "backbone": bone, "head": head_name,
                                 **score_head(head, features, scores, test), "fit_seconds": fit_seconds})
    return rows


def _estimate(values: Sequence[float]) -> dict[str, Any]:
    e = mean_ci95(values)
    return {"mean": e.mean, "ci95": e.ci95, "values": list(values)}


def _comparison(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    c = paired(a, b)
    return {"difference": c.difference, "low": c.low, "high": c.high, "p_t": c.p_value, "p_exact": c.p_exact,
            "n": c.n}


def group_of(taste: str) -> str:
    """``family`` for a taste of the generated family, ``named`` for the others."""
    return "family" if taste in FAMILY else "named"


def cell(rows: Sequence[dict[str, Any]], metric: str, linear: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per taste, and pooled per group (per seed, and over tastes), a head's figure and its difference
    from the linear head's (``linear``: the same backbone and count's linear rows)."""
    def table(source: Sequence[dict[str, Any]]) -> dict[str, dict[int, float]]:
        values: dict[str, dict[int, float]] = {}
        for r in source:
            values.setdefault(r["taste"], {})[r["seed"]] = r[metric]
        return values

    own, base = table(rows), table(linear)
    seeds = sorted({r["seed"] for r in rows})
    out: dict[str, Any] = {"per_taste": {}, "pooled": {}}
    for taste, by_seed in own.items():
        mine, theirs = [by_seed[s] for s in seeds], [base[taste][s] for s in seeds]
        out["per_taste"][taste] = {"value": _estimate(mine), "vs_linear": _comparison(mine, theirs)}
    for group in ("named", "family"):
        tastes = [t for t in own if group_of(t) == group]
        if not tastes:
            continue
        mine = [statistics.fmean(own[t][s] for t in tastes) for s in seeds]
        theirs = [statistics.fmean(base[t][s] for t in tastes) for s in seeds]
        over_mine = [statistics.fmean(own[t].values()) for t in tastes]
        over_theirs = [statistics.fmean(base[t].values()) for t in tastes]
        out["pooled"][group] = {
            "tastes": len(tastes), "value": _estimate(mine), "vs_linear": _comparison(mine, theirs),
            "over_tastes": {"value": _estimate(over_mine),
                            "vs_linear": _comparison(over_mine, over_theirs) if len(tastes) > 1 else None}}
    return out


def summarise(rows: Sequence[dict[str, Any]], budget: RewardStudyBudget) -> dict[str, Any]:
    """``cells[backbone][head][trees][metric]`` (``cell``) and each head's mean fit time."""
    cells: dict[str, Any] = {}
    for bone in {r["backbone"] for r in rows}:
        for head in budget.heads:
            for n in budget.at:
                mine = [r for r in rows if (r["backbone"], r["head"], r["trees"]) == (bone, head, n)]
                linear = [r for r in rows if (r["backbone"], r["head"], r["trees"]) == (bone, "linear", n)]
                cells.setdefault(bone, {}).setdefault(head, {})[str(n)] = {
                    metric: cell(mine, metric, linear) for metric in METRICS}
    fit = {f"{bone}/{head}/{n}": statistics.fmean(
        r["fit_seconds"] for r in rows if (r["backbone"], r["head"], r["trees"]) == (bone, head, n))
        for bone in cells for head in budget.heads for n in budget.at}
    return {"cells": cells, "fit_seconds": fit}


def _pm(e: dict[str, Any]) -> str:
    return f"{e['mean']:.3f} ± {e['ci95']:.3f}" if math.isfinite(e["ci95"]) else f"{e['mean']:.3f}"


def _versus(c: dict[str, Any] | None) -> str:
    return "" if c is None else f"{c['difference']:+.3f} p={c['p_exact']:.2g}"


def format_table(summary: dict[str, Any], budget: RewardStudyBudget, bone: str, n: int, metric: str) -> str:
    """One backbone, labelled count and metric: a row per taste, then the pooled rows; per head its mean
    ± 95% CI over seeds, and beside every head but linear its paired difference from linear with the exact
    sign-flip p."""
    heads = summary["cells"][bone]
    what = {"accuracy": "pair accuracy", "spearman": "Spearman correlation per tree",
            "across": "Spearman correlation across every test leaf"}[metric]
    lines = [f"{what} against the hidden taste: {bone} backbone, {n} labelled trees, {budget.test} test "
             f"trees (mean ± 95% CI over {budget.seeds} seeds; head - linear: paired difference, exact "
             "sign-flip p)",
             f"{'taste':<22}" + "".join(f"{h:>15}" + ("" if h == "linear" else f"{'- linear':>17}")
                                         for h in budget.heads)]
    first = heads["linear"][str(n)][metric]
    for taste in first["per_taste"]:
        line = f"{taste:<22}"
        for h in budget.heads:
            c = heads[h][str(n)][metric]["per_taste"][taste]
            line += f"{_pm(c['value']):>15}" + ("" if h == "linear" else f"{_versus(c['vs_linear']):>17}")
        lines.append(line)
    for group in first["pooled"]:
        for label, key in (("per seed", None), ("over tastes", "over_tastes")):
            line = f"{group + ' (' + label + ')':<22}"
            for h in budget.heads:
                pooled = heads[h][str(n)][metric]["pooled"][group]
                c = pooled[key] if key else pooled
                line += f"{_pm(c['value']):>15}" + ("" if h == "linear" else f"{_versus(c['vs_linear']):>17}")
            lines.append(line)
    return "\n".join(lines)


def format_summary(summary: dict[str, Any], budget: RewardStudyBudget) -> str:
    """Every table (backbone, labelled count, metric), then each head's mean fit time."""
    tables = [format_table(summary, budget, bone, n, metric) for bone in summary["cells"] for n in budget.at
              for metric in METRICS]
    fit = ", ".join(f"{key} {1000 * s:.0f} ms" for key, s in summary["fit_seconds"].items())
    return "\n\n".join([*tables, f"mean fit time (backbone/head/trees): {fit}"])


def run_reward_study(budget: RewardStudyBudget, out: Path, extra: Sequence[str] = (),
                     log: Callable[[str], None] = print, command: str = "") -> dict[str, Any]:
    """Grow the pool once, fit and score every head on every taste, seed and count, write
    ``out/rewards.json`` and return its content. Cheap enough to rerun whole: no resume."""
    for taste in budget.tastes:
        load_taste(taste)  # an unknown taste is refused before the pool grows
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as work:
        pool = build_pool(budget, Path(work) / "pool", extra, log)
    grown = time.perf_counter() - started
    rows: list[dict[str, Any]] = []
    for taste in budget.tastes:
        rows += run_taste(pool, taste, budget)
        log(f"{taste}: {len(rows)} fits so far, {time.perf_counter() - started:.0f} s")
    result = {"budget": asdict(budget), "command": command, "pool_seconds": grown,
              "minutes": (time.perf_counter() - started) / 60, "summary": summarise(rows, budget),
              "rows": rows}
    atomic_write_text(out / "rewards.json", json.dumps(result, indent=1) + "\n")
    return result
