"""Training from picks under the guard (``trainer/guard``): the glue to the trainer and the run folder.

The guard applies when the reward names ``picks`` (personal-reward mode) and a guard term, and
``guard.keep`` is not ``off``. This module draws the validation images with the trainer's own ODE
sampler, keeps validation prompts out of training where they are separate prompts, writes a run's
trail, checkpoints and figures to a folder and reads them back (a resumed run, or a person taking
another checkpoint later without training again).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..config.schema import GuardConfig, TrainConfig
from ..guard.choice import Choice, choose
from ..guard.figures import shown_points, trade_plot
from ..guard.tracker import GuardedResult, GuardedTraining
from ..guard.trail import Trail, point_key
from ..rewards.mix import parse_reward_spec
from ..rewards.registry import PICKS
from ..utils.atomic import atomic_write_text
from .evaluate import EvalPair, PromptSource, eval_pairs_for, generate, held_out_pairs, pairs_from_prompts
from .logs import save_image_grid
from .loop import Trainer

GRID_IMAGES = 4  # validation images kept per point for the before/after grid


def guarded(config: TrainConfig) -> bool:
    """Whether ``config`` trains from picks under the guard."""
    names = [t.name for t in parse_reward_spec(config.reward)]
    return (PICKS in names and len(names) > 1 and config.picks.mode == "reward"
            and config.guard.keep != "off")


def separate_validation_pairs(config: TrainConfig, test: Sequence[EvalPair]) -> list[EvalPair]:
    """Validation pairs of their own prompts (generated scenes or the training file), none of them a
    test prompt: what a headless run or a benchmark chooses its checkpoint on."""
    d, g = config.data, config.guard
    return eval_pairs_for(d.prompts, None, g.pairs, g.seed, exclude=[p.prompt for p in test])


def same_prompt_pairs(prompts: Sequence[str], config: TrainConfig) -> list[EvalPair]:
    """Validation pairs of the training prompts themselves at seeds training never draws (a picks
    folder's few prompts: the node's case)."""
    return pairs_from_prompts(list(dict.fromkeys(prompts)), config.guard.pairs, config.guard.seed + 1_000_000)


HELD_OUT_SHARE = 0.25
HELD_OUT_LEAST = 4
"""``guard.validation: held_out`` keeps this share of a folder's distinct prompts out of training, and at
least this many (a fall over fewer prompts says little about other prompts)."""


def held_out_prompts(prompts: Sequence[str], seed: int) -> list[str]:
    """The prompts ``guard.validation: held_out`` validates on: a quarter of the distinct ``prompts`` (at
    least :data:`HELD_OUT_LEAST`), drawn with ``seed``; one line naming the problem when too few are left
    to train on."""
    distinct = list(dict.fromkeys(prompts))
    count = max(HELD_OUT_LEAST, round(HELD_OUT_SHARE * len(distinct)))
    if len(distinct) < 2 * count:
        raise ValueError(f"guard.validation: held_out keeps {count} prompts out of training to validate on "
                         f"and needs at least {2 * count} distinct prompts; these picks have "
                         f"{len(distinct)}: label trees of more prompts, or use guard.validation: own")
    return random.Random(seed).sample(distinct, count)


def folder_validation_pairs(prompts: Sequence[str], config: TrainConfig) -> list[EvalPair]:
    """The guard's validation pairs when training takes its prompts from a file (``guard.validation``):
    the prompts themselves at unseen seeds (``own``), a held-out share of them (``held_out``), or
    generated scenes, nearly every pair its own prompt and none of these (``scenes``)."""
    g = config.guard
    if g.validation == "held_out":
        return pairs_from_prompts(held_out_prompts(prompts, g.seed), g.pairs, g.seed + 1_000_000)
    if g.validation == "scenes":
        return held_out_pairs(g.pairs, g.seed, exclude=prompts)
    return same_prompt_pairs(prompts, config)


def guard_trainer(trainer: Trainer, pairs: Sequence[EvalPair], taste: str = PICKS,
                  log: Callable[[str], None] = print, previous: GuardedResult | None = None,
                  exclude_pairs: bool = True, reward_spec: str | None = None,
                  config: GuardConfig | None = None, by_prompt: bool = False) -> GuardedTraining:
    """The guard over ``trainer``, measuring on ``pairs``; with ``exclude_pairs``, training never draws
    their prompts. ``config``: guard settings other than the trainer's (a benchmark's frontier);
    ``by_prompt``: the fall's standard error over the pairs' prompts (``guard.validation: held_out``)."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("the guard needs validation pairs (guard.pairs >= 1)")
    if exclude_pairs:
        held = sorted({p.prompt for p in trainer.eval_pairs} | {p.prompt for p in pairs})
        trainer.prompts = PromptSource(trainer.config.data.prompts, trainer.config.seed, exclude=held)

    def draw() -> tuple[Tensor, list[str]]:
        prompts = [p.prompt for p in pairs]
        images = generate(trainer.policy, prompts, [p.seed for p in pairs], trainer.eval_sigmas,
                          trainer.config.max_batch)
        return images, prompts

    return GuardedTraining(trainer, config or trainer.config.guard, draw, taste, log, GRID_IMAGES, previous,
                           reward_spec, by_prompt)


