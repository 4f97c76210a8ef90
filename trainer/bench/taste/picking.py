"""``treerpo bench picking``: how many clicks the personal reward needs, which tree to show next, and
when to stop, with a simulated person and no RL training.

Once per run, the base embedded model grows a pool of trees of 8 leaves into a picks folder (through
the real store, as TreeRPO Sample Trees to Pick does). Per seed, a seeded shuffle splits the pool into
``candidates`` (the folder the person picks in, in that age order) and ``test`` trees, and for each
hidden taste and each kind of person (:class:`~.person.SimulatedPerson`: likes 2 and dislikes 1, or a
single like; 15% mistakes) the person's picks on every candidate are drawn once, so that every order
sees the same picks:

- **order**: the trees are labelled oldest first, or in the active order (``preferences.active``:
  oldest first for the first 5, then the tree whose leaves' order the picks leave most open);
- **accuracy**: at 10, 15, 25 and 50 labelled trees, the personal reward (``rewards.personal``, fitted
  as training fits it) orders the test trees' leaf pairs; its accuracy is read against the HIDDEN taste
  (pairs ordered by the taste itself, not by the person's noisy picks). The quick linear reward that
  chooses the order is scored the same way, beside it;
- **when to stop**: following the oldest-first order, the first of the counts ``rule_at`` where
  ``preferences.progress`` says "stopped rising", and the personal reward's accuracy there against its
  accuracy at the largest of them.

Every figure is a mean over seeds with a 95% t interval; active minus oldest is the mean of per-seed
differences (paired). ``picking.json`` keeps every per-seed value.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...config.files import load_config
from ...config.schema import TrainConfig
from ...preferences.active import next_order
from ...preferences.linear_reward import Basis, fit_basis, fit_linear, linear_accuracy
from ...preferences.pairs import Pair, tree_pairs
from ...preferences.progress import STOP_FROM, advise, learning_curve
from ...preferences.records import Picks
from ...preferences.store import PickStore
from ...rewards.personal import FitConfig, fit_head, pair_accuracy, pooled_features
from ...utils.atomic import atomic_write_text
from ..common.stats import mean_ci95
from .person import SimulatedPerson, load_taste

ORDERS = ("oldest", "active")
TASTES = ("larger_objects", "central_objects", "deep_shades")
PEOPLE = ((2, 1), (1, 0))  # (likes, dislikes) per tree


@dataclass(frozen=True)
class PickingBudget:
    """How large the pool is and what is measured."""

    candidates: int = 200  # trees in the folder the person picks in
    test: int = 40  # trees whose pairs score the reward
    seeds: int = 5
    at: tuple[int, ...] = (10, 15, 25, 50)  # labelled-tree counts measured
    tastes: tuple[str, ...] = TASTES
    people: tuple[tuple[int, int], ...] = PEOPLE
    mistakes: float = 0.15
    rule_at: tuple[int, ...] = (STOP_FROM, 30, 35, 40, 50, 60, 80, 100)  # counts the stopping rule is read at

    @property
    def rule_upto(self) -> int:
        return max(self.rule_at)
    first_seed: int = 0


QUICK = PickingBudget(candidates=14, test=4, seeds=2, at=(6, 10), tastes=("larger_objects",),
                      rule_at=(8, 10))
QUICK_OVERRIDES = ("tree.steps=6",)


@dataclass
class Pool:
    """The grown trees: leaf images as the person sees them and the personal reward's features."""

    ids: list[str]  # oldest first
    images: dict[str, Tensor]
    features: dict[str, Tensor]
    prompts: dict[str, str]


@dataclass
class Run:
    """One seed, taste and person: accuracy against the hidden taste by order and labelled count."""

    seed: int
    taste: str
    likes: int
    dislikes: int
    head: dict[str, dict[int, float]] = field(default_factory=dict)  # order -> trees -> accuracy
    linear: dict[str, dict[int, float]] = field(default_factory=dict)
    stop_at: int | None = None  # first count where the rule says "stopped rising" (None: not by rule_upto)
    head_at_stop: float | None = None
    head_at_upto: float = float("nan")
    advice_by_trees: dict[int, str] = field(default_factory=dict)


def grow_pool(count: int, folder: Path, extra: Sequence[str], log: Callable[[str], None]) -> Pool:
    """``count`` trees of the base embedded model (its default tree: 8 leaves) stored in ``folder``."""
    from ...embedded.policy import EmbeddedPolicy
    from ...training.from_picks import model_id, store_trees
    from .trees import first_plan, tree_prompts, tree_seeds

    config = load_config(TrainConfig, None, list(extra))
    policy = EmbeddedPolicy.from_pretrained()
    store = PickStore(folder, create=True)
    started = time.perf_counter()
    ids = store_trees(policy, store, tree_prompts(config, 0, count), tree_seeds(0, count),
                      first_plan(config, policy), model_id(policy, "embedded"), max_batch=config.max_batch)
    log(f"grew {count} trees of {store.meta(ids[0]).leaves} leaves in {time.perf_counter() - started:.0f} s")
    images = {t: store.load_images(t) for t in ids}  # the stored PNGs: what the person sees
    with torch.no_grad():
        features = {t: pooled_features(images[t]) for t in ids}
    return Pool(ids, images, features, {t: store.meta(t).prompt for t in ids})


