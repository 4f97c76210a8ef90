"""``treerpo bench taste``: how well the pack learns a person's taste from picks, with a simulated person.

Per seed, on the embedded model:

- **person's trees**: ``trees`` trees of the base model (8 leaves each, scene prompts) go into a picks
  folder through the real store, and :class:`~.person.SimulatedPerson` labels each (likes 2, dislikes 1,
  15% mistakes) with a hidden taste;
- **reward mode**: a personal reward is fitted on the first n labelled trees (n = 25, 50, 100, 200 up to
  ``trees``; held-out pair accuracy reported), then a fresh LoRA trains ``iterations`` iterations on
  ``picks:w, scene:1-w`` (the scene reward guards prompt-following);
- **online mode**: a fresh LoRA trains on trees the person labels as training goes: each iteration
  the current model grows 8 trees into the folder, the person picks, and the tree's own objective
  trains on them (``PicksTrainer``); measured when 25, 50, 100, 200 trees have been labelled;
- **oracle**: the same budget with the hidden taste itself as the reward (``function:w, scene:1-w``).

Every figure is on held-out prompt/seed pairs: the mean hidden taste and scene reward of the images the
model draws, before and after. ``taste.json`` keeps per-seed values; the printout gives means with 95%
intervals over seeds.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..config.files import load_config
from ..config.schema import TrainConfig
from ..core.flow import make_sigmas
from ..preferences.store import PickStore
from ..rewards.registry import get_reward
from ..training.from_picks import PicksTrainer, model_id, store_trees
from ..training.loop import Trainer, iteration_plan, iteration_seeds
from ..utils.atomic import atomic_write_text
from .person import SimulatedPerson, Taste, load_taste
from .stats import mean_ci95

CHECKPOINTS = (25, 50, 100, 200)


@dataclass(frozen=True)
class TasteBudget:
    """How much the benchmark trains and labels."""

    trees: int = 200
    seeds: int = 3
    iterations: int = 24
    prompts_per_iteration: int = 8
    picks_weight: float = 0.15  # the guard (scene) held at 0.15 and not at 0.25: docs/results.md
    lr: float = 0.0016
    eval_pairs: int = 64
    likes: int = 2
    dislikes: int = 1
    mistakes: float = 0.15
    first_seed: int = 0
    modes: tuple[str, ...] = ("reward", "online")

    at: tuple[int, ...] = CHECKPOINTS  # labelled-tree counts measured (those below ``trees``, and it)

    def checkpoints(self) -> list[int]:
        points = [n for n in self.at if n < self.trees]
        return [*points, self.trees]


QUICK = TasteBudget(trees=6, seeds=2, iterations=2, prompts_per_iteration=2, eval_pairs=4,
                    modes=("reward", "online"))
QUICK_OVERRIDES = ("tree.steps=6", "sampling.eval_steps=3", "lora.rank=4")


@dataclass
class SeedResult:
    seed: int
    taste_before: float
    scene_before: float
    oracle: dict[str, float] = field(default_factory=dict)  # taste, scene after
    reward: dict[int, dict[str, float]] = field(default_factory=dict)  # trees -> taste, scene, accuracy
    online: dict[int, dict[str, float]] = field(default_factory=dict)  # trees -> taste, scene


def _config(budget: TasteBudget, seed: int, reward: str, weights: dict[str, str], extra: Sequence[str],
            mode: str = "reward") -> TrainConfig:
    spec = ", ".join(f"{k}: {v}" for k, v in weights.items())
    return load_config(TrainConfig, None, [
        f"seed={seed}", f"iterations={budget.iterations}", f"optim.lr={budget.lr}",
        f"data.prompts_per_iteration={budget.prompts_per_iteration}", f"data.eval_pairs={budget.eval_pairs}",
        f"reward={reward}", f"reward_weights={{{spec}}}", f"picks.mode={mode}",
        f"picks.trees_per_iteration={budget.prompts_per_iteration}", *extra])


def measure(trainer: Trainer, taste: Taste, scene: Callable[..., dict[str, torch.Tensor]],
            keep: dict[str, torch.Tensor] | None = None, name: str = "") -> dict[str, float]:
    """The hidden taste and the scene reward of the model's held-out images (its live weights);
    ``keep[name]`` gets the images when given (the before/after grid)."""
    trainer.policy.eval()
    from ..training.evaluate import generate

    pairs = trainer.eval_pairs
    prompts = [p.prompt for p in pairs]
    images = generate(trainer.policy, prompts, [p.seed for p in pairs], trainer.eval_sigmas,
                      trainer.config.max_batch)
    if keep is not None:
        keep[name] = images.float().cpu()
    return {"taste": float(taste(images, prompts).mean()),
            "scene": float(scene(images, prompts)["reward"].mean())}


def label_trees(store: PickStore, ids: Sequence[str], person: SimulatedPerson, rng: random.Random) -> None:
    """The person picks on each tree, saved through the store (as the ComfyUI picker saves them)."""
    for tree_id in ids:
        liked, disliked = person.pick(store.load_images(tree_id), store.meta(tree_id).prompt, rng)
        store.save_picks(tree_id, liked, disliked)


def _train(trainer: Trainer, iterations: int) -> None:
    for it in range(iterations):
        trainer.step(it)


def run_seed(budget: TasteBudget, seed: int, taste_spec: str, folder: Path, extra: Sequence[str],
             log: Callable[[str], None], grid: Path | None = None) -> SeedResult:
    """One seed of every mode; ``grid``: write the held-out images before and after each mode there."""
    name, taste = load_taste(taste_spec)
    scene = get_reward("scene")
    person = SimulatedPerson(taste, budget.likes, budget.dislikes, budget.mistakes)
    w = budget.picks_weight
    function = {"function": f"dynamic_treerpo.trainer.bench.tastes:{name}"} if ":" not in taste_spec else \
        {"function": taste_spec}
    guard = f"scene:{1 - w:g}"
    # the oracle: the same budget with the hidden taste itself as the reward
    oracle = Trainer(_config(budget, seed, f"function:{w:g},{guard}", function, extra))
    keep: dict[str, torch.Tensor] | None = {} if grid is not None else None
    before = measure(oracle, taste, scene, keep, "before")
    result = SeedResult(seed, before["taste"], before["scene"])
    _train(oracle, budget.iterations)
    result.oracle = measure(oracle, taste, scene, keep, "oracle")
    log(f"seed {seed} oracle: taste {before['taste']:.4f} -> {result.oracle['taste']:.4f}, scene "
        f"{before['scene']:.4f} -> {result.oracle['scene']:.4f}")
    del oracle
    if "reward" in budget.modes:
        result.reward = reward_mode(budget, seed, folder / f"seed{seed}_base", person, taste, scene, guard,
                                    extra, log, keep)
    if "online" in budget.modes:
        result.online = online_mode(budget, seed, folder / f"seed{seed}_online", person, taste, scene, guard,
                                    extra, log, keep)
    if grid is not None and keep:
        write_grid(keep, grid)
    return result


GRID_PAIRS = 8  # held-out pairs in the before/after grid


def write_grid(images: dict[str, torch.Tensor], path: Path) -> None:
    """Rows of the same held-out prompts and seeds: before, then after each mode and the oracle."""
    from ..training.logs import save_image_grid

    rows = [name for name in ("before", "reward", "online", "oracle") if name in images]
    width = min(GRID_PAIRS, *(images[name].shape[0] for name in rows))
    stacked = torch.cat([images[name][:width] for name in rows])
    captions = [name if i == 0 else "" for name in rows for i in range(width)]
    save_image_grid(stacked, path, nrow=width, captions=captions)


def reward_mode(budget: TasteBudget, seed: int, folder: Path, person: SimulatedPerson, taste: Taste,
                scene: Callable[..., Any], guard: str, extra: Sequence[str],
                log: Callable[[str], None], keep: dict[str, torch.Tensor] | None = None
                ) -> dict[int, dict[str, float]]:
    """Label ``trees`` base-model trees, then per checkpoint n: fit on the first n and train."""
    from ..embedded.policy import EmbeddedPolicy
    from ..rewards.personal import PersonalReward, fit_from_store, pooled_features

    config = _config(budget, seed, guard, {}, extra)
    policy = EmbeddedPolicy.from_pretrained()
    store = PickStore(folder, create=True)
    prompts = _prompts(config, seed, budget.trees)
    plan = first_plan(config, policy)
    ids = store_trees(policy, store, prompts, _seeds(seed, budget.trees), plan, model_id(policy, "embedded"),
                      max_batch=config.max_batch)
    label_trees(store, ids, person, random.Random(seed * 7919 + 1))
    out: dict[int, dict[str, float]] = {}
    for n in budget.checkpoints():
        fit = fit_from_store(store, pooled_features, ids[:n])
        reward = PersonalReward(fit, pooled_features)
        trainer = Trainer(config)
        trainer.reward = _with_picks(trainer, reward, budget.picks_weight)
        _train(trainer, budget.iterations)
        out[n] = {**measure(trainer, taste, scene, keep, "reward"), "accuracy": fit.held_out_accuracy,
                  "held_out_pairs": float(fit.held_out_pairs)}
        log(f"seed {seed} reward mode, {n} trees: held-out pair accuracy {fit.held_out_accuracy:.3f}; taste "
            f"{out[n]['taste']:.4f}, scene {out[n]['scene']:.4f}")
    return out


def _with_picks(trainer: Trainer, reward: Any, weight: float) -> Any:
    """The trainer's guard reward with the personal reward added as the ``picks`` term."""
    from ..rewards.mix import RewardMix

    spec = f"picks:{weight:g},{trainer.config.reward}"
    return RewardMix(spec, {}, trainer.device, prebuilt={"picks": reward, **trainer.reward.fns})


