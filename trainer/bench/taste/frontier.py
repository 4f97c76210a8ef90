"""The oracle frontier of ``treerpo bench taste``: the hidden taste itself as the reward, trained at each
of the budget's weights (and steered by the guard), the best point within the limit on the test pairs.

It reads the hidden taste and chooses on the test pairs themselves, so it is an optimistic ceiling, not
a method. An ablation run may borrow another run's frontier (``--frontier-from``) when that run trained
it with the same code, budget and options, so that both are measured against the same ceiling.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ...guard.choice import choose
from ...training.guarded import guard_trainer
from ...training.loop import Trainer
from ..common.provenance import check_resume
from .budget import FRONTIER_ONLY, SeedResult, TasteBudget, bench_config
from .measure import grid_images
from .person import taste_spec
from .storage import budget_fields, load_json, run_piece, seed_results


def _quiet(_: str) -> None:
    return None


def frontier_run(budget: TasteBudget, seed: int, weight: float, taste_name: str, extra: Sequence[str],
                 keep: dict[str, torch.Tensor] | None = None, steer: bool = False, bed: Any = None
                 ) -> dict[str, Any]:
    """The hidden taste as the reward at ``weight``: checkpoints, and lower LoRA strengths of those past the
    limit as the guard tries them, measured on the test pairs; the best one whose scene fall is within the
    limit (margin 0: the frontier is chosen on the test figures). Without the strengths the frontier
    would not be a ceiling for the method, which may scale its LoRA down. ``steer``: the guard steers the
    weight from ``weight`` on (measuring on the test pairs), the method's own way to the limit. ``bed``: a
    seed's test bed whose prompts file the frontier trains on (the template row), measured on its pairs."""
    function = {"function": taste_spec(taste_name)}
    config = bench_config(budget, seed, f"function:{weight:g},scene:{1 - weight:g}", function,
                          [*extra, f"guard.strength_tries={budget.frontier_strengths}", "guard.margin=0",
                           "guard.search=bisect", f"experimental.guard.steer={str(steer).lower()}"])
    if bed is not None and bed.prompts_file is not None:
        config = replace(config, data=replace(config.data, prompts=str(bed.prompts_file)))
        trainer = Trainer(config, evaluation=False)
        trainer.eval_pairs = list(bed.pairs)
    else:
        trainer = Trainer(config)
    tracker = guard_trainer(trainer, trainer.eval_pairs, taste="function", log=_quiet, exclude_pairs=False)
    result = tracker.run(0, budget.iterations)
    trail = result.trail
    best = choose(trail, 0.0).point
    name = "steered" if steer else f"{weight:g}"
    if keep is not None and best is not None:
        result.apply(trainer.policy.transformer)
        keep[f"frontier {name}"] = grid_images(trainer)
    base = trail.base
    return {"weight": name if steer else weight, "gain": 0.0 if best is None else best.taste - base.taste,
            "scene_change": 0.0 if best is None else best.guard - base.guard,
            "iteration": 0 if best is None else best.iteration,
            "strength": 1.0 if best is None else best.strength, "limit": trail.limit,
            "taste": (best or base).taste, "scene": (best or base).guard,
            "points": [asdict(p) for p in trail.points]}


def frontier_runs(budget: TasteBudget, result: SeedResult, taste_spec: str, extra: Sequence[str],
                  log: Callable[[str], None], keep: dict[str, torch.Tensor] | None = None,
                  pieces: Path | None = None, bed: Any = None) -> dict[str, Any]:
    """The frontier at every weight into ``result`` (its ``frontier`` and ``oracle``); the best run.
    ``pieces``: where each finished arm is kept until the seed is whole (a stopped run resumes there)."""
    name = taste_spec.rpartition(":")[2]
    result.frontier = {}
    arms = [(f"{w:g}", w, False) for w in budget.frontier_weights]
    arms += [("steered", budget.picks_weight, True)] if budget.frontier_steer else []
    for key, weight, steer in arms:
        def arm(w: float = weight, s: bool = steer) -> dict[str, Any]:
            return frontier_run(budget, result.seed, w, taste_spec, extra, keep, s, bed)
        run = run_piece(pieces, f"frontier_{key}", keep, arm)
        result.frontier[key] = run
        what = "steered by the guard" if steer else f"at weight {weight:g}"
        log(f"{name} seed {result.seed} frontier {what}: taste {run['gain']:+.4f} at iteration "
            f"{run['iteration']}, strength {run['strength']:g} (scene {run['scene_change']:+.4f})")
    best = best_frontier(result)
    result.oracle = {"taste": best["taste"], "scene": best["scene"], "weight": best["weight"]}
    return best


