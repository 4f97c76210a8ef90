"""The protocol's arms (every recipe as published; the paper's parts switched off one at a time) and
its clip treatments, and how each becomes a :class:`TrainConfig`.

- **Arms.** Dynamic-TreeRPO runs twice, with the Euler tail (paired with MixGRPO, which has it) and
  with the DPM-Solver++(2M) tail (paired with MixGRPO-Flash, which has it). Every baseline trains
  with its own published loss (``baseline_loss: published``) and sampler.
- **Clip treatments.** As published, only the tree rescales its ratio clip to the measured ratio
  spread (``clip_spread``, trainer/core/running_scales.py); the baselines' fixed 1e-4..1e-3 bounds
  do not bind on the embedded test bed (each arm's clip fraction: docs/results-protocol.md). The
  headline pairs are therefore also run with the rescale on every arm (``rescale-all``) and on none
  (``none``), so that a difference cannot come from the clip alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ...config.files import load_config
from ...config.schema import TrainConfig
from ...core.strategies import STRATEGIES

Role = Literal["main", "ablation"]


@dataclass(frozen=True)
class Arm:
    """One row of the protocol: a strategy with its sampler tail and config overrides."""

    name: str
    strategy: str
    tail: str
    overrides: tuple[str, ...] = ()
    role: Role = "main"
    knob: str = ""

    @property
    def is_tree(self) -> bool:
        return self.strategy == "dynamic_treerpo"


TREE = "dynamic_treerpo"  # the DPM-Solver++(2M) tail (the embedded default's)
TREE_EULER = "dynamic_treerpo_euler"
MAIN_ARMS = (
    Arm(TREE, "dynamic_treerpo", "dpm2m", ("tree.tail=dpm2m",)),
    Arm(TREE_EULER, "dynamic_treerpo", "euler", ("tree.tail=euler",)),
    Arm("mixgrpo", "mixgrpo", "euler", ("strategy=mixgrpo",)),
    Arm("mixgrpo_flash", "mixgrpo_flash", "dpm2m", ("strategy=mixgrpo_flash",)),
    Arm("dancegrpo", "dancegrpo", "none (SDE to the end)", ("strategy=dancegrpo",)),
    Arm("flow_grpo", "flow_grpo", "none (SDE to the end)", ("strategy=flow_grpo",)),
    Arm("flow_grpo_fast", "flow_grpo_fast", "euler", ("strategy=flow_grpo_fast",)),
    Arm("branchgrpo", "branchgrpo", "none (SDE to the end)", ("strategy=branchgrpo",)),
    Arm("diffusionnft", "diffusionnft", "dpm2m (deterministic, no SDE)", ("strategy=diffusionnft",)),
    Arm("awm", "awm", "dpm2m, SDE where 0.3 <= sigma <= 0.9", ("strategy=awm",)),
    Arm("dgpo", "dgpo", "dpm2m (deterministic, no SDE)", ("strategy=dgpo",)),
)
LIKE_FOR_LIKE = ((TREE_EULER, "mixgrpo"), (TREE, "mixgrpo_flash"))
# the corrected spec's capping clip: element-mean log-probabilities, no spread rescale, bounds at
# which the spec's share of the edges clip at the default learning rate (each arm's clip fraction as
# run: the recipes' table of docs/results-protocol.md)
CAPPING = ("clip_spread.enabled=false", "loss.clip.eps_low=1e-6", "loss.clip.eps_high=1e-5")
ABLATION_ARMS = (
    Arm("no LayerTuning", "dynamic_treerpo", "dpm2m", ("loss.prm_lambda=0.0",), "ablation", "LayerTuning-RL"),
    Arm("LayerTuning weight tanh", "dynamic_treerpo", "dpm2m", ("loss.prm_weight=tanh",), "ablation",
        "LayerTuning-RL"),
    Arm("capping dynamic clip", "dynamic_treerpo", "dpm2m", CAPPING, "ablation", "dynamic clipping"),
    Arm("capping fixed clip", "dynamic_treerpo", "dpm2m",
        (*CAPPING, "loss.clip.mode=fixed", "loss.clip.fixed=1e-5"), "ablation", "dynamic clipping"),
    Arm("no clip", "dynamic_treerpo", "dpm2m", ("loss.clip.mode=none",), "ablation", "dynamic clipping"),
    Arm("no depth-wise noise", "dynamic_treerpo", "dpm2m", ("tree.noise_growth=0.0",), "ablation",
        "depth-wise noise"),
    Arm("fixed window", "dynamic_treerpo", "dpm2m", ("window.schedule=fixed",), "ablation",
        "sliding window"),
)
ALL_ARMS = (*MAIN_ARMS, *ABLATION_ARMS)

SAME_RATE = {"capping fixed clip": "capping dynamic clip"}
"""Ablation arms trained at another arm's swept rate instead of their own: the fixed clip is compared
with the dynamic clip at the same rate."""
BEST_FIXED_CLIP = "capping best fixed clip"
FIXED_CLIPS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4)
"""The fixed clip bounds the ablation part sweeps on validation, at the dynamic clip's rate, for the
dynamic clip's strongest fixed rival (:func:`best_fixed_clip_arm`)."""


