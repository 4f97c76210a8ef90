"""The code fingerprint that ties a benchmark's parts to one code version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dynamic_treerpo.trainer.bench.common import provenance


def _package(tmp_path: Path) -> Path:
    package = tmp_path / "trainer"
    (package / "bench" / "taste").mkdir(parents=True)
    (package / "core").mkdir()
    (package / "core" / "flow.py").write_text("SIGMA = 1.0\n")
    (package / "bench" / "taste" / "page.py").write_text("TITLE = 'a'\n")
    return package


def test_the_fingerprint_changes_with_the_code_that_draws_but_not_with_the_pages(tmp_path: Path) -> None:
    package = _package(tmp_path)
    first = provenance.code_fingerprint(package)
    (package / "bench" / "taste" / "page.py").write_text("TITLE = 'b'\n")  # presentation only
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


def test_the_record_names_the_machine_and_the_pages_say_when_parts_ran_on_several() -> None:
    from dynamic_treerpo.trainer.bench.taste.page import code_line

    made = provenance.provenance()
    assert set(made["machine"]) == {"cpu", "cpu_capability", "torch", "gpu", "rounding"}
    assert made["machine"]["cpu"] and made["machine"]["torch"]
    here = {"code": "aaaa", "commit": "c" * 40, "dirty": False}
    epyc = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "torch": "2.9.0", "gpu": None}
    xeon = {**epyc, "cpu": "Intel Xeon", "cpu_capability": "AVX512"}
    assert provenance.machines_line([here]) == ""  # made before the machine was recorded
    one = provenance.machines_line([{**here, "machine": epyc}, {**here, "machine": dict(epyc)}])
    assert one == "On one kind of machine: AMD EPYC (AVX2), torch 2.9.0."
    two = provenance.machines_line([{**here, "machine": epyc}, {**here, "machine": xeon}])
    assert two.startswith("On **2 kinds of machine**") and "Intel Xeon (AVX512)" in two
    assert len(provenance.versions([{**here, "machine": epyc}, {**here, "machine": xeon}])) == 2
    line = code_line([{"code": [{**here, "machine": epyc}]}, {"code": [{**here, "machine": xeon}]}])
    assert line.startswith("Made at one code version: `cccccccccccc`") and "2 kinds of machine" in line


def test_a_protocol_part_resumed_on_another_cpu_with_the_same_numerics_records_that_machine_too() -> None:
    from types import SimpleNamespace

    from dynamic_treerpo.trainer.bench.protocol.resume import stamp_code

    epyc = {"code": "aaaa", "commit": "c" * 40, "dirty": False,
            "machine": {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "torch": "2.9.0", "gpu": None}}
    xeon = {**epyc, "machine": {**epyc["machine"], "cpu": "Intel Xeon"}}
    result = SimpleNamespace(code=[{"part": "main", **epyc}])
    stamp_code(result, "main", dict(epyc))
    assert len(result.code) == 1  # the same machine again: nothing new
    stamp_code(result, "main", xeon)
    assert [c["machine"]["cpu"] for c in result.code] == ["AMD EPYC", "Intel Xeon"]


@pytest.mark.parametrize(("change", "words"), [
    ({"cpu_capability": "AVX512"}, "ATEN_CPU_CAPABILITY=avx2"),
    ({"torch": "2.14.1"}, "torch 2.9.0 and this is torch 2.14.1"),
    ({"gpu": "NVIDIA H100"}, "GPU none and this run on NVIDIA H100"),
    ({"rounding": "bbbbbbbbbbbb", "cpu": "Intel Xeon"}, "AMD EPYC against Intel Xeon, rounding aaaaaaaaaaaa"),
])
def test_a_resume_with_other_numerics_is_refused_in_one_line_that_says_how(change: dict, words: str,
                                                                            tmp_path: Path) -> None:
    made = {"code": "aaaa", "commit": "c" * 40, "dirty": False,
            "machine": {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "torch": "2.9.0", "gpu": None,
                        "rounding": "aaaaaaaaaaaa"}}
    here = {**made, "machine": {**made["machine"], **change}}
    with pytest.raises(ValueError, match="would mix two roundings") as refused:
        provenance.check_resume([made], here, tmp_path / "taste.json")
    assert words in str(refused.value) and "\n" not in str(refused.value)
    provenance.check_resume([made], {**made, "machine": {**made["machine"], "cpu": "Intel Xeon"}},
                            tmp_path / "taste.json")  # another CPU, the same kernels: allowed
    provenance.check_resume([{k: v for k, v in made.items() if k != "machine"}], here,
                            tmp_path / "taste.json")  # parts made before 0.4.1: nothing to compare
    unprobed = {**made, "machine": {k: v for k, v in made["machine"].items() if k != "rounding"}}
    provenance.check_resume([unprobed], {**made, "machine": {**made["machine"], "rounding": "cccccccccccc"}},
                            tmp_path / "taste.json")  # parts made before 0.6.0 recorded no probe


def test_the_rounding_probe_repeats_and_tells_other_kernels_apart() -> None:
    """The probe is the same on every call and at any thread count here, and another level of PyTorch's
    kernels (the scalar ones, which every CPU has) rounds it otherwise: a resume between them is refused."""
    import os
    import subprocess
    import sys

    import torch

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU runs PyTorch's scalar kernels already: no other level to compare with")
    first = provenance.rounding_probe()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert provenance.rounding_probe() == first and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    code = "from dynamic_treerpo.trainer.bench.common import provenance; print(provenance.rounding_probe())"
    scalar = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout.strip()
    assert len(scalar) == 12 and scalar != first


def test_the_release_is_the_checkouts_own_not_the_installed_one(tmp_path: Path) -> None:
    """A worktree of an older commit run through PYTHONPATH records that commit's release."""
    package = _package(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "dynamic-treerpo"\nversion = "0.1.7"\n')
    assert provenance.release(package) == "0.1.7"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "another"\nversion = "9.9"\n')
    assert provenance.release(package) != "9.9"  # not ours: the installed distribution's
    here = (provenance.PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{provenance.release()}"' in here