def online_mode(budget: TasteBudget, seed: int, folder: Path, person: SimulatedPerson, taste: Taste,
                scene: Callable[..., Any], guard: str, extra: Sequence[str],
                log: Callable[[str], None], keep: dict[str, torch.Tensor] | None = None
                ) -> dict[int, dict[str, float]]:
    """The person labels the current model's trees as training goes (8 per iteration, fewer in the
    iteration that reaches a checkpoint, so that each is measured at exactly that many trees)."""
    config = _config(budget, seed, f"picks:{budget.picks_weight:g},{guard}", {"picks": str(folder)}, extra,
                     mode="online")
    counts = tree_counts(budget.checkpoints(), budget.prompts_per_iteration)
    config = replace(config, iterations=len(counts))
    rng = random.Random(seed * 7919 + 2)
    holder: dict[str, PicksTrainer] = {}

    def new_trees(iteration: int) -> list[str]:
        trainer = holder["trainer"]
        per = counts[iteration]
        prompts = trainer.prompts.prompts(iteration, per)
        seeds = iteration_seeds(config.seed, iteration, per)
        ids = store_trees(trainer.policy, trainer.store, list(prompts), seeds, trainer.plan(iteration),
                          model_id(trainer.policy, "embedded"), max_batch=config.max_batch)
        label_trees(trainer.store, ids, person, rng)
        return ids

    trainer = PicksTrainer(config, tree_source=new_trees)
    holder["trainer"] = trainer
    out: dict[int, dict[str, float]] = {}
    wanted, labelled = set(budget.checkpoints()), 0
    for it, count in enumerate(counts):
        trainer.step(it)
        labelled += count
        if labelled in wanted:
            out[labelled] = measure(trainer, taste, scene, keep, "online")
            log(f"seed {seed} online mode, {labelled} trees: taste {out[labelled]['taste']:.4f}, scene "
                f"{out[labelled]['scene']:.4f}")
    return out


