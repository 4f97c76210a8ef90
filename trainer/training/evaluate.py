"""Held-out evaluation, prompt sampling and plain ODE generation for the trainer.

The evaluation set is a fixed list of prompt/seed pairs drawn from its own seed; training prompts
are drawn per iteration from ``(seed, iteration)`` and never include an evaluation prompt, so the
held-out reward measures generalisation, and a resumed run draws exactly the same prompts. A
*validation* set (what a learning-rate sweep chooses on) is drawn from another seed and shares no
prompt with the test set (:func:`validation_pairs`), so nothing chosen on it has seen a test prompt.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..core.tree import RolloutPlan, StepOp, rollout
from ..embedded.scenes import layout, parse_prompt, render, sample_spec, spec_to_prompt
from ..models.policy import Policy
from ..rewards.registry import RewardFn


@dataclass(frozen=True)
class EvalPair:
    prompt: str
    seed: int


def held_out_pairs(count: int, seed: int, exclude: Sequence[str] = ()) -> list[EvalPair]:
    """``count`` fixed prompt/seed pairs for evaluation, none of whose prompts is in ``exclude``
    (without exclusions, the same pairs as ever for a seed)."""
    rng = np.random.default_rng(seed)
    excluded, prompts = set(exclude), []
    while len(prompts) < count:
        prompt = spec_to_prompt(sample_spec(rng))
        if prompt not in excluded:
            prompts.append(prompt)
    return pairs_from_prompts(prompts, count, seed)


def pairs_from_prompts(prompts: Sequence[str], count: int, seed: int) -> list[EvalPair]:
    """``count`` pairs cycling through ``prompts`` (a prompt seen again gets another seed)."""
    return [EvalPair(prompts[i % len(prompts)], seed * 100_003 + i) for i in range(count)]


def eval_pairs_for(prompts: str, eval_prompts: str | None, count: int, seed: int,
                   exclude: Sequence[str] = ()) -> list[EvalPair]:
    """The held-out set of a run: generated scenes, an evaluation prompt file, or (with a training
    prompt file and no evaluation file) ``count`` distinct prompts drawn from the training file,
    which :class:`PromptSource` then leaves out of training. No prompt of ``exclude`` is held out."""
    excluded = set(exclude)
    if eval_prompts is not None:
        kept = [p for p in read_prompt_file(eval_prompts) if p not in excluded]
        if not kept:
            raise ValueError(f"evaluation prompt file {eval_prompts}: every prompt is excluded")
        return pairs_from_prompts(kept, count, seed)
    if prompts == "scenes":
        return held_out_pairs(count, seed, excluded)
    pool = [p for p in dict.fromkeys(read_prompt_file(prompts)) if p not in excluded]
    if len(pool) <= count:
        raise ValueError(f"prompt file {prompts} has {len(pool)} distinct prompts"
                         f"{' besides the excluded ones' if excluded else ''}; holding out "
                         f"data.eval_pairs={count} for evaluation leaves none to train on: give "
                         "data.eval_prompts (a held-out prompt file) or lower data.eval_pairs")
    picked = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    return pairs_from_prompts([pool[int(i)] for i in picked], count, seed)


def validation_pairs(prompts: str, eval_prompts: str | None, count: int, validation_seed: int,
                     test_seed: int) -> tuple[list[EvalPair], list[EvalPair]]:
    """``(validation, test)`` pairs that share no prompt. The test pairs are the run's held-out set
    (``data.eval_seed = test_seed``); the validation pairs are drawn from the training source
    (generated scenes or the training prompt file, never the evaluation file) with
    ``validation_seed``, leaving out every test prompt. Training on the validation pairs' run then
    leaves out both (:class:`PromptSource` with ``exclude`` = all of their prompts)."""
    if validation_seed == test_seed:
        raise ValueError(f"validation seed must differ from the test seed (data.eval_seed), both {test_seed}")
    test = eval_pairs_for(prompts, eval_prompts, count, test_seed)
    return eval_pairs_for(prompts, None, count, validation_seed, [p.prompt for p in test]), test


def read_prompt_file(path: str | Path) -> list[str]:
    """Non-empty, non-comment lines of a prompt file; a bad file is a one-line error."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"prompt file not found: {file}")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"prompt file {file} is not UTF-8 text (byte {err.start})") from None
    prompts = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {file} has no prompts")
    return prompts


