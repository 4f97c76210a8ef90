"""``treerpo bench taste``: how much of a person's taste the default method learns from picks, on any
taste, with a simulated person, against the oracle frontier.

Per taste and seed, on the embedded model:

- **oracle frontier**: the hidden taste itself as the reward (``function:w, scene:1-w``), trained at each
  of ``frontier_weights``; at every checkpoint the taste and the scene reward (prompt-following) are
  measured on the held-out test pairs; per weight the best checkpoint whose scene fall stays within
  the guard's limit counts, and the frontier is the largest of those gains. It reads the hidden taste
  and chooses on the test pairs themselves, so it is an optimistic ceiling, not a method;
- **person's trees**: ``trees`` trees of the base model (8 leaves each) go into a picks folder through
  the real store, and :class:`~.person.SimulatedPerson` labels each (likes 2, dislikes 1, 15% mistakes);
- **the default method**, per labelled-tree count n (25, 50, 100): a personal reward fitted on the
  first n trees, training at the guard's picks weight (``picks:w, scene:1-w``) with the guard at its
  default: checkpoints measured on validation pairs (prompts that are neither trained on nor test
  prompts), the choice made from the personal reward and the scene reward only. The chosen checkpoint
  is then measured on the test pairs with the hidden taste and the scene reward.

Every figure is on held-out test prompt/seed pairs. ``taste.json`` (one per taste) keeps per-seed
values and is written after every seed, so a stopped run resumes (``--resume``) where it stopped.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ...preferences.store import PickStore
from ...rewards.registry import get_reward
from ...training.loop import Trainer
from ..common.provenance import check_resume, provenance
from .as_node import measure_pairs, node_round
from .budget import SeedResult, TasteBudget, bench_config
from .frontier import best_frontier, borrowed_frontiers, frontier_name, frontier_runs, redo_frontier
from .measure import (
    TestBed,
    bed_images,
    grid_images,
    grid_tree_count,
    measure,
    measure_base,
    test_bed,
    write_grid,
)
from .method import (
    fit_picks,
    on_policy_accuracy,
    picks_features,
    second_round_trees,
    summary,
    test_points,
    train_guarded,
)
from .person import SimulatedPerson, Taste, load_taste
from .storage import (
    budget_fields,
    load_json,
    per_seed_budget,
    reload,
    run_piece,
    seed_pieces,
    seed_results,
    write_taste_json,
)
from .trees import first_plan, person_trees, template_trees, tree_seeds


def _quiet(_: str) -> None:
    return None


def one_round(budget: TasteBudget, seed: int, store: PickStore, ids: Sequence[str], taste: Taste,
              scene: Callable[..., Any], extra: Sequence[str], keep: dict[str, torch.Tensor] | None = None,
              before: dict[str, float] | None = None) -> tuple[dict[str, Any], Any]:
    """The default method on the labelled trees ``ids``: the personal reward, training under the guard
    (validation pairs only), then the chosen checkpoint measured on the test pairs; ``before``: the base
    model's test figures (measured here when not given). Also ``(trainer, fit)``, for a second round."""
    config = bench_config(budget, seed, "scene", {}, extra)
    fit = fit_picks(store, ids, config)
    trainer, result, weights = train_guarded(config, fit, budget.picks_weights or (budget.picks_weight,),
                                             _quiet)
    if keep is not None:
        keep[f"{len(ids)} trees"] = grid_images(trainer)
    before = before or measure_base(trainer, result, taste, scene)
    run = summary(fit, result, test_points(trainer, result, before, taste, scene, measure))
    return {**run, "weights": weights.to_json()}, (trainer, fit)


