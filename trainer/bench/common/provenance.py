"""Which code made a benchmark's figures, so that a published run comes from one code version.

A long benchmark runs in parts (``--resume``). Each part records the fingerprint of the code that trains,
samples and scores (every file of ``trainer/`` but the modules that only print or plot), with the git
commit and whether the checkout had uncommitted changes there. A resume whose code differs from the stored
parts' is refused: the figures would mix two versions of the draws. The fingerprint is of the files'
contents, so it needs no git (an installed package) and a commit that changes only docs, tests or the
pages keeps it.
"""

from __future__ import annotations

import hashlib
import platform
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2]

PRESENTATION = frozenset({
    "bench/protocol/page.py", "bench/protocol/page_setup.py", "bench/protocol/page_tables.py",
    "bench/protocol/page_claims.py", "bench/protocol/page_cells.py", "bench/protocol/claims_block.py",
    "bench/protocol/report.py", "bench/protocol/results.py", "bench/protocol/claims.py",
    "bench/protocol/disturbed.py",
    "bench/taste/page.py", "bench/taste/summary.py", "bench/taste/ablation.py", "bench/taste/readme.py",
    "bench/common/stats.py", "bench/common/provenance.py", "guard/figures.py",
})
"""Modules (relative to ``trainer/``) that only summarise, test or draw stored figures: changing them
changes no draw, and a stored run is re-summarised with the current version anyway."""


def code_files(package: Path = PACKAGE) -> list[Path]:
    """The files whose contents decide a benchmark's draws, in a fixed order."""
    files = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package).as_posix()
        cached = "__pycache__" in rel or rel.endswith(".pyc")
        if path.is_file() and not cached and rel not in PRESENTATION:
            files.append(path)
    return files


def code_fingerprint(package: Path = PACKAGE) -> str:
    """A short hash of the names and contents of :func:`code_files`."""
    digest = hashlib.sha256()
    for path in code_files(package):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _probe_inputs(shape: tuple[int, ...], salt: int) -> Any:
    """Fixed values in [-0.5, 0.5) made with integer arithmetic, so that no kernel's rounding makes them."""
    import torch

    count = 1
    for size in shape:
        count *= size
    index = torch.arange(count, dtype=torch.int64) + salt * 7919
    return ((index * 2654435761) % 1009).to(torch.float32).div(1009.0).sub(0.5).reshape(shape)


def rounding_probe() -> str:
    """A short hash of what this machine's kernels make of fixed inputs, at one thread: a matrix product
    (the maths library's), a convolution, attention, a softmax, a normalisation and a random draw. Why:
    two machines at the same ``cpu_capability`` can still round otherwise (the maths library takes
    another path on another CPU; the CHANGELOG gives the measurement)."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, w = _probe_inputs((37, 211), 1), _probe_inputs((211, 97), 2)
        q, k, v = (_probe_inputs((1, 2, 29, 16), 3 + i) for i in range(3))
        image, kernel = _probe_inputs((1, 8, 19, 19), 6), _probe_inputs((16, 8, 3, 3), 7)
        outputs = [x @ w, F.conv2d(image, kernel, padding=1),
                   F.scaled_dot_product_attention(q, k, v), torch.softmax(3.0 * x, -1),
                   F.layer_norm(x, (211,)), F.gelu(x),
                   torch.randn(257, generator=torch.Generator().manual_seed(0))]
    finally:
        torch.set_num_threads(threads)
    digest = hashlib.sha256()
    for out in outputs:
        digest.update(out.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def machine() -> dict[str, Any]:
    """What ran the figures, beside the code. Why: PyTorch picks its CPU kernels by the vector extensions
    it uses (``cpu_capability``), the maths library picks its own path by the CPU, and training compounds
    the rounding. ``rounding`` (:func:`rounding_probe`) tells the two apart where the names cannot: an
    Intel Xeon and an AMD EPYC at AVX512 once gave the same figure to the last digit (CHANGELOG 0.4.2) and
    another pair of them, at one commit and seed, did not (:func:`rounding_probe`)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": _cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "gpu": gpu, "rounding": rounding_probe()}


def release(package: Path = PACKAGE) -> str | None:
    """The release of the code that runs: the ``pyproject.toml`` beside ``package`` in a checkout (a
    worktree of an older commit, run through ``PYTHONPATH``, is that commit's release, not the installed
    one's), else the installed distribution's (None when neither says)."""
    from ...compat.versions import installed_version

    pyproject = package.parent / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text(encoding="utf-8")
        if re.search(r'^name\s*=\s*"dynamic-treerpo"', text, re.M):
            found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
            if found:
                return found.group(1)
    return installed_version("dynamic-treerpo")


