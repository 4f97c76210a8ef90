"""The method as TreeRPO Train LoRA from Picks runs it: the benchmark hands the node's own training
(``trainer.training.session.train_from_picks``) a picks folder and the node's config, then measures the
run it kept on the test pairs.

Why not the benchmark's own loop: a figure should be about what a person gets by pressing run. The node
builds its config from :data:`~...config.picks_budget.PICKS_BUDGET` and its widgets, trains on the
prompts of the labelled trees, measures the guard on those prompts at seeds training never draws, fits
the personal reward on every labelled tree of the folder, and trains once per picks weight. Here the same
function does all of that; :func:`node_config` is the config the node builds, and a test holds the two
equal (tests/test_picks_budget.py).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...config.files import load_config
from ...config.picks_budget import PicksBudget
from ...config.schema import TrainConfig
from ...guard.levels import GUARDED_PICKS_WEIGHT
from ...preferences.store import TREES, PickStore
from ...rewards.registry import PICKS
from ...training.evaluate import EvalPair, generate
from .method import trail_test_points
from .person import Taste


def folder_with(store: PickStore, ids: Sequence[str], dest: Path) -> PickStore:
    """A picks folder at ``dest`` holding copies of the trees ``ids`` of ``store``, picks included: what a
    person's folder holds after labelling exactly those trees."""
    (dest / TREES).mkdir(parents=True, exist_ok=True)
    for tree_id in ids:
        shutil.copytree(store.root / TREES / tree_id, dest / TREES / tree_id)
    return PickStore(dest)


def node_overrides(iterations: int, seed: int, budget: PicksBudget, keep: str = "closely") -> list[str]:
    """The overrides the node's widgets and the budget give a guarded run in reward mode on the embedded
    model (``nodes/picks.py``, ``picks_config``), before its settings box."""
    return [f"iterations={iterations}", "strategy=dynamic_treerpo", f"seed={seed}", *budget.overrides(),
            "picks.mode=reward", f"guard.keep={keep}"]


def node_config(budget: PicksBudget, folder: Path, prompts_file: Path, seed: int, keep: str = "closely",
                extra: Sequence[str] = (), iterations: int | None = None) -> TrainConfig:
    """The config the node trains a picks folder with (the scene reward as the guard): its reward, the
    folder's prompts, the budget's rounds; ``extra`` (``--set`` lines) last, as the settings box."""
    overrides = node_overrides(iterations or budget.iterations, seed, budget, keep)
    config = load_config(TrainConfig, None, [*overrides, *extra])
    reward = f"{PICKS}:{GUARDED_PICKS_WEIGHT:g},scene:{1 - GUARDED_PICKS_WEIGHT:g}"
    return replace(config, reward=reward, reward_weights={PICKS: str(folder)},
                   data=replace(config.data, prompts=str(prompts_file)))


def folder_prompts(store: PickStore) -> list[str]:
    """The prompts of the folder's labelled trees, each once, in order (the node's ``folder_prompts``)."""
    return list(dict.fromkeys(store.meta(t).prompt for t, _ in store.labelled()))


def train_as_node(budget: PicksBudget, store: PickStore, seed: int, work: Path, keep: str = "closely",
                  extra: Sequence[str] = ()) -> tuple[Any, Any, dict[str, float]]:
    """Train the folder as the node does: ``(policy with the chosen weights, TrainingState, costs)``; the
    costs are the seconds spent and the images the training and the guard drew."""
    from ...embedded.policy import EmbeddedPolicy
    from ...training.session import train_from_picks

    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(folder_prompts(store)) + "\n", encoding="utf-8")
    config = node_config(budget, store.root, prompts, seed, keep, extra)
    policy = EmbeddedPolicy.from_pretrained()
    training = [0.0]

    def count(_: int, row: dict[str, Any]) -> None:  # the training steps' own seconds, every weight's run
        training[0] += float(row.get("iteration_s", 0.0))

    started, cpu = time.perf_counter(), time.process_time()
    state = train_from_picks(policy, store.root, config, config.iterations, on_iteration=count,
                             log=lambda _: None)
    seconds = time.perf_counter() - started
    costs = {"seconds": seconds, "cpu_seconds": time.process_time() - cpu, "training_seconds": training[0],
             "guard_seconds": seconds - training[0]}
    return state.policy, state, costs


@torch.no_grad()
def measure_pairs(policy: Any, pairs: Sequence[EvalPair], sigmas: torch.Tensor, max_batch: int, taste: Taste,
                  scene: Callable[..., dict[str, torch.Tensor]]) -> dict[str, float]:
    """The hidden taste and the scene reward of ``policy``'s images of ``pairs`` (its live weights)."""
    policy.eval()
    prompts = [p.prompt for p in pairs]
    images = generate(policy, prompts, [p.seed for p in pairs], sigmas, max_batch)
    return {"taste": float(taste(images, prompts).mean()),
            "scene": float(scene(images, prompts)["reward"].mean())}


def guard_images(state: Any) -> int:
    """Validation images the guard drew: the base once (the runs at each weight share it), then every
    checkpoint and strength each run measured."""
    trails = state.picks_weights.trails if state.picks_weights and state.picks_weights.trails else (
        state.guard.trail,)
    pairs = state.config.guard.pairs
    return pairs * (1 + sum(len(t.points) - 1 for t in trails))


def training_images(state: Any) -> int:
    """Images the training rollouts scored, over every picks weight's run (the tree's leaves per prompt)."""
    runs = len(state.picks_weights.weights) if state.picks_weights else 1
    c = state.config
    leaves = c.tree.trees_per_prompt * c.tree.branching ** c.tree.depth
    return runs * c.iterations * c.data.prompts_per_iteration * leaves


def node_round(budget: Any, seed: int, store: PickStore, ids: Sequence[str], work: Path, bed: Any,
               taste: Taste, scene: Callable[..., Any], before: dict[str, float], extra: Sequence[str],
               keep: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, Any], Any]:
    """The method on the labelled trees ``ids`` as the node runs it (a folder of exactly those trees),
    its kept run measured on the test pairs ``bed.pairs``: the run as ``taste.json`` stores it (with what
    it cost), and the trained policy with its state (for the on-policy check)."""
    from .method import fit_picks, summary

    folder = folder_with(store, ids, work / f"folder_{len(ids)}")
    policy, state, costs = train_as_node(budget.picks_budget(), folder, seed, work, budget.keep, extra)
    fit = fit_picks(folder, ids, state.config)  # the fit the run's reward made: same folder, same function
    sigmas, batch = bed.sigmas, state.config.max_batch

    def measure() -> dict[str, float]:
        return measure_pairs(policy, bed.pairs, sigmas, batch, taste, scene)

    points = trail_test_points(policy.transformer, state.guard, before, measure, budget.every_point)
    if keep is not None:
        from .measure import bed_images

        keep[f"{len(ids)} trees"] = bed_images(policy, bed, batch)
    costs.update({"training_images": training_images(state), "guard_images": guard_images(state)})
    run = summary(fit, state.guard, points)
    return {**run, "weights": state.picks_weights.to_json() if state.picks_weights else None,
            "costs": costs}, (policy, state, fit)
