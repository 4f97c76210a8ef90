"""Picking leaves in ComfyUI's real web frontend (headless Chromium), as an artist does it: the template
"Embedded shapes model, pick what you like and train" is opened as a file, run once (the trees are sampled;
training is refused until something is picked), two leaves are clicked on the panel of TreeRPO Sample
Trees to Pick (web/pick_leaves.js) and saved, a second tree is labelled with the keys, a save that says
nothing is refused on the panel, the picks are on disk; then the graph runs again and TreeRPO Train LoRA
from Picks trains and the LoRA file is saved.

Screenshots (the panel with picks, the large view, the refused save, the graph after training) stay in
pytest's temporary folder; the test prints where. Needs a Chromium and Playwright, as
tests/test_ui_frontend.py; skipped without either. Tiny settings: well under a minute on two idle cores.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfyui_server import REPO, Server, require_comfyui

TEMPLATE = "pick_and_train"
SAMPLE_ID, TRAIN_ID = 2, 3  # the template's node ids (workflows/api/pick_and_train.api.json)
FOLDER = "my_taste"
TINY = {SAMPLE_ID: {"trees_per_prompt": 1, "steps": 6},
        TRAIN_ID: {"iterations": 2, "settings": "data.prompts_per_iteration=2\ntree.steps=4\ntree.depth=2\n"
                                                "lora.rank=4\nlora.alpha=4.0"}}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# In the page: set widgets ({node id: {name: value}}), listen for the end of runs and for the answer of
# POST /prompt (its node_errors: what was refused), then queue as the Run button does.
QUEUE = r"""
async (changes) => {
  for (const [id, widgets] of Object.entries(changes)) {
    const node = app.graph.getNodeById(Number(id));
    for (const [name, value] of Object.entries(widgets)) {
      const widget = node.widgets.find((w) => w.name === name);
      widget.value = value;
      widget.callback?.(value);
    }
  }
  const seen = window.__picksRun = {end: null, refused: null};
  const ends = {execution_success: 'success', execution_interrupted: 'interrupted'};
  for (const [type, end] of Object.entries(ends)) {
    app.api.addEventListener(type, () => { seen.end = end; }, {once: true});
  }
  app.api.addEventListener('execution_error', ({detail}) => {
    seen.end = `error in node ${detail.node_id}: ${detail.exception_message}`;
  }, {once: true});
  const queuePrompt = app.api.queuePrompt;
  app.api.queuePrompt = async function (...args) {
    const reply = await queuePrompt.apply(this, args);
    seen.refused = reply.node_errors ?? {};
    app.api.queuePrompt = queuePrompt;
    return reply;
  };
  await app.extensionManager.command.execute('Comfy.QueuePrompt');
  return true;
}
"""

PANEL = r"""
(id) => {
  const node = app.graph.getNodeById(id);
  const root = node?.treerpoPanel?.view.root;
  if (!root) return null;
  const imgs = [...root.querySelectorAll('.tp-cell img')];
  return {count: root.querySelector('.tp-count').textContent,
          message: root.querySelector('.tp-msg').textContent,
          kind: root.querySelector('.tp-msg').className, cells: imgs.length,
          loaded: imgs.filter((img) => img.complete && img.naturalWidth > 0).length,
          cell: imgs.length ? imgs[0].parentElement.offsetWidth : 0,  // CSS pixels, before the zoom
          liked: [...root.querySelectorAll('.tp-cell.liked')].map((c) => Number(c.dataset.leaf)),
          disliked: [...root.querySelectorAll('.tp-cell.disliked')].map((c) => Number(c.dataset.leaf)),
          tree: root.querySelector('.tp-grid').dataset.tree, nodeSize: node.size.map(Math.round)};
}
"""


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple]:
    comfyui = require_comfyui()
    pytest.importorskip("playwright", reason="Playwright drives the browser: pip install playwright")
    ui = _script("check_ui_workflows")
    try:
        browser = ui.find_browser(None)
    except FileNotFoundError:
        pytest.skip("no Chromium on PATH: apt-get install chromium-headless-shell (make test does as root)")
    server = ui.start_server(comfyui.resolve(), tmp_path / "comfyui")
    tools = None
    try:
        tools, _ = ui.open_frontend(server, browser)
        yield ui, tools, server
    finally:
        if tools is not None:
            tools.close()
        ui.stop_server(server)


def wait_for(tools, expression: str, ok, timeout: float = 240.0):
    """The value of ``expression`` in the page once ``ok(value)``, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = tools.evaluate(expression)
    while not ok(value):
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s; last: {value}"
        time.sleep(0.25)
        value = tools.evaluate(expression)
    return value


def run_graph(tools, changes: dict) -> dict:
    tools.evaluate(f"({QUEUE})({json.dumps({str(k): v for k, v in changes.items()})})")
    return wait_for(tools, "window.__picksRun", lambda seen: seen["end"] is not None)