# ---------------------------------------------------------------------- figures
def before_after(result: GuardedResult, out_png: str | Path, choice: Choice | None = None,
                 columns: int = GRID_IMAGES) -> None:
    """Rows of the same validation pairs: the base model, then a checkpoint before the chosen one, the
    chosen one and the last one, each captioned with its change in taste and prompt-following."""
    trail, choice = result.trail, choice or result.choice
    rows = [p for p in [trail.base, *shown_points(trail, choice)] if point_key(p) in result.images]
    width = min(columns, *(result.images[point_key(p)].shape[0] for p in rows))
    captions = []
    for p in rows:
        mark = " (chosen)" if choice.point is not None and point_key(p) == point_key(choice.point) else ""
        head = "before" if p.iteration == 0 else f"{p.label}{mark}"
        detail = "" if p.iteration == 0 else (f"taste {p.taste - trail.base.taste:+.2f}, "
                                              f"prompt {-trail.fall(p):+.3f}")
        captions += [f"{head}\n{detail}" if k == 0 else "" for k in range(width)]
    stacked = torch.cat([result.images[point_key(p)][:width] for p in rows])
    save_image_grid(stacked, out_png, nrow=width, captions=captions, scale=3, font_size=15)


def write_figures(result: GuardedResult, folder: Path, choice: Choice | None = None,
                  others: Sequence[Trail] = ()) -> dict[str, Path]:
    """``trade.png`` and ``before_after.png`` in ``folder``; ``others``: the trails of the runs at the
    picks weights the guard did not keep (grey on the trade plot)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"trade": folder / "trade.png", "before_after": folder / "before_after.png"}
    trade_plot(result.trail, choice or result.choice, files["trade"], others=others)
    before_after(result, files["before_after"], choice)
    return files


# ---------------------------------------------------------------------- on disk
def save_guard(result: GuardedResult, folder: Path) -> None:
    """The trail (``trail.json``, with the choice), each checkpoint's LoRA (``lora_<it>.safetensors``),
    the kept validation images and the base's guard scores (``probe.safetensors``)."""
    save_progress(result.trail, result.snapshots, result.images, result.base_guard, folder, result.choice)


def save_progress(trail: Trail, snapshots: dict[int, dict[str, Tensor]], images: dict[str, Tensor],
                  base_guard: Tensor | None, folder: Path, choice: Choice | None = None) -> None:
    """What a run has measured so far (a resumed run continues from it); ``choice`` once it is made.
    Checkpoint files are written once; the trail last, atomically, so it never names a missing file."""
    folder.mkdir(parents=True, exist_ok=True)
    for it, state in snapshots.items():
        path = folder / f"lora_{it:05d}.safetensors"
        if not path.exists():
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    probe = {f"images.{k}": v.contiguous() for k, v in images.items()}
    if base_guard is not None:
        probe["base_guard"] = base_guard.contiguous()
    save_file(probe, str(folder / "probe.safetensors"))
    data = trail.to_json()
    if choice is not None:
        point = choice.point
        data["choice"] = {"iteration": None if point is None else point.iteration,
                          "strength": None if point is None else point.strength, "reason": choice.reason,
                          "within_limit": choice.within_limit}
    atomic_write_text(folder / "trail.json", json.dumps(data, indent=1) + "\n")


