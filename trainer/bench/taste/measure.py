"""What ``treerpo bench taste`` measures on the held-out test pairs: the hidden taste and the scene reward
of a model's images, and the before/after grid a person looks at.

Why apart from the run: the frontier and the method are measured the same way, on the same pairs, so
their figures can be set side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...guard.choice import take
from ...training.evaluate import EvalPair, generate
from ...training.loop import Trainer
from .budget import TasteBudget
from .person import Taste

GRID_PAIRS = 8  # held-out pairs in the before/after grid


@torch.no_grad()
def measure(trainer: Trainer, taste: Taste, scene: Callable[..., dict[str, torch.Tensor]]
            ) -> dict[str, float]:
    """The hidden taste and the scene reward of the model's held-out test images (its live weights)."""
    trainer.policy.eval()
    pairs = trainer.eval_pairs
    prompts = [p.prompt for p in pairs]
    images = generate(trainer.policy, prompts, [p.seed for p in pairs], trainer.eval_sigmas,
                      trainer.config.max_batch)
    return {"taste": float(taste(images, prompts).mean()),
            "scene": float(scene(images, prompts)["reward"].mean())}


def measure_base(trainer: Trainer, result: Any, taste: Taste, scene: Callable[..., Any]) -> dict[str, float]:
    """The base model's test figures (the run's zero LoRA), the chosen weights loaded back after."""
    result.apply(trainer.policy.transformer, take(result.trail, 0, 0.0))
    figures = measure(trainer, taste, scene)
    result.apply(trainer.policy.transformer)
    return figures


@torch.no_grad()
def bed_images(policy: Any, bed: Any, max_batch: int) -> torch.Tensor:
    """The first ``GRID_PAIRS`` test images of a seed's test bed under ``policy``'s current weights."""
    pairs = bed.pairs[:GRID_PAIRS]
    policy.eval()
    return generate(policy, [p.prompt for p in pairs], [p.seed for p in pairs], bed.sigmas,
                    max_batch).float().cpu()


@torch.no_grad()
def grid_images(trainer: Trainer) -> torch.Tensor:
    """The first ``GRID_PAIRS`` test images under the current weights (the before/after grid)."""
    pairs = trainer.eval_pairs[:GRID_PAIRS]
    trainer.policy.eval()
    return generate(trainer.policy, [p.prompt for p in pairs], [p.seed for p in pairs], trainer.eval_sigmas,
                    trainer.config.max_batch).float().cpu()


def grid_tree_count(budget: TasteBudget) -> int:
    """The labelled-tree count whose method row the grid shows (50 when measured, else the middle one)."""
    counts = budget.tree_counts()
    return 50 if 50 in counts else counts[len(counts) // 2]


def write_grid(images: dict[str, torch.Tensor], path: Path) -> None:
    """Rows of the same held-out prompts and seeds: before, from the picks, the frontier's best."""
    from ...training.logs import save_image_grid

    rows = ["before", *[k for k in images if k.endswith("trees")],
            *[k for k in images if k.startswith("frontier")]]
    width = min(GRID_PAIRS, *(images[name].shape[0] for name in rows))
    stacked = torch.cat([images[name][:width] for name in rows])
    captions = [name if i == 0 else "" for name in rows for i in range(width)]
    save_image_grid(stacked, path, nrow=width, captions=captions)


@dataclass(frozen=True)
class TestBed:
    """Where a seed is measured: its test pairs and sampling grid, and the prompts file the frontier
    trains on (None: generated scenes other than the test prompts, the main table's)."""

    pairs: list[EvalPair]
    sigmas: torch.Tensor
    prompts_file: Path | None = None


def test_bed(budget: TasteBudget, probe: Trainer, work: Path) -> TestBed:
    """The main table's test pairs are held-out generated scenes (the probe's held-out set); the template
    row's are the template's own prompts at seeds neither training nor the guard draws (the guard's are
    ``guard.seed + 1_000_000``'s, ``training.guarded.same_prompt_pairs``), since a person judges the
    images of their own prompts."""
    if not budget.template:
        return TestBed(list(probe.eval_pairs), probe.eval_sigmas)
    from ...config.picks_budget import PICKS_BUDGET
    from ...training.evaluate import pairs_from_prompts

    prompts = list(PICKS_BUDGET.template.prompts)
    file = work / "template_prompts.txt"
    file.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    pairs = pairs_from_prompts(prompts, budget.eval_pairs, probe.config.data.eval_seed)
    return TestBed(pairs, probe.eval_sigmas, file)
