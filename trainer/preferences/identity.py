"""Which weights sampled a tree: a fingerprint of a module's parameters, cheap and order-free.

Why not a file hash: in ComfyUI the model comes from a loader node (its file may be fp8, patched by
other nodes, or the embedded model's folder); the parameters are what sampled the tree. The
fingerprint hashes each parameter's name, shape and two float64 sums (printed at 9 digits), so it is
the same on any device, any number of threads and for any dtype that holds the same values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor


def fingerprint(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """A 16-hex-digit digest of ``(name, shape, sum, sum of |x|)`` of every tensor, by name."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
            # float64 sums: float32 ones change in their 6th digit with the number of threads torch
            # sums on (the order of the partial sums), which training itself sets
            t = tensor.detach().double()
            digest.update(f"{name}:{tuple(t.shape)}:{float(t.sum()):.9g}:{float(t.abs().sum()):.9g};".encode())
    return digest.hexdigest()[:16]


def base_fingerprint(module: torch.nn.Module) -> str:
    """The base weights of ``module``, LoRA layers left out (so training does not change it)."""
    return fingerprint((name.replace(".base_layer", ""), p) for name, p in module.named_parameters()
                       if "lora_" not in name)


def lora_fingerprint(state: dict[str, Tensor] | None) -> str | None:
    """A LoRA's tensors, None without one."""
    return fingerprint(state.items()) if state else None
