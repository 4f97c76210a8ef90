"""Write the web UI (LiteGraph) form of API-format workflows: ``<name>.api.json`` -> ``<name>.json``.

The UI format lists each node's widget values in the node's own widget order (plus a "control
after generate" value after seed widgets), so the conversion needs ComfyUI's node definitions:
those of a running server (``--server URL``, its ``/object_info``), or, by default, those of
ComfyUI loaded in this process with this pack (``--comfyui PATH``, else ``$TREERPO_COMFYUI``, else
``.comfyui``). Nodes are laid out left to right by their depth in the graph. The conversion itself
is ``trainer.workflow_format.api_to_ui``; ``treerpo run-workflow`` converts back with ``ui_to_api``.

    python scripts/api_to_ui.py workflows/api/*.api.json            # writes workflows/<name>.json
    python scripts/api_to_ui.py workflows/api/*.api.json --check    # exit 1 if a UI file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

from dynamic_treerpo.trainer.comfyui_host.runner import boot, comfyui_root
from dynamic_treerpo.trainer.comfyui_host.workflow_format import Definitions, api_to_ui, read_workflow

SUFFIX = ".api.json"


def server_definitions(url: str) -> Definitions:
    with urllib.request.urlopen(url.rstrip("/") + "/object_info", timeout=60) as response:
        return json.load(response)


def local_definitions(comfyui: Path | None) -> Definitions:
    with tempfile.TemporaryDirectory(prefix="treerpo_api_to_ui_") as tmp:
        host = boot(comfyui_root(comfyui), None, Path(tmp))
        try:
            return host.definitions()
        finally:
            host.loop.close()


def ui_path(api_file: Path) -> Path:
    if not api_file.name.endswith(SUFFIX):
        raise ValueError(f"{api_file}: expected a file named <name>{SUFFIX}")
    folder = api_file.parent.parent if api_file.parent.name == "api" else api_file.parent
    return folder / (api_file.name[: -len(SUFFIX)] + ".json")  # workflows/api/x.api.json -> workflows/x.json


def convert(api_file: Path, definitions: Definitions) -> str:
    """The UI JSON text for ``api_file``; its id is derived from the name, so output is stable."""
    name = ui_path(api_file).stem
    workflow_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"dynamic-treerpo/workflows/{name}"))
    return json.dumps(api_to_ui(read_workflow(api_file), definitions, workflow_id), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help=f"API-format workflows (<name>{SUFFIX})")
    parser.add_argument("--server", default=None, help="a running ComfyUI, e.g. http://127.0.0.1:8188")
    parser.add_argument("--comfyui", type=Path, default=None, help="ComfyUI folder to load in-process")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a UI file differs")
    args = parser.parse_args(argv)
    try:
        definitions = server_definitions(args.server) if args.server else local_definitions(args.comfyui)
        stale = []
        for api_file in args.files:
            target, text = ui_path(api_file), convert(api_file, definitions)
            if args.check:
                if not target.is_file() or target.read_text(encoding="utf-8") != text:
                    stale.append(target)
                continue
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    except (ValueError, FileNotFoundError, ImportError, OSError) as err:
        print(f"api_to_ui: error: {err}", file=sys.stderr)
        return 2
    for target in stale:
        print(f"stale: {target} (run scripts/api_to_ui.py on its .api.json)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
