"""Fail on an import cycle in ``trainer/`` or ``nodes/``, between modules or between layers.

Every import counts, including those inside functions (a cycle hidden in a function is still a
cycle). Two graphs are checked:

- **modules**: ``trainer.core.flow`` -> ``trainer.core.tree`` ...;
- **layers**: each of ``trainer/``'s subpackages is a layer (``core``, ``lora``, ``training`` ...),
  the modules directly in ``trainer/`` are the front end ``trainer``, and ``nodes/`` is ``nodes``.
  A layer may use lower layers only, so this graph must have no cycle either.

It also checks that ComfyUI is imported in exactly two places, ``nodes/comfy_door.py`` (the nodes'
one door to ComfyUI) and ``trainer/comfyui_host/runner.py`` (ComfyUI hosted headlessly), and that
``trainer/`` never imports ``nodes/``.

    python scripts/check_imports.py        # prints the layers in order, exits 1 on a problem
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGES = ("trainer", "nodes")
INSTALLED_NAME = "dynamic_treerpo"  # the import name pyproject.toml installs this folder under
COMFY_MODULES = {"comfy", "comfy_api", "comfy_execution", "comfy_extras", "folder_paths", "execution",
                 "server", "latent_preview", "node_helpers", "nodes", "main"}
COMFY_DOORS = {"nodes.comfy_door", "trainer.comfyui_host.runner"}


def module_files(root: Path) -> dict[str, Path]:
    """``dotted name -> file`` of every module of the pack's two packages (packages as ``x.y``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute pack module an ``import from`` names, or None when it is outside the pack."""
    if node.level == 0:
        name = node.module or ""
        if name.startswith(INSTALLED_NAME + "."):
            return name[len(INSTALLED_NAME) + 1:]
        return None
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(base):
        return None  # above the pack's packages (``from .. import`` out of nodes/ into the pack root)
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """``(pack modules it imports, top-level outside modules it imports)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    inside: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(INSTALLED_NAME + "."):
                    inside.add(alias.name[len(INSTALLED_NAME) + 1:])
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            if target is None:
                if node.level == 0 and node.module:
                    outside.add(node.module.split(".")[0])
                continue
            inside.add(target)
            inside.update(f"{target}.{alias.name}" for alias in node.names
                          if f"{target}.{alias.name}" in modules)  # ``from .pkg import submodule``
    return {m for m in inside if m in modules and m != module}, outside


def layer_of(module: str, subpackages: set[str]) -> str:
    """``nodes``; a subpackage of ``trainer/`` (``core``, ``lora`` ...); or ``trainer`` (its own modules)."""
    parts = module.split(".")
    if parts[0] == "nodes":
        return "nodes"
    if len(parts) >= 3 or (len(parts) == 2 and module in subpackages):
        return parts[1]
    return "trainer"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its members sorted), or None (``graphlib`` finds it)."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as err:
        return sorted(set(err.args[1]))
    return None


def layer_order(graph: dict[str, set[str]]) -> list[str]:
    """The layers from the bottom up: each uses only layers before it (the graph is acyclic)."""
    return list(TopologicalSorter(graph).static_order())


def analyse(root: Path) -> tuple[list[str], dict[str, set[str]]]:
    """``(problems, layer graph)`` of the pack at ``root``."""
    files = module_files(root)
    subpackages = {m for m, p in files.items() if p.name == "__init__.py" and m.startswith("trainer.")}

    def layer(module: str) -> str:
        return layer_of(module, subpackages)

    modules = set(files)
    graph: dict[str, set[str]] = {}
    problems: list[str] = []
    for module, path in files.items():
        inside, outside = imports_of(module, path, modules)
        graph[module] = inside
        comfy = sorted(outside & COMFY_MODULES)
        if comfy and module not in COMFY_DOORS:
            problems.append(f"{path.relative_to(root)} imports ComfyUI ({', '.join(comfy)}): only "
                            f"{' and '.join(sorted(COMFY_DOORS))} may")
        if module.startswith("trainer") and any(m.startswith("nodes") for m in inside):
            problems.append(f"{path.relative_to(root)} imports nodes/: the trainer never depends on the "
                            "nodes")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("module import cycle: " + " <-> ".join(cycle))
    layers: dict[str, set[str]] = {}
    for module, deps in graph.items():
        mine = layer(module)
        layers.setdefault(mine, set()).update(layer(d) for d in deps if layer(d) != mine)
    cycle = find_cycle(layers)
    if cycle:
        witnesses = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                           if layer(m) in cycle and layer(d) in cycle and layer(m) != layer(d))
        problems.append("layer cycle: " + " <-> ".join(cycle) + " (" + "; ".join(witnesses[:6]) + ")")
    return problems, layers


def main(argv: Iterable[str] = ()) -> int:
    args = list(argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    problems, layers = analyse(root)
    for problem in problems:
        print(f"check_imports: {problem}", file=sys.stderr)
    if not problems:
        print("no import cycle; the layers, bottom up, and what each uses:")
        for name in layer_order(layers):
            print(f"  {name:13s} {', '.join(sorted(layers[name])) or '-'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
