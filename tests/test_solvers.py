"""Solvers are registered steps: a new one runs through ``rollout`` untouched (trainer/core/solvers.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import make_sigmas, predicted_noise
from dynamic_treerpo.trainer.core.solvers import (
    SOLVERS,
    History,
    StepInput,
    StepResult,
    register_solver,
)
from dynamic_treerpo.trainer.core.tree import RolloutPlan, StepOp, rollout

LATENT = (2, 3)


def ddim(step: StepInput) -> StepResult:
    """Flow-matching DDIM: re-noise the clean prediction with the predicted noise. The same map as
    an Euler step, written another way, so its leaves must match Euler's."""
    eps = predicted_noise(step.x, step.v, step.op.sigma)
    s = step.op.sigma_next
    return StepResult((1.0 - s) * step.x0 + s * eps, History(step.x0, step.op.sigma))


def mirror(step: StepInput) -> StepResult:
    """A stochastic toy: ``branch`` children per row at ``x +- noise_level``, alternating, with a
    log-probability of each child's index (so the test can see which edge is which)."""
    b = step.op.branch
    signs = torch.tensor([(-1.0) ** k for k in range(b)]).repeat(step.x.shape[0])
    children = step.x.repeat_interleave(b, dim=0) + step.op.noise_level * signs.reshape(-1, 1, 1)
    return StepResult(children, step.history, torch.arange(children.shape[0], dtype=torch.float32))


@pytest.fixture
def toy_solvers() -> Iterator[None]:
    register_solver("toy_ddim", ddim)
    register_solver("toy_mirror", mirror, stochastic=True)
    yield
    del SOLVERS["toy_ddim"], SOLVERS["toy_mirror"]


def velocity(x: torch.Tensor, sigma: torch.Tensor, cond: object) -> torch.Tensor:
    return 0.5 * x + 0.1


def test_a_registered_deterministic_solver_runs_through_rollout(toy_solvers: None) -> None:
    grid = [float(s) for s in make_sigmas("shift", 5)]
    ops = list(itertools.pairwise(grid))
    toy = rollout(velocity, None, RolloutPlan("toy", tuple(StepOp(a, b, "toy_ddim") for a, b in ops), 2),
                  [3], LATENT)
    euler = rollout(velocity, None, RolloutPlan("ode", tuple(StepOp(a, b) for a, b in ops), 2), [3], LATENT)
    torch.testing.assert_close(toy.leaf_latents, euler.leaf_latents, rtol=0, atol=1e-6)
    assert toy.nfe == euler.nfe == 2 * 5 and toy.edge_child.numel() == 0


def test_a_registered_stochastic_solver_grows_the_tree(toy_solvers: None) -> None:
    plan = RolloutPlan("toy", (StepOp(1.0, 0.7, "toy_mirror", 2, 0.5, train=True), StepOp(0.7, 0.4),
                               StepOp(0.4, 0.2, "toy_mirror", 3, 0.25), StepOp(0.2, 0.0)), 1)
    calls: list[int] = []

    def counted(x: torch.Tensor, sigma: torch.Tensor, cond: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return velocity(x, sigma, cond)

    tree = rollout(counted, torch.arange(2), plan, [0, 1], LATENT)
    assert calls == [2, 4, 4, 12]  # one call per step for both prompts' live nodes
    assert tree.leaf_node.numel() == 2 * plan.leaves_per_prompt == 12
    assert tree.fwd_step.tolist() == [0, 0, 2, 2, 2, 2]
    assert tree.edge_log_prob_old.tolist() == [0, 1, 2, 3, *range(12)]
    assert tree.edge_train.tolist() == [True] * 4 + [False] * 12
    assert tree.edge_prompt.tolist() == [0, 0, 1, 1] + [0] * 6 + [1] * 6
    assert torch.equal(tree.edge_depth, tree.node_depth[tree.edge_parent] + 1)


def test_plans_name_registered_solvers_and_only_stochastic_ones_branch(toy_solvers: None) -> None:
    with pytest.raises(ValueError, match=r"step 0: unknown solver 'heun'; registered: .*toy_ddim"):
        RolloutPlan("x", (StepOp(1.0, 0.0, "heun"),), 1)
    with pytest.raises(ValueError, match="only SDE steps can branch"):
        RolloutPlan("x", (StepOp(1.0, 0.5, "toy_ddim", 2), StepOp(0.5, 0.0)), 1)
    with pytest.raises(ValueError, match="already registered"):
        register_solver("euler", ddim)
