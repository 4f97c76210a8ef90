"""The import graph: no cycle between modules or layers, ComfyUI imported through its two doors only
(scripts/check_imports.py, run here on the checkout and on small trees that break each rule)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_imports", REPO / "scripts" / "check_imports.py")
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def test_the_checkout_has_no_import_cycle_and_comfyui_behind_its_two_doors(capsys) -> None:
    assert check_imports.main([str(REPO)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "core          -" in printed  # the math imports nothing else of the trainer


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"trainer/__init__.py": "", "nodes/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_hidden_inside_a_function_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "trainer/lora/__init__.py": "",
        "trainer/lora/a.py": "from .b import x\n",
        "trainer/lora/b.py": "def f():\n    from .a import y\n",
    })
    problems, _ = check_imports.analyse(root)
    assert problems == ["module import cycle: trainer.lora.a <-> trainer.lora.b"]


def test_a_cycle_between_layers_is_found_and_names_the_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "trainer/embedded/__init__.py": "",
        "trainer/embedded/pretrain.py": "from ..models.embedded import Policy\n",
        "trainer/embedded/architecture.py": "",
        "trainer/models/__init__.py": "",
        "trainer/models/embedded.py": "from ..embedded.architecture import build\n",
    })
    problems, _ = check_imports.analyse(root)
    assert len(problems) == 1 and problems[0].startswith("layer cycle: embedded <-> models")
    assert "trainer.embedded.pretrain -> trainer.models.embedded" in problems[0]


@pytest.mark.parametrize("statement", ["import comfy.sd\n", "def f():\n    import folder_paths\n",
                                       "from comfy_api.latest import io\n"])
def test_comfyui_imported_outside_its_two_doors_is_refused(tmp_path: Path, statement: str) -> None:
    root = _tree(tmp_path, {"nodes/comfy_door.py": "import comfy.sd\n", "nodes/sampling.py": statement,
                            "trainer/comfyui_host/__init__.py": "",
                            "trainer/comfyui_host/runner.py": "def boot():\n    import execution\n"})
    problems, _ = check_imports.analyse(root)
    assert len(problems) == 1 and problems[0].startswith("nodes/sampling.py imports ComfyUI")


def test_the_trainer_importing_the_nodes_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"trainer/cli.py": "from ..nodes import training\n", "nodes/training.py": ""})
    problems, _ = check_imports.analyse(root)
    assert problems == ["trainer/cli.py imports nodes/: the trainer never depends on the nodes"]
