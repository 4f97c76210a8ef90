"""Baselines as plans of the same sampler, their forward counts, and the window schedules."""

from __future__ import annotations

import pytest
import torch

from dynamic_treerpo.trainer.core.flow import make_sigmas
from dynamic_treerpo.trainer.core.strategies import (
    BranchGRPOConfig,
    DanceGRPOConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    TreeConfig,
    build_plan,
    closed_form,
    compressed_tail_steps,
    strategy_name,
    window_start,
)
from dynamic_treerpo.trainer.core.tree import rollout

CONFIGS = [
    DanceGRPOConfig(steps=16, group_size=12),
    DanceGRPOConfig(steps=10, group_size=4, train_fraction=0.3),
    MixGRPOConfig(steps=25, window_start=0, group_size=12),
    MixGRPOConfig(steps=25, window_start=10, group_size=16, share_trunk=True),
    MixGRPOConfig(steps=25, window_start=10, group_size=16, flash=True),
    MixGRPOConfig(steps=12, window_start=7, window_size=4, group_size=3, flash=True, share_trunk=True),
    TreeConfig(steps=25, window_start=10, tail="dpm2m"),
    TreeConfig(steps=20, window_start=3, depth=3, branching=3, trees_per_prompt=2, tail="dpm2m",
               tail_compression=0.25),
    FlowGRPOConfig(steps=10, group_size=6),
    FlowGRPOConfig(steps=10, group_size=6, fast=True),
    BranchGRPOConfig(steps=20, splits=4),
    BranchGRPOConfig(steps=10, splits=3, branching=3),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{strategy_name(c)}")
def test_every_strategy_counts_as_its_closed_form(cfg) -> None:
    calls = []

    def velocity(x, sigma, cond):
        calls.append(x.shape[0])
        return 0.1 * x

    tree = rollout(velocity, None, build_plan(cfg, make_sigmas("shift", cfg.steps)), [0], (2,))
    expected = closed_form(cfg)
    assert tree.nfe == expected.rollout_nfe
    assert tree.leaf_node.numel() == expected.scored_images
    assert tree.trained_forwards.numel() == expected.train_nfe
    assert int(tree.edge_train.sum()) == expected.train_edges
    assert len(calls) == len(tree.plan.ops)


def test_paper_example_of_forwards_per_image() -> None:
    """T=25, b=2, d=4, l=10: 12.6 forwards per scored image against 25 for MixGRPO."""
    tree = closed_form(TreeConfig(steps=25, window_start=10, depth=4, branching=2))
    mix = closed_form(MixGRPOConfig(steps=25, window_start=10, group_size=16))
    assert tree.rollout_nfe / tree.scored_images == pytest.approx(12.56, abs=0.01)
    assert mix.rollout_nfe / mix.scored_images == 25


def test_flash_tail_is_compressed_and_ends_at_zero() -> None:
    cfg = MixGRPOConfig(steps=25, window_start=10, group_size=4, flash=True)
    plan = build_plan(cfg, make_sigmas("shift", 25))
    tail = [op for op in plan.ops if op.solver == "dpm2m"]
    assert len(tail) == compressed_tail_steps(25 - 14, 0.4) == 3  # int(12 * 0.4) points, 3 steps
    assert tail[0].sigma == pytest.approx(plan.ops[13].sigma_next) and tail[-1].sigma_next == 0.0


def test_plans_have_the_published_shape() -> None:
    sig = make_sigmas("shift", 16)
    dance = build_plan(DanceGRPOConfig(), sig)
    assert [op.solver for op in dance.ops] == ["sde"] * 15 + ["euler"]
    assert dance.trained_per_row == 9  # floor(0.6 * 15), drawn per trajectory at rollout
    assert dance.shared_root_noise and dance.roots_per_prompt == 12
    mix = build_plan(MixGRPOConfig(steps=16, window_start=5, share_trunk=True), sig)
    assert [op.branch for op in mix.ops if op.solver == "sde"] == [12, 1, 1, 1]
    assert [i for i, op in enumerate(mix.ops) if op.train] == [5, 6, 7, 8]
    sig10 = make_sigmas("shift", 10)
    flow = build_plan(FlowGRPOConfig(), sig10)
    assert [op.train for op in flow.ops] == [True] * 9 + [False] and not flow.shared_root_noise
    fast = [build_plan(FlowGRPOConfig(fast=True), sig10, seed=s) for s in range(40)]
    starts = {p.window_start for p in fast}
    assert starts == set(range(3))  # 3 SDE steps starting in [0, T // 2 - 3] (tests/test_published.py)
    for p in fast:
        sde = [i for i, op in enumerate(p.ops) if op.solver == "sde"]
        assert sde == [p.window_start + k for k in range(3)]
    branch = build_plan(BranchGRPOConfig(), make_sigmas("shift", 20))
    assert [i for i, op in enumerate(branch.ops) if op.branch == 2] == [0, 3, 6, 9]
    assert branch.ops[3].noise_level == 0.3 and branch.ops[3].noise_scale == pytest.approx(4.0)
    assert branch.ops[4].noise_scale == 1.0
    assert branch.leaves_per_prompt == 16 and all(op.train for op in branch.ops[:-1])


def test_dancegrpo_draws_its_trained_steps_per_trajectory() -> None:
    plan = build_plan(DanceGRPOConfig(steps=10, group_size=8), make_sigmas("shift", 10))
    tree = rollout(lambda x, s, c: 0.1 * x, None, plan, [0, 1], (2,))
    steps_of = {}
    for e in tree.edge_train.nonzero().flatten().tolist():
        leaf_row = int(tree.edge_child[e])
        while int(tree.node_parent[leaf_row]) >= 0:
            leaf_row = int(tree.node_parent[leaf_row])
        steps_of.setdefault(leaf_row, []).append(int(tree.edge_step[e]))
    assert len(steps_of) == 16 and all(len(v) == 5 for v in steps_of.values())  # floor(0.6 * 9)
    assert len({tuple(sorted(v)) for v in steps_of.values()}) > 4  # not one draw for all
    again = rollout(lambda x, s, c: 0.1 * x, None, plan, [0, 1], (2,))
    assert torch.equal(tree.edge_train, again.edge_train)


def test_shared_noise_roots_start_identical() -> None:
    plan = build_plan(DanceGRPOConfig(steps=4, group_size=3), make_sigmas("shift", 4))
    tree = rollout(lambda x, s, c: 0.1 * x, None, plan, [0], (5,))
    first = tree.fwd_x[tree.fwd_step == 0]
    assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2])


