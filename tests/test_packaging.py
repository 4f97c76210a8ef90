"""Installing the project adds one import name, ``dynamic_treerpo``: no top-level ``trainer`` (PyPI's
``trainer`` and ``coqui-tts-trainer`` own that name) and no top-level ``nodes`` (ComfyUI's)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
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


# --- Comfy Registry metadata (https://docs.comfy.org/registry/specifications) --------------------

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# what the registry accepts as a node id: letters, digits and single - _ . between them, < 100 chars
NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*")
VERSION_SPEC = re.compile(r"(?:==|>=|<=|!=|~=|>|<)?\d+\.\d+\.\d+")


def _requirements(lines: list[str]) -> set[str]:
    return {line.split("#")[0].replace(" ", "") for line in lines} - {""}


def test_pyproject_has_the_fields_the_comfy_registry_requires() -> None:
    project, comfy = PYPROJECT["project"], PYPROJECT["tool"]["comfy"]
    assert NODE_ID.fullmatch(project["name"]) and len(project["name"]) < 100
    assert "comfyui" not in project["name"].lower()  # the registry's rule: the id does not repeat ComfyUI
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])  # semver X.Y.Z
    assert project["description"].strip()
    # comfy-cli sends an SPDX string as the license text; a table needs `file` (that exists) or `text`
    license = project["license"]
    if isinstance(license, str):
        assert license.strip()
    else:
        assert license.get("text") or (REPO / license.get("file", "")).is_file()
    assert project["urls"]["Repository"].startswith("https://")
    assert all(url.startswith(project["urls"]["Repository"]) for url in project["urls"].values())
    assert all(c.split(" :: ")[1] in {"Microsoft", "POSIX", "MacOS", "OS Independent"}
               for c in project.get("classifiers", []) if c.startswith("Operating System :: "))
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", comfy["PublisherId"])
    assert comfy["DisplayName"].strip()
    assert comfy.get("Icon", "") == "" or comfy["Icon"].startswith("https://")
    requires_comfyui = comfy.get("requires-comfyui", "0.0.0")
    assert all(VERSION_SPEC.fullmatch(part.strip()) for part in requires_comfyui.split(","))
    # ComfyUI-Manager installs requirements.txt, the registry lists [project] dependencies: the same list
    assert _requirements(project["dependencies"]) == _requirements(
        (REPO / "requirements.txt").read_text().splitlines())


def test_comfy_node_validate_accepts_the_pack() -> None:
    """comfy-cli's own pre-publishing checks (offline): pyproject.toml, then ruff's exec/eval rules."""
    if importlib.util.find_spec("comfy_cli") is None:
        message = "comfy-cli is not installed (the `test` extra installs it: pip install -e '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "DO_NOT_TRACK": "1"}  # no telemetry, no consent prompt
    done = subprocess.run([sys.executable, "-m", "comfy_cli", "node", "validate"], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # it only warns (exit 0) about malformed optional fields and about exec/eval: none may appear
    assert "All validation checks passed" in output and "Warning" not in output, output


def test_comfyuis_own_reader_of_pyproject_gets_the_registry_fields() -> None:
    """ComfyUI reads the same file when it loads the pack (comfy_config.config_parser)."""
    from comfyui_server import require_comfyui

    root = require_comfyui()
    code = ("import json, sys; from comfy_config.config_parser import extract_node_configuration as read; "
            "c = read(sys.argv[1]); print(json.dumps([c.project.name, c.project.version, "
            "c.tool_comfy.publisher_id, c.tool_comfy.display_name, c.project.supported_os]))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO)], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    project, comfy = PYPROJECT["project"], PYPROJECT["tool"]["comfy"]
    assert json.loads(done.stdout.splitlines()[-1]) == [
        project["name"], project["version"], comfy["PublisherId"], comfy["DisplayName"], ["OS Independent"]]


def _readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_readme_keeps_two_set_up_commands_and_says_how_comfyui_users_install_the_pack() -> None:
    assert re.findall(r"```bash\n(.*?)\n```", _readme_section("Set up"), re.S) == ["make demo", "make test"]
    install = _readme_section("Installing in ComfyUI")
    project, comfy = PYPROJECT["project"], PYPROJECT["tool"]["comfy"]
    # not published yet: the README installs from this repository, and promises no registry or address
    for needed in (comfy["DisplayName"], "not published yet", "custom_nodes/dynamic_treerpo",
                   "requirements.txt", "Restart ComfyUI", "docs/models.md"):
        assert needed in install, needed
    assert f"comfy node install {project['name']}" not in install
    assert f"git clone {project['urls']['Repository']}" not in install


def test_the_changelog_starts_at_the_version_pyproject_gives() -> None:
    """A release a person can follow: the newest CHANGELOG.md entry is ``[project] version``, and every
    entry's version is a new one, newest first."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", text, re.M)
    assert versions, "CHANGELOG.md has no '## X.Y.Z (YYYY-MM-DD)' entry"
    version = PYPROJECT["project"]["version"]
    assert versions[0] == version, f"pyproject.toml says {version}, CHANGELOG.md's newest entry {versions[0]}"
    as_tuples = [tuple(int(n) for n in v.split(".")) for v in versions]
    assert as_tuples == sorted(set(as_tuples), reverse=True), f"CHANGELOG.md out of order: {versions}"
