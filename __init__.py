"""ComfyUI entry point of the Dynamic-TreeRPO node pack (V3 API).

ComfyUI imports this folder by file path and calls ``comfy_entrypoint``; the nodes (and with
them every ComfyUI import) are loaded only then, so the headless trainer never needs ComfyUI.
"""

WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    # a transformers, diffusers or peft outside the supported ranges is refused here, in one line that
    # names the package, the version found and the range (ComfyUI lists the pack as IMPORT FAILED)
    from .trainer.compat.versions import check_versions

    check_versions()
    from .nodes import extension

    return await extension()
