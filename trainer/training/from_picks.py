"""Training from a person's picks (``reward: picks``, ``data.picks: FOLDER``; docs/picks.md).

Two modes (``picks.mode``):

- ``reward`` (default): :mod:`~..rewards.personal` fits a personal reward on the picks; the ordinary
  :class:`~.loop.Trainer` then trains on fresh rollouts it scores (mixed with the other terms of
  ``reward``, e.g. ``picks:0.5,scene:0.5``, the scene reward guarding prompt-following).
- ``online``: :class:`PicksTrainer` trains the tree's own objective on the picked trees themselves.
  Each iteration takes ``picks.trees_per_iteration`` labelled trees of the folder (a seeded shuffle per
  pass over the folder), their leaves valued by the picks (liked 1, unmarked 0, disliked -1) and by
  the other terms of ``reward`` scored on the stored leaves, each term normalised within its tree and
  weighted, and makes the usual updates on their stored edges. The picks were made on trees the model
  sampled earlier: the ratio to the log-probability stored with each edge is an importance ratio, and
  the clip keeps the update near the sampling policy.

:func:`~.session.train_from_picks` is the front end's door (the ComfyUI node).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..config.schema import TrainConfig
from ..core.advantages import combine_rewards
from ..core.tree import Tree, concat_trees
from ..guard.terms import guard_spec
from ..models.policy import Policy
from ..preferences.records import ModelId, TreeMeta
from ..preferences.store import PickStore
from ..rewards.mix import RewardMix, parse_reward_spec
from ..rewards.registry import PICKS
from .build import resolve_device
from .loop import Rollout, Trainer


def _to(tree: Tree, device: torch.device) -> Tree:
    """The stored tree's latents on the model's device (the index tensors stay on the CPU)."""
    return replace(tree, fwd_x=tree.fwd_x.to(device), edge_x_child=tree.edge_x_child.to(device),
                   edge_log_prob_old=tree.edge_log_prob_old.to(device),
                   leaf_latents=tree.leaf_latents.to(device))


class PicksTrainer(Trainer):
    """The ``online`` mode: iterations over the picked trees instead of fresh rollouts."""

    def __init__(self, config: TrainConfig, policy: Policy | None = None, evaluation: bool = True,
                 tree_source: Callable[[int], list[str]] | None = None, **kwargs: Any) -> None:
        """``tree_source(iteration)``: the ids of the trees to train on at each iteration, instead of
        slices of the folder's labelled trees (``treerpo bench taste``'s person labels new trees of the
        current policy as training goes)."""
        folder = config.effective_reward_weights.get(PICKS)
        if not folder:
            raise ValueError("picks.mode online needs a picks folder: data.picks: FOLDER")
        self.store = PickStore(Path(folder), create=tree_source is not None)
        self.tree_source = tree_source
        self.labelled = self.store.check() if tree_source is None else []
        self.weights = {t.name: t.weight for t in parse_reward_spec(config.reward)}
        super().__init__(config, policy, evaluation, **kwargs)
        if tree_source is None:  # the stored edges are this model's: the same weights and latent shape
            self.store.check(model_id(self.policy))
            shape = tuple(self.policy.latent_shape)
            for tree_id in self.labelled:
                stored = tuple(self.store.meta(tree_id).latent_shape)
                if stored != shape:
                    raise ValueError(f"picks.mode online trains on the stored trees' latents, but tree "
                                     f"{tree_id} holds {stored} and the model draws {shape}: use picks.mode "
                                     "reward (it reads the images only)")

    def build_reward(self) -> RewardMix | None:
        """The other terms of ``reward`` (they score the stored leaves, and evaluations): the picks are
        values, not a function of an image."""
        if all(name == PICKS for name in self.weights):
            return None
        spec = guard_spec(self.config.reward, PICKS, rescale=False)
        weights = {k: v for k, v in self.config.effective_reward_weights.items() if k != PICKS}
        return RewardMix(spec, weights, resolve_device(self.config.model.device))

    def evaluate(self, average: bool | None = None) -> tuple[dict[str, float], torch.Tensor]:
        if self.reward is None:  # nothing scores a new image: the picks judged stored ones only
            return {}, torch.zeros(0)
        return super().evaluate(average)

    def trees_of(self, iteration: int) -> list[str]:
        """This iteration's labelled trees: a seeded shuffle of the folder per pass, sliced."""
        if self.tree_source is not None:
            return self.tree_source(iteration)
        per = min(self.config.picks.trees_per_iteration, len(self.labelled))
        start = iteration * per
        order: list[str] = []
        for epoch in range(start // len(self.labelled), (start + per - 1) // len(self.labelled) + 1):
            shuffled = list(self.labelled)
            random.Random(self.config.seed * 1_000_003 + epoch).shuffle(shuffled)
            order += shuffled
        offset = start - (start // len(self.labelled)) * len(self.labelled)
        return order[offset: offset + per]

    def rollout_and_score(self, iteration: int) -> Rollout:
        """The iteration's picked trees (of one plan: the first tree's), valued by picks and guard."""
        chosen = self.trees_of(iteration)
        trees = [self.store.load_tree(t) for t in chosen]
        same = [i for i, t in enumerate(trees) if t.plan == trees[0].plan]
        chosen, trees = [chosen[i] for i in same], [trees[i] for i in same]
        tree = _to(concat_trees(trees), self.device)
        metas = [self.store.meta(t) for t in chosen]
        prompts = [m.prompt for m in metas]
        self.policy.eval()
        cond = self.policy.encode(prompts)
        leaf_prompt = tree.node_prompt[tree.leaf_node]
        pick_values = torch.tensor([v for t, m in zip(chosen, metas, strict=True)
                                    for v in self.store.picks(t).values(m.leaves)], dtype=torch.float32)
        scores: dict[str, torch.Tensor] = {"reward_picks": pick_values}
        if self.reward is not None:
            with torch.no_grad():
                leaf_prompts = [prompts[int(p)] for p in leaf_prompt]
                guard = self.reward(self.policy.decode(tree.leaf_latents), leaf_prompts)
            for term in self.reward.terms:
                scores[f"reward_{term.name}"] = (guard["reward"] if len(self.reward.terms) == 1
                                                 else guard[f"reward_{term.name}"]).float().cpu()
        names = list(self.weights)
        stacked = torch.stack([scores[f"reward_{n}"] for n in names], dim=1)
        scores["reward"] = sum(self.weights[n] * scores[f"reward_{n}"] for n in names)
        values = combine_rewards(stacked, leaf_prompt, torch.tensor([self.weights[n] for n in names]))
        targets = self.targets_for(tree, values, iteration, first_prompt=0)
        return Rollout(prompts, 0, tree.plan, cond, tree, scores, targets)


def model_id(policy: Policy, name: str = "") -> ModelId:
    """The identity a stored tree records of ``policy``: its kind, a name and its base weights'
    fingerprint (the LoRA's, when one is attached)."""
    from ..lora.adapters import lora_state_dict
    from ..preferences.identity import base_fingerprint, lora_fingerprint

    transformer = policy.transformer
    kind = "embedded" if type(policy).__name__ == "EmbeddedPolicy" else type(policy).__name__.lower()
    lora = lora_fingerprint(lora_state_dict(transformer)) if hasattr(transformer, "peft_config") else None
    return ModelId(kind, name or kind, base_fingerprint(transformer), lora)


@torch.no_grad()
def store_trees(policy: Policy, store: PickStore, prompts: list[str], seeds: list[int], plan: Any,
                identity: ModelId, sampler: dict[str, Any] | None = None,
                max_batch: int | None = None) -> list[str]:
    """Grow one tree per prompt (``plan``, seeded per prompt) with ``policy`` and store each with its
    decoded leaves; returns the tree ids. Headless sampling for people to pick (and for ``treerpo
    bench taste``'s simulated person)."""
    from ..core.tree import rollout

    policy.eval()
    ids = []
    for prompt, seed in zip(prompts, seeds, strict=True):
        tree = rollout(policy.velocity, policy.encode([prompt]), plan, [seed], policy.latent_shape,
                       max_batch=max_batch, device=policy.device)
        images = policy.decode(tree.leaf_latents).float().cpu()
        meta = TreeMeta(prompt=prompt, seed=int(seed), model=identity, leaves=images.shape[0],
                        image_size=(images.shape[-2], images.shape[-1]),
                        latent_shape=tuple(policy.latent_shape), plan={}, sampler=dict(sampler or {}))
        ids.append(store.add_tree(tree, images, meta))  # the store writes CPU copies
    return ids
