"""Setting up a run: a config in, the parts of a run out (:class:`RunParts`).

The loop (``loop.py``) reads as the algorithm; everything it needs is made here once: the reward, the
model with its adapter (wrapped for data-parallel training), the optimizer, the weights' averages (the
evaluation EMA; the slow copy of DiffusionNFT, AWM and DGPO), the sigma grids, the held-out pairs and the
prompt source, the loss and its running scales. The order matters and is kept: the reward is built before
the model loads (a missing reward file fails in seconds), and the LoRA is initialised by name from the
seed, so the same config builds the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config.schema import TrainConfig
from ..core.ema import ParameterEMA
from ..core.flow import make_sigmas
from ..core.objective import LossConfig
from ..core.running_scales import ClipSpread, RewardScale, top_bound
from ..embedded.policy import EmbeddedPolicy
from ..lora.adapters import attach_lora
from ..models.policy import Policy, check_policy
from ..rewards.mix import RewardMix, parse_reward_spec
from ..rewards.registry import PICKS, RewardFn, get_reward
from .distributed import Dist, shard, wrap_model
from .evaluate import EvalPair, PromptSource, clean_renders, eval_pairs_for
from .nft import OldPolicy
from .plans import iteration_plan

MATCHING_STRATEGIES = ("diffusionnft", "awm", "dgpo")
"""Recipes that train on the clean images re-noised (no step of the rollout), with a slow copy."""


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device is {name!r} but this machine has no CUDA device")
    return device


def build_policy(config: TrainConfig) -> Policy:
    """The model named by ``config.model`` (no adapter yet)."""
    m = config.model
    device = resolve_device(m.device)
    if not m.cudnn_attention and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # see ModelConfig.cudnn_attention
    if m.kind == "embedded":
        return EmbeddedPolicy.from_pretrained(m.path).to(device)
    options: dict[str, Any] = dict(height=m.height, width=m.width, dtype=m.dtype,
                                   device=device, offload=m.offload,
                                   gradient_checkpointing=m.gradient_checkpointing,
                                   decode_batch=m.decode_batch, transformer_file=m.transformer_file,
                                   quantize=m.quantize)
    if m.guidance is not None:
        options["guidance"] = m.guidance
    if m.max_sequence_length is not None:
        options["max_sequence_length"] = m.max_sequence_length
    if m.kind == "flux":
        from ..models.flux import FluxPolicy

        return FluxPolicy.from_pretrained(m.path, **options)
    from ..models.sd3 import SD3Policy

    return SD3Policy.from_pretrained(m.path, **options)


def build_reward(config: TrainConfig) -> RewardMix:
    """The run's reward: the registry's terms, and the ``picks`` term as a personal reward fitted on
    ``data.picks`` with ``picks.backbone`` (docs/picks.md)."""
    device = resolve_device(config.model.device)
    weights = config.effective_reward_weights
    prebuilt: dict[str, RewardFn] = {}
    if config.uses_picks and config.picks.mode == "reward":
        from ..rewards.personal import build as personal_reward

        p = config.picks
        if shares_backbone(config):  # a guard term of the same CLIP: one copy serves both
            prebuilt[p.backbone] = get_reward(p.backbone, weights[p.backbone], device)
        prebuilt[PICKS] = personal_reward(weights[PICKS], device, p.backbone, p.backbone_weights,
                                            built_backbone=prebuilt.get(p.backbone), head=p.head,
                                            pessimism=p.pessimism)
    return RewardMix(config.reward, weights, device, prebuilt)


def shares_backbone(config: TrainConfig) -> bool:
    """Whether ``picks.backbone`` is also a term of ``reward``, with the same weights: then the run
    builds that CLIP once (a FLUX recipe guards its picks with PickScore, whose CLIP is ~1B parameters)."""
    p = config.picks  # a CLIP backbone has its weights (PicksConfig checks)
    path = config.effective_reward_weights.get(p.backbone)
    terms = {t.name for t in parse_reward_spec(config.reward)}
    return (p.backbone in terms and path is not None
            and Path(path).resolve() == Path(p.backbone_weights).resolve())


def load_policy(config: TrainConfig, policy: Policy | None = None) -> Policy:
    """The model named by the config (or ``policy``, given by a front end such as a ComfyUI node),
    with a fresh LoRA attached (or all weights trainable)."""
    policy = build_policy(config) if policy is None else policy
    check_policy(policy)
    if config.lora.enabled:
        attach_lora(policy.transformer, config.lora.rank, config.lora.alpha, config.lora.targets,
                    seed=config.seed)
    else:
        policy.transformer.requires_grad_(True)
    return policy


@dataclass
class RunParts:
    """What a run is made of (see the module docstring). ``reward`` is None only for a run whose rewards
    are all stored values (training online on picked trees without a guard)."""

    reward: RewardMix | None
    policy: Policy
    grad_sync: Callable[[bool], AbstractContextManager[Any]] | None
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    ema: ParameterEMA | None
    old: OldPolicy | None
    sigmas: torch.Tensor
    eval_sigmas: torch.Tensor
    eval_pairs: list[EvalPair]
    prompts: PromptSource
    loss: LossConfig
    spread: ClipSpread
    reward_scale: RewardScale
    renders: torch.Tensor | None


def build_run(config: TrainConfig, policy: Policy | None = None, evaluation: bool = True,
              dist: Dist | None = None,
              reward: Callable[[TrainConfig], RewardMix | None] = build_reward) -> RunParts:
    """The parts of a run of ``config``. ``policy``: a model already loaded (trained in place: pass a
    copy); None loads ``config.model``. ``evaluation`` False (training steps in a front end): no held-out
    set, so no prompt is kept out of training. ``reward``: how the run's reward is built."""
    torch.set_num_threads(config.threads)
    dist = dist or Dist()
    shard(config.data.prompts_per_iteration, dist)  # an uneven split fails before loading
    # rewards first: a missing reward file fails in seconds, before a large model loads
    built_reward = reward(config)
    policy = load_policy(config, policy)
    wrapped, grad_sync = wrap_model(policy.transformer, dist, not config.lora.enabled)
    if wrapped is not policy.transformer:
        policy.wrap_transformer(wrapped)
    params = list(policy.trainable_parameters())
    o = config.optim
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    ema_cfg = config.effective_eval_ema  # Flow-GRPO and DiffusionNFT evaluate an average of the weights
    ema = ParameterEMA(params, ema_cfg.decay, ema_cfg.every, ema_cfg.per_update) if ema_cfg.enabled else None
    # DiffusionNFT samples with an old policy, a slow average of the trained LoRA; AWM and DGPO keep such a
    # slow copy for their proximity terms (DGPO samples with it late in training)
    old = OldPolicy(params) if config.strategy in MATCHING_STRATEGIES else None
    steps, s = config.strategy_config.steps, config.sampling
    tokens = policy.image_tokens
    sigmas = make_sigmas(s.schedule, steps, s.shift, image_tokens=tokens)
    eval_sigmas = make_sigmas(s.schedule, s.eval_steps, s.shift, image_tokens=tokens)
    d = config.data
    eval_pairs = eval_pairs_for(d.prompts, d.eval_prompts, d.eval_pairs, d.eval_seed) if evaluation else []
    prompts = PromptSource(d.prompts, config.seed, exclude=[p.prompt for p in eval_pairs])
    loss = config.effective_loss  # a baseline's published loss, or the loss section
    # drift (flow loss on ideal renders) exists where renders do: the embedded model's scenes
    embedded_scenes = d.prompts == "scenes" and d.eval_prompts is None and config.model.kind == "embedded"
    renders = clean_renders(eval_pairs) if evaluation and embedded_scenes else None
    # a bad window or noise pool fails here, in one line, before any model call
    iteration_plan(config, sigmas, 0, policy.latent_unshuffle).noise.check(tuple(policy.latent_shape))
    return RunParts(built_reward, policy, grad_sync, params, optimizer, ema, old, sigmas, eval_sigmas,
                    eval_pairs, prompts, loss, ClipSpread(config.effective_clip_spread, top_bound(loss.clip)),
                    RewardScale(), renders)
