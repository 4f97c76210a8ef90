"""ComfyUI entry point of the Dynamic-TreeRPO node pack.

ComfyUI imports this folder by file path. The nodes themselves arrive with the node-pack work;
until then the pack registers no nodes, and nothing here imports ComfyUI at module level.
"""

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
