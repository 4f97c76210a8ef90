"""Augmented assignment on tensors that autograd can differentiate, for models written for inference.

ComfyUI's diffusion models (FLUX, SD3) update activations in place (``img += attn``) after a layer
norm has saved that very tensor for its backward. Plain autograd refuses such a graph; under
gradient checkpointing the recomputed tensor is modified the same way and the gradient comes out
silently wrong (far off finite differences on FLUX's double blocks; tests/test_comfy_policy.py compares
the LoRA gradients with finite differences). Within
:func:`out_of_place_updates`, ``a += b`` (and ``-=``, ``*=``, ``/=``) on a tensor that autograd is
recording builds a new tensor instead: the value is the same, the saved one stays intact. Without
gradients (sampling) the operators stay in place, exactly as the model was written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "__iadd__": torch.Tensor.__add__, "__isub__": torch.Tensor.__sub__,
    "__imul__": torch.Tensor.__mul__, "__itruediv__": torch.Tensor.__truediv__,
}
_lock = threading.Lock()
_depth = 0
_saved: dict[str, Any] = {}


def _records(a: Any, b: Any) -> bool:
    return torch.is_grad_enabled() and (
        a.requires_grad or (isinstance(b, torch.Tensor) and b.requires_grad))


def _guarded(name: str) -> Callable[[Any, Any], Any]:
    in_place, out_of_place = _saved[name], _OPERATORS[name]

    def operator(self: torch.Tensor, other: Any) -> Any:
        return out_of_place(self, other) if _records(self, other) else in_place(self, other)

    return operator


@contextmanager
def out_of_place_updates() -> Iterator[None]:
    """Within the block, recorded tensors get out-of-place augmented assignment (re-entrant)."""
    global _depth
    with _lock:
        if _depth == 0:
            _saved.update({name: getattr(torch.Tensor, name) for name in _OPERATORS})
            for name in _OPERATORS:
                setattr(torch.Tensor, name, _guarded(name))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, method in _saved.items():
                    setattr(torch.Tensor, name, method)