def test_window_out_of_range_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"window_start=22 out of range .* \[0, 20\]"):
        build_plan(TreeConfig(window_start=22), make_sigmas("shift", 25))
    with pytest.raises(ValueError, match="sigma grid has 11 values"):
        build_plan(TreeConfig(), make_sigmas("shift", 10))


def test_window_schedules() -> None:
    seq = [window_start(i, "progressive", 2, 5, every=2) for i in range(12)]
    assert seq == [2, 2, 3, 3, 4, 4, 5, 5, 2, 2, 3, 3]  # rolls back after max
    seq = [window_start(i, "progressive", 2, 5, every=2, roll_back=False) for i in range(12)]
    assert seq == [2, 2, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]
    seq = [window_start(i, "progressive", 0, 8, every=1, stride=3) for i in range(5)]
    assert seq == [0, 3, 6, 0, 3]
    rand = [window_start(i, "random", 1, 6, seed=9) for i in range(200)]
    assert min(rand) == 1 and max(rand) == 6
    assert rand == [window_start(i, "random", 1, 6, seed=9) for i in range(200)]
    assert window_start(50, "fixed", 4, 9) == 4
    with pytest.raises(ValueError, match="unknown window schedule"):
        window_start(0, "cosine", 0, 3)


def test_the_training_nodes_leaf_budget_names_every_strategys_image_settings(monkeypatch) -> None:
    """A too-large group is refused at validation naming the keys that set it, for every recipe
    (nodes/budget.py imports no ComfyUI, so it is loaded here from its file)."""
    import importlib.util
    import sys
    from dataclasses import fields
    from pathlib import Path

    from dynamic_treerpo.trainer.config.schema import TrainConfig
    from dynamic_treerpo.trainer.core.strategies import STRATEGIES

    path = Path(__file__).resolve().parents[1] / "nodes" / "budget.py"
    spec = importlib.util.spec_from_file_location("treerpo_node_budget", path)
    budget = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, budget)  # its dataclasses look their module up
    spec.loader.exec_module(budget)
    assert set(budget.STRATEGY_IMAGE_KEYS) == set(STRATEGIES)
    config = TrainConfig()
    for keys in budget.STRATEGY_IMAGE_KEYS.values():
        for key in keys:
            section, name = key.split(".")
            assert name in {f.name for f in fields(getattr(config, section))}, key
