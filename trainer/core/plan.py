"""What a rollout runs: a :class:`RolloutPlan` is a sequence of :class:`~.solvers.StepOp` (which
solver, how many children a node draws, with what noise) applied to every prompt's roots.

Dynamic-TreeRPO and every baseline are only different plans (``strategies.py``), so they share the
sampler, and a plan is checked when it is built: a bad plan fails in one line, before any sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .flow import FULL_NOISE, SDE_KINDS, LogProbForm, NoiseSubspace
from .solvers import SOLVERS, SdeOptions, StepOp


@dataclass(frozen=True)
class RolloutPlan:
    """A complete sampling recipe for one prompt's group, applied to every prompt of a batch."""

    strategy: str
    ops: tuple[StepOp, ...]
    roots_per_prompt: int
    shared_root_noise: bool = False
    antithetic: bool = False
    sde_kind: str = "flow_grpo"
    window_start: int = 0
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    log_prob_form: LogProbForm = "gaussian"
    noise: NoiseSubspace = FULL_NOISE
    trained_per_row: int | None = None  # keep this many trained steps per root, drawn per root

    def __post_init__(self) -> None:
        if self.roots_per_prompt < 1:
            raise ValueError(f"roots_per_prompt must be >= 1, got {self.roots_per_prompt}")
        if self.trained_per_row is not None and self.trained_per_row < 1:
            raise ValueError(f"trained_per_row must be >= 1, got {self.trained_per_row}")
        if self.sde_kind not in SDE_KINDS:
            raise ValueError(f"unknown sde_kind {self.sde_kind!r}; expected one of {SDE_KINDS}")
        if not self.ops:
            raise ValueError("a plan needs at least one step")
        for i, op in enumerate(self.ops):
            check_step(i, op)
        if self.ops[-1].sigma_next != 0.0:
            raise ValueError("a plan must end at sigma 0")

    @property
    def leaves_per_prompt(self) -> int:
        """Images scored per prompt."""
        return self.roots_per_prompt * math.prod(op.branch for op in self.ops)

    @property
    def sde_options(self) -> SdeOptions:
        """The settings every stochastic step of this plan samples with."""
        return SdeOptions(self.sde_kind, self.antithetic, self.log_prob_reduction, self.log_prob_form,
                          self.noise)


def check_step(i: int, op: StepOp) -> None:
    """Raise a one-line error unless step ``i`` is one its solver can run: only a stochastic solver
    branches, trains or scales its noise, and it needs noise and a density (not the step to 0)."""
    if not op.sigma > op.sigma_next >= 0.0:
        raise ValueError(f"step {i}: sigma must decrease, got {op.sigma} -> {op.sigma_next}")
    if op.branch < 1:
        raise ValueError(f"step {i}: branch must be >= 1, got {op.branch}")
    if op.solver not in SOLVERS:
        raise ValueError(f"step {i}: unknown solver {op.solver!r}; registered: {', '.join(sorted(SOLVERS))}")
    stochastic = SOLVERS[op.solver].stochastic
    if op.noise_scale <= 0.0 or (op.noise_scale != 1.0 and not stochastic):
        raise ValueError(f"step {i}: noise_scale must be > 0, and apply to an SDE step")
    if stochastic:
        if op.noise_level <= 0.0:
            raise ValueError(f"step {i}: an SDE step needs noise_level > 0")
        if op.sigma_next <= 0.0:
            raise ValueError(f"step {i}: the final step (to sigma 0) has no density; "
                             "it cannot be an SDE step")
    elif op.branch != 1 or op.train:
        raise ValueError(f"step {i}: only SDE steps can branch or be trained")
