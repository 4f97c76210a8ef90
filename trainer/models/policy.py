"""The one model abstraction: everything model-specific hides behind :class:`Policy`.

The sampler, the losses and the training loop are written once against this protocol; the
embedded default, diffusers FLUX.1/SD3 and a ComfyUI MODEL are its implementations. The protocol
lists every member the trainer reads; :class:`PolicyBase` gives the optional ones their defaults,
so an implementation writes only what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from torch.nn import Parameter


@runtime_checkable
class Policy(Protocol):
    """A flow-matching text-to-image model as the trainer sees it."""

    latent_shape: tuple[int, ...]
    """One latent, without the batch dimension."""
    transformer: nn.Module
    """What a LoRA attaches to, checkpoints save and data-parallel training wraps."""
    device: torch.device
    """Where latents and conditioning live."""
    image_tokens: int
    """Transformer tokens per image: FLUX's resolution-dependent schedule shift reads it."""
    forwards_per_row: int
    """Model forwards per latent row (2 with classifier-free guidance): forward counts use it."""
    latent_unshuffle: int
    """Pixel-unshuffle factor of the latent (pooled SDE noise works on image blocks)."""

    def encode(self, prompts: Sequence[str]) -> Any:
        """Conditioning with one row per prompt (tensors, or dicts/tuples of tensors)."""

    def velocity(self, x: Tensor, sigma: Tensor, cond: Any) -> Tensor:
        """Batched ``v(x, s, c)`` with ``v ~ eps - x0``; gradients flow when enabled."""

    def decode(self, latents: Tensor) -> Tensor:
        """Clean latents to images ``[B, 3, H, W]`` in ``[0, 1]``."""

    def encode_images(self, images: Tensor) -> Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]`` to clean latents (held-out drift needs it)."""

    def trainable_parameters(self) -> Iterable[Parameter]:
        """What the optimizer updates (the LoRA, or all weights for full fine-tuning)."""

    def train(self, mode: bool = True) -> Any:
        """Training mode (dropout, checkpointing) for the update passes."""

    def eval(self) -> Any:
        """Inference mode for rollouts and evaluation."""

    def wrap_transformer(self, wrapped: Callable[..., Any]) -> None:
        """Route the forwards of :meth:`velocity` through ``wrapped`` (a data-parallel wrapper
        around :attr:`transformer`, which must see every forward to reduce the gradients)."""

    def transformer_forward(self) -> Callable[..., Any]:
        """What :meth:`velocity` calls: the transformer, or the wrapper around it."""


class PolicyBase:
    """Defaults of a :class:`Policy`'s optional members; implementations inherit them.

    The wrapper is stored outside ``nn.Module``'s registry on purpose: registered as a submodule it
    would add a second copy of every weight to ``state_dict``.
    """

    forwards_per_row: int = 1
    latent_unshuffle: int = 1
    _forward_wrapper: Callable[..., Any] | None = None

    def encode_images(self, images: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} cannot encode images into latents")

    def wrap_transformer(self, wrapped: Callable[..., Any]) -> None:
        object.__setattr__(self, "_forward_wrapper", wrapped)

    def transformer_forward(self) -> Callable[..., Any]:
        return self._forward_wrapper or self.transformer  # type: ignore[attr-defined]


def missing_members(policy: object) -> list[str]:
    """The :class:`Policy` members ``policy`` lacks (empty when it is one)."""
    names = [n for n in Policy.__annotations__] + [
        n for n, v in vars(Policy).items() if callable(v) and not n.startswith("_")]
    return [n for n in dict.fromkeys(names) if not hasattr(policy, n)]


def check_policy(policy: object) -> None:
    """Refuse, in one line, an object the trainer cannot train."""
    missing = missing_members(policy)
    if missing:
        raise TypeError(f"{type(policy).__name__} is not a Policy: it lacks {', '.join(missing)} "
                        "(see trainer/models/policy.py)")