def tree_counts(checkpoints: Sequence[int], per: int) -> list[int]:
    """Trees labelled per online iteration: ``per`` at a time, cut short to land on each checkpoint."""
    counts: list[int] = []
    done = 0
    for target in sorted(checkpoints):
        while done < target:
            counts.append(min(per, target - done))
            done += counts[-1]
    return counts


def first_plan(config: TrainConfig, policy: Any) -> Any:
    """The tree plan of iteration 0 (the trees the person labels in reward mode)."""
    s = config.sampling
    sigmas = make_sigmas(s.schedule, config.strategy_config.steps, s.shift, image_tokens=policy.image_tokens)
    return iteration_plan(config, sigmas, 0, policy.latent_unshuffle)


def _prompts(config: TrainConfig, seed: int, count: int) -> list[str]:
    from ..training.evaluate import PromptSource, eval_pairs_for

    d = config.data
    held = eval_pairs_for(d.prompts, d.eval_prompts, d.eval_pairs, d.eval_seed)
    source = PromptSource(d.prompts, seed + 4242, exclude=[p.prompt for p in held])
    return list(source.prompts(0, count))


def _seeds(seed: int, count: int) -> list[int]:
    return iteration_seeds(seed + 4242, 0, count)


def summarise(results: Sequence[SeedResult], budget: TasteBudget, taste: str) -> dict[str, Any]:
    """``taste.json``: per mode, the figures the issue asks for, means and 95% intervals over seeds."""
    def est(values: list[float]) -> dict[str, float]:
        e = mean_ci95(values)
        return {"mean": e.mean, "ci95": e.ci95}

    base_taste = [r.taste_before for r in results]
    base_scene = [r.scene_before for r in results]
    oracle_gain = [r.oracle["taste"] - r.taste_before for r in results]
    out: dict[str, Any] = {"taste": taste, "trees": budget.trees, "seeds": [r.seed for r in results],
                           "budget": asdict(budget), "oracle_gain_mean": statistics.fmean(oracle_gain),
                           "oracle_gain_ci95": est(oracle_gain)["ci95"],
                           "oracle_scene_after": statistics.fmean(r.oracle["scene"] for r in results),
                           "modes": {}}
    for mode in budget.modes:
        per_seed = [getattr(r, mode) for r in results]
        last = max(per_seed[0])
        gains = [p[last]["taste"] - r.taste_before for p, r in zip(per_seed, results, strict=True)]
        scene_changes = [p[last]["scene"] - r.scene_before for p, r in zip(per_seed, results, strict=True)]
        # per seed, paired with the oracle run of the same seed: how far above half the oracle's gain
        margins = [g - 0.5 * o for g, o in zip(gains, oracle_gain, strict=True)]
        row = {"mode": mode, "taste_before": statistics.fmean(base_taste),
               "taste_after": statistics.fmean(p[last]["taste"] for p in per_seed),
               "taste_gain_mean": statistics.fmean(gains), "taste_gain_ci95": est(gains)["ci95"],
               "taste_gain_per_seed": gains, "oracle_gain_mean": statistics.fmean(oracle_gain),
               "share_of_oracle": statistics.fmean(gains) / statistics.fmean(oracle_gain)
               if statistics.fmean(oracle_gain) else float("nan"),
               "over_half_oracle_mean": statistics.fmean(margins),
               "over_half_oracle_ci95": est(margins)["ci95"],
               "scene_before": statistics.fmean(base_scene),
               "scene_after": statistics.fmean(p[last]["scene"] for p in per_seed),
               "scene_change_mean": statistics.fmean(scene_changes),
               "scene_change_ci95": est(scene_changes)["ci95"],
               "gain_by_trees": {str(n): statistics.fmean(p[n]["taste"] - r.taste_before
                                                          for p, r in zip(per_seed, results, strict=True))
                                 for n in sorted(per_seed[0]) if all(n in p for p in per_seed)}}
        if mode == "reward":
            row["held_out_pair_accuracy"] = {str(n): statistics.fmean(p[n]["accuracy"] for p in per_seed)
                                             for n in sorted(per_seed[0])}
        out["modes"][mode] = row
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"taste {summary['taste']}: {summary['trees']} labelled trees, seeds {summary['seeds']}; "
             f"oracle gain {summary['oracle_gain_mean']:+.4f} ± {summary['oracle_gain_ci95']:.4f}"]
    for row in summary["modes"].values():
        lines.append(
            f"  {row['mode']:<7} taste {row['taste_before']:.4f} -> {row['taste_after']:.4f}, gain "
            f"{row['taste_gain_mean']:+.4f} ± {row['taste_gain_ci95']:.4f} "
            f"({row['share_of_oracle']:.0%} of the oracle's); scene {row['scene_before']:.4f} -> "
            f"{row['scene_after']:.4f}; gain by trees "
            + ", ".join(f"{n}: {g:+.4f}" for n, g in row["gain_by_trees"].items()))
        if "held_out_pair_accuracy" in row:
            lines.append("          held-out pair accuracy by trees " + ", ".join(
                f"{n}: {a:.3f}" for n, a in row["held_out_pair_accuracy"].items()))
    return "\n".join(lines)


