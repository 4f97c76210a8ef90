"""Write ``locales/en/nodeDefs.json``: the plain-words label of every input of the pack's nodes.

Each input declares its label as ``display_name`` in the node's V3 schema (``nodes/*.py``), and ComfyUI
0.3.75 serves it in ``/object_info``; but frontend 1.32.9 labels widgets and sockets from its translations
only (``nodeDefs.<node>.inputs.<input>.name``, else the input's id). A pack adds translations with a
``locales/<language>/nodeDefs.json`` file, which ComfyUI serves at ``/i18n`` and the frontend merges before
it builds any node. This script writes that file from the schemas, so the labels have one source;
saved workflows and API graphs keep using the input ids. English only: other languages fall back to it.

    python scripts/node_labels.py            # writes locales/en/nodeDefs.json
    python scripts/node_labels.py --check    # exit 1 if the file is not what the nodes declare
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCALE_FILE = REPO / "locales" / "en" / "nodeDefs.json"
PREFIX = "TreeRPO"  # the pack's node ids


def labels(definitions: dict[str, dict]) -> dict[str, dict]:
    """``{node: {"inputs": {input: {"name": label}}}}`` for every pack node input with a display name."""
    out: dict[str, dict] = {}
    for node, definition in sorted(definitions.items()):
        if not node.startswith(PREFIX):
            continue
        inputs = {}
        for group in ("required", "optional"):
            for name, spec in definition.get("input", {}).get(group, {}).items():
                options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                if options.get("display_name"):
                    inputs[name] = {"name": options["display_name"]}
        if inputs:
            out[node] = {"inputs": inputs}
    return out


def render(definitions: dict[str, dict]) -> str:
    return json.dumps(labels(definitions), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", type=Path, default=None, help="ComfyUI folder to load in-process")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file differs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "scripts"))
    from api_to_ui import local_definitions

    text = render(local_definitions(args.comfyui))
    if args.check:
        if not LOCALE_FILE.is_file() or LOCALE_FILE.read_text(encoding="utf-8") != text:
            print(f"stale: {LOCALE_FILE.relative_to(REPO)} (run scripts/node_labels.py)", file=sys.stderr)
            return 1
        return 0
    LOCALE_FILE.parent.mkdir(parents=True, exist_ok=True)
    LOCALE_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {LOCALE_FILE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