def frontier_name(weight: float | str) -> str:
    """A frontier arm's name: its weight, or ``steered``."""
    return weight if isinstance(weight, str) else f"{weight:g}"


def best_frontier(result: SeedResult) -> dict[str, Any]:
    """The frontier's run with the most taste over its weights."""
    return max(result.frontier.values(), key=lambda r: r["gain"])


def _best_point(result: SeedResult) -> tuple[Any, ...]:
    best = best_frontier(result)
    return best["weight"], best["iteration"], best.get("strength", 1.0)


def redo_frontier(budget: TasteBudget, done: list[SeedResult], previous: dict[str, Any], taste: str,
                  extra: Sequence[str], log: Callable[[str], None], grid: Path) -> bool:
    """Redo the frontier of the stored seeds when a frontier-only field changed; whether it did. The grid's
    frontier row shows the first seed's best point: when that point moves, the grid (which would need the
    method's images again) is removed rather than left showing another point."""
    stored = budget_fields(previous)
    if all(stored[k] == getattr(budget, k) for k in FRONTIER_ONLY):
        return False
    for result in done:
        was = _best_point(result)
        frontier_runs(budget, result, taste, extra, log)
        if result.seed == budget.first_seed and _best_point(result) != was and grid.exists():
            grid.unlink()
            log(f"{grid}: removed, its frontier row showed another point (a fresh run writes it again)")
    return True


FRONTIER_BLIND = ("guard.pairs", "guard.search", "guard.strength_tries", "guard.margin", "guard.steer",
                  "experimental.guard.steer", "picks.pessimism", "experimental.picks.pessimism", "picks.head",
                  "picks.backbone", "guard.validation")
"""Options (``--set``) the frontier sets itself or never reads: a run that differs from another only in
these (and in the person, the rounds or the tree counts) may take that run's frontier."""
_NOT_FRONTIER = ("seeds", "trees", "at", "rounds", "mistakes", "likes", "dislikes", "margin", "modes",
                 "first_seed", "picks_weights", "every_point")


def _frontier_keys(budget: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in budget.items() if k not in _NOT_FRONTIER}


def _frontier_extra(extra: Sequence[str]) -> list[str]:
    return [e for e in extra if e.partition("=")[0].strip() not in FRONTIER_BLIND]


def borrowed_frontiers(source: Path, budget: TasteBudget, extra: Sequence[str], code: dict[str, Any]
                       ) -> dict[int, dict[str, dict[str, Any]]]:
    """Per seed, the frontier stored in ``source`` (a ``taste.json``), refused in one line unless that run
    had the same code, the same frontier budget and the same options the frontier reads."""
    data = load_json(source)
    if data is None:
        raise ValueError(f"--frontier-from: {source} does not exist")
    results = seed_results(data)
    check_resume([r.code for r in results], code, source)
    mine = _frontier_keys(json.loads(json.dumps(asdict(budget))))
    if _frontier_keys(budget_fields(data)) != mine:
        raise ValueError(f"--frontier-from: {source} trained its frontier with another budget")
    if _frontier_extra(data.get("extra", [])) != _frontier_extra(extra):
        raise ValueError(f"--frontier-from: {source} ran with other --set options that its frontier reads "
                         f"({_frontier_extra(data.get('extra', []))})")
    return {r.seed: r.frontier for r in results}
