"""Each baseline's loss as its public code has it (docs/algorithm.md, "Baselines").

A baseline run with ``baseline_loss: published`` trains with :func:`published_loss` of its
strategy, whatever the ``loss`` section says; the fields below are the only ones that change, so a
comparison with Dynamic-TreeRPO differs in exactly the published ways (tests check that).
"""

from __future__ import annotations

from dataclasses import replace

from ..core.objective import LossConfig

MIXGRPO_DANCEGRPO = ("mixgrpo", "mixgrpo_flash", "dancegrpo")
FLOW_GRPO = ("flow_grpo", "flow_grpo_fast")
FLOW_GRPO_KL_BETA = 0.04  # its GenEval recipe (compositional prompts, like the scene reward)
BRANCHGRPO_CLIP = 1e-3  # its FLUX script's clip_range


def published_loss(strategy: str, loss: LossConfig) -> LossConfig:
    """The loss of ``strategy``'s public code; other fields (log-probability scale) are kept.

    - MixGRPO, MixGRPO-Flash, DanceGRPO: leaf advantages normalised per prompt group and clipped
      at 5, the fixed ratio clip 1e-4, no LayerTuning term, no KL.
    - Flow-GRPO (and Fast): the same, but the std is the global one over the batch (its
      ``global_std``) and a KL to the reference policy with beta 0.04.
    - BranchGRPO: each node's value is the mean of its leaves, normalised among the nodes of its
      prompt and depth, clipped at 5; the fixed ratio clip 1e-3; no LayerTuning, no KL.
    """
    fixed = replace(loss.clip, mode="fixed", fixed=1e-4, asymmetric=False)
    if strategy in MIXGRPO_DANCEGRPO:
        return replace(loss, advantage="leaf", advantage_scale="std", advantage_std="group",
                       adv_clip=5.0, clip=fixed, prm_lambda=0.0, kl_beta=0.0)
    if strategy in FLOW_GRPO:
        return replace(loss, advantage="leaf", advantage_scale="std", advantage_std="batch",
                       adv_clip=5.0, clip=fixed, prm_lambda=0.0, kl_beta=FLOW_GRPO_KL_BETA)
    if strategy == "branchgrpo":
        return replace(loss, advantage="tree", node_value="mean", advantage_baseline="depth",
                       advantage_scale="std", advantage_std="group", adv_clip=5.0,
                       clip=replace(fixed, fixed=BRANCHGRPO_CLIP), prm_lambda=0.0, kl_beta=0.0)
    raise ValueError(f"{strategy!r} has no published baseline loss")
