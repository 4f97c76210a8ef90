"""Dynamic-TreeRPO core: flow-matching SDE steps, tree rollout, strategies, advantages, losses.

This package never imports ComfyUI; the ComfyUI nodes and the ``treerpo`` command line are thin
front ends over it. The names below are the stable API.
"""

from .core.advantages import (
    best_leaf_index,
    combine_rewards,
    edge_advantages,
    node_advantages,
    node_values,
    normalise_in_groups,
)
from .core.flow import (
    Gaussian,
    dpm2m_step,
    gaussian_log_prob,
    make_sigmas,
    ode_step,
    sde_step,
    sde_transition,
)
from .core.losses import ClipConfig, clip_bounds, grpo_edge_loss, layer_weight
from .core.objective import (
    LossConfig,
    LossStats,
    TrainTargets,
    backward_over_tree,
    microbatch_loss,
    prepare_targets,
)
from .core.strategies import (
    STRATEGIES,
    DanceGRPOConfig,
    MixGRPOConfig,
    TreeConfig,
    build_plan,
    closed_form,
    window_start,
)
from .core.tree import RolloutPlan, StepOp, Tree, rollout

__all__ = [
    "STRATEGIES", "ClipConfig", "DanceGRPOConfig", "Gaussian", "LossConfig", "LossStats",
    "MixGRPOConfig", "RolloutPlan", "StepOp", "TrainTargets", "Tree", "TreeConfig",
    "backward_over_tree", "best_leaf_index", "build_plan", "clip_bounds", "closed_form",
    "combine_rewards", "dpm2m_step", "edge_advantages", "gaussian_log_prob", "grpo_edge_loss",
    "layer_weight", "make_sigmas", "microbatch_loss", "node_advantages", "node_values",
    "normalise_in_groups", "ode_step", "prepare_targets", "rollout", "sde_step", "sde_transition",
    "window_start",
]
