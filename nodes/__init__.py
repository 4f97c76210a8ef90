"""ComfyUI nodes of the pack: thin front ends over ``trainer/``. Imported only inside ComfyUI."""

from __future__ import annotations

from ._comfy import ComfyExtension, io
from .embedded import NODES as EMBEDDED_NODES


class TreeRPOExtension(ComfyExtension):
    """The pack's V3 extension: the list of its nodes."""

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(EMBEDDED_NODES)


async def extension() -> TreeRPOExtension:
    return TreeRPOExtension()
