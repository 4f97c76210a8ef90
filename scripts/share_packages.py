"""Hard-link installed distributions from this Python's environment into another virtual environment,
so that the floor test environment shares .venv's torch instead of unpacking a second copy.

    .venv/bin/python scripts/share_packages.py --into .venv-floor --skip-pinned pins.txt torch torchvision

torch's Linux wheels bring about 5 GB of CUDA libraries (nvidia-*, triton); two copies of them filled the
disk of a CI machine. The named distributions and everything they require are linked, except what the
target already has and what ``--skip-pinned`` pins (the floor's own versions win). The files listed in each
distribution's RECORD are linked (copied where the two folders are on different file systems), so pip in
the target sees ordinary installs: it can check, upgrade or uninstall them there without touching the
source, and a later ``pip install torch==...`` in the target fixes any version that differs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement_closure(names: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` need, themselves included (markers and extras evaluated)."""
    found: dict[str, metadata.Distribution] = {}
    visited: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(canonicalize_name(name), frozenset()) for name in names]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in visited:
            continue
        visited.add((name, extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"share_packages: {name} is not installed in {sys.prefix}") from None
        found[canonicalize_name(dist.metadata["Name"])] = dist
        environments = [{"extra": extra} for extra in sorted(extras)] or [{"extra": ""}]
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate(env) for env in environments):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return list(found.values())


def target_site_packages(venv: Path) -> Path:
    """The target environment's site-packages, as its own interpreter reports it."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"share_packages: {venv} is not a virtual environment (no bin/python)")
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def installed_names(site: Path) -> set[str]:
    """Canonical names of the distributions already installed in ``site``."""
    return {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])}


def link_file(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (a copy across file systems)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def share(dist: metadata.Distribution, source_site: Path, target_site: Path, target_python: Path) -> int:
    """Link one distribution's files into ``target_site``; a script in bin/ is copied with its ``#!`` line
    pointing at the target's Python. Returns the bytes shared."""
    shared = 0
    for record in dist.files or []:
        src = Path(os.path.normpath(dist.locate_file(record)))
        if not src.is_file():
            continue
        dst = Path(os.path.normpath(target_site / record))
        if src.is_relative_to(source_site):
            link_file(src, dst)
            shared += src.stat().st_size
            continue
        # a console script (bin/torchrun): its first line names the source's Python
        text = src.read_bytes()
        if text.startswith(b"#!"):
            text = b"#!" + str(target_python).encode() + text[text.index(b"\n"):]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(text)
        dst.chmod(src.stat().st_mode)
    return shared


def pinned_names(path: Path | None) -> set[str]:
    """Names that a pins file (``name==version`` lines) fixes."""
    if path is None:
        return set()
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return {canonicalize_name(Requirement(line).name) for line in lines if line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="distributions to share (with what they require)")
    parser.add_argument("--into", type=Path, required=True, help="the target virtual environment")
    parser.add_argument("--skip-pinned", type=Path, help="a pins file: the distributions it names stay out")
    args = parser.parse_args()

    target_site = target_site_packages(args.into)
    target_python = args.into.resolve() / "bin" / "python"
    source_site = Path(os.path.normpath(metadata.distribution(args.names[0]).locate_file("")))
    skip = installed_names(target_site) | pinned_names(args.skip_pinned)
    names, shared = [], 0
    for dist in requirement_closure(args.names):
        key = canonicalize_name(dist.metadata["Name"])
        if key in skip:
            continue
        shared += share(dist, source_site, target_site, target_python)
        names.append(key)
    print(f"share_packages: {len(names)} distributions ({shared / 2**30:.1f} GiB) shared with {args.into}")


if __name__ == "__main__":
    main()
