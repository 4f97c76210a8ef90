"""``treerpo bench taste-guard-steps``: could the guard measure prompt-following more precisely at the
same cost, on images of fewer sampling steps? The limit is about the images a person sees
(``sampling.eval_steps``, 10 Euler steps on the embedded model), so cheap images alone would measure
another model's fall. They can still help as a control variate: full-step images on ``n`` pairs, cheap
images on ``N >= n`` pairs (the ``n`` among them), and the full-step fall estimated as
``mean_full(n) + b * (mean_cheap(N) - mean_cheap(n))``, unbiased for the full-step fall, with a variance
of about ``s^2 (1 - rho^2) / n + rho^2 s^2 / N``, where ``rho`` is the per-pair correlation of the
full-step and cheap changes of prompt-following (two-phase sampling).

Per taste and seed this trains the hidden taste as the reward (the oracle of ``treerpo bench taste``, at
``--weight``) under the guard, then measures every point of its trail (the base, each checkpoint, each
strength the guard tried) on the same validation pairs at the full steps and at each of ``--steps``, and
prints per step count: how far the cheap fall is from the full one (bias), whether it orders the points
the same (Spearman), ``rho``, and the standard error of the two-phase fall against the plain one at the
same cost in sampling steps.

    treerpo bench taste-guard-steps --tastes lower_objects,warm_shades --seeds 1 --out runs/guard_steps
    treerpo bench taste-guard-steps --report --out runs/guard_steps

``--out/<taste>_<seed>.json`` is written per taste and seed; a rerun skips those already there. Why in
the taste wing: it trains the taste benchmark's oracle on its bed; docs/picks.md reads its stored runs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ...core.flow import make_sigmas
from ...lora.adapters import load_lora_state
from ...training.evaluate import generate
from ...training.guarded import guard_trainer, separate_validation_pairs
from ...training.loop import Trainer
from ..common.stats import mean_ci95
from .budget import TasteBudget, bench_config
from .hidden_tastes import function_spec


def two_phase_se(sd: float, rho: float, full: int, cheap: int, pairs: int) -> tuple[float, int, int]:
    """The smallest standard error of the two-phase fall at the cost of ``pairs`` full-step pairs (cost in
    sampling steps: ``full`` per full-step image, ``cheap`` per cheap one), with the ``n`` and ``N`` that
    reach it; ``n = pairs, N = 0`` is the plain measurement."""
    best = (sd / math.sqrt(pairs), pairs, 0)
    budget = pairs * full
    for n in range(2, pairs):
        many = (budget - n * full) // cheap
        if many < n:
            continue
        se = math.sqrt(sd**2 * (1 - rho**2) / n + rho**2 * sd**2 / many)
        if se < best[0]:
            best = (se, n, int(many))
    return best


@torch.no_grad()
def scores(trainer: Trainer, guard: Any, pairs: list, sigmas: torch.Tensor) -> torch.Tensor:
    """Prompt-following of each validation pair's image under the policy's current weights."""
    trainer.policy.eval()
    prompts = [p.prompt for p in pairs]
    images = generate(trainer.policy, prompts, [p.seed for p in pairs], sigmas, trainer.config.max_batch)
    return guard(images.float().cpu(), prompts)["reward"].float().cpu()


def study(taste: str, seed: int, weight: float, steps: Sequence[int], log: Callable[[str], None] = print
          ) -> dict[str, Any]:
    """Train the oracle at ``weight`` under the guard, then measure every point of its trail at the full
    steps and at each of ``steps``: per point and step count, the mean change of prompt-following against
    the base on the same pairs, and per step count the per-pair changes' correlation with the full ones."""
    from scipy.stats import spearmanr

    budget = TasteBudget()
    config = bench_config(budget, seed, f"function:{weight:g},scene:{1 - weight:g}",
                          {"function": function_spec(taste)}, [])
    trainer = Trainer(config)
    pairs = separate_validation_pairs(config, trainer.eval_pairs)
    tracker = guard_trainer(trainer, pairs, taste="function", log=lambda _: None)
    result = tracker.run(0, budget.iterations)
    full = config.sampling.eval_steps
    grid = {k: make_sigmas(config.sampling.schedule, k, config.sampling.shift,
                           image_tokens=trainer.policy.image_tokens) for k in [full, *steps]}
    points = result.trail.points
    per: dict[int, list[torch.Tensor]] = {k: [] for k in grid}
    for point in points:
        load_lora_state(trainer.policy.transformer, result.weights(point.iteration, point.strength))
        for k, sigmas in grid.items():
            per[k].append(scores(trainer, tracker.guard, pairs, sigmas))
        log(f"{taste} seed {seed}: measured {point.label} at {', '.join(str(k) for k in grid)} steps")
    out: dict[str, Any] = {"taste": taste, "seed": seed, "weight": weight, "pairs": len(pairs),
                           "full_steps": full, "limit": result.trail.limit, "points": [], "by_steps": {}}
    for i, point in enumerate(points[1:], start=1):
        out["points"].append({"iteration": point.iteration, "strength": point.strength,
                              "change": {str(k): float((per[k][i] - per[k][0]).mean()) for k in grid}})
    changes_full = [per[full][i] - per[full][0] for i in range(1, len(points))]
    sds = [float(a.std(unbiased=True)) for a in changes_full]
    means_full = [float(a.mean()) for a in changes_full]
    for k in steps:
        changes_k = [per[k][i] - per[k][0] for i in range(1, len(points))]
        rhos = [float(torch.corrcoef(torch.stack([a, b]))[0, 1]) for a, b in zip(changes_full, changes_k,
                                                                                     strict=True)]
        means_k = [float(b.mean()) for b in changes_k]
        out["by_steps"][str(k)] = {"rho": rhos, "sd_full": sds,
                                   "spearman": float(spearmanr(means_full, means_k)[0]),
                                   "bias": [b - a for a, b in zip(means_full, means_k, strict=True)]}
    return out