def best_fixed_clip_arm(clip: float) -> Arm:
    """The capping clip with a fixed bound of ``clip`` (the one the ablation part's clip sweep chose)."""
    overrides = (*CAPPING, "loss.clip.mode=fixed", f"loss.clip.fixed={clip:g}")
    return Arm(BEST_FIXED_CLIP, "dynamic_treerpo", "dpm2m", overrides, "ablation", "dynamic clipping")


def select_arms(names: str | None, arms: Sequence[Arm] = ALL_ARMS) -> list[Arm]:
    """The arms named in a comma-separated list (``--arms``), in protocol order; None: all."""
    if names is None:
        return list(arms)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {a.name for a in arms}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        name = unknown[0] if unknown else "(none given)"
        raise ValueError(f"unknown arm {name!r} in --arms; the arms are: " + ", ".join(a.name for a in arms))
    return [a for a in arms if a.name in wanted]


def runnable_arms(arms: Sequence[Arm], log: Callable[[str], None]) -> list[Arm]:
    """``arms`` whose strategy this trainer has (``STRATEGIES``); each other one is skipped with a line."""
    kept = []
    for arm in arms:
        if arm.strategy in STRATEGIES:
            kept.append(arm)
        else:
            log(f"skipping arm {arm.name}: this trainer has no strategy {arm.strategy!r}")
    return kept


# --------------------------------------------------------------------------- clip treatments
@dataclass(frozen=True)
class Treatment:
    """Config overrides added to every arm of a treatment; ``rescale`` is whether every arm's
    effective clip-spread rescale must then be on (True), off (False) or as published (None)."""

    name: str
    description: str
    rescale: bool | None

    def overrides(self, arm: Arm) -> tuple[str, ...]:
        if self.rescale is None:
            return ()
        extra = ("clip_spread.enabled=true",) if self.rescale else ("clip_spread.enabled=false",)
        if self.rescale and not arm.is_tree:  # a baseline's published clip takes the rescale too
            extra += ("clip_spread.on_baselines=true",)
        return extra


PUBLISHED = Treatment("published", "each arm as published: only the tree rescales its clip", None)
TREATMENTS = (
    Treatment("rescale-all", "every arm rescales its ratio clip to the measured spread", True),
    Treatment("none", "no arm rescales its clip (the tree keeps its dynamic 1e-4..1e-3 bounds, "
                      "which then do not bind, like the baselines' fixed ones)", False),
)


def arm_config(base: Sequence[str], arm: Arm, config_path: str | None, lr: float | None = None,
               seed: int | None = None, validation_seed: int | None = None,
               treatment: Treatment = PUBLISHED) -> TrainConfig:
    """The config of ``arm`` (under ``treatment``) on top of the protocol's base overrides. A tree arm
    samples with its own tail whatever the base config's is (the ablations are the DPM-Solver tree's)."""
    tail = [f"tree.tail={arm.tail}"] if arm.is_tree else []
    extra = [*base, *tail, *arm.overrides, *treatment.overrides(arm)]
    if lr is not None:
        extra.append(f"optim.lr={lr}")
    if seed is not None:
        extra.append(f"seed={seed}")
    if validation_seed is not None:
        extra.append(f"data.eval_seed={validation_seed}")
    return load_config(TrainConfig, config_path, extra)


