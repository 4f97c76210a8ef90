"""Forward counts of every strategy, measured by running the sampler and the training pass.

A cheap linear velocity stands in for the model: the counts depend only on the plan. Each row
puts the measured rollout count beside the closed form of docs/algorithm.md.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.awm import AWMConfig
from ...core.dgpo import DGPOConfig
from ...core.flow import make_sigmas
from ...core.objective import LossConfig, backward_over_tree, prepare_targets
from ...core.strategies import (
    BranchGRPOConfig,
    DanceGRPOConfig,
    DiffusionNFTConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    StrategyConfig,
    TreeConfig,
    build_plan,
    closed_form,
)
from ...core.tree import rollout
from ...training.awm import awm_backward
from ...training.dgpo import dgpo_backward
from ...training.nft import OldPolicy, nft_rows

# the example of docs/algorithm.md's forward counts: T = 25, window at 10, depth 4, binary branching
PAPER_TREE = TreeConfig(steps=25, window_start=10, depth=4, branching=2)


def strategy_configs(tree: TreeConfig = PAPER_TREE, mixgrpo: MixGRPOConfig | None = None,
                     dancegrpo: DanceGRPOConfig | None = None,
                     group_size: int | None = None) -> dict[str, StrategyConfig]:
    """The compared strategies at the tree's steps, window start and tail compression; the baselines
    keep their own knobs (MixGRPO's window size, DanceGRPO's trained fraction) from their configs.
    ``group_size`` None: as many images per prompt as the tree scores."""
    g = group_size or tree.trees_per_prompt * tree.leaves_per_tree
    mix = replace(mixgrpo or MixGRPOConfig(), steps=tree.steps, window_start=tree.window_start,
                  group_size=g, tail_compression=tree.tail_compression)
    dance = replace(dancegrpo or DanceGRPOConfig(), steps=tree.steps, group_size=g)
    flow = FlowGRPOConfig(steps=tree.steps, group_size=g)
    # BranchGRPO: as many binary splits as the tree's leaves need, spread evenly over the steps
    branch = BranchGRPOConfig(steps=tree.steps, splits=max(1, (g - 1).bit_length()))
    return {
        "dancegrpo": dance,
        "flow_grpo": flow,
        "flow_grpo_fast": replace(flow, fast=True),
        "branchgrpo": branch,
        "mixgrpo": mix,
        "mixgrpo_shared_trunk": replace(mix, share_trunk=True),
        "mixgrpo_flash": replace(mix, flash=True),
        "diffusionnft": DiffusionNFTConfig(steps=tree.steps, group_size=g),
        "awm": AWMConfig(steps=tree.steps, group_size=g),
        "dgpo": DGPOConfig(steps=tree.steps, group_size=g),
        "dynamic_treerpo": tree,
    }


def measure(config: StrategyConfig, steps: int) -> dict[str, float | int | str]:
    """Run one prompt through the sampler and a training pass; count forwards."""
    weight = torch.nn.Parameter(torch.tensor(0.1))

    def velocity(x: torch.Tensor, sigma: torch.Tensor, cond: object) -> torch.Tensor:
        return weight * x

    plan = build_plan(config, make_sigmas("shift", steps))
    tree = rollout(velocity, None, plan, seeds=[0], latent_shape=(2,))
    rewards = torch.rand(tree.leaf_node.numel(), generator=torch.Generator().manual_seed(0))
    if isinstance(config, DiffusionNFTConfig):  # trains re-noised leaves, not the rollout's steps
        rows = nft_rows(tree, config, 0, 0)[0].numel()
        per_row = 3 if config.kl_beta > 0 else 2  # v_theta, v_old (and the reference)
        expected = closed_form(config)
        return {"rollout_nfe": tree.nfe, "train_nfe": rows * per_row, "train_edges": 0,
                "scored_images": tree.leaf_node.numel(),
                "rollout_nfe_per_image": tree.nfe / tree.leaf_node.numel(),
                "closed_form_rollout_nfe": expected.rollout_nfe, "closed_form_train_nfe": expected.train_nfe,
                "model_calls": tree.model_calls}
    if isinstance(config, (AWMConfig, DGPOConfig)):  # re-noised leaves, counted by their training pass
        backward = awm_backward if isinstance(config, AWMConfig) else dgpo_backward
        sigmas = make_sigmas("shift", steps)
        stats = backward(velocity, None, tree, rewards - rewards.mean(), sigmas, config, OldPolicy([weight]),
                         velocity, 0, 0, None)
        expected = closed_form(config)
        return {"rollout_nfe": tree.nfe, "train_nfe": stats.nfe, "train_edges": 0,
                "scored_images": tree.leaf_node.numel(),
                "rollout_nfe_per_image": tree.nfe / tree.leaf_node.numel(),
                "closed_form_rollout_nfe": expected.rollout_nfe, "closed_form_train_nfe": expected.train_nfe,
                "model_calls": tree.model_calls}
    targets = prepare_targets(tree, rewards, LossConfig())
    stats = backward_over_tree(velocity, None, tree, targets, LossConfig())
    expected = closed_form(config)
    images = tree.leaf_node.numel()
    return {
        "rollout_nfe": tree.nfe,
        "train_nfe": stats.train_nfe,
        "train_edges": stats.train_edges,
        "scored_images": images,
        "rollout_nfe_per_image": tree.nfe / images,
        "closed_form_rollout_nfe": expected.rollout_nfe,
        "closed_form_train_nfe": expected.train_nfe,
        "model_calls": tree.model_calls,
    }


def nfe_table(configs: dict[str, StrategyConfig]) -> list[dict[str, float | int | str]]:
    """One row per strategy of :func:`strategy_configs` (``strategy`` key first)."""
    return [{"strategy": name, **measure(cfg, cfg.steps)} for name, cfg in configs.items()]


def format_table(rows: list[dict[str, float | int | str]]) -> str:
    """A plain-text table with the ratio of forwards per image against MixGRPO."""
    base = next((r["rollout_nfe_per_image"] for r in rows if r["strategy"] == "mixgrpo"), None)
    head = (f"{'strategy':<22}{'images':>7}{'rollout':>9}{'closed':>8}{'per img':>9}"
            f"{'vs mix':>8}{'train':>7}{'edges':>7}{'calls':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{float(r['rollout_nfe_per_image']) / float(base):.2f}x" if base else "-"
        lines.append(f"{r['strategy']:<22}{r['scored_images']:>7}{r['rollout_nfe']:>9}"
                     f"{r['closed_form_rollout_nfe']:>8}{float(r['rollout_nfe_per_image']):>9.2f}"
                     f"{ratio:>8}{r['train_nfe']:>7}{r['train_edges']:>7}{r['model_calls']:>7}")
    return "\n".join(lines)
