"""The sampler's solvers: what one step of a plan does to the live nodes, one function per solver.

A plan's :class:`StepOp` names its solver; ``rollout`` looks each name up once in :data:`SOLVERS`
and, at every step, hands the step the live states with their velocity (one model call for all of
them) and records what it returns. A deterministic step moves every node in place; a stochastic one
draws ``op.branch`` children per node, each with its log-probability, which the tree keeps as edges.
So adding a solver is one function and one :func:`register_solver` call: the rollout, which only
grows the tree, does not change (as diffusers' schedulers each own one ``step()``).

Every step runs its math in float32 and draws its noise from each prompt's own generator, in the
order the rows are given (prompt-major), so a tree does not depend on batching or sharding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .flow import (
    FULL_NOISE,
    LogProbForm,
    NoiseSubspace,
    dpm2m_step,
    gaussian_log_prob,
    ode_step,
    sde_transition,
)


@dataclass(frozen=True)
class StepOp:
    """One step ``sigma -> sigma_next`` of a plan, run by the registered solver ``solver``.

    ``sde`` steps draw ``branch`` children per node with ``noise_level``; ``train`` marks their
    edges as trained. ``noise_scale`` multiplies the noise a child draws and nothing else: the mean
    and the density (its log-probability) keep ``noise_level``'s, as BranchGRPO's split steps do
    (Fredreic1849/BranchGRPO@19fbb9f ``fastvideo/train_branchgrpo_flux.py`` 271-279). ``euler`` and
    ``dpm2m`` steps are deterministic and move nodes in place.
    """

    sigma: float
    sigma_next: float
    solver: str = "euler"
    branch: int = 1
    noise_level: float = 0.0
    train: bool = False
    noise_scale: float = 1.0


@dataclass(frozen=True)
class SdeOptions:
    """The plan-wide settings of its stochastic steps (the ``RolloutPlan`` fields of these names):
    one plan samples every SDE step with one form, one density and one noise subspace."""

    sde_kind: str = "flow_grpo"
    antithetic: bool = False
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    log_prob_form: LogProbForm = "gaussian"
    noise: NoiseSubspace = FULL_NOISE


@dataclass(slots=True)  # built at every step: plain slots, no frozen-init cost
class History:
    """The previous step's clean-image prediction and its sigma, one row per live node: what a
    multistep solver (DPM-Solver++(2M)) extrapolates from. Empty before the first step."""

    x0: Tensor | None = None
    sigma: float | None = None


@dataclass(slots=True)  # built at every step: plain slots, no frozen-init cost
class StepInput:
    """Everything a step may read: its op, the live rows (prompt-major) and their model output."""

    op: StepOp
    x: Tensor  # [rows, *latent] float32: the live nodes' states at op.sigma
    v: Tensor  # [rows, *latent] float32: their velocity (one model call for all rows)
    x0: Tensor  # [rows, *latent] float32: their predicted clean latents, x - sigma v
    history: History
    row_prompt: Tensor  # [rows] long: each row's prompt, whose generator draws that row's noise
    generators: Sequence[torch.Generator]  # one per prompt
    options: SdeOptions


@dataclass(slots=True)  # built at every step: plain slots, no frozen-init cost
class StepResult:
    """What a step returns. ``log_prob`` None: the rows moved in place (``x`` has as many rows as
    the input). Otherwise ``x`` holds ``op.branch`` children per input row, siblings adjacent, and
    ``log_prob`` each child's old log-probability: the tree records them as edges."""

    x: Tensor
    history: History
    log_prob: Tensor | None = None


StepFn = Callable[[StepInput], StepResult]
"""One solver's step: a pure function of its input (its randomness comes from the given generators)."""


@dataclass(frozen=True)
class Solver:
    """A registered solver: its step, and whether it is stochastic. Only stochastic steps may branch
    or be trained, and they need a noise level and a density (``sigma_next > 0``); the plan checks
    it when it is built."""

    step: StepFn
    stochastic: bool = False


SOLVERS: dict[str, Solver] = {}
"""The solvers by ``StepOp.solver`` name; :func:`register_solver` adds one."""


