"""Record the pack's node input layouts for the release in pyproject.toml, in web/node_layouts.json.

Run it after changing a node's inputs, with the version in pyproject.toml raised (CHANGELOG.md says what
changed for saved workflows). It reads the node definitions of ComfyUI loaded in this process with this
pack (``--comfyui PATH``, else ``$TREERPO_COMFYUI``, else ``.comfyui``) and appends them as a new release
when they differ from the newest one recorded. A recorded release's layouts are never rewritten (graphs
were saved with them): raise the version first, or pass ``--amend`` to rewrite the newest one while that
version is still being made (not yet published). An input added to a node also needs its entry in ``added``
(the value that keeps graphs saved before it doing what they did): tests/test_saved_workflows.py names
any that is missing.

    .venv/bin/python scripts/record_node_layouts.py            # write
    .venv/bin/python scripts/record_node_layouts.py --check    # exit 1 if the record is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tomllib
from api_to_ui import local_definitions

from dynamic_treerpo.trainer.comfyui_host.layouts import LAYOUTS_FILE, Record, layouts_of, read_record

REPO = Path(__file__).resolve().parents[1]


def updated(record: Record, version: str, current: dict, amend: bool = False) -> Record:
    """``record`` with ``current`` as release ``version`` (see the module docstring); a ValueError, in one
    line, when that would rewrite a recorded release."""
    releases = list(record.releases)
    newest_version, newest = releases[-1]
    if newest == current:
        return record
    if newest_version == version and amend:
        releases[-1] = (version, current)
    elif version in {v for v, _ in releases}:
        raise ValueError(f"the nodes' inputs changed since {newest_version}, and pyproject.toml still says "
                         f"{version}: raise the version (a recorded release's layouts are what graphs saved "
                         "with it hold), or pass --amend while it is unpublished")
    else:
        releases.append((version, current))
    return Record(tuple(releases), record.added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfyui", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="only say whether the record is stale")
    parser.add_argument("--amend", action="store_true",
                        help="rewrite the newest release when it is pyproject's version, not yet published")
    args = parser.parse_args(argv)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    record = read_record()
    try:
        new = updated(record, version, layouts_of(local_definitions(args.comfyui)), args.amend)
    except ValueError as err:
        print(f"{LAYOUTS_FILE.name}: {err}", file=sys.stderr)
        return 1
    if new == record:
        print(f"{LAYOUTS_FILE.name}: up to date ({record.current[0]})")
        return 0
    if args.check:
        print(f"{LAYOUTS_FILE.name} is stale: the nodes' inputs changed since {record.current[0]}; run "
              "scripts/record_node_layouts.py", file=sys.stderr)
        return 1
    LAYOUTS_FILE.write_text(json.dumps(new.to_json(), indent=1) + "\n", encoding="utf-8")
    print(f"{LAYOUTS_FILE.name}: recorded {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
