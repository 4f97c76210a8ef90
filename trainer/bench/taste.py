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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config.files import load_config
from ..config.schema import TrainConfig
from ..core.flow import make_sigmas
from ..guard.choice import choose, take
from ..guard.levels import GUARDED_PICKS_WEIGHT
from ..guard.weights import DEFAULT_WEIGHTS
from ..preferences.store import PickStore
from ..rewards.registry import get_reward
from ..training.evaluate import generate
from ..training.from_picks import model_id, store_trees
from ..training.guarded import guard_trainer, separate_validation_pairs
from ..training.loop import Trainer
from ..training.plans import iteration_plan, iteration_seeds
from ..utils.atomic import atomic_write_text
from .common.provenance import check_resume, provenance, versions
from .person import SimulatedPerson, Taste, load_taste
from .taste_method import (
    fit_picks,
    label_trees,
    on_policy_accuracy,
    picks_features,
    second_round_trees,
    summary,
    test_points,
    train_guarded,
)

CHECKPOINTS = (25, 50, 100)
FRONTIER_WEIGHTS = (0.3, 0.5, 0.8)
TASTE_SET = ("larger_objects", "central_objects", "deep_shades", "lower_objects", "warm_shades")
"""The tastes of the published table: the three built in first, two of kinds added for it (where the
objects sit, and warm against cool shades), both of which pull against the prompt."""
QUICK_TASTES = ("larger_objects", "lower_objects")
GRID_PAIRS = 8  # held-out pairs in the before/after grid


@dataclass(frozen=True)
class TasteBudget:
    """How much the benchmark trains, labels and measures."""

    trees: int = 100
    seeds: int = 5
    iterations: int = 24
    prompts_per_iteration: int = 8
    lr: float = 0.0016
    eval_pairs: int = 512  # held-out test pairs: every reported figure (128 measure a fall to +-0.015)
    validation_pairs: int = 512  # the guard's (never test prompts, never trained on): guard.pairs' default
    keep: str = "closely"
    checkpoints: int = 4
    margin: float = 1.0
    picks_weight: float = GUARDED_PICKS_WEIGHT  # the reward as written; the steered frontier starts there
    picks_weights: tuple[float, ...] = DEFAULT_WEIGHTS  # the guard's (guard.weights); (): picks_weight alone
    frontier_weights: tuple[float, ...] = FRONTIER_WEIGHTS
    frontier_strengths: int = 4  # lower LoRA strengths the frontier tries, as the guard does (0: none)
    likes: int = 2
    dislikes: int = 1
    mistakes: float = 0.15
    first_seed: int = 0
    modes: tuple[str, ...] = ("reward",)
    rounds: int = 1  # 2: half the clicks on base-model trees, half on trees of the first round's model
    frontier_steer: bool = True  # the frontier also trains the hidden taste with the guard steering
    at: tuple[int, ...] = CHECKPOINTS  # labelled-tree counts measured (those below ``trees``, and it)

    def __post_init__(self) -> None:
        if self.rounds not in (1, 2):
            raise ValueError(f"rounds must be 1 or 2, got {self.rounds}")
        if self.rounds == 2 and min(self.tree_counts()) < 2:
            raise ValueError("two rounds need at least 2 labelled trees at every count (--at)")

    def tree_counts(self) -> list[int]:
        points = [n for n in self.at if n < self.trees]
        return [*points, self.trees]


QUICK = TasteBudget(trees=6, seeds=2, iterations=2, prompts_per_iteration=2, eval_pairs=4,
                    validation_pairs=4, checkpoints=2, frontier_weights=(0.3, 0.5), at=(3,), rounds=2)
QUICK_OVERRIDES = ("tree.steps=6", "sampling.eval_steps=3", "lora.rank=4")


@dataclass
class SeedResult:
    seed: int
    taste_before: float
    scene_before: float
    oracle: dict[str, float] = field(default_factory=dict)  # the frontier's best point: taste, scene
    frontier: dict[str, dict[str, Any]] = field(default_factory=dict)  # weight -> best point and trail
    reward: dict[int, dict[str, Any]] = field(default_factory=dict)  # trees -> taste, scene, chosen, ...
    code: dict[str, Any] | None = None  # the code version that ran this seed (provenance.provenance)


