"""The code fingerprint that ties a benchmark's parts to one code version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench import provenance


def _package(tmp_path: Path) -> Path:
    package = tmp_path / "trainer"
    (package / "bench").mkdir(parents=True)
    (package / "core").mkdir()
    (package / "core" / "flow.py").write_text("SIGMA = 1.0\n")
    (package / "bench" / "taste_page.py").write_text("TITLE = 'a'\n")
    return package


def test_the_fingerprint_changes_with_the_code_that_draws_but_not_with_the_pages(tmp_path: Path) -> None:
    package = _package(tmp_path)
    first = provenance.code_fingerprint(package)
    (package / "bench" / "taste_page.py").write_text("TITLE = 'b'\n")  # presentation only
    (package / "core" / "__pycache__").mkdir()
    (package / "core" / "__pycache__" / "flow.cpython-312.pyc").write_bytes(b"\0")
    assert provenance.code_fingerprint(package) == first
    (package / "core" / "flow.py").write_text("SIGMA = 0.9\n")
    assert provenance.code_fingerprint(package) != first
    shutil.copy(package / "core" / "flow.py", package / "core" / "flow2.py")  # a new module counts too
    assert len({first, provenance.code_fingerprint(package)}) == 2


def test_a_resume_is_refused_across_code_versions_and_unrecorded_parts() -> None:
    here = {"code": "aaaa", "commit": "c" * 40, "dirty": False}
    provenance.check_resume([here, dict(here)], here, Path("x.json"))
    with pytest.raises(ValueError, match="made by other code"):
        provenance.check_resume([here, {**here, "code": "bbbb"}], here, Path("x.json"))
    with pytest.raises(ValueError, match="recorded no code version"):
        provenance.check_resume([None], here, Path("x.json"))
    assert provenance.versions([here, dict(here), None]) == [here]


def test_this_checkout_records_a_commit_and_whether_it_is_dirty() -> None:
    made = provenance.provenance()
    assert len(made["code"]) == 16 and made["code"] == provenance.code_fingerprint()
    if made["commit"] is not None:
        assert len(made["commit"]) == 40 and isinstance(made["dirty"], bool)
