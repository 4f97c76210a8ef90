"""Each baseline's recipe as its public code has it (docs/algorithm.md, "Baselines"): its loss, its
number of optimizer updates per rollout and its evaluation with an average of the weights.

A baseline run with ``baseline_loss: published`` trains with these, whatever the ``loss`` and
``optim`` sections say; the fields below are the only ones that change, so a comparison with
Dynamic-TreeRPO differs in exactly the published ways (tests/test_published.py pins every value to
the anchor's file and line).

Anchors (commits read): Flow-GRPO yifan123/flow_grpo@ac4c86e (Fast: @9745241, the first with it),
DanceGRPO XueZeyue/DanceGRPO@15cc71d, MixGRPO Tencent-Hunyuan/MixGRPO@e5cdd6a, BranchGRPO
Fredreic1849/BranchGRPO@19fbb9f, DiffusionNFT NVlabs/DiffusionNFT@24af555, AWM
scxue/advantage_weighted_matching@be51372, DGPO Luo-Yihong/DGPO@01ceb4b.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.objective import LossConfig

MIXGRPO = ("mixgrpo", "mixgrpo_flash")
FLOW_GRPO = ("flow_grpo", "flow_grpo_fast")
ADV_CLIP = 5.0  # every anchor's adv_clip_max
GRPO_CLIP = 1e-4  # MixGRPO, DanceGRPO and Flow-GRPO's clip_range
FLOW_GRPO_FAST_CLIP = 1e-5  # flow_grpo@9745241 config/grpo.py:185
FLOW_GRPO_KL_BETA = 0.04  # GenEval's (compositional prompts, like the scene reward): config/grpo.py:91
FLOW_GRPO_STD_EPS = 1e-4  # flow_grpo/stat_tracking.py:27 (and DiffusionNFT's copy of it)
BRANCHGRPO_CLIP = 1e-3  # its FLUX script's clip_range: finetune_flux_branchgrpo_8gpus.sh:94
BRANCHGRPO_FLAT_STD = 1e-6  # a depth whose std is below this gets advantage 0: train_branchgrpo_flux.py:675
UPDATES_PER_ROLLOUT = {
    "mixgrpo": 4, "mixgrpo_flash": 4,  # 12 samples a GPU, an update every 3: ..._MixGRPO.sh:68
    "dancegrpo": 3,  # 12 samples, an update every 4: finetune_flux_grpo.sh:29,34 (the README's script)
    "flow_grpo": 2, "flow_grpo_fast": 2,  # gradient_accumulation = batches // 2: config/grpo.py:183-184
    "branchgrpo": 37,  # an update every 12 of a GPU's 2 x 218 transitions: the .sh:71, train_...py:1592-1596
    "diffusionnft": 1,  # gradient_step_per_epoch 1: config/nft.py:39-45
    "awm": 1,  # accumulation over every micro-batch of the epoch: config/dgx_awm.py:51-54
    "dgpo": 1,  # accumulation over every (batch, noise level) of the epoch: config/dgpo.py:73-74
}


@dataclass(frozen=True)
class EvalEma:
    """Evaluate with an exponential moving average of the trained weights; off by default.

    The anchors' schedule (``core/ema.py``): with ``n`` optimizer steps done, a call averages when
    ``(n + 1) % every == 0``, with the decay ``min((1 + n) / (10 + n), decay)``. ``per_update``: calls
    per optimizer step, as Flow-GRPO calls after each micro-batch it accumulates into a step
    (DiffusionNFT: once a step)."""

    enabled: bool = False
    decay: float = 0.9
    every: int = 1
    per_update: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay < 1.0 or self.every < 1 or self.per_update < 1:
            raise ValueError(f"eval_ema.decay must be in [0, 1), eval_ema.every and eval_ema.per_update "
                             f">= 1, got {self.decay}, {self.every} and {self.per_update}")


FLOW_GRPO_EMA_CALLS = 2
"""Flow-GRPO's EMA calls per optimizer step: it steps the EMA after every training micro-batch
(flow_grpo@ac4c86e ``scripts/train_sd3.py`` 954-955, inside the micro-batch loop) and accumulates
``num_batches_per_epoch // 2`` micro-batches into a step: ``48 / (32 GPUs x 9 / 24)`` = 4, so 2
(``config/grpo.py`` 83 and 88, its GenEval config; the Fast config the same, 183-184 at 9745241)."""


PUBLISHED_EMA = {
    # flow_grpo@ac4c86e scripts/train_sd3.py:444-445 (decay 0.9, every 8), evaluated at 218-219
    "flow_grpo": EvalEma(True, 0.9, 8, FLOW_GRPO_EMA_CALLS),
    "flow_grpo_fast": EvalEma(True, 0.9, 8, FLOW_GRPO_EMA_CALLS),
    # scripts/train_nft_sd3.py:565-567, once after each optimizer step (1021-1029), evaluated at 220-221
    "diffusionnft": EvalEma(True, 0.9, 1, 1),
    "awm": EvalEma(True, 0.99, 1),  # config/dgx_awm.py:91-92, stepped at train_sd3_awm.py:1391-1392
    # scripts/train_sd3_dgpo.py:627 (decay 0.9, every 8), called once per training batch (1214-1215) of
    # the 2 its GenEval epoch accumulates into one step (config/dgpo.py:67-70), evaluated at 391-392
    "dgpo": EvalEma(True, 0.9, 8, 2),
}


def published_loss(strategy: str, loss: LossConfig) -> LossConfig:
    """The loss of ``strategy``'s public code; other fields (log-probability scale) are kept.

    - MixGRPO (-Flash) and DanceGRPO: leaf advantages normalised per prompt group with the sample std
      (``torch.std``), clipped at 5; every (sample, step) weighs the same; the fixed ratio clip 1e-4;
      no LayerTuning term, no KL.
    - Flow-GRPO: the same with the population std of every raw reward of the batch plus 1e-4 (its
      ``global_std``) and a KL to the reference policy, beta 0.04, over ``2 g^2`` (its form).
      Flow-GRPO-Fast: its fast configs' ratio clip 1e-5 and no KL.
    - BranchGRPO: each node's value is the mean of its leaves, normalised among the nodes of its
      prompt and depth with the sample std (0 where that std is below 1e-6), clipped at 5; every
      transition weighs the same; the fixed ratio clip 1e-3; no LayerTuning, no KL.
    - DiffusionNFT: its own objective (``core/nft.py``); here only the advantage it feeds ``r``: the
      global std with 1e-4, as Flow-GRPO's. AWM (``core/awm.py``): the same advantage. DGPO
      (``core/dgpo.py``): the per-prompt population std with 1e-4 (its GenEval config).

    A reward mix (``reward_mix`` ``auto``): with the global std, the weighted sum of the raw rewards
    (Flow-GRPO's, DiffusionNFT's and AWM's ``multi_score``); otherwise each normalised within its group
    first. DGPO sums the raw rewards too (``raw``), then divides by the prompt's own std.
    """
    fixed = replace(loss.clip, mode="fixed", fixed=GRPO_CLIP, asymmetric=False)
    common = dict(advantage_scale="std", adv_clip=ADV_CLIP, prm_lambda=0.0, edge_weighting="transition",
                  reward_mix="auto")  # a reward mix as each recipe combines it: see LossConfig
    if strategy in (*MIXGRPO, "dancegrpo"):
        return replace(loss, advantage="leaf", advantage_std="group", std_ddof=1, std_eps=1e-8,
                       clip=fixed, kl_beta=0.0, **common)
    if strategy in FLOW_GRPO:
        fast = strategy == "flow_grpo_fast"
        return replace(loss, advantage="leaf", advantage_std="global", std_ddof=0, std_eps=FLOW_GRPO_STD_EPS,
                       clip=replace(fixed, fixed=FLOW_GRPO_FAST_CLIP) if fast else fixed,
                       kl_beta=0.0 if fast else FLOW_GRPO_KL_BETA, kl_form="flow_grpo", **common)
    if strategy == "branchgrpo":
        return replace(loss, advantage="tree", node_value="mean", advantage_baseline="depth",
                       advantage_std="group", std_ddof=1, std_eps=1e-8, flat_std=BRANCHGRPO_FLAT_STD,
                       clip=replace(fixed, fixed=BRANCHGRPO_CLIP), kl_beta=0.0, **common)
    if strategy in ("diffusionnft", "awm"):
        return replace(loss, advantage="leaf", advantage_std="global", std_ddof=0,
                       std_eps=FLOW_GRPO_STD_EPS, kl_beta=0.0, **common)
    if strategy == "dgpo":  # its GenEval config's per-prompt std (global_std False, config/dgpo.py:78)
        # and, with several rewards, their raw weighted sum (flow_grpo/rewards.py:492-499 in its copy)
        return replace(loss, advantage="leaf", advantage_std="group", std_ddof=0,
                       std_eps=FLOW_GRPO_STD_EPS, kl_beta=0.0, **{**common, "reward_mix": "raw"})
    raise ValueError(f"{strategy!r} has no published baseline loss")


def published_updates(strategy: str) -> int:
    """Optimizer updates per rollout in ``strategy``'s published script."""
    if strategy not in UPDATES_PER_ROLLOUT:
        raise ValueError(f"{strategy!r} has no published number of updates per rollout")
    return UPDATES_PER_ROLLOUT[strategy]


def published_ema(strategy: str) -> EvalEma:
    """How ``strategy``'s published code evaluates: with an average of the weights, or not."""
    return PUBLISHED_EMA.get(strategy, EvalEma())
