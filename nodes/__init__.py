"""ComfyUI nodes of the pack: thin front ends over ``trainer/``. Imported only inside ComfyUI."""

from __future__ import annotations

from ._comfy import ComfyExtension, io
from .embedded import NODES as EMBEDDED_NODES
from .rewards import NODES as REWARD_NODES
from .sampling import NODES as SAMPLING_NODES
from .training import NODES as TRAINING_NODES


class TreeRPOExtension(ComfyExtension):
    """The pack's V3 extension: the list of its nodes."""

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*EMBEDDED_NODES, *SAMPLING_NODES, *TRAINING_NODES, *REWARD_NODES]


async def extension() -> TreeRPOExtension:
    return TreeRPOExtension()
