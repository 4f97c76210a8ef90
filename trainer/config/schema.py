"""The headless trainer's typed configuration (YAML sections map onto these dataclasses).

Every [choice] of docs/algorithm.md is an option here or in the core configs it nests
(``TreeConfig``, ``MixGRPOConfig``, ``DanceGRPOConfig``, ``LossConfig``), with its default.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from ..core.awm import AWMConfig
from ..core.dgpo import DGPOConfig
from ..core.objective import LossConfig
from ..core.running_scales import ClipSpreadConfig
from ..core.strategies import (
    BranchGRPOConfig,
    DanceGRPOConfig,
    DiffusionNFTConfig,
    FlowGRPOConfig,
    MixGRPOConfig,
    Strategy,
    StrategyConfig,
    TreeConfig,
)
from ..rewards.registry import PICKS
from .layout import YamlLayout
from .published import EvalEma, published_ema, published_loss, published_updates

# Options kept for experiments: each measured no better than its default on the embedded test bed
# (docs/algorithm.md, "What moved the previous embedded default"). The math reads them in their
# sections; YAML files keep them under ``experimental:`` so a newcomer's file shows what matters.
EXPERIMENTAL_OPTIONS = (
    "tree.antithetic", "tree.noise_pool", "mixgrpo.noise_pool", "dancegrpo.noise_pool",
    "flow_grpo.noise_pool", "branchgrpo.noise_pool",
    "loss.advantage_std", "loss.advantage_baseline", "loss.prm_scale", "loss.step_scale",
    "guard.steer",  # docs/picks.md, "What each lever gives"
    "picks.pessimism",  # docs/picks.md, "What each lever gives"
)
BaselineLoss = Literal["published", "shared"]
"""``published``: a baseline strategy trains with its own published loss
(:func:`~.published.published_loss`), whatever ``loss`` and ``clip_spread`` say; ``shared``: with
the ``loss`` and ``clip_spread`` sections as configured (Dynamic-TreeRPO's parts on a baseline's
sampler, for ablations). Dynamic-TreeRPO always uses the sections as configured."""


YAML_LAYOUT = YamlLayout(
    moved={option: f"experimental.{option}" for option in EXPERIMENTAL_OPTIONS},
    removed={"loss.clip.scale": "the clip spread sets it at every update"},
)


@dataclass(frozen=True)
class ModelConfig:
    """Which model to fine-tune, from local weights (nothing is downloaded).

    ``kind``: ``embedded`` (the small default shipped in the package; ``path`` None means those
    weights), ``flux`` (FLUX.1-dev/schnell) or ``sd3`` (SD3/SD3.5), whose ``path`` is a local
    diffusers folder; ``transformer_file`` optionally replaces its transformer with a single-file
    checkpoint. The other keys apply to ``flux``/``sd3``: ``dtype`` of the weights (the SDE math is
    float32), ``device`` (``auto``: CUDA when present), image size, ``guidance`` (FLUX's guidance
    embedding, SD3's classifier-free guidance scale; None: the model's default, 3.5 and 4.5),
    ``max_sequence_length`` of T5 (None: the pipeline's), ``offload`` of text encoders and VAE to
    CPU between uses, ``gradient_checkpointing`` and ``decode_batch`` (VAE decode rows per call).
    ``quantize``: ``fp8`` stores the transformer's weights in float8_e4m3fn, each layer upcast to
    ``dtype`` while it runs (diffusers' layerwise casting); the LoRA trains in float32 and the SDE math
    is float32. It halves the transformer's weight memory (FLUX.1-dev: 22.2 GiB in bf16, 11.1 in fp8).
    ``cudnn_attention``: let attention use PyTorch's cuDNN backend on CUDA. Off by default: with
    torch 2.11 / cuDNN 9.19 on an H200 it failed FLUX's LoRA backward with an illegal memory access
    (docs/models.md); the flash and memory-efficient backends ran it.
    """

    kind: Literal["embedded", "flux", "sd3"] = "embedded"
    path: str | None = None
    transformer_file: str | None = None
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    device: str = "auto"
    height: int = 512
    width: int = 512
    guidance: float | None = None
    max_sequence_length: int | None = None
    offload: bool = False
    gradient_checkpointing: bool = False
    decode_batch: int = 4
    cudnn_attention: bool = False
    quantize: Literal["none", "fp8"] = "none"

    def __post_init__(self) -> None:
        if self.quantize != "none" and self.kind == "embedded":
            raise ValueError("model.quantize applies to flux and sd3 models, not the embedded one")
        if self.kind not in ("embedded", "flux", "sd3"):
            raise ValueError(f"model kind must be 'embedded', 'flux' or 'sd3', got {self.kind!r}")
        if self.kind != "embedded" and not self.path:
            raise ValueError(f"model.path is required for kind {self.kind!r}: a local diffusers folder")
        if self.height % 16 or self.width % 16 or self.height < 16 or self.width < 16:
            raise ValueError(f"image size must be a positive multiple of 16, got {self.height}x{self.width}")
        if self.decode_batch < 1:
            raise ValueError(f"decode_batch must be >= 1, got {self.decode_batch}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA on the transformer (peft). ``alpha / rank`` is the strength written into exports.

    ``enabled`` false trains every transformer weight instead (full fine-tuning; the export is the
    whole transformer in safetensors, and the KL term is unavailable: there is no frozen reference).
    """

    enabled: bool = True
    rank: int = 16
    alpha: float = 16.0
    targets: tuple[str, ...] = (
        "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
        "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "proj_mlp",
    )

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if not self.targets:
            raise ValueError("targets must name at least one module")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with gradient clipping; ``updates_per_iteration`` optimizer steps per rollout.

    With more than one update, later updates see ratios away from 1, which is when clipping acts.
    ``epochs``: passes over each rollout's trained forwards (PPO-style reuse; each pass reshuffled
    and split into ``updates_per_iteration`` updates) [choice].
    ``schedule``: the learning rate of iteration ``i`` of ``iterations`` is ``lr`` (``constant``) or
    ``lr`` times a cosine from 1 down to ``min_lr_ratio`` (``cosine``), after ``warmup`` iterations
    of linear warm-up; it is a function of the iteration alone, so a resumed run gets the same rates.
    An update whose loss or gradient is not finite is skipped (counted in ``skipped_updates``);
    ``max_skipped_in_a_row`` such updates in a row stop the run with its last checkpoint intact
    (0: never stop).
    """

    lr: float = 1.7e-3
    weight_decay: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    updates_per_iteration: int = 2
    epochs: int = 1
    schedule: Literal["constant", "cosine"] = "constant"
    warmup: int = 0
    min_lr_ratio: float = 0.0
    max_skipped_in_a_row: int = 8

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.updates_per_iteration < 1:
            raise ValueError("updates_per_iteration must be >= 1")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.max_skipped_in_a_row < 0:
            raise ValueError(f"max_skipped_in_a_row must be >= 0, got {self.max_skipped_in_a_row}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def lr_at(self, iteration: int, iterations: int) -> float:
        """Learning rate of 0-based ``iteration`` in a run of ``iterations``."""
        if self.warmup and iteration < self.warmup:
            return self.lr * (iteration + 1) / (self.warmup + 1)
        if self.schedule == "constant":
            return self.lr
        span = max(1, iterations - self.warmup)
        progress = min(1.0, (iteration - self.warmup) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


@dataclass(frozen=True)
class SamplingConfig:
    """Sigma schedule of rollouts and evaluation; ``log_prob`` reduces the step log-density over
    latent elements (``mean``, as the anchors) or sums it."""

    schedule: Literal["linear", "shift", "flux"] = "shift"
    shift: float = 3.0
    eval_steps: int = 10
    log_prob: Literal["mean", "sum"] = "mean"


@dataclass(frozen=True)
class WindowConfig:
    """Where the SDE window / tree starts each iteration (MixGRPO's sliding window).

    ``start`` None means the strategy's own ``window_start``."""

    schedule: Literal["progressive", "random", "fixed"] = "progressive"
    start: int | None = None
    every: int = 10
    stride: int = 1
    roll_back: bool = True


@dataclass(frozen=True)
class DataConfig:
    """Training prompts (``scenes``: generated; or a text file, one prompt per line) and the
    held-out evaluation set of prompt/seed pairs (never used for training).

    ``eval_prompts``: a prompt file of held-out prompts; None takes generated scenes when
    ``prompts`` is ``scenes``, else ``eval_pairs`` prompts drawn from the training file and removed
    from training. ``picks``: a picks folder (docs/picks.md), for the ``picks`` reward.
    """

    prompts: str = "scenes"
    eval_prompts: str | None = None
    picks: str | None = None
    prompts_per_iteration: int = 64
    eval_pairs: int = 128
    eval_seed: int = 12345
    eval_every: int = 8

    def __post_init__(self) -> None:
        if self.prompts_per_iteration < 1 or self.eval_pairs < 1 or self.eval_every < 1:
            raise ValueError("prompts_per_iteration, eval_pairs and eval_every must be >= 1")


@dataclass(frozen=True)
class PicksConfig:
    """Training from a person's picks (``reward: picks``, ``data.picks: FOLDER``; docs/picks.md).

    ``mode``: ``reward`` fits a personal reward (a head over frozen ``backbone`` features) on the picks
    and trains on fresh rollouts it scores; ``online`` trains the tree's own objective on the picked
    trees themselves, the picks as their leaves' rewards (``trees_per_iteration`` of them per
    iteration). ``reward`` is the default: ``treerpo bench taste`` measured it learning more, and sooner,
    from the same picks (docs/picks.md, docs/results.md).
    ``backbone``: ``content`` (pooled pixels plus the colour, amount and place of what is drawn; any
    model; in a pilot it ordered a hidden taste's pairs better than ``pooled``, docs/picks.md),
    ``pooled`` (pixels pooled on a few grids; the default before 0.4.0), ``scene-clip`` (the embedded
    model's own CLIP-style image encoder beside ``content``: what is drawn, how many, which colour on which
    shape, on which side; its 64x64 pictures only) or the image embedding of the ``pickscore`` /
    ``hps-v2.1`` reward's CLIP at ``backbone_weights``. ``head``: ``linear`` (a
    Bradley-Terry score linear in the features' principal directions; more accurate from few picks,
    docs/picks.md, "How many picks"), ``quadratic`` / ``kernel`` (that score plus squares and products
    of a few coordinates / a Gaussian kernel's random features: a distance or a peak), ``ensemble`` (the
    bootstrap mean of linear scores), ``ard`` (experimental: the linear score with a prior per direction
    set from the picks, which shrinks the directions they do not need) or ``mlp`` (a two-layer head);
    ``rewards.personal`` says why each.
    """

    mode: Literal["reward", "online"] = "reward"
    backbone: Literal["pooled", "content", "scene-clip", "pickscore", "hps-v2.1"] = "content"
    backbone_weights: str | None = None
    head: Literal["linear", "mlp", "quadratic", "kernel", "ensemble", "ard"] = "linear"
    trees_per_iteration: int = 8
    pessimism: float = 0.0  # experimental: train on the head's lower bound (beta posterior sd)

    def __post_init__(self) -> None:
        if self.mode not in ("reward", "online"):
            raise ValueError(f"picks.mode must be 'reward' or 'online', got {self.mode!r}")
        if self.backbone not in ("pooled", "content", "scene-clip", "pickscore", "hps-v2.1"):
            raise ValueError("picks.backbone must be pooled, content, pickscore or hps-v2.1 (or scene-clip, "
                             f"the embedded model's), got {self.backbone!r}")
        if self.backbone not in ("pooled", "content", "scene-clip") and not self.backbone_weights:
            raise ValueError(f"picks.backbone {self.backbone} needs picks.backbone_weights: the reward's "
                             "weights path (docs/models.md)")
        if self.head not in ("linear", "mlp", "quadratic", "kernel", "ensemble", "ard"):
            raise ValueError(f"picks.head must be linear, quadratic, kernel, ensemble, ard or mlp, got "
                             f"{self.head!r}")
        if self.pessimism < 0:
            raise ValueError(f"picks.pessimism must be >= 0, got {self.pessimism:g}")
        if self.pessimism > 0 and self.head == "mlp":
            raise ValueError("picks.pessimism needs picks.head: linear, quadratic, kernel, ensemble or ard "
                             "(the MLP head has no posterior)")
        if self.trees_per_iteration < 1:
            raise ValueError(f"picks.trees_per_iteration must be >= 1, got {self.trees_per_iteration}")


GUARD_WORDS = ("strictly", "closely", "loosely", "off")
"""How closely training from picks keeps following the prompt (``trainer/guard/levels.py`` gives each
word its limit)."""


STRENGTH_SEARCHES = ("line", "bisect")
MEASURE_ORDERS = ("backward", "every")
"""How the guard places lower LoRA strengths (``guard.search``)."""
GUARD_VALIDATIONS = ("own", "held_out", "scenes")
"""Which prompts the guard validates a picks folder on (``guard.validation``)."""


def check_weights(weights: Iterable[float]) -> tuple[float, ...]:
    """``guard.weights`` as a tuple, or one line naming what is wrong: each in (0, 1), none repeated."""
    out = tuple(float(w) for w in weights)
    bad = [w for w in out if not (0.0 < w < 1.0 and math.isfinite(w))]
    if bad:
        raise ValueError(f"guard.weights must each lie strictly between 0 and 1, got {bad[0]:g}")
    if len(set(out)) != len(out):
        raise ValueError(f"guard.weights names a weight twice: {', '.join(f'{w:g}' for w in out)}")
    return out


@dataclass(frozen=True)
class GuardConfig:
    """A limit on how much prompt-following training from picks may trade for taste (``trainer/guard``,
    docs/picks.md). It applies when ``reward`` names ``picks`` and a guard term besides it.

    ``keep``: ``strictly`` / ``closely`` / ``loosely`` allow the guard reward's mean on validation pairs
    to fall by at most 0.01 / 0.02 / 0.05 on the scene reward's scale (another guard: the same share
    of its own spread); ``off``: no guard, the reward's weights as written (the expert's fixed picks
    weight). ``limit``: the fall as a number instead. ``checkpoints``: how many, evenly spaced over the
    run; ``pairs``: validation prompt/seed pairs (drawn with ``seed``, never trained on), whose count
    sets how precisely the fall is known (its standard error shrinks as ``1 / sqrt(pairs)``;
    docs/picks.md gives its size on the scene reward); ``margin``: how many standard errors of the
    measured fall must also fit under the limit (1: the limit holds unless the measurement was unlucky
    by more than one standard error);
    ``strength_tries``: lower LoRA strengths measured for checkpoints past the limit; ``search``: how
    they are placed: ``bisect`` (the checkpoint with the most taste, halving the interval between the
    strongest strength known to fit and the weakest known not to, one measurement per try) or ``line``
    (the first version's: the first checkpoint past the limit and the one with the most taste, each where
    a straight line from the base predicts the limit, and at 0.7 of that). The defaults, 512 pairs and
    ``bisect``, replaced the first version's 128 pairs and ``line``, whose margin took most of the limit
    (docs/picks.md, "What each lever gives", renders the comparison); on a large model each pair is an
    image per measurement: set fewer (a wider margin). ``steer``: the guard also steers training: after
    each checkpoint a controller (``trainer/guard/controller.py``) sets the picks weight of the next
    iterations from the measured fall, starting from the reward's own weight, so the run ends near the
    limit whatever the taste (off: it did no better than the fixed weight, docs/picks.md).
    ``measure``: when the checkpoints are measured: ``backward`` (after training, the last checkpoint first
    and earlier ones only while the later ones are past the limit or lost taste; it chose as ``every`` did
    on the stored benchmark runs with fewer measurements, ``trainer/guard/order.py``) or ``every`` (each
    checkpoint as it is kept, the order before this option; ``steer`` measures so whatever this says).
    ``validation``: which prompts the guard measures on when training takes its prompts from a file (a
    picks folder's, the node's case): ``own``, the training prompts themselves at seeds training never
    draws, so the limit is kept on the prompts trained on; ``held_out``, a quarter of them (at least 4)
    kept out of training, with the fall's standard error over those prompts rather than over the pairs,
    so that the limit stands for prompts training never saw (it needs at least twice as many distinct
    prompts as it holds out); ``scenes``, ``pairs`` generated scenes of the embedded model's kind (nearly
    every pair its own prompt, none of the training prompts): prompts in general, not the person's.
    Generated scenes (``data.prompts: scenes``) always validate on scenes of their own.
    ``weights``: the picks weights the guard tries (``trainer/guard/weights.py``): the same picks train
    once at each weight (the other terms share the rest as written) and the run whose chosen checkpoint
    gained the most personal reward on the validation pairs is kept; one training per weight. The
    default is one training at 0.4: on the same runs it kept at least the share of the taste that 0.5.0's
    two trainings at 0.3 and 0.5 kept, at half the training (docs/results-taste.md, "One training").
    ``[]``: the reward's own weights as written, one training (the expert's fixed weight).
    """

    keep: str | bool = "closely"  # YAML reads a bare ``off`` as false: both mean off
    limit: float | None = None
    checkpoints: int = 6
    pairs: int = 512
    seed: int = 777
    margin: float = 1.0
    strength_tries: int = 4
    search: str = "bisect"
    steer: bool = False
    measure: str = "backward"
    weights: tuple[float, ...] = (0.4,)
    validation: str = "own"

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", check_weights(self.weights))
        if self.validation not in GUARD_VALIDATIONS:
            raise ValueError(f"guard.validation must be one of {', '.join(GUARD_VALIDATIONS)}, "
                             f"got {self.validation!r}")
        if self.keep is False:
            object.__setattr__(self, "keep", "off")
        if self.keep not in GUARD_WORDS or self.keep is True:
            raise ValueError(f"guard.keep must be one of {', '.join(GUARD_WORDS)}, got {self.keep!r}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"guard.limit must be >= 0, got {self.limit}")
        if self.checkpoints < 1 or self.pairs < 2 or self.strength_tries < 0:
            raise ValueError("guard.checkpoints must be >= 1, guard.pairs >= 2 and guard.strength_tries >= 0")
        if self.margin < 0:
            raise ValueError(f"guard.margin must be >= 0, got {self.margin}")
        if self.measure not in MEASURE_ORDERS:
            raise ValueError(f"guard.measure must be one of {', '.join(MEASURE_ORDERS)}, "
                             f"got {self.measure!r}")
        if self.search not in STRENGTH_SEARCHES:
            raise ValueError(f"guard.search must be one of {', '.join(STRENGTH_SEARCHES)}, "
                             f"got {self.search!r}")

    def every(self, iterations: int) -> int:
        """Iterations between checkpoints in a run of ``iterations`` (the last one always is one)."""
        return max(1, math.ceil(iterations / self.checkpoints))


@dataclass(frozen=True)
class DistributedConfig:
    """``backend``: ``auto`` (NCCL with CUDA, else gloo), ``nccl`` or ``gloo``. ``timeout_s``: how
    long a collective waits for a rank that stopped answering before the run fails (keep it above
    the longest step between collectives, e.g. an evaluation)."""

    backend: str = "auto"
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"distributed.backend must be auto, nccl or gloo, got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"distributed.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class TrainConfig:
    """A training run. ``iterations`` and ``checkpoint_every`` are top-level on purpose
    (``--set iterations=2`` makes a short run).

    ``reward``: a registered name, or several with weights (``hps-v2.1:0.7,pickscore:0.3``: each is
    normalised within its prompt's images, then weighted [choice]); ``reward_weights``: the local
    weights path of each model reward, by name.
    """

    iterations: int = 40
    checkpoint_every: int = 8
    seed: int = 0
    threads: int = 2
    max_batch: int = 64
    reward: str = "scene"
    reward_weights: dict[str, str] = field(default_factory=dict)
    strategy: Strategy = "dynamic_treerpo"
    baseline_loss: BaselineLoss = "published"
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    tree: TreeConfig = field(default_factory=lambda: TreeConfig(steps=10, window_start=0, depth=3,
                                                                 branching=2, trees_per_prompt=1,
                                                                 tail="dpm2m"))
    mixgrpo: MixGRPOConfig = field(default_factory=lambda: MixGRPOConfig(steps=10, window_size=3,
                                                                        group_size=8))
    dancegrpo: DanceGRPOConfig = field(default_factory=lambda: DanceGRPOConfig(steps=10, group_size=8))
    flow_grpo: FlowGRPOConfig = field(default_factory=lambda: FlowGRPOConfig(steps=10, group_size=8))
    branchgrpo: BranchGRPOConfig = field(default_factory=lambda: BranchGRPOConfig(steps=10, splits=3))
    diffusionnft: DiffusionNFTConfig = field(default_factory=lambda: DiffusionNFTConfig(steps=10,
                                                                                        group_size=8))
    awm: AWMConfig = field(default_factory=lambda: AWMConfig(steps=10, group_size=8))
    dgpo: DGPOConfig = field(default_factory=lambda: DGPOConfig(steps=10, group_size=8))
    loss: LossConfig = field(default_factory=LossConfig)
    eval_ema: EvalEma = field(default_factory=EvalEma)
    clip_spread: ClipSpreadConfig = field(default_factory=ClipSpreadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    picks: PicksConfig = field(default_factory=PicksConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    yaml_layout: ClassVar[YamlLayout] = YAML_LAYOUT

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        from ..rewards.mix import parse_reward_spec

        terms = {t.name for t in parse_reward_spec(self.reward)}  # a bad name fails at load time
        stray = sorted(set(self.reward_weights) - terms)
        if stray:
            raise ValueError(f"reward_weights names {stray[0]!r}, which is not in reward {self.reward!r}")
        if PICKS in terms and not (self.data.picks or self.reward_weights.get(PICKS)):
            raise ValueError("reward 'picks' needs a picks folder: data.picks: FOLDER (docs/picks.md)")
        if self.picks.mode == "online" and PICKS in terms and self.strategy != "dynamic_treerpo":
            raise ValueError("picks.mode online trains the picked trees with the tree's own objective: "
                             "strategy must be dynamic_treerpo")
        if self.strategy == "dgpo" and not self.lora.enabled:
            raise ValueError("strategy dgpo compares each image's error with the LoRA-free model's: it needs "
                             "a LoRA (lora.enabled: true)")
        if not self.lora.enabled and self.effective_loss.kl_beta > 0:
            what = ("loss.kl_beta > 0" if self.effective_loss is self.loss else
                    f"{self.strategy}'s published loss (KL to the reference, beta "
                    f"{self.effective_loss.kl_beta})")
            raise ValueError(f"{what} needs a LoRA (lora.enabled: true): full fine-tuning keeps no "
                             "frozen reference model")

    @property
    def effective_reward_weights(self) -> dict[str, str]:
        """``reward_weights``, with ``data.picks`` as the ``picks`` reward's folder."""
        if self.data.picks and PICKS not in self.reward_weights:
            return {**self.reward_weights, PICKS: self.data.picks}
        return dict(self.reward_weights)

    @property
    def uses_picks(self) -> bool:
        """Whether the reward names ``picks``."""
        from ..rewards.mix import parse_reward_spec

        return any(t.name == PICKS for t in parse_reward_spec(self.reward))

    @property
    def uses_published_loss(self) -> bool:
        """A baseline strategy with ``baseline_loss: published``."""
        return self.strategy != "dynamic_treerpo" and self.baseline_loss == "published"

    @property
    def effective_loss(self) -> LossConfig:
        """The loss this run trains with (see ``BaselineLoss``)."""
        return published_loss(self.strategy, self.loss) if self.uses_published_loss else self.loss

    @property
    def effective_updates(self) -> int:
        """Optimizer updates per rollout: a baseline's published number, else ``optim``'s."""
        if self.uses_published_loss:
            return published_updates(self.strategy)
        return self.optim.updates_per_iteration

    @property
    def effective_eval_ema(self) -> EvalEma:
        """Whether evaluation uses an average of the weights: as the baseline publishes, else ``eval_ema``."""
        return published_ema(self.strategy) if self.uses_published_loss else self.eval_ema

    @property
    def effective_clip_spread(self) -> ClipSpreadConfig:
        """The clip-spread rescale this run uses: off for a baseline's published (fixed) clip, unless
        ``clip_spread.on_baselines``."""
        if self.uses_published_loss and not self.clip_spread.on_baselines:
            return replace(self.clip_spread, enabled=False)
        return self.clip_spread

    @property
    def strategy_config(self) -> StrategyConfig:
        """The nested config of the selected strategy."""
        if self.strategy == "dynamic_treerpo":
            return self.tree
        if self.strategy == "dancegrpo":
            return self.dancegrpo
        if self.strategy in ("flow_grpo", "flow_grpo_fast"):
            return replace(self.flow_grpo, fast=self.strategy == "flow_grpo_fast")
        if self.strategy == "branchgrpo":
            return self.branchgrpo
        if self.strategy == "diffusionnft":
            return self.diffusionnft
        if self.strategy == "awm":
            return self.awm
        if self.strategy == "dgpo":
            return self.dgpo
        return replace(self.mixgrpo, flash=self.strategy == "mixgrpo_flash")
