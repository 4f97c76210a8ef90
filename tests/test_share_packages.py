"""scripts/share_packages.py: the floor environment shares .venv's torch by hard links, so that CI does
not unpack its 5 GB of CUDA libraries twice (a CI run once filled its disk that way)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("share_packages", REPO / "scripts" / "share_packages.py")
share_packages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(share_packages)


def _names(dists) -> set[str]:
    return {share_packages.canonicalize_name(d.metadata["Name"]) for d in dists}


def test_the_closure_follows_requirements_with_their_extras_and_markers() -> None:
    names = _names(share_packages.requirement_closure(["torch"]))
    assert {"torch", "sympy", "mpmath"} <= names  # mpmath only through sympy
    if sys.platform == "linux" and "cuda-toolkit" in names:
        # cuda-toolkit[cublas,...]: the extras bring the libraries, its bare requirement does not
        assert "nvidia-cublas" in names
    assert not names & {"optree", "opt-einsum"}  # torch's own extras were not asked for


def test_a_missing_distribution_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit, match="no-such-dist-xyz is not installed"):
        share_packages.requirement_closure(["no-such-dist-xyz"])


def test_shared_files_are_links_that_the_target_imports(tmp_path: Path) -> None:
    target = tmp_path / "floor"
    venv.create(target, with_pip=False)
    pins = tmp_path / "pins.txt"
    pins.write_text("pyyaml==6.0.1\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "share_packages.py"), "--into", str(target),
                          "--skip-pinned", str(pins), "tqdm", "pyyaml"],
                         check=True, capture_output=True, text=True).stdout
    assert "1 distributions" in out  # tqdm; pyyaml is pinned, the floor installs its own
    code = "import tqdm, importlib.util as u; print(tqdm.__file__, u.find_spec('yaml') is None)"
    imported, yaml_missing = subprocess.run([str(target / "bin" / "python"), "-c", code], check=True,
                                            capture_output=True, text=True).stdout.split()
    import tqdm
    assert Path(imported).samefile(tqdm.__file__)  # the same inode: linked, not copied
    assert Path(imported).parent != Path(tqdm.__file__).parent
    assert yaml_missing == "True"
    # a console script is copied with its #! line naming the target's Python
    script = target / "bin" / "tqdm"
    assert script.read_text().splitlines()[0] == f"#!{target.resolve()}/bin/python"
    # a second run skips what the target already has
    again = subprocess.run([sys.executable, str(REPO / "scripts" / "share_packages.py"), "--into",
                            str(target), "tqdm"], check=True, capture_output=True, text=True).stdout
    assert "0 distributions" in again
