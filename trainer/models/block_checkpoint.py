"""Gradient checkpointing of a transformer's blocks, for models that do not offer it themselves
(ComfyUI's FLUX and SD3 modules): each block keeps no activations in the forward and recomputes
them in backward, so training memory holds one block's activations instead of all of them.

A block that updates tensors in place must run under ``autograd_safe.out_of_place_updates``:
checkpointing does not detect a recomputed tensor modified after it was saved, and the gradient
would be silently wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: every member of the model's ``ModuleList`` children (searched depth-first)."""
    blocks: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            blocks.extend(child)
        else:
            blocks.extend(transformer_blocks(child))
    return blocks


def _checkpointed(forward: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        # dict arguments (ComfyUI's transformer_options) change between blocks: recompute with
        # the values of this call
        kwargs = {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return wrapped


@contextmanager
def checkpointed_blocks(model: nn.Module) -> Iterator[int]:
    """Within the block, ``model``'s blocks run checkpointed; yields how many; restored on exit."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no block list to checkpoint")
    saved = [block.__dict__.get("forward") for block in blocks]  # another tool's patch, if any
    for block in blocks:
        block.forward = _checkpointed(block.forward)
    try:
        yield len(blocks)
    finally:
        for block, before in zip(blocks, saved, strict=True):
            if before is None:
                del block.forward  # the class's forward shows again
            else:
                block.forward = before