def _config(budget: TasteBudget, seed: int, reward: str, weights: dict[str, str], extra: Sequence[str]
            ) -> TrainConfig:
    spec = ", ".join(f"{k}: {v}" for k, v in weights.items())
    return load_config(TrainConfig, None, [
        f"seed={seed}", f"iterations={budget.iterations}", f"optim.lr={budget.lr}",
        f"data.prompts_per_iteration={budget.prompts_per_iteration}", f"data.eval_pairs={budget.eval_pairs}",
        f"reward={reward}", f"reward_weights={{{spec}}}", f"guard.keep={budget.keep}",
        f"guard.checkpoints={budget.checkpoints}", f"guard.pairs={budget.validation_pairs}",
        f"guard.margin={budget.margin}", *extra])


@torch.no_grad()
def measure(trainer: Trainer, taste: Taste, scene: Callable[..., dict[str, torch.Tensor]]
            ) -> dict[str, float]:
    """The hidden taste and the scene reward of the model's held-out test images (its live weights)."""
    trainer.policy.eval()
    pairs = trainer.eval_pairs
    prompts = [p.prompt for p in pairs]
    images = generate(trainer.policy, prompts, [p.seed for p in pairs], trainer.eval_sigmas,
                      trainer.config.max_batch)
    return {"taste": float(taste(images, prompts).mean()),
            "scene": float(scene(images, prompts)["reward"].mean())}


@torch.no_grad()
def grid_images(trainer: Trainer) -> torch.Tensor:
    """The first ``GRID_PAIRS`` test images under the current weights (the before/after grid)."""
    pairs = trainer.eval_pairs[:GRID_PAIRS]
    trainer.policy.eval()
    return generate(trainer.policy, [p.prompt for p in pairs], [p.seed for p in pairs], trainer.eval_sigmas,
                    trainer.config.max_batch).float().cpu()


def _quiet(_: str) -> None:
    return None


def frontier_run(budget: TasteBudget, seed: int, weight: float, taste_name: str, extra: Sequence[str],
                 keep: dict[str, torch.Tensor] | None = None, steer: bool = False) -> dict[str, Any]:
    """The hidden taste as the reward at ``weight``: checkpoints, and lower LoRA strengths of those past the
    limit as the guard tries them, measured on the test pairs; the best one whose scene fall is within the
    limit (margin 0: the frontier is chosen on the test figures). Without the strengths the frontier
    would not be a ceiling for the method, which may scale its LoRA down. ``steer``: the guard steers the
    weight from ``weight`` on (measuring on the test pairs), the method's own way to the limit."""
    function = {"function": f"dynamic_treerpo.trainer.bench.tastes:{taste_name}"} if ":" not in taste_name \
        else {"function": taste_name}
    config = _config(budget, seed, f"function:{weight:g},scene:{1 - weight:g}", function,
                     [*extra, f"guard.strength_tries={budget.frontier_strengths}", "guard.margin=0",
                      "guard.search=bisect", f"experimental.guard.steer={str(steer).lower()}"])
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


def person_trees(budget: TasteBudget, seed: int, folder: Path, person: SimulatedPerson, extra: Sequence[str]
                 ) -> tuple[PickStore, list[str]]:
    """``budget.trees`` base-model trees of training prompts, labelled by the person."""
    from ..embedded.policy import EmbeddedPolicy

    config = _config(budget, seed, "scene", {}, extra)
    policy = EmbeddedPolicy.from_pretrained()
    store = PickStore(folder, create=True)
    prompts = _prompts(config, seed, budget.trees)
    ids = store_trees(policy, store, prompts, _seeds(seed, budget.trees), first_plan(config, policy),
                      model_id(policy, "embedded"), max_batch=config.max_batch)
    label_trees(store, ids, person, random.Random(seed * 7919 + 1))
    return store, ids


def _one_round(budget: TasteBudget, seed: int, store: PickStore, ids: Sequence[str], taste: Taste,
               scene: Callable[..., Any], extra: Sequence[str], keep: dict[str, torch.Tensor] | None = None,
               before: dict[str, float] | None = None) -> tuple[dict[str, Any], Any]:
    """The default method on the labelled trees ``ids``: the personal reward, training under the guard
    (validation pairs only), then the chosen checkpoint measured on the test pairs; ``before``: the base
    model's test figures (measured here when not given). Also ``(trainer, fit)``, for a second round."""
    config = _config(budget, seed, "scene", {}, extra)
    fit = fit_picks(store, ids, config)
    trainer, result, weights = train_guarded(config, fit, budget.picks_weights or (budget.picks_weight,),
                                             _quiet)
    if keep is not None:
        keep[f"{len(ids)} trees"] = grid_images(trainer)
    before = before or measure_base(trainer, result, taste, scene)
    run = summary(fit, result, test_points(trainer, result, before, taste, scene, measure))
    return {**run, "weights": weights.to_json()}, (trainer, fit)


