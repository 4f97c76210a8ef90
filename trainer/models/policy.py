"""The one model abstraction: everything model-specific hides behind :class:`Policy`.

The sampler, the losses and the training loop are written once against this protocol; the
embedded default, diffusers FLUX.1/SD3 and a ComfyUI MODEL are its implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor
from torch.nn import Parameter


@runtime_checkable
class Policy(Protocol):
    """A flow-matching text-to-image model as the trainer sees it."""

    latent_shape: tuple[int, ...]

    def encode(self, prompts: Sequence[str]) -> Any:
        """Conditioning with one row per prompt (tensors, or dicts/tuples of tensors)."""

    def velocity(self, x: Tensor, sigma: Tensor, cond: Any) -> Tensor:
        """Batched ``v(x, s, c)`` with ``v ~ eps - x0``; gradients flow when enabled."""

    def decode(self, latents: Tensor) -> Tensor:
        """Clean latents to images ``[B, 3, H, W]`` in ``[0, 1]``."""

    def trainable_parameters(self) -> Iterable[Parameter]:
        """What the optimizer updates (the LoRA, or all weights for full fine-tuning)."""


WRAPPED = "wrapped_transformer"


def transformer_call(policy: Any) -> Callable[..., Any]:
    """What a policy's velocity calls: its transformer, or the data-parallel wrapper around it that
    ``trainer.training.distributed`` installed (DDP must see the forward to reduce the gradients)."""
    return policy.__dict__.get(WRAPPED) or policy.transformer
