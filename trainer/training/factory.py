"""Which trainer a config asks for: the picks' online mode trains on stored trees, everything else on
fresh rollouts. Both the headless run and the front ends' steps build their trainer here."""

from __future__ import annotations

from typing import Any

from ..config.schema import TrainConfig
from ..models.policy import Policy
from .from_picks import PicksTrainer
from .loop import Trainer


def make_trainer(config: TrainConfig, policy: Policy | None = None, evaluation: bool = True,
                 **kwargs: Any) -> Trainer:
    """:class:`~.from_picks.PicksTrainer` for picks in ``online`` mode, else the ordinary
    :class:`~.loop.Trainer` (which fits the personal reward itself in ``reward`` mode)."""
    if config.uses_picks and config.picks.mode == "online":
        return PicksTrainer(config, policy, evaluation, **kwargs)
    return Trainer(config, policy, evaluation, **kwargs)
