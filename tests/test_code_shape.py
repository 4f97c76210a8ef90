"""The shape a newcomer can find their way in: what one module imports from another is public (no
``_private`` name crosses a module), no function in ``trainer/`` or ``nodes/`` runs past a screen or two,
and no benchmark module grows into a pile of jobs. Each check lists every offender, so a failure says
where to look."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = "dynamic_treerpo"
OWN_TOP = {PACK, "tests", "scripts"}
MAX_FUNCTION_LINES = 80
MAX_BENCH_FILE_LINES = 500


def python_files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        path = ROOT / folder
        yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_module(node: ast.ImportFrom) -> bool:
    """A relative import, or one of the pack's, the tests' or the scripts' modules."""
    return node.level > 0 or (node.module or "").split(".")[0] in OWN_TOP


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``from own.module import _name``, an own module with a private name in its path, and
    ``module._name`` on an own module this file imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(root)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and own_module(node):
            what = "." * node.level + (node.module or "")
            if any(is_private(part) for part in (node.module or "").split(".")):
                found.append(f"{where}:{node.lineno} from {what}")
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"{where}:{node.lineno} from {what} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OWN_TOP:
                    if any(is_private(part) for part in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno} import {alias.name}")
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"{where}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_module_imports_another_modules_private_name() -> None:
    found = [hit for path in python_files("trainer", "nodes", "scripts", "tests", "__init__.py")
             for hit in private_imports(path)]
    assert not found, "make these names public (no leading underscore):\n" + "\n".join(found)


def test_the_private_name_check_sees_each_form(tmp_path: Path) -> None:
    source = ("from .core import _hidden\nfrom ._door import x\nfrom dynamic_treerpo.trainer import cli\n"
              "import argparse\ncli._helper()\nargparse._SubParsersAction\n")
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    hits = private_imports(tmp_path / "m.py", tmp_path)
    assert [h.split(" ", 1)[1] for h in hits] == ["from .core import _hidden", "from ._door",
                                                    "cli._helper"]


def test_no_function_of_the_pack_is_over_80_lines() -> None:
    found = [hit for path in python_files("trainer", "nodes") for hit in long_functions(path)]
    assert not found, "split these by job:\n" + "\n".join(found)


def test_no_benchmark_module_is_over_500_lines() -> None:
    found = [f"{p.relative_to(ROOT)} ({n} lines)" for p in python_files("trainer/bench")
             if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_BENCH_FILE_LINES]
    assert not found, "split these by job:\n" + "\n".join(found)
