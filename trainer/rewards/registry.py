"""Rewards by name. A reward maps images ``[B, 3, H, W]`` in ``[0, 1]`` and their prompts to a dict
of per-image tensors; ``reward`` is what training maximises, other keys are logged beside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

RewardFn = Callable[[Tensor, Sequence[str]], dict[str, Tensor]]


def _scene() -> RewardFn:
    from .scene_reward import scene_metrics

    return scene_metrics


_REWARDS: dict[str, Callable[[], RewardFn]] = {"scene": _scene}


def reward_names() -> list[str]:
    return sorted(_REWARDS)


def get_reward(name: str) -> RewardFn:
    """The reward function registered under ``name``; an unknown name is a one-line error."""
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; available: {', '.join(reward_names())}")
    return _REWARDS[name]()
