"""Data-parallel training on ``torch.distributed``: one process per GPU (or per CPU share with gloo),
started by ``torchrun`` or ``accelerate launch``, which set ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``.

Why the run is the same at any world size: the prompts of an iteration are split into equal
shards by rank; every random draw of a prompt derives from ``(seed, iteration, prompt)``; each
rank normalises its loss by its own prompt count, so the average over ranks that DDP (LoRA) and
FSDP2 (full fine-tuning) apply to the gradients is the single-process gradient of the whole
batch. Only statistics that cross prompts (the clip-spread estimate, logged means) are gathered.
Rank 0 alone writes logs, checkpoints and exports; checkpoints hold consolidated (unsharded)
state, so ``--resume`` works at any world size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..config.schema import DistributedConfig


@dataclass(frozen=True)
class Dist:
    """This process's place in the job (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(config: DistributedConfig) -> Dist:
    """Join the process group the launcher described (``WORLD_SIZE`` > 1), once; else single."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = config.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)  # "cuda" then means this rank's GPU
        dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s))
    return Dist(dist.get_rank(), dist.get_world_size(), local)


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()


def shard(count: int, d: Dist) -> slice:
    """This rank's equal share of ``count`` prompts (an uneven split is a one-line error)."""
    if count % d.world_size:
        raise ValueError(f"data.prompts_per_iteration ({count}) must be a multiple of the number of "
                         f"processes ({d.world_size}): each rank takes an equal share of the prompts")
    size = count // d.world_size
    return slice(d.rank * size, (d.rank + 1) * size)


def gather(values: Tensor, d: Dist) -> Tensor:
    """Every rank's ``values`` concatenated in rank order. Each rank holds the same number (equal
    prompt shards, chunks dealt per prompt and layer); a mismatch is an error, not padding."""
    if not d.enabled:
        return values
    local = values.detach().float().cpu().contiguous()
    parts = [torch.zeros_like(local) for _ in range(d.world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts)


def reduce_sum(values: dict[str, float], d: Dist) -> dict[str, float]:
    """Sum each number over ranks."""
    if not d.enabled:
        return dict(values)
    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(total)
    return dict(zip(keys, total.tolist(), strict=True))


def sum_over_ranks(d: Dist) -> Callable[[Tensor], Tensor] | None:
    """A function summing a CPU tensor over ranks (None in one process: nothing to sum)."""
    if not d.enabled:
        return None

    def reduce(t: Tensor) -> Tensor:
        out = t.clone()
        dist.all_reduce(out)
        return out

    return reduce


def reduce_max(value: float, d: Dist) -> float:
    if not d.enabled:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


# ------------------------------------------------------------------------------ model wrapping
GradSync = Callable[[bool], AbstractContextManager]


def wrap_model(transformer: nn.Module, d: Dist, full_finetune: bool) -> tuple[nn.Module, GradSync]:
    """The module the policy calls, and ``sync(last)``: a context for one micro-batch's forward and
    backward in which gradients are averaged over ranks only when ``last`` (one reduction per
    optimizer update, however many micro-batches it takes).

    LoRA: ``DistributedDataParallel`` (buffers are not broadcast: rollouts and evaluation run
    forwards without any collective). Full fine-tuning: FSDP2's ``fully_shard`` on each block, then
    on the whole transformer (in place; the transformer itself stays what the policy calls).
    """
    if not d.enabled:
        return transformer, lambda _last: nullcontext()
    if full_finetune:
        from torch.distributed.fsdp import fully_shard

        from ..models.block_checkpoint import transformer_blocks

        for block in transformer_blocks(transformer):
            fully_shard(block)
        fully_shard(transformer)

        @contextmanager
        def fsdp_sync(last: bool) -> Iterator[None]:
            transformer.set_requires_gradient_sync(last)
            yield

        return transformer, fsdp_sync
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [d.local_rank] if next(transformer.parameters()).is_cuda else None
    ddp = DistributedDataParallel(transformer, device_ids=device_ids, broadcast_buffers=False)
    return ddp, lambda last: nullcontext() if last else ddp.no_sync()


def full_state(transformer: nn.Module, d: Dist) -> dict[str, Tensor]:
    """Every weight, unsharded, on the CPU (a collective under FSDP: call it on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not d.enabled:
        return {k: v.detach().clone().contiguous() for k, v in transformer.state_dict().items()}
    state = get_model_state_dict(transformer, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter names, unsharded: it loads at any world size."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load :func:`optimizer_state` (or a plain ``optimizer.state_dict()``, as older runs saved)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if all(isinstance(k, int) for k in state.get("state", {})) and state.get("param_groups") and all(
            isinstance(p, int) for p in state["param_groups"][0]["params"]):
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def load_full_state(transformer: nn.Module, state: dict[str, Tensor]) -> None:
    """Load an unsharded state into a (possibly sharded) transformer, strictly."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(transformer, state, options=StateDictOptions(full_state_dict=True, strict=True))
