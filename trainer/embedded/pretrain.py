"""Reproduce the embedded default's weights from a seed: flow-matching pretraining on scenes.

    python -m dynamic_treerpo.trainer.embedded.pretrain --out trainer/embedded/weights

Data: unlimited procedurally generated scenes (``scenes.sample_batch``), captioned exactly in
stages 1 and 2 and with web-like noise in stage 3 (``captions.captioner``: count, colour-binding
and region words flipped at rate 0.5, so the model learns to draw but not to follow them).
Objective: x0-prediction MSE at ``s ~ U(0, 1)`` on ``x_s = (1 - s) x0 + s eps``. AdamW with a
linear warm-up, a constant phase and a linear cool-down over the last ``cooldown`` fraction of the
steps; each stage saves an exponential moving average (EMA) of its weights, which samples far
cleaner. The shipped weights are competent but compose badly on purpose, so that RL has
systematic errors to fix (trainer/embedded/MODEL_CARD.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from .captions import EXACT, WEB_LIKE, CaptionNoise, captioner
from .policy import EmbeddedPolicy
from .scenes import sample_batch

DEFAULT_STEPS = 1500
DEFAULT_REFINE_STEPS = 1500
DEFAULT_NOISY_STEPS = 2000
DEFAULT_NOISY_LR = 5e-4


def lr_at(step: int, steps: int, lr: float, warmup: int, cooldown: float) -> float:
    """Linear warm-up, constant, then a linear decay to 0 over the last ``cooldown`` fraction."""
    decay_start = steps * (1.0 - cooldown)
    factor = min(1.0, (step + 1) / warmup)
    if step >= decay_start:
        factor *= max(0.0, (steps - step) / (steps - decay_start))
    return lr * factor


@torch.no_grad()
def ema_update(ema: dict[str, torch.Tensor], model: torch.nn.Module, decay: float) -> None:
    """``ema = decay * ema + (1 - decay) * weights`` for every parameter."""
    for name, param in model.named_parameters():
        ema[name].mul_(decay).add_(param.detach(), alpha=1.0 - decay)


def train_step(policy: EmbeddedPolicy, optimizer: torch.optim.Optimizer, images: np.ndarray,
               prompts: list[str], gen: torch.Generator) -> float:
    """One x0-prediction step on a batch of clean renders; returns the loss."""
    x0 = policy.encode_images(torch.from_numpy(images))
    sigma = torch.rand(x0.shape[0], generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    s = sigma.reshape(-1, 1, 1, 1)
    x = (1.0 - s) * x0 + s * eps
    loss = (policy.predict_x0(x, sigma, policy.encode(prompts)) - x0).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    return loss.item()


def _save_ema(policy: EmbeddedPolicy, ema: dict[str, torch.Tensor], folder: Path) -> None:
    """Save the policy with its transformer weights swapped for the EMA ones."""
    live = {k: v.detach().clone() for k, v in policy.transformer.state_dict().items()}
    policy.transformer.load_state_dict({**live, **ema})
    policy.save_pretrained(folder)
    policy.transformer.load_state_dict(live)


def train_stage(policy: EmbeddedPolicy, steps: int, seed: int, stage: int, batch: int, lr: float,
                warmup: int, cooldown: float, ema_decay: float, snapshots: Path | None = None,
                snapshot_every: int = 0, noise: CaptionNoise = EXACT) -> dict[str, torch.Tensor]:
    """One stage of pretraining from the policy's current weights; returns the EMA weights.

    Each stage has its own optimizer, schedule and random streams seeded by ``(seed, stage)``,
    so a stage's result depends only on its starting weights and its arguments.
    """
    rng = np.random.default_rng(seed if stage == 1 else [seed, stage])
    gen = torch.Generator().manual_seed(seed if stage == 1 else seed * 1000 + stage)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.01)
    caption = captioner(noise)
    ema = {k: v.detach().clone() for k, v in policy.transformer.named_parameters()}
    start, running = time.time(), None
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup, cooldown)
        images, prompts = sample_batch(batch, rng, caption)
        loss = train_step(policy, optimizer, images, prompts, gen)
        ema_update(ema, policy.transformer, min(ema_decay, (step + 1) / (step + 10)))
        running = loss if running is None else 0.98 * running + 0.02 * loss
        if (step + 1) % 50 == 0:
            print(f"stage {stage} step {step + 1}/{steps} loss {running:.4f} "
                  f"({time.time() - start:.0f} s)", flush=True)
        if snapshots is not None and snapshot_every and (step + 1) % snapshot_every == 0:
            _save_ema(policy, ema, snapshots / f"stage{stage}_step_{step + 1}")
    return ema


def pretrain(out: Path, steps: int = DEFAULT_STEPS, refine_steps: int = DEFAULT_REFINE_STEPS,
             seed: int = 0, batch: int = 64, lr: float = 1e-3, refine_lr: float = 5e-4,
             warmup: int = 100, cooldown: float = 1 / 3, ema_decay: float = 0.995,
             snapshot_every: int = 0, init: Path | None = None, from_stage: int = 2,
             noisy_steps: int = DEFAULT_NOISY_STEPS, noisy_lr: float = DEFAULT_NOISY_LR,
             noise: CaptionNoise = WEB_LIKE) -> EmbeddedPolicy:
    """Three stages, each from the previous one's EMA weights; saves the final EMA weights to ``out``.

    1. from scratch on exact captions at ``lr`` (learns to draw);
    2. a warm restart on exact captions at ``refine_lr`` (draws cleaner);
    3. a warm restart on web-like noisy captions (``captions.CaptionNoise``, default rates) at
       ``noisy_lr``: the model unlearns following count, colour-binding and region words while it
       keeps drawing, which is the systematic error reinforcement learning then fixes.

    ``init`` skips the stages before ``from_stage`` and starts from a folder holding the output of
    stage ``from_stage - 1`` (the same result, minus their time).
    """
    snapshots = out if snapshot_every else None
    stages = [(1, steps, lr, EXACT), (2, refine_steps, refine_lr, EXACT),
              (3, noisy_steps, noisy_lr, noise)]
    if init is None:
        policy = EmbeddedPolicy.from_scratch(seed)
        from_stage = 1
    else:
        if not 2 <= from_stage <= 3:
            raise ValueError(f"--from-stage {from_stage}: with --init, start at stage 2 or 3")
        policy = EmbeddedPolicy.from_pretrained(init)
    for stage, stage_steps, stage_lr, stage_noise in stages[from_stage - 1:]:
        if stage_steps <= 0:
            continue
        ema = train_stage(policy, stage_steps, seed, stage, batch, stage_lr, warmup, cooldown,
                          ema_decay, snapshots, snapshot_every, stage_noise)
        _load_ema(policy, ema)
        if snapshots is not None:
            policy.save_pretrained(out / f"stage{stage}")
    policy.save_pretrained(out)
    return policy


def _load_ema(policy: EmbeddedPolicy, ema: dict[str, torch.Tensor]) -> None:
    live = policy.transformer.state_dict()
    policy.transformer.load_state_dict({**live, **ema})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="stage 1 steps")
    parser.add_argument("--refine-steps", type=int, default=DEFAULT_REFINE_STEPS, help="stage 2 steps")
    parser.add_argument("--refine-lr", type=float, default=5e-4)
    parser.add_argument("--noisy-steps", type=int, default=DEFAULT_NOISY_STEPS,
                        help="stage 3 steps (noisy captions)")
    parser.add_argument("--noisy-lr", type=float, default=DEFAULT_NOISY_LR)
    parser.add_argument("--count-noise", type=float, default=CaptionNoise.count,
                        help="stage 3: probability a count word is flipped")
    parser.add_argument("--binding-noise", type=float, default=CaptionNoise.binding,
                        help="stage 3: probability the groups' colours are permuted")
    parser.add_argument("--region-noise", type=float, default=CaptionNoise.region,
                        help="stage 3: probability the region words are swapped")
    parser.add_argument("--init", type=Path, default=None,
                        help="start at --from-stage from this folder (the previous stage's output)")
    parser.add_argument("--from-stage", type=int, default=2, choices=(2, 3))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cooldown", type=float, default=1 / 3, help="fraction of steps with decaying lr")
    parser.add_argument("--ema-decay", type=float, default=0.995)
    parser.add_argument("--snapshot-every", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pretrain(args.out, args.steps, args.refine_steps, args.seed, args.batch, args.lr, args.refine_lr,
             cooldown=args.cooldown, ema_decay=args.ema_decay, snapshot_every=args.snapshot_every,
             init=args.init, from_stage=args.from_stage, noisy_steps=args.noisy_steps,
             noisy_lr=args.noisy_lr,
             noise=CaptionNoise(args.count_noise, args.binding_noise, args.region_noise))


if __name__ == "__main__":
    main()
