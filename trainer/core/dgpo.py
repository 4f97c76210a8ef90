"""DGPO, direct group preference optimisation (Luo-Yihong/DGPO@01ceb4b), as its SD3 GenEval recipe
has it (``config/dgpo.py`` ``geneval_sd3``, ``scripts/train_sd3_dgpo.py``).

Images are sampled with a deterministic DPM-Solver++(2M), scored, and re-noised afresh (one noise
per prompt group and noise level) at a few noise levels drawn once per rollout. Each group is a
preference between its better and worse images: the group's implicit reward ``s_g`` sums, over its
images, advantage x ``beta_dpo`` x (the model's matching error minus the LoRA-free model's), and the
loss is ``sigmoid(s_g)`` x advantage x matching error per image: its gradient is that of the
log-sigmoid group loss ``-log sigmoid(-s_g)`` (up to the constant ``G / beta_dpo``). An image whose
error moved past ``clip`` against the slow copy's (a PPO-like trust region) adds no gradient. A KL
term to the LoRA-free model keeps the update close.

Anchor lines (``scripts/train_sd3_dgpo.py`` unless named): the noise levels, drawn once and shared
52-74 and 1064; the shared noise 76-108 and 1102-1103; re-noising 1106-1107; the reference and the
slow copy 1111-1119; the matching error 1132; the clip 1133-1144; the group loss 162-193; the KL
1150-1156; the slow copy's decay 1175-1177 (``flow_grpo/ema.py`` 32-43); sampling with the slow copy
after ``switch_ema_ref`` 799-800; ``config/dgpo.py`` ``geneval_sd3`` for the values of
:class:`DGPOConfig`. Pure functions of tensors; ``trainer/training/dgpo.py`` feeds them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DGPOConfig:
    """DGPO's rollout and loss. ``group_size`` images per prompt (16, D:67), sampled by the
    deterministic DPM-Solver++(2M) (T:557-559); ``train_timesteps`` noise levels (4, D:28) drawn
    without repetition from the first ``max_train_step + 1`` grid steps (``trunc_steps`` 4, D:64),
    once per rollout for every image; ``beta_dpo`` (100, D:88); ``clip`` (0.01, D:59) of the trust
    region against the slow copy; ``kl_beta`` (0.02, D:63) to the LoRA-free model; ``adv_clip`` (5);
    the slow copy follows the trained LoRA with ``min(slow_decay_cap, slow_decay_rate * step)`` (0.3,
    0.001: T:1175-1177) and samples the rollouts after ``switch_step`` optimizer steps (500, D:61);
    ``shared_noise``: one re-noising draw per group and noise level (D:30)."""

    steps: int = 10
    group_size: int = 16
    train_timesteps: int = 4
    max_train_step: int = 4
    beta_dpo: float = 100.0
    clip: float = 0.01
    kl_beta: float = 0.02
    adv_clip: float = 5.0
    slow_decay_rate: float = 0.001
    slow_decay_cap: float = 0.3
    switch_step: int = 500
    shared_noise: bool = True

    def __post_init__(self) -> None:
        if self.steps < 2 or self.group_size < 2:
            raise ValueError("dgpo.steps and dgpo.group_size must be >= 2")
        if not 1 <= self.train_timesteps <= self.max_train_step + 1:
            raise ValueError(f"dgpo.train_timesteps must be in 1..max_train_step + 1 "
                             f"({self.max_train_step + 1}), got {self.train_timesteps}")
        if self.max_train_step >= self.steps:
            raise ValueError(f"dgpo.max_train_step must be below dgpo.steps ({self.steps}), "
                             f"got {self.max_train_step}")
        if self.beta_dpo <= 0 or self.clip < 0 or self.adv_clip <= 0:
            raise ValueError("dgpo.beta_dpo and dgpo.adv_clip must be > 0 and dgpo.clip >= 0")


def draw_timesteps(config: DGPOConfig, seed: int) -> list[int]:
    """The grid indices of one rollout's training rows: ``train_timesteps`` of ``0..max_train_step``
    without repetition, the same for every image (the anchor draws them on one rank and broadcasts)."""
    return sorted(random.Random(seed).sample(range(config.max_train_step + 1), config.train_timesteps))


def group_implicit_reward(advantage: Tensor, error: Tensor, ref_error: Tensor, groups: Tensor,
                          beta_dpo: float, group_size: int) -> Tensor:
    """Per row, its group's ``s_g = sum_i A_i beta (e_i - e_ref_i) / G`` (detached): how much better than
    the reference the group's preference already holds (negative: the better images already have the
    lower error, so the group pushes less)."""
    per_row = advantage.double() * beta_dpo * (error.detach().double() - ref_error.double()) / group_size
    sums = torch.zeros(int(groups.max()) + 1, dtype=per_row.dtype, device=per_row.device)
    sums.index_add_(0, groups.to(per_row.device), per_row)
    return sums[groups.to(per_row.device)]


def outside_trust_region(advantage: Tensor, error: Tensor, old_error: Tensor, clip: float) -> Tensor:
    """Rows whose error moved too far in the advantage's direction against the slow copy's:
    ``ratio = exp(e_old - e)`` above ``1 + clip`` for ``A > 0``, below ``1 - clip`` for ``A <= 0``."""
    ratio = torch.exp(old_error.double() - error.detach().double())
    return torch.where(advantage > 0, ratio > 1.0 + clip, ratio < 1.0 - clip)


def dgpo_loss(advantage: Tensor, error: Tensor, ref_error: Tensor, old_error: Tensor, groups: Tensor,
              config: DGPOConfig) -> Tensor:
    """Per row, ``sigmoid(s_g) A e`` with ``A`` clipped at ``adv_clip`` and ``e`` detached where the
    row is outside the trust region (it then adds no gradient)."""
    a = advantage.double().clamp(-config.adv_clip, config.adv_clip)
    weight = torch.sigmoid(group_implicit_reward(a, error, ref_error, groups, config.beta_dpo,
                                                 config.group_size))
    clipped = outside_trust_region(a, error, old_error, config.clip)
    e = torch.where(clipped, error.detach().double(), error.double())
    return weight.detach() * a * e