def two_rounds(budget: TasteBudget, seed: int, store: PickStore, ids: Sequence[str], n: int, taste: Taste,
               scene: Callable[..., Any], extra: Sequence[str], person: SimulatedPerson,
               before: dict[str, float], keep: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """``n`` clicks in two rounds: the first ``n // 2`` base-model trees train a first model; the person
    labels ``n - n // 2`` trees that the chosen model samples (the same prompts as the first trees, other
    seeds); the reward refitted on all of them trains again from the base model."""
    first = list(ids[: n // 2])
    run1, (trainer, fit1) = one_round(budget, seed, store, first, taste, scene, extra, before=before)
    count = n - len(first)
    prompts = [store.meta(t).prompt for t in itertools.islice(itertools.cycle(first), count)]
    config = trainer.config
    second = second_round_trees(trainer, store, prompts, tree_seeds(seed + 555 + n, count),
                                first_plan(config, trainer.policy), person,
                                random.Random(seed * 7919 + 2 * n + 3))
    features = picks_features(config)
    on_policy = on_policy_accuracy(fit1, store, second, features)
    base_accuracy = on_policy_accuracy(fit1, store, list(ids[n // 2: n // 2 + count]), features)
    del trainer
    run2, _ = one_round(budget, seed, store, [*first, *second], taste, scene, extra, keep, before)
    chosen = run1["chosen"]
    return {**run2, "rounds": [
        {"trees": len(first), "model": "base", "chosen": [chosen["iteration"], chosen["strength"]],
         "taste": run1["taste"], "scene": run1["scene"]},
        {"trees": count, "model": f"round 1 at {chosen['iteration']}@{chosen['strength']:g}",
         "first_reward_accuracy": on_policy, "first_reward_accuracy_on_base_trees": base_accuracy}]}


ON_POLICY_TREES = 8
"""Trees the chosen model samples after a one-round run, labelled by the person, on which the personal
reward's pair accuracy is measured: does the reward still order what training moved to?"""


def on_policy_check(budget: TasteBudget, seed: int, n: int, trainer: Any, fit: Any, store: PickStore,
                    ids: Sequence[str], person: SimulatedPerson) -> dict[str, Any]:
    """The personal reward's pair accuracy on ``ON_POLICY_TREES`` trees of the chosen model (the prompts of
    the person's first trees, other seeds), beside its held-out accuracy on base-model trees. The trees go
    to the store after the method ran, so they change none of its figures."""
    count = min(ON_POLICY_TREES, len(ids))
    prompts = [store.meta(t).prompt for t in itertools.islice(itertools.cycle(ids), count)]
    trees = second_round_trees(trainer, store, prompts, tree_seeds(seed + 777 + n, count),
                               first_plan(trainer.config, trainer.policy), person,
                               random.Random(seed * 7919 + 5 * n + 11))
    return {"trees": count, "accuracy": on_policy_accuracy(fit, store, trees, picks_features(trainer.config))}


def run_seed(budget: TasteBudget, seed: int, taste_spec: str, folder: Path, extra: Sequence[str],
             log: Callable[[str], None], grid: Path | None = None,
             frontier: dict[str, dict[str, Any]] | None = None, pieces: Path | None = None) -> SeedResult:
    """One seed: the frontier, the person's trees, and the method at each tree count; ``grid``: write the
    test images before, from the picks and with the frontier's best there. ``frontier``: this seed's
    frontier from another run of the same code and budget (``--frontier-from``), not trained again (the
    grid then has no frontier row). ``pieces``: where each finished frontier arm and tree count is kept
    until the seed is whole, so that a stopped run resumes inside the seed (its draws do not depend on
    the pieces before it)."""
    name, taste = load_taste(taste_spec)
    scene = get_reward("scene")
    keep: dict[str, torch.Tensor] | None = {} if grid is not None else None
    probe = Trainer(bench_config(budget, seed, "scene", {}, extra), evaluation=not budget.template)
    bed = test_bed(budget, probe, folder)
    before = measure_pairs(probe.policy, bed.pairs, bed.sigmas, probe.config.max_batch, taste, scene)
    if keep is not None:
        keep["before"] = bed_images(probe.policy, bed, probe.config.max_batch)
    shift = probe.config.sampling.shift
    del probe
    result = SeedResult(seed, before["taste"], before["scene"])
    if frontier is not None:
        result.frontier = frontier
        best = best_frontier(result)
        result.oracle = {"taste": best["taste"], "scene": best["scene"], "weight": best["weight"]}
        log(f"{name} seed {seed}: the frontier of --frontier-from, taste {best['gain']:+.4f}")
    else:
        best = frontier_runs(budget, result, taste_spec, extra, log, keep, pieces, bed)
    if keep is not None:  # one frontier row in the grid: the best weight's
        best_row = f"frontier {frontier_name(best['weight'])}"
        keep = {k: v for k, v in keep.items() if not k.startswith("frontier") or k == best_row}
    person = SimulatedPerson(taste, budget.likes, budget.dislikes, budget.mistakes)
    if budget.template:
        store, ids = template_trees(seed, folder / f"seed{seed}", person, shift)
    else:
        store, ids = person_trees(budget, seed, folder / f"seed{seed}", person, extra)
    method = seed_method(budget, seed, store, ids, taste, scene, extra, person, before, folder, bed)
    for n in budget.tree_counts():
        shown = keep if keep is not None and n == grid_tree_count(budget) else None
        run = run_piece(pieces, f"trees_{n}", shown, lambda n=n, shown=shown: method(n, shown))
        result.reward[n] = run
        log(f"{name} seed {seed}, {n} trees: held-out pair accuracy {run['accuracy']:.3f}; taste "
            f"{run['taste'] - before['taste']:+.4f}, scene {run['scene'] - before['scene']:+.4f}; "
            f"{run['chosen']['reason']}")
    if grid is not None and keep:
        write_grid(keep, grid)
    return result


def seed_method(budget: TasteBudget, seed: int, store: PickStore, ids: Sequence[str], taste: Taste,
                scene: Callable[..., Any], extra: Sequence[str], person: SimulatedPerson,
                before: dict[str, float], folder: Path, bed: TestBed
                ) -> Callable[[int, dict[str, torch.Tensor] | None], dict[str, Any]]:
    """The method of a seed at ``n`` labelled trees: as the node runs it (``as_node``), or the benchmark's
    own loop of runs stored before 0.6 (one round or two), each with its on-policy check."""
    def method(n: int, shown: dict[str, torch.Tensor] | None) -> dict[str, Any]:
        if budget.as_node:
            work = folder / f"seed{seed}_trees{n}"
            work.mkdir(parents=True, exist_ok=True)
            run, (policy, state, fit) = node_round(budget, seed, store, ids[:n], work, bed, taste, scene,
                                                   before, extra, shown)
            trained = SimpleNamespace(policy=policy, config=state.config)
            run["on_policy"] = on_policy_check(budget, seed, n, trained, fit, store, ids[:n], person)
            return run
        if budget.rounds == 2:
            return two_rounds(budget, seed, store, ids, n, taste, scene, extra, person, before, shown)
        run, (trainer, fit) = one_round(budget, seed, store, ids[:n], taste, scene, extra, shown, before)
        run["on_policy"] = on_policy_check(budget, seed, n, trainer, fit, store, ids[:n], person)
        return run

    return method


def run_taste(budget: TasteBudget, taste: str, out: Path, extra: Sequence[str] = (),
              log: Callable[[str], None] = print, command: str = "", resume: bool = False,
              frontier_from: Path | None = None) -> dict[str, Any]:
    """Every seed of one taste into ``out/taste.json`` (written after each seed); with ``resume``, the
    seeds already there are kept (their frontier redone if only ``frontier_strengths`` changed) and the
    rest run (the same budget and the same code otherwise). ``frontier_from``: another run's
    ``taste.json`` whose frontier the seeds take instead of training it again (an ablation of the method,
    on the same seeds)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("tmp*"):  # the person's trees of a run that was stopped (made again as needed)
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    path = out / "taste.json"
    code = provenance()
    borrowed = borrowed_frontiers(frontier_from, budget, extra, code) if frontier_from else {}
    done: list[SeedResult] = []
    previous = load_json(path) if resume else None
    wanted = [budget.first_seed + k for k in range(budget.seeds)]
    if previous is not None:
        mine = per_seed_budget(json.loads(json.dumps(asdict(budget))))
        if per_seed_budget(budget_fields(previous)) != mine:
            raise ValueError(f"{path} was made with another budget: run without --resume into another --out")
        done = seed_results(previous)
        check_resume([r.code for r in done], code, path)
        if "extra" in previous and list(previous["extra"]) != list(extra):
            raise ValueError(f"{path} was made with other --set options ({previous['extra']}): run without "
                             "--resume into another --out")
        if redo_frontier(budget, done, previous, taste, extra, log, out / "before_after.png"):
            write_taste_json(path, done, budget, taste, command, wanted, extra)
    with tempfile.TemporaryDirectory(dir=out) as work:
        for seed in wanted:
            if any(r.seed == seed for r in done):
                continue
            grid = out / "before_after.png" if seed == wanted[0] else None
            pieces = seed_pieces(out, seed, code, resume)
            result = run_seed(budget, seed, taste, Path(work), extra, log, grid, borrowed.get(seed), pieces)
            result.code = code
            done.append(result)
            write_taste_json(path, done, budget, taste, command, wanted, extra)
            shutil.rmtree(pieces, ignore_errors=True)  # the seed is whole in taste.json
    return reload(out)

