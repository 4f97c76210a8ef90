"""Reproduce the embedded model's image encoder from a seed: CLIP-style pretraining on scenes.

    python -m dynamic_treerpo.trainer.embedded.image_encoder --out trainer/embedded/weights/image_encoder

An image tower (``image_tower.ImageTower``, what the personal reward's ``scene-clip`` backbone reads) and
a text tower (``text_tower.TextTower``) learn one embedding space with the symmetric InfoNCE loss of
CLIP and a learned temperature. Each batch holds fresh renders and the embedded model's drawings of
renders (``contrastive_data``: made once, before training, from ``pool`` scenes), and each picture
brings near-miss captions as extra negatives, so the loss cannot be met by colours and shapes alone.
Captions of the same scene are all positives (a batch may hold one scene twice). AdamW with a linear
warm-up and a linear cool-down (``pretrain.lr_at``); the final weights are saved with the held-out
retrieval figures (``encoder_retrieval``) in ``retrieval.json``.

Deterministic on the CPU for a given seed and thread count; it runs on one thread by default, since it
is sized to finish on a shared machine's single core.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..utils.atomic import atomic_write_text
from .contrastive_data import augment, redraw, sample_near_misses, sample_scenes, scene_key, shuffled_prompt
from .encoder_retrieval import retrieval_report
from .image_tower import ImageTower, TowerSpec, save_towers
from .pretrain import lr_at
from .scenes import SceneSpec, spec_to_prompt
from .text_tower import TextTower


@dataclass(frozen=True)
class EncoderTraining:
    """The pretraining recipe (the defaults made the shipped weights)."""

    steps: int = 1500
    batch: int = 128
    misses: int = 2  # near-miss captions per picture
    redrawn: float = 0.5  # share of each batch drawn by the embedded model
    pool: int = 3072  # the model's drawings made before training
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup: int = 100
    cooldown: float = 0.3
    held_out: int = 512  # scenes of the final retrieval check
    seed: int = 0


class Towers(nn.Module):
    """Both towers and CLIP's learned temperature (as the log of the logits' scale)."""

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        self.image = ImageTower(spec)
        self.text = TextTower(spec.dim)
        self.log_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))


def same_scene(rows: Sequence[SceneSpec], columns: Sequence[SceneSpec]) -> Tensor:
    """``[rows, columns]``: 1 where the two describe the same scene."""
    keys = {k: i for i, k in enumerate(dict.fromkeys(scene_key(s) for s in [*rows, *columns]))}
    r = torch.tensor([keys[scene_key(s)] for s in rows])
    c = torch.tensor([keys[scene_key(s)] for s in columns])
    return (r.view(-1, 1) == c.view(1, -1)).float()


def soft_cross_entropy(logits: Tensor, positives: Tensor) -> Tensor:
    """Cross-entropy against a target spread evenly over each row's positives."""
    target = positives / positives.sum(dim=1, keepdim=True)
    return -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def contrastive_loss(towers: Towers, images: Tensor, specs: Sequence[SceneSpec], misses: Sequence[SceneSpec],
                     rng: np.random.Generator) -> Tensor:
    """Symmetric InfoNCE: pictures against every caption of the batch and the near misses, captions
    against every picture."""
    captions = [shuffled_prompt(s, rng) for s in [*specs, *misses]]
    image = towers.image(images)
    text = towers.text(captions)
    scale = towers.log_scale.clamp(max=float(np.log(100.0))).exp()
    logits = scale * image @ text.T
    to_text = soft_cross_entropy(logits, same_scene(specs, [*specs, *misses]))
    to_image = soft_cross_entropy(logits[:, : len(specs)].T, same_scene(specs, specs))
    return 0.5 * (to_text + to_image)


def drawing_pool(count: int, rng: np.random.Generator, gen: torch.Generator, log: Callable[[str], None]
                 ) -> tuple[Tensor, list[SceneSpec]]:
    """``count`` renders redrawn by the shipped embedded model, stored in 8 bits as its PNGs are."""
    from .policy import EmbeddedPolicy

    policy = EmbeddedPolicy.from_pretrained().eval()
    started, chunks, specs = time.perf_counter(), [], []
    for start in range(0, count, 64):
        images, batch_specs = sample_scenes(min(64, count - start), rng)
        drawn = redraw(policy, images, [spec_to_prompt(s) for s in batch_specs], gen)
        chunks.append((drawn * 255).round().to(torch.uint8))
        specs += batch_specs
    log(f"the embedded model redrew {count} scenes in {time.perf_counter() - started:.0f} s")
    return torch.cat(chunks), specs