def treatment_problem(config: TrainConfig, arm: Arm, treatment: Treatment) -> str | None:
    """Why ``arm`` cannot run under ``treatment`` (its effective rescale is not what the treatment
    asks), or None."""
    if treatment.rescale is None or config.effective_clip_spread.enabled == treatment.rescale:
        return None
    if treatment.rescale and config.uses_published_loss:
        return ("it cannot take the clip-spread rescale (with baseline_loss=published, "
                "TrainConfig.effective_clip_spread turns it off)")
    return f"its clip-spread rescale stays {'off' if treatment.rescale else 'on'}"


# --------------------------------------------------------------------------- equal images per iteration
GROUP_SECTION = {"mixgrpo": "mixgrpo", "mixgrpo_flash": "mixgrpo", "dancegrpo": "dancegrpo",
                 "flow_grpo": "flow_grpo", "flow_grpo_fast": "flow_grpo", "diffusionnft": "diffusionnft",
                 "awm": "awm", "dgpo": "dgpo"}
"""The config section holding each baseline's ``group_size`` (images per prompt)."""


def images_per_iteration(config: TrainConfig) -> int:
    """Scored images of one iteration: prompts x leaves per prompt."""
    from ...core.flow import make_sigmas
    from ...training.plans import iteration_plan

    sigmas = make_sigmas(config.sampling.schedule, config.strategy_config.steps, config.sampling.shift)
    return config.data.prompts_per_iteration * iteration_plan(config, sigmas, 0).leaves_per_prompt


def matching_steps(arm: Arm, steps: int, build: Callable[[Arm], TrainConfig]) -> Arm:
    """``arm`` with the override that makes it sample with ``steps`` steps (the tree's), when its config
    says another number: the embedded default gives every strategy the same steps, a FLUX or SD3 config
    may set only the tree's."""
    config = build(arm)
    section = "tree" if arm.is_tree else GROUP_SECTION.get(arm.strategy, arm.strategy)
    if config.strategy_config.steps == steps or not hasattr(getattr(config, section, None), "steps"):
        return arm
    return dataclasses.replace(arm, overrides=(*arm.overrides, f"{section}.steps={steps}"))


def matching_images(arm: Arm, images: int, build: Callable[[Arm], TrainConfig]) -> Arm:
    """``arm`` with the override that makes it score ``images`` per iteration (a baseline's group size,
    or BranchGRPO's number of splits), when its config scores another number; unchanged otherwise
    (or when nothing matches: :func:`check_same_images` then refuses the protocol)."""
    config = build(arm)
    if images_per_iteration(config) == images:
        return arm
    per_prompt, prompts = divmod(images, config.data.prompts_per_iteration)
    section = GROUP_SECTION.get(arm.strategy)
    if prompts == 0 and section is not None:
        candidates = [(f"{section}.group_size={per_prompt}",)]
    elif prompts == 0 and arm.strategy == "branchgrpo":
        candidates = [(f"branchgrpo.splits={s}",) for s in range(1, config.branchgrpo.steps)]
    else:
        candidates = []
    for extra in candidates:
        matched = dataclasses.replace(arm, overrides=(*arm.overrides, *extra))
        try:
            if images_per_iteration(build(matched)) == images:
                return matched
        except ValueError:
            continue
    return arm


def check_same_images(configs: dict[str, TrainConfig]) -> int:
    """Images per iteration of every arm; different counts would not be a fair comparison."""
    counts = {name: images_per_iteration(c) for name, c in configs.items()}
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{k} {v}" for k, v in counts.items())
        raise ValueError(f"the arms score different numbers of images per iteration ({listed}): set each "
                         "baseline's group size (branchgrpo.splits) to the tree's leaves")
    return next(iter(counts.values()))