def run_taste(budget: TasteBudget, taste: str, out: Path, extra: Sequence[str] = (),
              log: Callable[[str], None] = print, command: str = "") -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(dir=out) as work:
        for k in range(budget.seeds):
            results.append(run_seed(budget, budget.first_seed + k, taste, Path(work), extra, log,
                                    out / "before_after.png" if k == 0 else None))
    summary = summarise(results, budget, taste)
    summary["per_seed"] = [asdict(r) for r in results]
    summary["command"] = command
    atomic_write_text(out / "taste.json", json.dumps(summary, indent=1) + "\n")
    return summary


def reload(out: Path) -> dict[str, Any]:
    """``out/taste.json`` summarised again from its per-seed values (with this version's figures)."""
    data = json.loads((out / "taste.json").read_text(encoding="utf-8"))
    budget = data["budget"]
    budget = TasteBudget(**{**budget, "modes": tuple(budget["modes"]),
                            "at": tuple(budget.get("at", CHECKPOINTS))})
    results = []
    for row in data["per_seed"]:
        for mode in ("reward", "online"):
            row[mode] = {int(n): v for n, v in row.get(mode, {}).items()}
        results.append(SeedResult(**row))
    summary = summarise(results, budget, data["taste"])
    summary["per_seed"] = [asdict(r) for r in results]
    summary["command"] = data.get("command", "")
    return summary
