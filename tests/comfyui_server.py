"""A real ComfyUI server for the node pack's tests (installed by ``make comfyui``).

The server runs ``main.py --cpu`` from the git-ignored ComfyUI copy with a temporary base
directory whose ``custom_nodes`` holds a link to this checkout, exactly as a user installs the
pack. Tests talk to it over HTTP (``POST /prompt``, ``GET /history``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = "dynamic_treerpo"


def comfyui_dir() -> Path | None:
    """``$TREERPO_COMFYUI`` or the checkout's ``.comfyui``; None when not installed."""
    root = Path(os.environ.get("TREERPO_COMFYUI", REPO / ".comfyui"))
    return root if (root / "main.py").is_file() else None


def require_comfyui() -> Path:
    """The ComfyUI folder; skip visibly without one, but fail under CI, which installs it."""
    root = comfyui_dir()
    if root is None:
        message = "ComfyUI is not installed: run `make comfyui` (scripts/install_comfyui.py)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    port: int
    base: Path
    log: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.load(r)

    def post_prompt(self, prompt: dict) -> tuple[int, dict]:
        """``POST /prompt``: (HTTP status, JSON body), also for a rejected prompt."""
        req = urllib.request.Request(self.url + "/prompt", data=json.dumps({"prompt": prompt}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read().decode() or "{}")

    def run(self, prompt: dict, timeout: float = 240.0) -> dict:
        """Queue ``prompt`` and wait for its history entry (status and outputs)."""
        status, body = self.post_prompt(prompt)
        if status != 200:
            raise AssertionError(f"prompt rejected ({status}): {body}")
        prompt_id = body["prompt_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            if prompt_id in history:
                return history[prompt_id]
            time.sleep(0.25)
        raise AssertionError(f"prompt {prompt_id} did not finish in {timeout} s; log: {self.log}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(root: Path, base: Path, timeout: float = 120.0, options: Sequence[str] = ()) -> Server:
    """Start ComfyUI on a free port with this checkout linked as a custom node pack; ``options``: more of
    ComfyUI's command-line options (e.g. ``--preview-method auto``)."""
    (base / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / PACK_NAME).symlink_to(REPO, target_is_directory=True)
    port = _free_port()
    log = base / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--disable-api-nodes", "--database-url", "sqlite:///:memory:", "--base-directory", str(base),
         *options],
        cwd=root, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    server = Server(port, base, log, process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ComfyUI exited with {process.returncode}:\n{server.log_text()[-3000:]}")
        try:
            server.get("/object_info/KSampler")
            return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    process.kill()
    raise AssertionError(f"ComfyUI did not answer in {timeout} s:\n{server.log_text()[-3000:]}")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
