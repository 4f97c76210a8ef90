"""Installing the project adds one import name, ``dynamic_treerpo``: no top-level ``trainer`` (PyPI's
``trainer`` and ``coqui-tts-trainer`` own that name) and no top-level ``nodes`` (ComfyUI's)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_of_the_pack_under_one_import_name() -> None:
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == {"dynamic_treerpo": "."}
    on_disk = {"dynamic_treerpo"} | {
        "dynamic_treerpo." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in ("trainer", "nodes") for init in (REPO / folder).rglob("__init__.py")}
    assert set(setup["packages"]) == on_disk


def test_the_installed_distribution_has_one_top_level_name_and_its_command() -> None:
    dist = importlib.metadata.distribution("dynamic-treerpo")
    assert dist.read_text("top_level.txt").split() == ["dynamic_treerpo"]
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == {"treerpo": "dynamic_treerpo.trainer.cli:main"}


def test_the_installed_package_is_this_checkout() -> None:
    import dynamic_treerpo.trainer

    assert Path(dynamic_treerpo.trainer.__file__).resolve() == REPO / "trainer" / "__init__.py"
