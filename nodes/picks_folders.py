"""Where picks folders live: ``<ComfyUI output>/treerpo_picks/<name>``, by a plain name only.

Why a name and not a path: a workflow shared on the internet sets the folder, and the picking panel's
routes take it from a URL. Both must stay inside one folder of ComfyUI's output, whatever they are
given, so a name is checked against a short alphabet and then resolved and confined once more.
"""

from __future__ import annotations

import re
from pathlib import Path

from .comfy_door import output_directory

PICKS_ROOT = "treerpo_picks"  # under ComfyUI's output folder
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "letters, digits, '_', '-' and '.', at most 64, starting with a letter or digit"


def picks_root() -> Path:
    """The folder every picks folder lives in."""
    return Path(output_directory()).resolve() / PICKS_ROOT


def check_name(name: str) -> str:
    """``name`` stripped, or a one-line refusal: a plain folder name, nothing that leaves the root."""
    name = name.strip()
    if not name:
        raise ValueError("name the picks folder, e.g. my_taste")
    if not NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{name!r} is not a plain folder name ({NAME_RULE}): picks folders live in "
                         f"ComfyUI's output/{PICKS_ROOT}/")
    return name


def picks_folder(name: str) -> Path:
    """``<output>/treerpo_picks/<name>``, confined to that root (checked twice: by name, then resolved)."""
    root = picks_root()
    path = (root / check_name(name)).resolve()
    if path.parent != root:
        raise ValueError(f"{name!r} leaves ComfyUI's output/{PICKS_ROOT}/ folder")
    return path