def report(runs: list[dict[str, Any]]) -> str:
    """One row per step count over every run's points: the cheap fall's bias and rank agreement, rho, and
    the two-phase standard error against the plain one at the same cost."""
    if not runs:
        return "no runs"
    full, pairs = runs[0]["full_steps"], runs[0]["pairs"]
    lines = [f"{len(runs)} runs ({', '.join(sorted({r['taste'] for r in runs}))}), {pairs} validation "
             f"pairs, full images {full} steps; every point of each trail (checkpoints and strengths)",
             "| cheap steps | cost of a cheap image | bias of the cheap change (mean, 95% CI) | Spearman of "
             "the points' changes | rho (median) | two-phase SE / plain SE at equal cost (median) | "
             "n full, N cheap |", "|---|---|---|---|---|---|---|"]
    for k in sorted({int(k) for r in runs for k in r["by_steps"]}):
        rows = [r["by_steps"][str(k)] for r in runs]
        bias = [b for row in rows for b in row["bias"]]
        rhos = [x for row in rows for x in row["rho"]]
        sds = [x for row in rows for x in row["sd_full"]]
        ratios, sizes = [], []
        for rho, sd in zip(rhos, sds, strict=True):
            se, n, many = two_phase_se(sd, rho, full, k, pairs)
            ratios.append(se / (sd / math.sqrt(pairs)))
            sizes.append((n, many))
        estimate = mean_ci95(bias)
        mean, half = estimate.mean, estimate.ci95
        median_size = sorted(sizes)[len(sizes) // 2]
        lines.append(f"| {k} | {k / full:.2f} | {mean:+.4f} ({mean - half:+.4f} to {mean + half:+.4f}) | "
                     f"{statistics.median(r['spearman'] for r in rows):.2f} | "
                     f"{statistics.median(rhos):.2f} | "
                     f"{statistics.median(ratios):.2f} | {median_size[0]}, {median_size[1]} |")
    return "\n".join(lines)


def run_guard_steps(tastes: Sequence[str], seeds: int, weight: float, steps: Sequence[int], out: Path,
                    report_only: bool) -> list[dict[str, Any]]:
    """Every taste and seed studied into ``out/<taste>_<seed>.json`` where missing (none with
    ``report_only``); every run in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if not report_only:
        for taste in tastes:
            for seed in range(seeds):
                path = out / f"{taste}_{seed}.json"
                if not path.exists():
                    path.write_text(json.dumps(study(taste, seed, weight, steps), indent=1) + "\n")
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
