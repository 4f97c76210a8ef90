"""The trees a simulated person labels: training prompts that avoid every test and validation prompt,
their seeds, and the base model's tree plan, stored through the real picks store.

Why shared: ``bench taste`` and ``bench picking`` show the person the same kind of trees, so a figure
of one benchmark (how many clicks the reward needs) speaks about the trees of the other.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...config.schema import TrainConfig
from ...core.flow import make_sigmas
from ...preferences.store import PickStore
from ...training.from_picks import model_id, store_trees
from ...training.guarded import separate_validation_pairs
from ...training.plans import iteration_plan, iteration_seeds
from .budget import TasteBudget, bench_config
from .method import label_trees
from .person import SimulatedPerson


def first_plan(config: TrainConfig, policy: Any) -> Any:
    """The tree plan of iteration 0 (the trees the person labels)."""
    s = config.sampling
    sigmas = make_sigmas(s.schedule, config.strategy_config.steps, s.shift, image_tokens=policy.image_tokens)
    return iteration_plan(config, sigmas, 0, policy.latent_unshuffle)


def tree_prompts(config: TrainConfig, seed: int, count: int) -> list[str]:
    """``count`` training prompts for the person's trees, none of them a test or validation prompt."""
    from ...training.evaluate import PromptSource, eval_pairs_for

    d = config.data
    held = eval_pairs_for(d.prompts, d.eval_prompts, d.eval_pairs, d.eval_seed)
    validation = separate_validation_pairs(config, held)
    source = PromptSource(d.prompts, seed + 4242, exclude=[p.prompt for p in [*held, *validation]])
    return list(source.prompts(0, count))


def tree_seeds(seed: int, count: int) -> list[int]:
    """The sampling seeds of the person's ``count`` trees."""
    return iteration_seeds(seed + 4242, 0, count)


def person_trees(budget: TasteBudget, seed: int, folder: Path, person: SimulatedPerson, extra: Sequence[str]
                 ) -> tuple[PickStore, list[str]]:
    """``budget.trees`` base-model trees of training prompts, labelled by the person."""
    from ...embedded.policy import EmbeddedPolicy

    config = bench_config(budget, seed, "scene", {}, extra)
    policy = EmbeddedPolicy.from_pretrained()
    store = PickStore(folder, create=True)
    prompts = tree_prompts(config, seed, budget.trees)
    ids = store_trees(policy, store, prompts, tree_seeds(seed, budget.trees), first_plan(config, policy),
                      model_id(policy, "embedded"), max_batch=config.max_batch)
    label_trees(store, ids, person, random.Random(seed * 7919 + 1))
    return store, ids


def template_trees(seed: int, folder: Path, person: SimulatedPerson, shift: float
                   ) -> tuple[PickStore, list[str]]:
    """The trees the pick-and-train template grows with its seed widget at ``seed`` (its prompts, trees
    per prompt and tree shape, ``PICKS_BUDGET.template``), labelled by the person: what a person who
    opens the template and presses run picks from."""
    from ...config.picks_budget import PICKS_BUDGET
    from ...embedded.policy import EmbeddedPolicy
    from ...training.plans import picking_jobs, picking_plan

    t = PICKS_BUDGET.template
    policy = EmbeddedPolicy.from_pretrained()
    store = PickStore(folder, create=True)
    plan = picking_plan(t.steps, t.depth, t.branching, t.window_start, t.noise_level, shift, seed,
                        policy.image_tokens, policy.latent_unshuffle)
    sampler = {"steps": t.steps, "depth": t.depth, "branching": t.branching, "window_start": t.window_start,
               "noise_level": t.noise_level, "shift": shift}
    identity = model_id(policy, "embedded")
    ids: list[str] = []
    for prompt, tree_seed in picking_jobs(list(t.prompts), t.trees_per_prompt, seed):
        ids += store_trees(policy, store, [prompt], [tree_seed], plan, identity, sampler)
    label_trees(store, ids, person, random.Random(seed * 7919 + 1))
    return store, ids
