"""Row selection for conditioning of any shape: one prompt's conditioning per latent row.

A conditioning is a tensor whose first dimension is the prompt, or a dict/list/tuple of such
(nested), or anything else (passed through unchanged: scalars, ``None``, strings). The sampler
picks the rows of the prompts its nodes belong to, so any model's conditioning works.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

Cond = Any


def select_rows(cond: Cond, index: Tensor) -> Cond:
    """Return ``cond`` with every tensor's first dimension indexed by ``index``."""
    if isinstance(cond, Tensor):
        return cond.index_select(0, index.to(cond.device))
    if isinstance(cond, dict):
        return {key: select_rows(value, index) for key, value in cond.items()}
    if isinstance(cond, tuple) and hasattr(cond, "_fields"):
        return type(cond)(*(select_rows(value, index) for value in cond))
    if isinstance(cond, (list, tuple)):
        return type(cond)(select_rows(value, index) for value in cond)
    return cond


def index_tensor(indices: list[int] | Tensor) -> Tensor:
    """Indices as a CPU ``long`` tensor."""
    return torch.as_tensor(indices, dtype=torch.long)