def taste_pairs(scores: Sequence[float]) -> list[Pair]:
    """Every leaf pair the hidden taste orders strictly (ties left out)."""
    return [Pair(i, j) for i in range(len(scores)) for j in range(len(scores)) if scores[i] > scores[j]]


def labelling_order(order: str, candidates: list[str], picks: dict[str, list[Pair]],
                    features: dict[str, Tensor], basis: Basis, count: int) -> list[str]:
    """The first ``count`` trees the person labels, one at a time, asking ``next_order`` after each."""
    labelled: list[str] = []
    while len(labelled) < count:
        known = {t: picks[t] for t in labelled}
        labelled.append(next_order(candidates, known, features, order, basis=basis)[0])
    return labelled


def run_person(pool: Pool, seed: int, taste_name: str, likes: int, dislikes: int, budget: PickingBudget,
               log: Callable[[str], None]) -> Run:
    """Both orders and the stopping rule for one seed, taste and person."""
    name, taste = load_taste(taste_name)
    order = list(pool.ids)
    random.Random(seed).shuffle(order)
    test = order[: budget.test]
    candidates = sorted(order[budget.test: budget.test + budget.candidates])  # the folder, oldest first
    person = SimulatedPerson(taste, likes, dislikes, budget.mistakes)
    rng = random.Random(seed * 7919 + likes * 31 + dislikes)
    picks = {t: tree_pairs(Picks(*(tuple(m) for m in person.pick(pool.images[t], pool.prompts[t], rng))),
                           pool.images[t].shape[0]) for t in candidates}
    truth = {t: taste_pairs(taste(pool.images[t], [pool.prompts[t]] * pool.images[t].shape[0]).tolist())
             for t in test}
    basis = fit_basis([pool.features[t] for t in candidates])
    x = {t: basis(pool.features[t]) for t in (*candidates, *test)}
    test_feats, test_x = {t: pool.features[t] for t in test}, {t: x[t] for t in test}
    run = Run(seed, name, likes, dislikes)

    def head_accuracy(labelled: Sequence[str]) -> float:
        head = fit_head({t: pool.features[t] for t in labelled}, {t: picks[t] for t in labelled},
                        FitConfig(seed=seed))
        return pair_accuracy(head, test_feats, truth)

    for kind in ORDERS:
        sequence = labelling_order(kind, candidates, picks, pool.features, basis, max(budget.at))
        run.head[kind], run.linear[kind] = {}, {}
        for n in budget.at:
            labelled = sequence[:n]
            run.head[kind][n] = head_accuracy(labelled)
            model = fit_linear({t: x[t] for t in labelled}, {t: picks[t] for t in labelled})
            run.linear[kind][n] = linear_accuracy(model, test_x, truth)
    for n in sorted(budget.rule_at):
        labelled = candidates[:n]
        advice = advise(n, learning_curve(labelled, picks, pool.features, basis))
        run.advice_by_trees[n] = advice.text
        if advice.more_helps is False:
            run.stop_at, run.head_at_stop = n, head_accuracy(labelled)
            break
    run.head_at_upto = head_accuracy(candidates[: budget.rule_upto])
    log(f"seed {seed} {name} (likes {likes}, dislikes {dislikes}): personal reward at "
        + ", ".join(f"{n}: {run.head['oldest'][n]:.3f} / {run.head['active'][n]:.3f}" for n in budget.at)
        + f" (oldest / active); stopped rising at {run.stop_at or f'> {budget.rule_upto}'}")
    return run


def _estimate(values: Sequence[float]) -> dict[str, Any]:
    e = mean_ci95(values)
    return {"mean": e.mean, "ci95": e.ci95, "per_seed": list(values)}


