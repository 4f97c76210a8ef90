"""Any Python function as a reward: ``reward: function`` with ``reward_weights: {function: SPEC}``.

``SPEC`` is ``MODULE:FUNCTION`` (an importable module, e.g. ``my_package.tastes:likes_red``) or
``FILE.py:FUNCTION``. The function takes a batch of images ``[B, 3, H, W]`` in ``[0, 1]`` and their B
prompts, and returns one score per image (a tensor, array or list of B numbers), higher being better.

Why: tastes, house styles and checks that no reward model knows are a few lines of Python; a user (or
``treerpo bench taste``'s simulated person, or the protocol's taste task) plugs them in without
touching the pack. Wrong output (not B finite numbers) is a one-line error naming the function.

A module of the pack that moved keeps its old path working through ``MOVED_MODULES`` (a plain map of
names, so this layer imports nothing of the benchmarks): saved configs and stored benchmark runs name
``dynamic_treerpo.trainer.bench.tastes:NAME``, the benchmark's tastes before they moved.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

HELP = "MODULE:FUNCTION or FILE.py:FUNCTION, a function (images [B, 3, H, W] in [0, 1], prompts) -> B scores"
MOVED_MODULES = {
    "dynamic_treerpo.trainer.bench.tastes": "dynamic_treerpo.trainer.bench.taste.hidden_tastes",
}
"""Old module path -> where it lives now, for specs written before a move (saved configs, stored runs)."""


def load_function(spec: str) -> Callable[..., Any]:
    """The function ``spec`` names; a missing module, file or function is a one-line error."""
    where, sep, name = str(spec).rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"reward function {spec!r}: expected {HELP}")
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"reward function file not found: {path}")
        module_spec = importlib.util.spec_from_file_location(f"treerpo_reward_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot import {path} as Python")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(MOVED_MODULES.get(where, where))
        except ImportError as err:
            raise ImportError(f"reward function {spec!r}: cannot import {where!r} ({err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"reward function {spec!r}: {where} has no function {name!r}")
    return fn


def scores_of(fn: Callable[..., Any], spec: str, images: Tensor, prompts: Sequence[str]) -> Tensor:
    """``fn``'s B scores as a float tensor, checked."""
    out = fn(images, list(prompts))
    scores = torch.as_tensor(out.detach().cpu() if isinstance(out, Tensor) else out, dtype=torch.float32)
    scores = scores.flatten()
    if scores.numel() != images.shape[0]:
        raise ValueError(f"reward function {spec!r} returned {scores.numel()} scores for "
                         f"{images.shape[0]} images")
    if not all(math.isfinite(v) for v in scores.tolist()):
        raise ValueError(f"reward function {spec!r} returned a score that is not a finite number")
    return scores


def build(weights: str | None, device: str | torch.device = "cpu") -> Callable[..., dict[str, Tensor]]:
    """The reward of the function ``weights`` names (the reward's "weights" are its spec)."""
    if not weights:
        raise ValueError(f"reward 'function' needs the function: reward_weights: {{function: SPEC}} "
                         f"(--weights function=SPEC), SPEC being {HELP}")
    fn = load_function(weights)

    def reward(images: Tensor, prompts: Sequence[str]) -> dict[str, Tensor]:
        return {"reward": scores_of(fn, weights, images.float().cpu(), prompts)}

    return reward
