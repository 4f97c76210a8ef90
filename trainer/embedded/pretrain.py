"""Reproduce the embedded default's weights from a seed: flow-matching pretraining on scenes.

    python -m trainer.embedded.pretrain --out trainer/embedded/weights

Data: unlimited procedurally generated scenes (``scenes.sample_batch``). Objective: x0-prediction
MSE at ``s ~ U(0, 1)`` on ``x_s = (1 - s) x0 + s eps``. AdamW with a linear warm-up, a constant
phase and a linear cool-down over the last ``cooldown`` fraction of the steps; the saved weights
are an exponential moving average (EMA) of the trained ones, which samples far cleaner. The
shipped weights stop early on purpose: the base must be competent but imperfect, so that RL has
room to improve it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from ..models.embedded import EmbeddedPolicy
from .scenes import sample_batch

DEFAULT_STEPS = 1500
DEFAULT_REFINE_STEPS = 1500


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
                snapshot_every: int = 0) -> dict[str, torch.Tensor]:
    """One stage of pretraining from the policy's current weights; returns the EMA weights.

    Each stage has its own optimizer, schedule and random streams seeded by ``(seed, stage)``,
    so a stage's result depends only on its starting weights and its arguments.
    """
    rng = np.random.default_rng(seed if stage == 1 else [seed, stage])
    gen = torch.Generator().manual_seed(seed if stage == 1 else seed * 1000 + stage)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.01)
    ema = {k: v.detach().clone() for k, v in policy.transformer.named_parameters()}
    start, running = time.time(), None
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup, cooldown)
        images, prompts = sample_batch(batch, rng)
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
             snapshot_every: int = 0, init: Path | None = None) -> EmbeddedPolicy:
    """Stage 1 from scratch, then stage 2 (a warm restart at ``refine_lr``) from stage 1's EMA
    weights; saves the final EMA weights to ``out``. ``init`` skips stage 1 and starts stage 2
    from a folder holding stage 1's output (the same result, minus stage 1's time)."""
    snapshots = out if snapshot_every else None
    if init is None:
        policy = EmbeddedPolicy.from_scratch(seed)
        ema = train_stage(policy, steps, seed, 1, batch, lr, warmup, cooldown, ema_decay,
                          snapshots, snapshot_every)
        _load_ema(policy, ema)
        if snapshots is not None:
            policy.save_pretrained(out / "stage1")
    else:
        policy = EmbeddedPolicy.from_pretrained(init)
    if refine_steps > 0:
        ema = train_stage(policy, refine_steps, seed, 2, batch, refine_lr, warmup, cooldown,
                          ema_decay, snapshots, snapshot_every)
        _load_ema(policy, ema)
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
    parser.add_argument("--init", type=Path, default=None,
                        help="start stage 2 from this stage-1 output folder instead of training stage 1")
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
             init=args.init)


if __name__ == "__main__":
    main()
