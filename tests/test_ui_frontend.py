"""The UI workflows in ComfyUI's real web frontend, in headless Chromium (scripts/check_ui_workflows.py).

Each ``workflows/*.json`` is opened as a user opens a file, checked against the file and its
``workflows/api/<name>.api.json``, and photographed fitted to the view; then the template browser
is opened on this pack's category (its cards must be the pack's workflows) and photographed, and
the first workflow is opened from its card. A second test runs two workflows from the page
(``--run-previews``) and photographs the live previews their nodes show mid-run. The PNGs stay in
pytest's temporary folder (the last three runs are kept): the tests print where, so that a person can
look at them.

Needs a Chromium (``make test`` installs Debian's ``chromium-headless-shell`` when it runs as root,
as CI does) and Playwright for Python (the ``test`` extra), which drives it; skipped without either.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from comfyui_server import REPO, require_comfyui
from PIL import Image

SCRIPT = REPO / "scripts" / "check_ui_workflows.py"
WIDTH, HEIGHT = 1400, 900  # the page size of the script's screenshots


def _script():
    spec = importlib.util.spec_from_file_location("check_ui_workflows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_shows_something(path: Path) -> None:
    """A valid PNG of the whole page, not a blank one: many colours over the canvas area."""
    assert 20_000 < path.stat().st_size < 5_000_000, f"{path.name}: {path.stat().st_size} bytes"
    with Image.open(path) as image:
        image.verify()  # the PNG's structure and checksums
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (WIDTH, HEIGHT), f"{path.name}: {image.size}"
        # the canvas, below the menu and right of the sidebar: nodes, links and text, many colours
        canvas = image.convert("RGB").crop((100, 150, WIDTH - 100, HEIGHT - 100))
    colours = canvas.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200, f"{path.name}: {len(colours)} colours over the canvas, a blank page?"
    assert max(count for count, _ in colours) < 0.9 * canvas.width * canvas.height, \
        f"{path.name}: one colour covers the canvas"


def run_script(options: list[str], shots: Path, capsys, timeout: float = 600) -> str:
    """The script's output with ``options`` and ``--screenshots shots``, which must succeed; skips
    without a Chromium."""
    comfyui = require_comfyui()
    pytest.importorskip("playwright", reason="Playwright drives the browser: pip install playwright "
                        "(the test extra; no `playwright install` needed)")
    script = _script()
    try:
        browser = script.find_browser(None)
    except FileNotFoundError:
        pytest.skip(f"no Chromium on PATH ({', '.join(script.BROWSERS)}): `make test` installs "
                    "Debian's chromium-headless-shell when run as root (as CI does); "
                    "else: apt-get install chromium-headless-shell")
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(SCRIPT), "--comfyui", str(comfyui), "--browser", browser,
                          *options, "--screenshots", str(shots)],
                         capture_output=True, text=True, timeout=timeout)
    output = run.stdout + run.stderr
    with capsys.disabled():  # shown also when the test passes
        shown = " ".join(Path(option).name if option.endswith(".json") else option for option in options)
        print(f"\n{SCRIPT.name} {shown} ({time.monotonic() - started:.0f} s); "
              f"screenshots in {shots}")
    assert run.returncode == 0, output
    return output


def test_ui_workflows_and_templates_in_the_real_frontend(tmp_path: Path, capsys) -> None:
    shots = tmp_path / "screenshots"
    output = run_script(["--templates"], shots, capsys)
    names = sorted(p.name[: -len(".json")] for p in (REPO / "workflows").glob("*.json"))
    assert names, "no UI workflows in workflows/"
    expected = {f"{name}.png" for name in names} | {"template_browser.png", f"template_{names[0]}.png"}
    assert {p.name for p in shots.iterdir()} == expected, output
    assert f"template browser: {len(names)} templates under" in output, output
    for name in sorted(expected):
        assert_shows_something(shots / name)


def test_live_previews_in_the_real_frontend(tmp_path: Path, capsys) -> None:
    """The live previews, photographed in the page while the workflows run (``--run-previews``): the
    reward curve and progress text of TreeRPO Train LoRA (steps) in train_embedded (interrupted from
    iteration 3 on), and the branches of TreeRPO Best of Tree, side by side, in best_of_tree (100
    steps). A test of its own, which ``-k 'not live_previews'`` leaves out: about 35 s on two idle
    cores, but 3 minutes and more on busy ones (the runs share the CPU with whatever else runs)."""
    shots = tmp_path / "screenshots"
    names = ["train_embedded", "best_of_tree"]
    output = run_script([str(REPO / "workflows" / f"{name}.json") for name in names] + ["--run-previews"],
                        shots, capsys)
    assert {p.name for p in shots.iterdir()} == {f"{n}.png" for n in names} | {f"run_{n}.png" for n in names}
    runs = {m[1]: m[0] for m in re.finditer(r"^run (\w+): .*$", output, re.MULTILINE)}
    assert sorted(runs) == sorted(names), output
    for name, line in runs.items():
        assert ": OK (" in line and "while the node ran" in line, line
        assert_shows_something(shots / f"run_{name}.png")
    train, tree = runs["train_embedded"], runs["best_of_tree"]
    assert re.search(r"preview \d+x\d+ shown on the node", train), train
    text = re.search(r"progress text on the page: 'iteration (\d+)/(\d+): reward -?\d+\.\d{4}'", train)
    assert text and int(text[1]) >= min(3, int(text[2])), train  # a curve of a few points
    assert re.search(r"run (interrupted|success) ", train), train
    size = re.search(r"preview (\d+)x(\d+) shown on the node", tree)
    assert size and int(size[1]) == 2 * int(size[2]), f"not 4 x 2 tiles of square leaves: {tree}"
    assert "run success" in tree, tree