def measure_base(trainer: Trainer, result: Any, taste: Taste, scene: Callable[..., Any]) -> dict[str, float]:
    """The base model's test figures (the run's zero LoRA), the chosen weights loaded back after."""
    result.apply(trainer.policy.transformer, take(result.trail, 0, 0.0))
    figures = measure(trainer, taste, scene)
    result.apply(trainer.policy.transformer)
    return figures


def two_rounds(budget: TasteBudget, seed: int, store: PickStore, ids: Sequence[str], n: int, taste: Taste,
               scene: Callable[..., Any], extra: Sequence[str], person: SimulatedPerson,
               before: dict[str, float], keep: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """``n`` clicks in two rounds: the first ``n // 2`` base-model trees train a first model; the person
    labels ``n - n // 2`` trees that the chosen model samples (the same prompts as the first trees, other
    seeds); the reward refitted on all of them trains again from the base model."""
    first = list(ids[: n // 2])
    run1, (trainer, fit1) = _one_round(budget, seed, store, first, taste, scene, extra, before=before)
    count = n - len(first)
    prompts = [store.meta(t).prompt for t in itertools.islice(itertools.cycle(first), count)]
    config = trainer.config
    second = second_round_trees(trainer, store, prompts, _seeds(seed + 555 + n, count),
                                first_plan(config, trainer.policy), person,
                                random.Random(seed * 7919 + 2 * n + 3))
    features = picks_features(config)
    on_policy = on_policy_accuracy(fit1, store, second, features)
    base_accuracy = on_policy_accuracy(fit1, store, list(ids[n // 2: n // 2 + count]), features)
    del trainer
    run2, _ = _one_round(budget, seed, store, [*first, *second], taste, scene, extra, keep, before)
    chosen = run1["chosen"]
    return {**run2, "rounds": [
        {"trees": len(first), "model": "base", "chosen": [chosen["iteration"], chosen["strength"]],
         "taste": run1["taste"], "scene": run1["scene"]},
        {"trees": count, "model": f"round 1 at {chosen['iteration']}@{chosen['strength']:g}",
         "first_reward_accuracy": on_policy, "first_reward_accuracy_on_base_trees": base_accuracy}]}


ON_POLICY_TREES = 8
"""Trees the chosen model samples after a one-round run, labelled by the person, on which the personal
reward's pair accuracy is measured: does the reward still order what training moved to?"""


def on_policy_check(budget: TasteBudget, seed: int, n: int, trainer: Trainer, fit: Any, store: PickStore,
                    ids: Sequence[str], person: SimulatedPerson) -> dict[str, Any]:
    """The personal reward's pair accuracy on ``ON_POLICY_TREES`` trees of the chosen model (the prompts of
    the person's first trees, other seeds), beside its held-out accuracy on base-model trees. The trees go
    to the store after the method ran, so they change none of its figures."""
    count = min(ON_POLICY_TREES, len(ids))
    prompts = [store.meta(t).prompt for t in itertools.islice(itertools.cycle(ids), count)]
    trees = second_round_trees(trainer, store, prompts, _seeds(seed + 777 + n, count),
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
    probe = Trainer(_config(budget, seed, "scene", {}, extra))
    before = measure(probe, taste, scene)
    if keep is not None:
        keep["before"] = grid_images(probe)
    del probe
    result = SeedResult(seed, before["taste"], before["scene"])
    if frontier is not None:
        result.frontier = frontier
        best = best_frontier(result)
        result.oracle = {"taste": best["taste"], "scene": best["scene"], "weight": best["weight"]}
        log(f"{name} seed {seed}: the frontier of --frontier-from, taste {best['gain']:+.4f}")
    else:
        best = frontier_runs(budget, result, taste_spec, extra, log, keep, pieces)
    if keep is not None:  # one frontier row in the grid: the best weight's
        best_row = f"frontier {frontier_name(best['weight'])}"
        keep = {k: v for k, v in keep.items() if not k.startswith("frontier") or k == best_row}
    person = SimulatedPerson(taste, budget.likes, budget.dislikes, budget.mistakes)
    store, ids = person_trees(budget, seed, folder / f"seed{seed}", person, extra)
    def method(n: int, shown: dict[str, torch.Tensor] | None) -> dict[str, Any]:
        if budget.rounds == 2:
            return two_rounds(budget, seed, store, ids, n, taste, scene, extra, person, before, shown)
        run, (trainer, fit) = _one_round(budget, seed, store, ids[:n], taste, scene, extra, shown, before)
        run["on_policy"] = on_policy_check(budget, seed, n, trainer, fit, store, ids[:n], person)
        return run

    for n in budget.tree_counts():
        shown = keep if keep is not None and n == _grid_count(budget) else None
        run = _run_piece(pieces, f"trees_{n}", shown, lambda n=n, shown=shown: method(n, shown))
        result.reward[n] = run
        log(f"{name} seed {seed}, {n} trees: held-out pair accuracy {run['accuracy']:.3f}; taste "
            f"{run['taste'] - before['taste']:+.4f}, scene {run['scene'] - before['scene']:+.4f}; "
            f"{run['chosen']['reason']}")
    if grid is not None and keep:
        write_grid(keep, grid)
    return result


def load_piece(pieces: Path | None, name: str, keep: dict[str, torch.Tensor] | None) -> dict[str, Any] | None:
    """A finished piece of a seed (a frontier arm, a tree count) kept in ``pieces``, its grid rows put
    into ``keep``; None when it has not run."""
    if pieces is None or not (pieces / f"{name}.json").is_file():
        return None
    images = pieces / f"{name}.pt"
    if keep is not None and images.is_file():
        keep.update(torch.load(images, weights_only=True))
    return json.loads((pieces / f"{name}.json").read_text(encoding="utf-8"))


def save_piece(pieces: Path | None, name: str, value: dict[str, Any], rows: dict[str, torch.Tensor]) -> None:
    """Keep a finished piece (and the grid rows it made) until its seed is whole."""
    if pieces is None:
        return
    if rows:
        torch.save(rows, pieces / f"{name}.pt")
    atomic_write_text(pieces / f"{name}.json", json.dumps(value) + "\n")


def _run_piece(pieces: Path | None, name: str, keep: dict[str, torch.Tensor] | None,
               run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()`` unless ``pieces`` holds its result already (a resumed seed); kept there after."""
    found = load_piece(pieces, name, keep)
    if found is not None:
        return found
    had = set(keep or {})
    value = run()
    save_piece(pieces, name, value, {k: v for k, v in (keep or {}).items() if k not in had})
    return value


def frontier_runs(budget: TasteBudget, result: SeedResult, taste_spec: str, extra: Sequence[str],
                  log: Callable[[str], None], keep: dict[str, torch.Tensor] | None = None,
                  pieces: Path | None = None) -> dict[str, Any]:
    """The frontier at every weight into ``result`` (its ``frontier`` and ``oracle``); the best run.
    ``pieces``: where each finished arm is kept until the seed is whole (a stopped run resumes there)."""
    name = taste_spec.rpartition(":")[2]
    result.frontier = {}
    arms = [(f"{w:g}", w, False) for w in budget.frontier_weights]
    arms += [("steered", budget.picks_weight, True)] if budget.frontier_steer else []
    for key, weight, steer in arms:
        def arm(w: float = weight, s: bool = steer) -> dict[str, Any]:
            return frontier_run(budget, result.seed, w, taste_spec, extra, keep, s)
        run = _run_piece(pieces, f"frontier_{key}", keep, arm)
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


def _grid_count(budget: TasteBudget) -> int:
    counts = budget.tree_counts()
    return 50 if 50 in counts else counts[len(counts) // 2]


def write_grid(images: dict[str, torch.Tensor], path: Path) -> None:
    """Rows of the same held-out prompts and seeds: before, from the picks, the frontier's best."""
    from ..training.logs import save_image_grid

    rows = ["before", *[k for k in images if k.endswith("trees")],
            *[k for k in images if k.startswith("frontier")]]
    width = min(GRID_PAIRS, *(images[name].shape[0] for name in rows))
    stacked = torch.cat([images[name][:width] for name in rows])
    captions = [name if i == 0 else "" for name in rows for i in range(width)]
    save_image_grid(stacked, path, nrow=width, captions=captions)


def first_plan(config: TrainConfig, policy: Any) -> Any:
    """The tree plan of iteration 0 (the trees the person labels)."""
    s = config.sampling
    sigmas = make_sigmas(s.schedule, config.strategy_config.steps, s.shift, image_tokens=policy.image_tokens)
    return iteration_plan(config, sigmas, 0, policy.latent_unshuffle)


def _prompts(config: TrainConfig, seed: int, count: int) -> list[str]:
    from ..training.evaluate import PromptSource, eval_pairs_for

    d = config.data
    held = eval_pairs_for(d.prompts, d.eval_prompts, d.eval_pairs, d.eval_seed)
    validation = separate_validation_pairs(config, held)
    source = PromptSource(d.prompts, seed + 4242, exclude=[p.prompt for p in [*held, *validation]])
    return list(source.prompts(0, count))


def _seeds(seed: int, count: int) -> list[int]:
    return iteration_seeds(seed + 4242, 0, count)


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def seed_results(data: dict[str, Any]) -> list[SeedResult]:
    """The per-seed results stored in a ``taste.json``."""
    out = []
    for row in data.get("per_seed", []):
        row = dict(row)
        row["reward"] = {int(n): v for n, v in row.get("reward", {}).items()}
        out.append(SeedResult(**{k: v for k, v in row.items() if k in SeedResult.__dataclass_fields__}))
    return out


_FRONTIER_ONLY = ("frontier_strengths",)
"""Budget fields that change the frontier alone: a resumed run with another value redoes only the frontier
of the seeds already there (the person's trees and the method do not depend on it)."""


def _per_seed(budget: dict[str, Any]) -> dict[str, Any]:
    """The budget less its seed count and frontier-only fields: what each seed's method ran with (so a
    resumed run may add or drop seeds, or redo the frontier)."""
    return {k: v for k, v in budget.items() if k != "seeds" and k not in _FRONTIER_ONLY}


def _stored_budget(data: dict[str, Any]) -> dict[str, Any]:
    """A ``taste.json``'s budget; one written before ``frontier_strengths`` existed had none (0), one
    written before the guard chose the weight trained at ``picks_weight`` alone (no ``picks_weights``)."""
    return {"frontier_strengths": 0, "picks_weights": [], **data["budget"]}


def stored_budget(data: dict[str, Any]) -> TasteBudget:
    """The budget a stored ``taste.json`` was run with (its tuples as tuples again)."""
    b = _stored_budget(data)
    tuples = ("modes", "at", "frontier_weights", "picks_weights")
    return TasteBudget(**{**b, **{k: tuple(b[k]) for k in tuples}})


def _redo_frontier(budget: TasteBudget, done: list[SeedResult], previous: dict[str, Any], taste: str,
                   extra: Sequence[str], log: Callable[[str], None], grid: Path) -> bool:
    """Redo the frontier of the stored seeds when a frontier-only field changed; whether it did. The grid's
    frontier row shows the first seed's best point: when that point moves, the grid (which would need the
    method's images again) is removed rather than left showing another point."""
    stored = _stored_budget(previous)
    if all(stored[k] == getattr(budget, k) for k in _FRONTIER_ONLY):
        return False
    for result in done:
        was = _best_point(result)
        frontier_runs(budget, result, taste, extra, log)
        if result.seed == budget.first_seed and _best_point(result) != was and grid.exists():
            grid.unlink()
            log(f"{grid}: removed, its frontier row showed another point (a fresh run writes it again)")
    return True


def _best_point(result: SeedResult) -> tuple[Any, ...]:
    best = best_frontier(result)
    return best["weight"], best["iteration"], best.get("strength", 1.0)


FRONTIER_BLIND = ("guard.pairs", "guard.search", "guard.strength_tries", "guard.margin", "guard.steer",
                  "experimental.guard.steer", "picks.pessimism", "experimental.picks.pessimism", "picks.head",
                  "picks.backbone")
"""Options (``--set``) the frontier sets itself or never reads: a run that differs from another only in
these (and in the person, the rounds or the tree counts) may take that run's frontier."""
_NOT_FRONTIER = ("seeds", "trees", "at", "rounds", "mistakes", "likes", "dislikes", "margin", "modes",
                 "first_seed", "picks_weights")


def _frontier_keys(budget: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in budget.items() if k not in _NOT_FRONTIER}


def _frontier_extra(extra: Sequence[str]) -> list[str]:
    return [e for e in extra if e.partition("=")[0].strip() not in FRONTIER_BLIND]


def borrowed_frontiers(source: Path, budget: TasteBudget, extra: Sequence[str], code: dict[str, Any]
                       ) -> dict[int, dict[str, dict[str, Any]]]:
    """Per seed, the frontier stored in ``source`` (a ``taste.json``), refused in one line unless that run
    had the same code, the same frontier budget and the same options the frontier reads."""
    data = _load(source)
    if data is None:
        raise ValueError(f"--frontier-from: {source} does not exist")
    results = seed_results(data)
    check_resume([r.code for r in results], code, source)
    mine = _frontier_keys(json.loads(json.dumps(asdict(budget))))
    if _frontier_keys(_stored_budget(data)) != mine:
        raise ValueError(f"--frontier-from: {source} trained its frontier with another budget")
    if _frontier_extra(data.get("extra", [])) != _frontier_extra(extra):
        raise ValueError(f"--frontier-from: {source} ran with other --set options that its frontier reads "
                         f"({_frontier_extra(data.get('extra', []))})")
    return {r.seed: r.frontier for r in results}


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
    previous = _load(path) if resume else None
    wanted = [budget.first_seed + k for k in range(budget.seeds)]
    if previous is not None:
        if _per_seed(_stored_budget(previous)) != _per_seed(json.loads(json.dumps(asdict(budget)))):
            raise ValueError(f"{path} was made with another budget: run without --resume into another --out")
        done = seed_results(previous)
        check_resume([r.code for r in done], code, path)
        if "extra" in previous and list(previous["extra"]) != list(extra):
            raise ValueError(f"{path} was made with other --set options ({previous['extra']}): run without "
                             "--resume into another --out")
        if _redo_frontier(budget, done, previous, taste, extra, log, out / "before_after.png"):
            _write(path, done, budget, taste, command, wanted, extra)
    with tempfile.TemporaryDirectory(dir=out) as work:
        for seed in wanted:
            if any(r.seed == seed for r in done):
                continue
            grid = out / "before_after.png" if seed == wanted[0] else None
            pieces = seed_pieces(out, seed, code, resume)
            result = run_seed(budget, seed, taste, Path(work), extra, log, grid, borrowed.get(seed), pieces)
            result.code = code
            done.append(result)
            _write(path, done, budget, taste, command, wanted, extra)
            shutil.rmtree(pieces, ignore_errors=True)  # the seed is whole in taste.json
    return reload(out)


def seed_pieces(out: Path, seed: int, code: dict[str, Any], resume: bool) -> Path:
    """The folder that keeps a seed's finished pieces while it runs: reused by ``--resume`` when the
    same code made it (refused in one line otherwise), emptied for a fresh run."""
    pieces = out / f".seed{seed}.pieces"
    stamp = pieces / "code.json"
    if pieces.exists() and resume and stamp.is_file():
        made = json.loads(stamp.read_text(encoding="utf-8"))
        check_resume([made], code, pieces)
        return pieces
    shutil.rmtree(pieces, ignore_errors=True)
    pieces.mkdir(parents=True)
    atomic_write_text(stamp, json.dumps(code) + "\n")
    return pieces


def _write(path: Path, done: list[SeedResult], budget: TasteBudget, taste: str, command: str,
           wanted: Sequence[int], extra: Sequence[str] = (), note: dict[str, Any] | None = None) -> None:
    """``taste.json`` from the seeds ``done``; ``note``: keys added as they are (where a combined run
    came from)."""
    from .taste_summary import summarise

    summary = summarise(done, budget, taste)
    summary["per_seed"] = [asdict(r) for r in done]
    summary["command"] = command
    summary["extra"] = list(extra)
    summary["code"] = versions(r.code for r in done)
    summary["complete"] = all(any(r.seed == s for r in done) for s in wanted)
    summary.update(note or {})
    atomic_write_text(path, json.dumps(summary, indent=1) + "\n")


CARRIED = ("combined_from",)
"""``taste.json`` keys a summary carries over as they are (see :func:`_write`'s ``note``)."""


def reload(out: Path) -> dict[str, Any]:
    """``out/taste.json`` summarised again from its per-seed values (with this version's figures)."""
    from .taste_summary import summarise

    data = json.loads((out / "taste.json").read_text(encoding="utf-8"))
    budget = stored_budget(data)
    results = seed_results(data)
    summary = summarise(results, budget, data["taste"])
    summary["per_seed"] = [asdict(r) for r in results]
    summary["command"] = data.get("command", "")
    summary["extra"] = data.get("extra", [])
    summary["code"] = versions(r.code for r in results)
    summary["complete"] = data.get("complete", True)
    summary.update({k: data[k] for k in CARRIED if k in data})
    return summary