def resumed_guard(folder: Path, done: int, margin: float) -> GuardedResult | None:
    """A run folder's guard measurements up to iteration ``done`` (a checkpoint of the trainer may be
    older than the guard's last point), or None when there are none yet."""
    if not (folder / "trail.json").is_file():
        return None
    result = load_guard(folder, margin)
    result.trail.points = [p for p in result.trail.points if p.iteration <= done and p.strength == 1.0]
    result.snapshots = {it: w for it, w in result.snapshots.items() if it <= done}
    result.images = {k: v for k, v in result.images.items() if int(k.split("@")[0]) <= done
                     and k.endswith("@1")}
    return result if result.trail.points else None


def load_guard(folder: Path, margin: float = 1.0, snapshots: bool = True) -> GuardedResult:
    """A guarded run written by :func:`save_guard`, with the choice it made (a run saved before it
    chose: chosen now from its trail with ``margin``). ``snapshots=False`` leaves the checkpoints' LoRA
    files on disk (a caller that reads the measurements only: on a large model they are gigabytes)."""
    data = json.loads((folder / "trail.json").read_text(encoding="utf-8"))
    trail = Trail.from_json(data)
    kept = {int(p.stem.split("_")[1]): load_file(str(p))
            for p in sorted(folder.glob("lora_*.safetensors"))} if snapshots else {}
    probe = load_file(str(folder / "probe.safetensors")) if (folder / "probe.safetensors").exists() else {}
    images = {k.removeprefix("images."): v for k, v in probe.items() if k.startswith("images.")}
    saved = data.get("choice")
    if saved is None:
        choice = choose(trail, margin)
    else:
        point = None if saved["iteration"] is None else trail.find(saved["iteration"], saved["strength"])
        choice = Choice(point, saved["reason"], saved["within_limit"])
    return GuardedResult(trail, kept, choice, images, probe.get("base_guard"))


def take_from_run(run_dir: Path, iteration: int | None, strength: float, out: Path
                  ) -> tuple[Choice, dict[str, Path]]:
    """Another checkpoint (``iteration``; None: the guard's choice) at ``strength`` of a finished guarded
    run, written as its LoRA files and figures into ``out``, without training: ``(choice, files)``."""
    from ..config.files import load_config
    from ..lora.files import (
        COMFYUI_FILE,
        DIFFUSERS_FILE,
        KOHYA_FILE,
        save_comfyui_state,
        save_diffusers_state,
        save_kohya_file,
    )
    from ..lora.keys import COMFYUI_PREFIX, DIFFUSERS_MODEL_PREFIX

    folder = run_dir / "guard"
    if not (folder / "trail.json").is_file():
        raise ValueError(f"{run_dir} has no guarded run to take a checkpoint from (no guard/trail.json): "
                         "train from picks with guard.keep strictly, closely or loosely")
    config = load_config(TrainConfig, run_dir / "config.yaml", [])
    result = load_guard(folder)
    if iteration is None:
        choice = result.choice
        if strength != 1.0 and choice.point is not None:
            choice = result.take(choice.point.iteration, choice.point.strength * strength)
    else:
        choice = result.take(iteration, strength)
    point = choice.point
    state = result.weights(0, 0.0) if point is None else result.weights(point.iteration, point.strength)
    lora, kind = config.lora, config.model.kind
    prefix = COMFYUI_PREFIX if kind == "embedded" else DIFFUSERS_MODEL_PREFIX
    out.mkdir(parents=True, exist_ok=True)
    files = {"comfyui": save_comfyui_state(out / COMFYUI_FILE, state, lora.rank, lora.alpha, prefix),
             "diffusers": save_diffusers_state(out / DIFFUSERS_FILE, state,
                                               {k.rsplit(".lora_", 1)[0]: lora.alpha for k in state}),
             "kohya": save_kohya_file(out / KOHYA_FILE, state, alpha=lora.alpha, kind=kind)}
    trade_plot(result.trail, choice, out / "trade.png")
    return choice, {**files, "trade": out / "trade.png"}