def picks_on_disk(server: Server) -> dict[str, dict]:
    """Each labelled tree's newest picks, read from the folder as the trainer reads it."""
    out = {}
    for tree in sorted((server.base / "output" / "treerpo_picks" / FOLDER / "trees").iterdir()):
        saves = sorted((tree / "picks").glob("*.json"))
        if saves:
            out[tree.name] = json.loads(saves[-1].read_text())
    return out


def test_pick_two_leaves_on_the_node_then_train_from_the_picks(page, tmp_path: Path, capsys) -> None:
    ui, tools, server = page
    shots = tmp_path / "screenshots"
    started = time.monotonic()
    ui_file = REPO / "workflows" / f"{_script('api_to_ui').TITLES[TEMPLATE]}.json"
    _, failures, _ = ui.check_file(tools, ui_file, server.url)  # opened as a file: the API file's graph
    assert not failures, failures

    # 1. Run: the trees are sampled; training is refused for now (nothing picked yet), by name
    seen = run_graph(tools, TINY)
    assert seen["end"] == "success", seen
    refused = seen["refused"][str(TRAIN_ID)]["errors"][0]
    assert refused["details"].startswith("picks_folder: there is no picks folder 'my_taste' yet"), refused
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p and p["cells"] == 8 and p["loaded"] == 8)
    ui.save_screenshot(tools, shots, "panel_after_sampling")  # the whole graph: nothing under the panel
    assert panel["count"] == "0 labelled of 3 trees" and panel["cell"] >= 120, panel

    # 2. click two leaves (the second with shift: disliked), save with the button
    cells = tools.page.locator(".treerpo-picker .tp-cell")
    cells.nth(0).click()
    cells.nth(5).click()
    cells.nth(6).click(modifiers=["Shift"])
    cells.nth(5).click()  # again: undone
    cells.nth(2).click()
    panel = tools.evaluate(f"({PANEL})({SAMPLE_ID})")
    assert (panel["liked"], panel["disliked"]) == ([0, 2], [6]), panel
    first_tree = panel["tree"]
    ui.save_screenshot(tools, shots, "picks_panel", nodes=[SAMPLE_ID])
    tools.page.locator(".treerpo-picker .tp-save").click()
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["count"].startswith("1 labelled"))
    assert panel["tree"] != first_tree and panel["liked"] == [], panel
    on_disk = picks_on_disk(server)
    assert [(p["liked"], p["disliked"]) for p in on_disk.values()] == [([0, 2], [6])], on_disk
    assert list(on_disk) == [first_tree]
    status = f"app.graph.getNodeById({TRAIN_ID}).widgets.find((w) => w.name === 'treerpo_picks_status')" \
             "?.element.textContent"
    assert tools.evaluate(status) == "1 labelled of 3 trees in my_tastepick ⤢"  # the training node's counter

    # 3. the next tree with the keys: 2 like (the mouse over the node's panel), then in the large view
    # shift+4 dislike, Enter saves
    tools.page.locator(".treerpo-picker .tp-count").hover()
    tools.page.keyboard.press("Digit2")
    assert tools.evaluate(f"({PANEL})({SAMPLE_ID})")["liked"] == [1]
    tools.page.locator(".treerpo-picker .tp-size").click()
    tools.page.keyboard.press("Shift+Digit4")
    ui.save_screenshot(tools, shots, "picks_large_view", fit=False)
    tools.page.keyboard.press("Enter")
    wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["count"].startswith("2 labelled"))
    assert sorted((p["liked"], p["disliked"]) for p in picks_on_disk(server).values()) == [([0, 2], [6]),
                                                                                         ([1], [3])]
    # a save that says nothing is refused, in one line on the panel, and nothing is written
    tools.page.keyboard.press("Enter")
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: "error" in p["kind"])
    assert panel["message"].startswith("Not saved: no leaf is marked"), panel
    ui.save_screenshot(tools, shots, "picks_refused", fit=False)
    tools.page.keyboard.press("Escape")
    assert len(picks_on_disk(server)) == 2

    # 4. Run again: sampling is cached, training runs on the picks, the LoRA is saved
    seen = run_graph(tools, {})
    assert seen["end"] == "success" and not seen["refused"], seen
    lora = server.base / "output" / "loras" / "treerpo_my_taste.safetensors"
    assert lora.is_file() and lora.stat().st_size > 1000
    assert len(list((server.base / "output" / "treerpo").glob("picks_after_*.png"))) == 4
    time.sleep(1.0)  # the Save Image nodes load their images
    ui.save_screenshot(tools, shots, "after_training")
    ui.save_screenshot(tools, shots, "before_and_after", nodes=[9, 12])  # base and trained, same seed
    with capsys.disabled():
        print(f"\npicking in the frontend ({time.monotonic() - started:.0f} s); screenshots in {shots}")