def training_batch(recipe: EncoderTraining, pool: tuple[Tensor, list[SceneSpec]], rng: np.random.Generator,
                   gen: torch.Generator) -> tuple[Tensor, list[SceneSpec], list[SceneSpec]]:
    """Pictures (model drawings from the pool, then fresh renders; augmented), their specs and near misses."""
    drawn = round(recipe.batch * recipe.redrawn)
    pick = rng.integers(len(pool[1]), size=drawn)
    fresh, fresh_specs = sample_scenes(recipe.batch - drawn, rng)
    images = torch.cat([pool[0][torch.from_numpy(pick)].float() / 255.0, torch.from_numpy(fresh)])
    specs = [pool[1][int(i)] for i in pick] + fresh_specs
    misses = [m for s in specs for m in sample_near_misses(s, recipe.misses, rng)]
    return augment(images, gen), specs, misses


def train_towers(recipe: EncoderTraining, log: Callable[[str], None] = print) -> Towers:
    """The towers after ``recipe.steps`` steps from seeded random weights."""
    torch.manual_seed(recipe.seed)
    towers = Towers(TowerSpec())
    rng = np.random.default_rng([recipe.seed, 1])
    gen = torch.Generator().manual_seed(recipe.seed)
    pool = drawing_pool(recipe.pool, np.random.default_rng([recipe.seed, 2]), gen, log)
    optimizer = torch.optim.AdamW(towers.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    started, running = time.perf_counter(), None
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe.steps, recipe.lr, recipe.warmup, recipe.cooldown)
        images, specs, misses = training_batch(recipe, pool, rng, gen)
        loss = contrastive_loss(towers, images, specs, misses, rng)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        running = value if running is None else 0.95 * running + 0.05 * value
        if (step + 1) % 100 == 0:
            log(f"step {step + 1}/{recipe.steps} loss {running:.3f} temperature "
                f"{1 / float(towers.log_scale.detach().exp()):.3f} ({time.perf_counter() - started:.0f} s)")
    towers.eval().requires_grad_(False)
    with torch.no_grad():
        drawn = pool[0].float() / 255.0
        towers.image.set_principal_axes(torch.cat([towers.image(drawn[i:i + 256])
                                                   for i in range(0, len(drawn), 256)]))
    return towers


@torch.no_grad()
def held_out_report(towers: Towers, scenes: int, seed: int) -> dict[str, dict[str, float]]:
    """Retrieval on ``scenes`` unseen scenes (their own seed), clean and as the embedded model draws them."""
    from .policy import EmbeddedPolicy

    rng = np.random.default_rng([seed, 99])
    images, specs = sample_scenes(scenes, rng)
    policy = EmbeddedPolicy.from_pretrained().eval()
    gen = torch.Generator().manual_seed(seed + 99)
    drawn = torch.cat([redraw(policy, images[i:i + 64], [spec_to_prompt(s) for s in specs[i:i + 64]], gen)
                       for i in range(0, scenes, 64)])
    drawn = (drawn * 255).round() / 255
    return {"clean": retrieval_report(towers.image(torch.from_numpy(images)), specs, towers.text),
            "drawn": retrieval_report(towers.image(drawn), specs, towers.text)}


def format_report(report: dict[str, dict[str, float]]) -> str:
    """One line per set of pictures."""
    return "\n".join(f"held-out {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items())
                     for name, values in report.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    defaults = EncoderTraining()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = EncoderTraining(**{k: getattr(args, k) for k in asdict(defaults)})
    started = time.perf_counter()
    towers = train_towers(recipe)
    trained = time.perf_counter() - started
    report = held_out_report(towers, recipe.held_out, recipe.seed)
    save_towers(args.out, towers.image, towers.text)
    atomic_write_text(args.out / "retrieval.json",
                      json.dumps({"recipe": asdict(recipe), "held_out": report}, indent=1) + "\n")
    print(format_report(report))
    print(f"trained in {trained / 60:.1f} min on {args.threads} thread(s); saved to {args.out}")


if __name__ == "__main__":
    main()
