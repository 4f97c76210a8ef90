"""Print each requirement pinned at its floor (``name==floor``), for the floor test environment
(``make test-floor``): the lowest versions the pack promises to support.

    python scripts/floor_pins.py [--extras tensorboard ...] > pins.txt

Reads requirements.txt (what the nodes need) and, with ``--extras``, those extras of pyproject.toml
(their floors are promises too).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def floor_pins(lines: Iterable[str]) -> list[str]:
    """``name==floor`` for every requirement line; a requirement without a ``>=`` floor is an error."""
    pins = []
    for line in lines:
        text = line.split("#")[0].strip()
        if not text:
            continue
        req = Requirement(text)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        if len(floors) != 1:
            raise SystemExit(f"requirements: {text!r} has no single >= floor to test")
        pins.append(f"{req.name}=={floors[0]}")
    return pins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", nargs="*", default=[], help="extras of pyproject.toml to pin too")
    args = parser.parse_args()
    lines = (REPO / "requirements.txt").read_text().splitlines()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in args.extras:
        lines += extras[name]
    print("\n".join(floor_pins(lines)))


if __name__ == "__main__":
    main()