def provenance(package: Path = PACKAGE) -> dict[str, Any]:
    """The code fingerprint, the commit (None outside a git checkout) and whether ``trainer/`` had
    uncommitted changes (None when unknown), the release (:func:`release`) and the machine
    (:func:`machine`)."""
    commit = _git(["rev-parse", "HEAD"], package)
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", "."], package) if commit else None
    dirty = None if status is None else bool(status)
    return {"code": code_fingerprint(package), "commit": commit, "dirty": dirty,
            "version": release(package), "machine": machine()}


NUMERICS = ("cpu_capability", "torch", "gpu", "rounding")
"""What of :func:`machine` decides the rounding, hence the figures (the CPU's name alone does not)."""


def numerics_mismatch(made: Mapping[str, Any] | None, here: Mapping[str, Any] | None) -> str | None:
    """Why figures made on ``made`` would not repeat on ``here`` (one clause), or None when they would or
    either recorded no machine (parts made before 0.4.1). ``rounding`` is compared only where both
    recorded it (parts made before 0.6.0 did not)."""
    if not made or not here:
        return None
    for key in NUMERICS:
        if key == "rounding" and (key not in made or key not in here):
            continue
        if made.get(key) != here.get(key):
            if key == "cpu_capability":
                level = str(made[key]).lower()
                return (f"its parts used PyTorch's {made[key]} CPU kernels and this run uses {here[key]} "
                        f"(set ATEN_CPU_CAPABILITY={level} before the run, if this CPU has {made[key]})")
            if key == "torch":
                return f"its parts ran on torch {made[key]} and this is torch {here[key]}"
            if key == "rounding":
                return (f"its parts' kernels rounded a fixed probe otherwise than this machine's do "
                        f"({made.get('cpu', 'another CPU')} against {here.get('cpu', 'this one')}, rounding "
                        f"{made[key]} against {here[key]})")
            return f"its parts ran on GPU {made[key] or 'none'} and this run on {here[key] or 'none'}"
    return None


def check_resume(stored: Iterable[Mapping[str, Any] | None], current: Mapping[str, Any], path: Path) -> None:
    """Refuse (one line) to add parts to ``path`` unless every stored part ran the current code, with the
    same numerics (:data:`NUMERICS`) where both recorded them."""
    for part in stored:
        if part is None or "code" not in part:
            raise ValueError(f"{path} has parts that recorded no code version: run without --resume into "
                             "another --out")
        if part["code"] != current["code"]:
            made = part.get("commit") or "an unknown commit"
            raise ValueError(f"{path} was made by other code ({made[:12]}, code {part['code']}; this is code "
                             f"{current['code']}): a published run comes from one code version, so run "
                             "without --resume into another --out, or resume at that commit")
        why = numerics_mismatch(part.get("machine"), current.get("machine"))
        if why:
            raise ValueError(f"{path} would mix two roundings: {why}; a published run repeats to the last "
                             "digit only with the same numerics, so resume on such a machine, or run "
                             "without --resume into another --out")


def versions(stored: Iterable[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """The distinct records of a run's parts (code version and machine; one for a run made at one version
    on one kind of machine)."""
    out: list[dict[str, Any]] = []
    for part in stored:
        if part is not None and dict(part) not in out:
            out.append(dict(part))
    return out


def distinct(found: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The code versions among ``found``, one per fingerprint, in order."""
    return list({v["code"]: v for v in found}.values())


def machine_name(found: Mapping[str, Any]) -> str:
    """A machine as a page names it: the CPU and its vector extensions PyTorch uses (and the GPU)."""
    gpu = f", {found['gpu']}" if found.get("gpu") else ""
    return f"{found['cpu']} ({found['cpu_capability']}{gpu}), torch {found['torch']}"


def machines_line(found: Iterable[Mapping[str, Any]]) -> str:
    """Which machines ran the parts: one sentence, empty when none recorded it (made before 0.4.1)."""
    names = list(dict.fromkeys(machine_name(v["machine"]) for v in found if v.get("machine")))
    if not names:
        return ""
    if len(names) == 1:
        return f"On one kind of machine: {names[0]}."
    return (f"On **{len(names)} kinds of machine** (with the same kernels, torch and GPU, which the resume "
            "checks): "
            + "; ".join(names) + ".")


def version_name(version: Mapping[str, Any]) -> str:
    """A code version as a page names it: its commit, whether it had uncommitted changes, its fingerprint."""
    commit = (version.get("commit") or "an unknown commit")[:12]
    dirty = " with uncommitted changes" if version.get("dirty") else ""
    return f"`{commit}`{dirty} (code {version['code']})"