class PromptSource:
    """Training prompts per iteration: generated scenes, or a prompt file, minus held-out prompts."""

    def __init__(self, source: str, seed: int, exclude: Sequence[str] = ()) -> None:
        self.seed = seed
        self.exclude = set(exclude)
        self.pool: list[str] | None = None
        if source != "scenes":
            pool = [p for p in read_prompt_file(source) if p not in self.exclude]
            if not pool:
                raise ValueError(f"prompt file {source}: every prompt is in the evaluation set")
            self.pool = pool

    def prompts(self, iteration: int, count: int) -> list[str]:
        rng = np.random.default_rng([self.seed, iteration])
        if self.pool is not None:
            return [self.pool[i] for i in rng.integers(0, len(self.pool), count)]
        out: list[str] = []
        while len(out) < count:
            prompt = spec_to_prompt(sample_spec(rng))
            if prompt not in self.exclude:
                out.append(prompt)
        return out


def ode_plan(sigmas: Tensor) -> RolloutPlan:
    """Deterministic Euler sampling over ``sigmas`` (one image per seed)."""
    values = [float(s) for s in sigmas]
    ops = tuple(StepOp(a, b) for a, b in itertools.pairwise(values))
    return RolloutPlan("ode", ops, roots_per_prompt=1)


@torch.no_grad()
def generate(policy: Policy, prompts: Sequence[str], seeds: Sequence[int], sigmas: Tensor,
             max_batch: int | None = None) -> Tensor:
    """Images ``[N, 3, H, W]`` for prompt/seed pairs, by ODE sampling."""
    cond = policy.encode(list(prompts))
    tree = rollout(policy.velocity, cond, ode_plan(sigmas), list(seeds), policy.latent_shape,
                   max_batch=max_batch, device=policy.device)
    return policy.decode(tree.leaf_latents)


def clean_renders(pairs: Sequence[EvalPair]) -> Tensor:
    """Ideal renders of the evaluation prompts (layout drawn from each pair's seed)."""
    images = [render(layout(parse_prompt(p.prompt), np.random.default_rng(p.seed))) for p in pairs]
    return torch.from_numpy(np.stack(images))


@torch.no_grad()
def drift_loss(policy: Policy, renders: Tensor, prompts: Sequence[str], seed: int = 0,
               max_batch: int = 64) -> float:
    """Flow-matching (velocity) loss on fixed clean renders at fixed sigmas and noise.

    Rises when RL pulls the model away from the data it was trained on (reward hacking shows).
    """
    gen = torch.Generator().manual_seed(seed)
    x0 = policy.encode_images(renders)
    sigma = torch.linspace(0.1, 0.9, x0.shape[0]).to(x0.device)
    eps = torch.randn(x0.shape, generator=gen).to(x0.device)  # drawn on the CPU: same on any device
    s = sigma.reshape(-1, *([1] * (x0.ndim - 1)))
    x = (1 - s) * x0 + s * eps
    total = 0.0
    for start in range(0, x0.shape[0], max_batch):
        sl = slice(start, start + max_batch)
        v = policy.velocity(x[sl], sigma[sl], policy.encode(list(prompts[sl])))
        total += float(((v - (eps[sl] - x0[sl])) ** 2).sum())
    return total / x0.numel()


def evaluate(policy: Policy, pairs: Sequence[EvalPair], sigmas: Tensor, reward: RewardFn,
             max_batch: int | None = None) -> tuple[dict[str, float], Tensor]:
    """Mean held-out metrics (``eval_reward``, ``eval_exact``, ...) and the generated images."""
    images = generate(policy, [p.prompt for p in pairs], [p.seed for p in pairs], sigmas, max_batch)
    metrics = reward(images, [p.prompt for p in pairs])
    out = {f"eval_{k}": float(v.float().mean()) for k, v in metrics.items()}
    return out, images
