"""ComfyUI nodes of the pack: thin front ends over ``trainer/``. Imported only inside ComfyUI."""

from __future__ import annotations

from .checkpoints import NODES as CHECKPOINT_NODES
from .comfy_door import ComfyExtension, io
from .embedded import NODES as EMBEDDED_NODES
from .picks import NODES as PICKS_NODES
from .picks_routes import register_routes
from .rewards import NODES as REWARD_NODES
from .sampling import NODES as SAMPLING_NODES
from .training import NODES as TRAINING_NODES


class TreeRPOExtension(ComfyExtension):
    """The pack's V3 extension: the list of its nodes."""

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*EMBEDDED_NODES, *SAMPLING_NODES, *TRAINING_NODES, *REWARD_NODES, *PICKS_NODES,
                *CHECKPOINT_NODES]


async def extension() -> TreeRPOExtension:
    register_routes()  # the picking panel's routes (web/pick_leaves.js), when a server runs
    return TreeRPOExtension()
