"""The UI workflows in ComfyUI's real web frontend, in headless Chromium (scripts/check_ui_workflows.py).

Each ``workflows/*.json`` is opened as a user opens a file, checked against the file and its
``workflows/api/<id>.api.json`` (and its nodes' labels: plain words, no raw input ids), and photographed
fitted to the view; then the template browser is opened on this pack's category (its cards must be the
pack's workflows, each with its thumbnail loaded, its title and description) and photographed, and every
workflow is opened from its card: every node must then be whole in the window, not under a menu. A second
test runs two workflows from the page (``--run-previews``), photographs the live previews their nodes show
mid-run, and, once Best of Tree has run, its leaves and scores shown on the node by the pack's web
extension; it runs in both of the frontend's node views, the classic canvas and "Nodes 2.0" (Vue
components: ``--vue-nodes``). The PNGs stay in pytest's temporary folder (the last three runs are kept):
the tests print where, so that a person can look at them.

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


def _script(path: Path = SCRIPT):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_TO_UI = _script(REPO / "scripts" / "api_to_ui.py")  # the UI files' names


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
    names = sorted(p.name[: -len(".api.json")] for p in (REPO / "workflows" / "api").glob("*.api.json"))
    assert len(names) == len(list((REPO / "workflows").glob("*.json"))), "a UI file per API file"
    expected = ({f"{name}.png" for name in names} | {"template_browser.png"}
                | {f"template_{name}.png" for name in names})
    assert {p.name for p in shots.iterdir()} == expected, output
    assert re.search(rf"^template browser: {len(names)} templates under \w+: OK \(every card with its "
                     "thumbnail, title and description", output, re.MULTILINE), output
    for name in names:  # opened from its card, every node whole in the window
        assert re.search(rf"^template {name}: \d+ nodes, \d+ links: OK \(.*all \d+ nodes whole in view",
                         output, re.MULTILINE), output
    for name in sorted(expected):
        assert_shows_something(shots / name)


@pytest.mark.parametrize("view", ["classic", "nodes2"])
def test_live_previews_in_the_real_frontend(view: str, tmp_path: Path, capsys) -> None:
    """The live previews, photographed in the page while the workflows run (``--run-previews``): the
    reward curve and progress text of TreeRPO Train LoRA (steps) in train_embedded (interrupted from
    iteration 3 on), and the branches of TreeRPO Best of Tree, side by side, in best_of_tree (100
    steps), then its scores; in the classic node view and in "Nodes 2.0" (``--vue-nodes``). A test of its
    own, which ``-k 'not live_previews'`` leaves out: about 35 s a view on two idle cores, but 3 minutes
    and more on busy ones (the runs share the CPU with whatever else runs)."""
    shots = tmp_path / "screenshots"
    names = ["train_embedded", "best_of_tree"]
    files = [str(API_TO_UI.ui_path(REPO / "workflows" / "api" / f"{n}.api.json")) for n in names]
    vue = ["--vue-nodes"] if view == "nodes2" else []
    output = run_script([*files, "--run-previews", *vue], shots, capsys)
    assert f"frontend ready ({'Nodes 2.0' if view == 'nodes2' else 'classic'} node view)" in output, output
    scores = {"scores_best_of_tree.png", "scores_best_of_tree_grid.png"}
    assert {p.name for p in shots.iterdir()} == ({f"{n}.png" for n in names} | {f"run_{n}.png" for n in names}
                                                 | scores), output
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
    # then Best of Tree shows its leaves with their scores and the best one (web/best_of_tree.js)
    assert re.search(r"after the run the node shows 8 leaves with their scores, leaf \d framed as the best "
                     r"\(\d\.\d{4}\), 8 previews loaded, the grid \d+x\d+ inside the node", tree), tree
    for name in sorted(scores):
        assert_shows_something(shots / name)
