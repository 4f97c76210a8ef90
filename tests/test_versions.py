"""Supported versions: one range per requirement, the same in requirements.txt, pyproject.toml and the
code that checks them, and a one-line refusal of a version outside its range wherever the pack loads."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from dynamic_treerpo.trainer.compat import versions
from dynamic_treerpo.trainer.compat.versions import (
    CHECKED_AT_LOAD,
    SUPPORTED,
    UnsupportedVersion,
    check_versions,
    require,
)

REPO = Path(__file__).resolve().parents[1]


def _ranges(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        text = line.split("#")[0].strip()
        if text:
            req = Requirement(text)
            found[req.name.lower().replace("-", "_")] = ",".join(sorted(str(s) for s in req.specifier))
    return found


def test_requirements_pyproject_and_the_checked_ranges_agree() -> None:
    in_code = {name.lower(): ",".join(sorted(spec.specifier.split(","))) for name, spec in SUPPORTED.items()}
    requirements = _ranges((REPO / "requirements.txt").read_text().splitlines())
    pyproject = _ranges(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert requirements == in_code == pyproject


def test_every_requirement_says_what_it_is_for() -> None:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.search(r"\s#\s*\w", line), f"requirements.txt: {line!r} does not say what it is for"


def test_no_heavy_logging_packages_in_what_the_nodes_need() -> None:
    names = set(_ranges((REPO / "requirements.txt").read_text().splitlines()))
    assert not names & {"tensorboard", "grpcio", "protobuf", "torch", "torchvision"}


def test_the_installed_environment_is_supported() -> None:
    check_versions(list(SUPPORTED))  # the environment running the tests: default or floor


@pytest.mark.parametrize(("package", "found", "refused"), [
    ("transformers", "4.44.2", True), ("transformers", "4.45.0", False), ("transformers", "5.24.0", False),
    ("transformers", "6.0.0", True), ("transformers", "6.0.0.dev0", True), ("diffusers", "0.30.3", True),
    ("diffusers", "0.31.0", False), ("peft", "0.12.0", True), ("peft", "1.0.0", True),
    ("huggingface_hub", "0.23.1", True), ("huggingface_hub", "2.4.0", False), ("transformers", None, True),
])
def test_a_version_outside_its_range_is_refused_in_one_line(monkeypatch, package: str, found: str | None,
                                                            refused: bool) -> None:
    monkeypatch.setattr(versions, "installed_version", lambda name: found if name == package else
                        SUPPORTED[name].floor)
    if not refused:
        check_versions()
        return
    with pytest.raises(UnsupportedVersion) as err:
        check_versions()
    message = str(err.value)
    assert "\n" not in message
    assert package in message and SUPPORTED[package].specifier in message
    assert (found or "is not installed") in message


def test_a_feature_above_the_floor_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setattr(versions, "installed_version", lambda name: SUPPORTED[name].floor)
    with pytest.raises(UnsupportedVersion, match=r"model.quantize: fp8 supports diffusers>=9\.0, but "
                                                 r"diffusers 0\.31 is installed"):
        require("diffusers", "9.0", "model.quantize: fp8")


def test_the_comfyui_entry_point_refuses_an_unsupported_version(monkeypatch) -> None:
    import dynamic_treerpo

    monkeypatch.setattr(versions, "installed_version", lambda name: "4.30.0" if name == "transformers"
                        else SUPPORTED[name].floor)
    with pytest.raises(UnsupportedVersion, match=r"transformers 4\.30\.0 is installed"):
        asyncio.run(dynamic_treerpo.comfy_entrypoint())


def test_the_command_line_refuses_an_unsupported_version_in_one_line(tmp_path: Path) -> None:
    code = ("import sys; from dynamic_treerpo.trainer.compat import versions; "
            "versions.installed_version = lambda name: '0.1' if name == 'peft' else "
            "versions.SUPPORTED[name].floor; from dynamic_treerpo.trainer.cli import main; "
            "sys.exit(main(['nfe']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("treerpo nfe: error: Dynamic-TreeRPO supports peft>=0.13,<1, but peft "
                                   "0.1 is installed: pip install 'peft>=0.13,<1'")


def test_only_packages_whose_outputs_differ_by_version_are_checked_at_load() -> None:
    assert set(CHECKED_AT_LOAD) <= set(SUPPORTED)
    assert {"transformers", "diffusers", "peft"} <= set(CHECKED_AT_LOAD)


# The environment many ComfyUI packs pin (issue: "install into the ComfyUI people already have"), and
# ComfyUI 0.3.75's own floors for the packages both list: installing the pack must upgrade none of them.
SHARED_ENVIRONMENT = {"transformers": "4.57.6", "diffusers": "0.35.2", "peft": "0.17.1",
                      "tokenizers": "0.22.2", "huggingface_hub": "0.36.0", "numpy": "1.25.0",
                      "safetensors": "0.4.2"}


@pytest.mark.parametrize(("package", "version"), sorted(SHARED_ENVIRONMENT.items()))
def test_the_ranges_admit_what_shared_comfyui_environments_have(package: str, version: str) -> None:
    assert SUPPORTED[package].admits(version)


def test_fp8_storage_below_its_diffusers_is_refused_before_loading(monkeypatch, tmp_path: Path) -> None:
    from dynamic_treerpo.trainer.models.flux import FluxPolicy

    monkeypatch.setattr(versions, "installed_version", lambda name: SUPPORTED[name].floor)
    with pytest.raises(UnsupportedVersion, match=r"model\.quantize: fp8 supports diffusers>=0\.33, but "
                                                 r"diffusers 0\.31 is installed"):
        FluxPolicy.from_pretrained(tmp_path / "no-model-here", height=64, width=64, quantize="fp8")
