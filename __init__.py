"""ComfyUI entry point of the Dynamic-TreeRPO node pack (V3 API).

ComfyUI imports this folder by file path and calls ``comfy_entrypoint``; the nodes (and with
them every ComfyUI import) are loaded only then, so the headless trainer never needs ComfyUI.
"""


async def comfy_entrypoint():
    from .nodes import extension

    return await extension()