def summarise(runs: Sequence[Run], budget: PickingBudget) -> dict[str, Any]:
    """Per taste and person and labelled count: each order's accuracy, active minus oldest (paired), and
    the quick linear reward's; and where the stopping rule fired."""
    rows: list[dict[str, Any]] = []
    stops: list[dict[str, Any]] = []
    groups: dict[tuple[str, int, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.taste, run.likes, run.dislikes), []).append(run)
    for (taste, likes, dislikes), group in groups.items():
        for n in budget.at:
            oldest = [r.head["oldest"][n] for r in group]
            active = [r.head["active"][n] for r in group]
            differences = [a - o for a, o in zip(active, oldest, strict=True)]
            rows.append({"taste": taste, "likes": likes, "dislikes": dislikes, "trees": n,
                         "oldest": _estimate(oldest), "active": _estimate(active),
                         "active_minus_oldest": _estimate(differences),
                         "linear_oldest": _estimate([r.linear["oldest"][n] for r in group]),
                         "linear_minus_head": _estimate([r.linear["oldest"][n] - r.head["oldest"][n]
                                                         for r in group])})
        fired = [r for r in group if r.stop_at is not None]
        stops.append({"taste": taste, "likes": likes, "dislikes": dislikes,
                      "stop_at": [r.stop_at for r in group], "fired": len(fired), "seeds": len(group),
                      "head_at_stop": _estimate([r.head_at_stop for r in fired]) if fired else None,
                      "head_at_upto_same_seeds": (_estimate([r.head_at_upto for r in fired])
                                                  if fired else None),
                      "head_at_upto": _estimate([r.head_at_upto for r in group])})
    pooled = {}
    for n in budget.at:
        per_seed: dict[int, list[float]] = {}
        for run in runs:
            per_seed.setdefault(run.seed, []).append(run.head["active"][n] - run.head["oldest"][n])
        pooled[str(n)] = _estimate([statistics.fmean(v) for v in per_seed.values()])
    return {"budget": asdict(budget), "seeds": sorted({r.seed for r in runs}), "rows": rows, "stops": stops,
            "active_minus_oldest_all": pooled}


def _pm(e: dict[str, Any], signed: bool = False) -> str:
    return f"{e['mean']:{'+' if signed else ''}.3f} ± {e['ci95']:.3f}"


def format_summary(summary: dict[str, Any]) -> str:
    """The comparison as a table (accuracy of the personal reward against the hidden taste)."""
    b = summary["budget"]
    lines = [f"personal reward's pair accuracy against the hidden taste on {b['test']} held-out trees "
             f"(mean ± 95% CI over seeds {summary['seeds']}; {b['candidates']} trees to pick from, "
             f"{b['mistakes']:.0%} mistakes)",
             f"{'taste':<16}{'person':<10}{'trees':>5}  {'oldest first':>15}  {'active':>15}  "
             f"{'active - oldest':>16}  {'quick linear':>15}"]
    for r in summary["rows"]:
        person = f"{r['likes']}+/{r['dislikes']}-"
        lines.append(f"{r['taste']:<16}{person:<10}{r['trees']:>5}  {_pm(r['oldest']):>15}  "
                     f"{_pm(r['active']):>15}  {_pm(r['active_minus_oldest'], True):>16}  "
                     f"{_pm(r['linear_oldest']):>15}")
    lines.append("active - oldest, every taste and person pooled per seed: " + ", ".join(
        f"{n} trees {_pm(e, True)}" for n, e in summary["active_minus_oldest_all"].items()))
    upto = max(b["rule_at"])
    lines.append(f"stopped rising (oldest first, read at {', '.join(map(str, b['rule_at']))} trees):")
    for s in summary["stops"]:
        at = ", ".join(str(n) if n is not None else f">{upto}" for n in s["stop_at"])
        line = f"  {s['taste']:<16}{s['likes']}+/{s['dislikes']}-  at {at}"
        if s["head_at_stop"] is not None:
            line += (f"; accuracy there {_pm(s['head_at_stop'])}, at {upto} trees "
                     f"{_pm(s['head_at_upto_same_seeds'])} (the {s['fired']} seeds it fired on)")
        else:
            line += f"; accuracy at {upto} trees {_pm(s['head_at_upto'])}"
        lines.append(line)
    return "\n".join(lines)


def run_picking(budget: PickingBudget, out: Path, extra: Sequence[str] = (),
                log: Callable[[str], None] = print, command: str = "") -> dict[str, Any]:
    """Grow the pool once, run every seed, taste and person, write ``out/picking.json``."""
    if budget.candidates < max(max(budget.at), budget.rule_upto):
        raise ValueError(f"candidates ({budget.candidates}) must be at least the largest labelled count "
                         f"({max(max(budget.at), budget.rule_upto)})")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as work:
        pool = grow_pool(budget.candidates + budget.test, Path(work) / "pool", extra, log)
    runs = [run_person(pool, budget.first_seed + k, taste, likes, dislikes, budget, log)
            for k in range(budget.seeds) for taste in budget.tastes for likes, dislikes in budget.people]
    summary = summarise(runs, budget)
    summary["per_run"] = [asdict(r) for r in runs]
    summary["command"] = command
    summary["minutes"] = (time.perf_counter() - started) / 60
    atomic_write_text(out / "picking.json", json.dumps(summary, indent=1) + "\n")
    return summary
