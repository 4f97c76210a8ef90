"""Write the web UI (LiteGraph) form of API-format workflows: ``api/<id>.api.json`` -> ``<title>.json``.

The UI format lists each node's widget values in the node's own widget order (plus a "control
after generate" value after seed widgets), so the conversion needs ComfyUI's node definitions:
those of a running server (``--server URL``, its ``/object_info``), or, by default, those of
ComfyUI loaded in this process with this pack (``--comfyui PATH``, else ``$TREERPO_COMFYUI``, else
``.comfyui``). Nodes are laid out left to right by their depth in the graph. The conversion itself
is ``trainer.workflow_format.api_to_ui``; ``treerpo run-workflow`` converts back with ``ui_to_api``.

The UI files are the pack's templates in ComfyUI's template browser, which shows a pack template's file
name as its title and again, with ``-`` and ``_`` as spaces, as its description (ComfyUI 0.3.75 lists a
pack's ``workflows/*.json`` by name only; frontend 1.32.9 reads nothing else of them but
``<name>.jpg``, the thumbnail). So each UI file is named in plain words (``TITLES``: which model, what it
does, and whether it runs on a CPU or which weights it needs), while its API file keeps a short id.

The UI files save no view (``extra.ds``): the frontend fits a workflow without one into the window when
it opens (its fit view, what the "." key does), whatever the window's size, where a saved offset and
zoom left nodes off-screen or under the menus.

    python scripts/api_to_ui.py workflows/api/*.api.json            # writes workflows/<title>.json
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

from dynamic_treerpo.trainer.comfyui_host.layouts import STAMP, read_record
from dynamic_treerpo.trainer.comfyui_host.runner import boot, comfyui_root
from dynamic_treerpo.trainer.comfyui_host.workflow_format import Definitions, api_to_ui, read_workflow

SUFFIX = ".api.json"
# API id -> the UI file's name: the template browser's title and description. No "-" or "_" (shown as
# spaces in the description) and nothing a file system or a URL refuses (":", "/", "?", "#").
TITLES = {
    "train_embedded": "Embedded shapes model, train a LoRA (runs on a CPU)",
    "sample_and_score": "Embedded shapes model, draw and score images (runs on a CPU)",
    "best_of_tree": "Embedded shapes model, best of 8 variations (runs on a CPU)",
    "pick_and_train": "Embedded shapes model, pick what you like and train (runs on a CPU)",
    "flux_dev_template": "FLUX.1 dev, best of 8 variations (needs FLUX.1 dev weights and a GPU)",
    "flux_dev_train": "FLUX.1 dev, train a LoRA (needs FLUX.1 dev weights and a GPU)",
    "flux_dev_train_fp8": "FLUX.1 dev fp8, train a LoRA (needs FLUX.1 dev weights and a 24 GB GPU)",
    "flux_pick_fp8": "FLUX.1 dev, pick what you like and train (needs FLUX.1 dev weights and a 24 GB GPU)",
    "qwen_image_train": "Qwen Image, train a LoRA (needs Qwen Image weights and a big GPU)",
}


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


def api_id(api_file: Path) -> str:
    if not api_file.name.endswith(SUFFIX):
        raise ValueError(f"{api_file}: expected a file named <name>{SUFFIX}")
    return api_file.name[: -len(SUFFIX)]


def ui_path(api_file: Path) -> Path:
    """``workflows/api/<id>.api.json`` -> ``workflows/<title>.json`` (``<id>.json`` for ids not in TITLES)."""
    folder = api_file.parent.parent if api_file.parent.name == "api" else api_file.parent
    name = api_id(api_file)
    return folder / f"{TITLES.get(name, name)}.json"


def api_path(ui_file: Path) -> Path:
    """The API file of a UI workflow: ``workflows/<title>.json`` -> ``workflows/api/<id>.api.json``."""
    stem = ui_file.name[: -len(".json")]
    name = next((key for key, title in TITLES.items() if title == stem), stem)
    return ui_file.parent / "api" / f"{name}{SUFFIX}"


def ui_workflow(prompt: dict, definitions: Definitions, name: str) -> dict:
    """The UI form of ``prompt`` as the pack ships it: no saved view, so that the frontend fits the graph
    into the window on opening; its id is derived from ``name`` (the API id), so output is stable."""
    workflow_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"dynamic-treerpo/workflows/{name}"))
    workflow = api_to_ui(prompt, definitions, workflow_id)
    workflow["extra"].pop("ds", None)
    release, layouts = read_record().current  # the release whose layout the values are in, as the UI stamps
    for node in workflow["nodes"]:
        if node["type"] in layouts:
            node.setdefault("properties", {})[STAMP] = release
    return workflow


def convert(api_file: Path, definitions: Definitions) -> str:
    """The UI JSON text for ``api_file``."""
    workflow = ui_workflow(read_workflow(api_file), definitions, api_id(api_file))
    return json.dumps(workflow, indent=1) + "\n"


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
    orphans = orphan_ui_files(args.files)
    for orphan in orphans:  # e.g. left behind when a template was renamed
        print(f"{'stale' if args.check else 'note'}: {orphan} has no API file among those given "
              "(delete it if its workflow was renamed)", file=sys.stderr)
    return 1 if stale or (args.check and orphans) else 0


def orphan_ui_files(api_files: list[Path]) -> list[Path]:
    """UI files in the folders written to that none of ``api_files`` writes."""
    written = {ui_path(f).resolve() for f in api_files}
    folders = {target.parent for target in written}
    return sorted(p for folder in folders for p in folder.glob("*.json") if p.resolve() not in written)


if __name__ == "__main__":
    sys.exit(main())