def register_solver(name: str, step: StepFn, stochastic: bool = False) -> None:
    """Make ``name`` a solver plans can use; a name is registered once (no silent replacement)."""
    if name in SOLVERS:
        raise ValueError(f"solver {name!r} is already registered")
    SOLVERS[name] = Solver(step, stochastic)


def solver_for(name: str) -> Solver:
    """The registered solver ``name``, or a one-line error naming the registered ones."""
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}; registered: {', '.join(sorted(SOLVERS))}") from None


# ------------------------------------------------------------------------------ the built-in steps
def euler(step: StepInput) -> StepResult:
    """Euler step of the probability-flow ODE. Its clean prediction becomes the history, so that a
    DPM-Solver++(2M) step after it is second order, as MixGRPO-Flash's tail is
    (Tencent-Hunyuan/MixGRPO@e5cdd6a fastvideo/utils/sampling_utils.py 114-127)."""
    op = step.op
    return StepResult(ode_step(step.x, step.v, op.sigma, op.sigma_next), History(step.x0, op.sigma))


def dpm2m(step: StepInput) -> StepResult:
    """DPM-Solver++(2M): second order from the history of the previous step's clean prediction
    (first order without one, and exactly ``x0`` on the final step to sigma 0)."""
    op, past = step.op, step.history
    x = dpm2m_step(step.x, step.x0, op.sigma, op.sigma_next, past.x0, past.sigma)
    return StepResult(x, History(step.x0, op.sigma))


def sde(step: StepInput) -> StepResult:
    """The flow SDE step of the plan's form: ``op.branch`` children per row, each drawn from the
    row's Gaussian transition with noise ``noise_scale`` times the standard one, and its
    log-probability under that transition (the plan's reduction and form). The children inherit
    their parent's clean prediction as history (a DPM-Solver++(2M) tail after the window)."""
    op, opts, b = step.op, step.options, step.op.branch
    rows = step.x.shape[0]
    dist = sde_transition(opts.sde_kind, step.x, step.v, op.sigma, op.sigma_next, op.noise_level, opts.noise)
    per_prompt = torch.bincount(step.row_prompt, minlength=len(step.generators)) * b
    eps = branch_noise(step.generators, per_prompt.tolist(), tuple(step.x.shape[1:]), step.x.device, b,
                       opts.antithetic)
    child_dist = dist.rows(torch.arange(rows, device=step.x.device).repeat_interleave(b))
    x_child = child_dist.sample(eps * op.noise_scale if op.noise_scale != 1.0 else eps)
    log_prob = gaussian_log_prob(x_child, child_dist, opts.log_prob_reduction, opts.log_prob_form)
    x0 = step.x0 if b == 1 else step.x0.repeat_interleave(b, dim=0)
    return StepResult(x_child, History(x0, op.sigma), log_prob)


def branch_noise(generators: Sequence[torch.Generator], per_prompt: list[int],
                 latent_shape: Sequence[int], device: torch.device, branch: int = 1,
                 antithetic: bool = False) -> Tensor:
    """Children's noise, prompt-major, each prompt drawing from its own generator.

    ``antithetic``: siblings come in mirrored pairs ``(eps, -eps)`` (an odd last child draws its
    own). Each child's marginal is unchanged, so log-probabilities and ratios stay exact, while the
    pair's shared part of the advantage cancels in the gradient, as in mirrored evolution strategies.
    """
    parts = []
    for p, n in enumerate(per_prompt):
        if not antithetic or branch < 2:
            parts.append(torch.randn((n, *latent_shape), generator=generators[p]))
            continue
        parents, pairs = n // branch, branch // 2
        half = torch.randn((parents, pairs, *latent_shape), generator=generators[p])
        mirrored = torch.stack([half, -half], dim=2).reshape(parents, 2 * pairs, *latent_shape)
        if branch % 2:
            odd = torch.randn((parents, 1, *latent_shape), generator=generators[p])
            mirrored = torch.cat([mirrored, odd], dim=1)
        parts.append(mirrored.reshape(n, *latent_shape))
    return torch.cat(parts).to(device)


register_solver("euler", euler)
register_solver("dpm2m", dpm2m)
register_solver("sde", sde, stochastic=True)
