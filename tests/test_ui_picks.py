"""Picking leaves in ComfyUI's real web frontend (headless Chromium), as an artist does it, in both of the
frontend's node views: the classic canvas and "Nodes 2.0" (Vue components, the user setting
``Comfy.VueNodes.Enabled``, set before the page opens). The template "Embedded shapes model, pick what you
like and train" is opened as a file, run once (the trees are sampled; training is refused until something is
picked); the picking panel of TreeRPO Sample Trees to Pick (web/pick_leaves.js) must then be on the page
with a size, inside its node and uncovered; two leaves are clicked and saved, a second tree is labelled
with the keys in the large view, a save that says nothing is refused on the panel, a single like is
accepted, the picks are on disk and the training node's counter follows. The server's answer about the
folder passes through the browser's request routing: first without its two optional fields (``next_order``
and ``advice``, as a server without them answers: the oldest tree comes first, no advice line), midway with
ones that follow the count of labelled trees: the next tree must then follow that order, the advice show
under both counters, and after a save the panel must read the folder again by itself (the new advice on
both counters, the new order followed by the next save) without redrawing the tree it shows.

Then the graph runs again: TreeRPO Train LoRA from Picks trains under the guard (tiny: four validation
pairs, a checkpoint every round), the LoRA file is saved, and both the training node and TreeRPO Choose
Checkpoint show the guard's two images (the trade plot and the before/after grid, ComfyUI's ordinary
``images`` output; no stale live preview in their place) with a size inside the node, and the guard's line
(web/training_nodes.js), the one the server sent. Then Choose Checkpoint is set to round 1 at strength 0.5
and the graph queued again: the training node must come from ComfyUI's cache (``execution_cached`` names
it, no ``executing`` for it) while Choose Checkpoint runs, its line saying "iteration 1 at strength 0.5, as
asked", and the training node keeping its own.

Screenshots (the panel with picks, the large view, the refused save, the advice, the graph after training,
the training node and Choose Checkpoint with the guard's images and line, Choose Checkpoint after the
second choice) stay in pytest's temporary folder, one folder per view; the test prints where. Needs a
Chromium and Playwright, as tests/test_ui_frontend.py; skipped without either. Tiny settings: about a minute
per view on two idle cores.
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
SAMPLE_ID, TRAIN_ID, CHOOSE_ID = 2, 3, 13  # the template's node ids (workflows/api/pick_and_train.api.json)
FOLDER = "my_taste"
TREES = 6  # three prompts, two trees each
TINY = {SAMPLE_ID: {"trees_per_prompt": 2, "steps": 6},
        TRAIN_ID: {"iterations": 2, "settings": "data.prompts_per_iteration=2\ntree.steps=4\ntree.depth=2\n"
                                                "lora.rank=4\nlora.alpha=4.0\nsampling.eval_steps=3\n"
                                                "guard.pairs=4\nguard.checkpoints=2"}}


def advice(labelled: int) -> dict:
    """The advice the routed answer gives: it names the count, so that a fresh answer can be told apart."""
    return {"text": f"{labelled} labelled, held-out agreement still rising: more picks help",
            "more_helps": True}


STATE = f"**/treerpo/picks/{FOLDER}/state"  # the panel's reads of the folder (nodes/picks_routes.py)
GUIDANCE = ("next_order", "advice")  # the answer's optional fields


def without_guidance(route) -> None:
    """The server's answer without its optional fields, as a server without them answers."""
    response = route.fetch()
    body = {key: value for key, value in response.json().items() if key not in GUIDANCE}
    route.fulfill(response=response, json=body)
VIEWS = {"classic": False, "nodes2": True}  # the node view: Comfy.VueNodes.Enabled


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UI = _script("check_ui_workflows")  # the page helpers (Playwright is imported there only if installed)

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
  const seen = window.__picksRun = {end: null, refused: null, cached: [], executing: []};
  const mine = (listener) => (event) => { if (window.__picksRun === seen) listener(event); };
  // which nodes came from ComfyUI's cache, and which ran (the executing message names each one that runs)
  app.api.addEventListener('execution_cached', mine(({detail}) => {
    seen.cached.push(...detail.nodes.map(String)); }));
  app.api.addEventListener('executing', mine(({detail}) => {
    if (detail != null) seen.executing.push(String(detail)); }));
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

# In the page: what the picking panel of node ``id`` shows, and whether it is on the page with a size, inside
# its node and not covered (at the centre of its first leaf's cell: what a click there reaches).
PANEL = r"""
(id) => {""" + UI.NODE_BOX + r"""
  const node = app.graph.getNodeById(id);
  const root = node?.treerpoPanel?.view.root;
  if (!root) return null;
  const imgs = [...root.querySelectorAll('.tp-cell img')];
  const advice = root.querySelector('.treerpo-advice');
  return {count: root.querySelector('.tp-count').textContent,
          message: root.querySelector('.tp-msg').textContent,
          kind: root.querySelector('.tp-msg').className, cells: imgs.length,
          loaded: imgs.filter((img) => img.complete && img.naturalWidth > 0).length,
          cell: imgs.length ? imgs[0].parentElement.offsetWidth : 0,  // CSS pixels, before the zoom
          liked: [...root.querySelectorAll('.tp-cell.liked')].map((c) => Number(c.dataset.leaf)),
          disliked: [...root.querySelectorAll('.tp-cell.disliked')].map((c) => Number(c.dataset.leaf)),
          tree: root.querySelector('.tp-grid').dataset.tree,
          advice: advice.offsetHeight ? advice.textContent : '',
          shown: shownIn(root, node, imgs[0]?.parentElement ?? root)};  // the first leaf's cell
}
"""

# In the page: count the changes of the leaves on node ``id``'s picking panel from now on (its grid's children
# replaced).
GRID_CHANGES = r"""
(id) => {
  const grid = app.graph.getNodeById(id).treerpoPanel.view.grid;
  window.__gridChanges?.observer.disconnect();
  const changes = window.__gridChanges = {count: 0, observer: new MutationObserver((records) => {
    changes.count += records.filter((r) => r.type === 'childList').length; })};
  changes.observer.observe(grid, {childList: true});
  return true;
}
"""

# In the page: the training node's counter line (web/pick_leaves.js): its text, its advice line, and whether
# it is on the page with a size, inside the node, uncovered (at its "pick" button).
STATUS = r"""
(id) => {""" + UI.NODE_BOX + r"""
  const node = app.graph.getNodeById(id);
  const widget = node.widgets.find((w) => w.name === 'treerpo_picks_status');
  const box = widget?.element.querySelector('.treerpo-status');
  if (!box) return null;
  const advice = box.querySelector('.treerpo-advice');
  return {text: box.querySelector('.tp-row span').textContent,
          advice: advice.offsetHeight ? advice.textContent : '',
          shown: shownIn(box, node, box.querySelector('button'))};
}
"""

# In the page: what node ``id`` shows of the guard after a run (web/training_nodes.js and the frontend's own
# image preview): its guard line, whether it is marked as the base model returned, on the page inside the node
# and uncovered; whether the frontend's progress text widget is still there (it said the same), and the
# images. Classic view: the node's loaded images (node.imgs), the one shown (imageIndex; null: the overview),
# the size the frontend draws each at alone (renderPreview: fitted to the node's width and the preview's room,
# never enlarged), the preview's room inside the node, and nothing over its middle. Nodes 2.0: the images in
# the node's element with their size, inside the node and uncovered, and the preview's dots (one per image).
GUARD = r"""
(id) => {""" + UI.NODE_BOX + r"""
  const node = app.graph.getNodeById(id);
  const line = node.widgets.find((w) => w.name === 'treerpo_guard_line')?.element;
  const out = {line: line?.textContent ?? null, base: Boolean(line?.classList.contains('base')),
               color: line ? getComputedStyle(line).color : null,
               lineShown: line?.textContent ? shownIn(line, node) : null,
               textPreview: node.widgets.some((w) => w.name === '$$node-text-preview')};
  if (LiteGraph.vueNodesMode) {
    const own = document.querySelector(`.lg-node[data-node-id="${id}"]`);
    out.images = [...(own?.querySelectorAll('img') ?? [])].map((img) => ({
      src: decodeURIComponent(img.src), loaded: img.complete && img.naturalWidth > 0,
      ...shownIn(img, node, img.closest('.image-preview') ?? img.parentElement)}));
    out.dots = (own?.querySelectorAll('.image-preview button.rounded-full') ?? []).length;
    return out;
  }
  const preview = node.widgets.find((w) => w.name === '$$canvas-image-preview');
  const room = preview?.computedHeight ?? 0;
  const sizeLine = app.extensionManager.setting.get('Comfy.Node.AllowImageSizeDraw') ? 15 : 0;
  out.images = (node.imgs ?? []).map((img) => {
    const scale = Math.min(node.size[0] / img.naturalWidth, (room - sizeLine) / img.naturalHeight, 1);
    return {src: decodeURIComponent(img.src), loaded: img.complete && img.naturalWidth > 0,
            size: [Math.round(img.naturalWidth * scale), Math.round(img.naturalHeight * scale)]};
  });
  const box = nodeBox(node), zoom = app.canvas.ds.scale;
  const middle = LiteGraph.NODE_TITLE_HEIGHT + (preview?.y ?? 0) + room / 2;
  const hit = document.elementFromPoint((box.left + box.right) / 2, box.top + middle * zoom);
  Object.assign(out, {index: node.imageIndex ?? null, room: Math.round(room),
                      inside: Boolean(preview) && preview.y + room <= node.size[1] + 1,
                      uncovered: hit === app.canvas.canvas});
  return out;
}
"""


@pytest.fixture(params=list(VIEWS))
def page(request, tmp_path: Path) -> Iterator[tuple]:
    comfyui = require_comfyui()
    pytest.importorskip("playwright", reason="Playwright drives the browser: pip install playwright")
    try:
        browser = UI.find_browser(None)
    except FileNotFoundError:
        pytest.skip("no Chromium on PATH: apt-get install chromium-headless-shell (make test does as root)")
    server = UI.start_server(comfyui.resolve(), tmp_path / "comfyui")
    tools = None
    try:
        tools, _ = UI.open_frontend(server, browser, vue_nodes=VIEWS[request.param])
        yield request.param, tools, server
    finally:
        if tools is not None:
            tools.close()
        UI.stop_server(server)


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
    folder = server.base / "output" / "treerpo_picks" / FOLDER / "trees"
    for tree in tree_ids(server):
        saves = sorted((folder / tree / "picks").glob("*.json"))
        if saves:
            out[tree] = json.loads(saves[-1].read_text())
    return out


def tree_ids(server: Server) -> list[str]:
    """The folder's trees, oldest first (their names sort by the time they were stored)."""
    return sorted(p.name for p in (server.base / "output" / "treerpo_picks" / FOLDER / "trees").iterdir())


# In the page (Nodes 2.0): click the dot of image ``index`` under node ``id``'s image preview.
DOT = r"""
(id, index) => {
  const own = document.querySelector(`.lg-node[data-node-id="${id}"]`);
  own.querySelectorAll('.image-preview button.rounded-full')[index].click();
  return true;
}
"""


def last_output(server: Server, node_id: int) -> dict:
    """The ui output the server sent for ``node_id`` in the newest prompt that has one (ComfyUI's history,
    oldest prompt first)."""
    return [entry["outputs"][str(node_id)] for entry in server.get("/history").values()
            if str(node_id) in entry["outputs"]][-1]


def guard_shown(tools, view: str, node_id: int, sent: dict, shot: Path | None = None) -> dict:
    """What node ``node_id`` shows of the guard (GUARD), checked against ``sent`` (its ui output): the
    line, once, on the page inside the node and uncovered; both images loaded with a size inside the node,
    no stale live preview among them (Nodes 2.0), the first shown alone and each at the node's width when
    shown (classic).
    With ``shot``, the node photographed there (``<shot>.png``) and with its second image shown
    (``<shot>_second_image.png``)."""
    names = [image["filename"] for image in sent["images"]]
    assert len(names) == 2, sent  # the trade plot and the before/after grid
    tools.evaluate(f"({UI.FIT_VIEW})([{node_id}], 1.0)")  # the canvas loads a node's images as it draws it
    # the guard's line, and under it which picks the run learned from (Train LoRA from Picks)
    expected = "\n".join([sent["treerpo_guard"][0], *sent.get("treerpo_picks", [])[:1]])

    def ready(state: dict) -> bool:
        srcs = [image["src"] for image in state["images"] if image["loaded"]]
        return state["line"] == expected and any(names[0] in src for src in srcs) and (
            view == "nodes2" or all(any(name in src for src in srcs) for name in names))

    state = wait_for(tools, f"({GUARD})({node_id})", ready, timeout=30)
    tools.page.mouse.move(5, 600)  # off the nodes: no tooltip over them in the screenshots
    time.sleep(0.5)  # the node's new size, drawn
    state = tools.evaluate(f"({GUARD})({node_id})")
    assert_shown({"shown": state["lineShown"]}, f"the guard's line on node {node_id}")
    assert not state["textPreview"], state  # the progress text said the same line: not twice
    if shot is not None:
        UI.save_screenshot(tools, shot.parent, shot.name, nodes=[node_id])
    if view == "classic":
        assert state["index"] == 0 and state["inside"] and state["uncovered"], state
        # each, when shown, at (about) the node's width: the node made room for the taller one
        assert all(image["size"][0] >= 300 and image["size"][1] > 100 for image in state["images"]), state
        if shot is not None:  # the second image, as the frontend's arrow shows it
            tools.evaluate(f"(() => {{ const n = app.graph.getNodeById({node_id}); n.imageIndex = 1; "
                           "n.setDirtyCanvas(true, true); return true; })()")
            UI.save_screenshot(tools, shot.parent, f"{shot.name}_second_image", nodes=[node_id])
            tools.evaluate(f"(() => {{ app.graph.getNodeById({node_id}).imageIndex = 0; return true; }})()")
        return state
    assert [image for image in state["images"] if image["src"].startswith("blob:")] == [], state
    assert state["dots"] == 2, state  # the frontend's preview: one image at a time, a dot for each
    for index, name in enumerate(names):
        if index:  # the next image, as its dot shows it
            tools.evaluate(f"({DOT})({node_id}, {index})")
        shown = wait_for(tools, f"({GUARD})({node_id})",
                         lambda s, name=name: any(name in i["src"] and i["loaded"] for i in s["images"]),
                         timeout=30)
        image = next(i for i in shown["images"] if name in i["src"])
        assert min(image["size"]) > 100 and image["inside"] and image["uncovered"], shown
        if index and shot is not None:
            UI.save_screenshot(tools, shot.parent, f"{shot.name}_second_image", nodes=[node_id])
    tools.evaluate(f"({DOT})({node_id}, 0)")  # back to the plot
    return state


def assert_shown(state: dict, what: str) -> None:
    """``state["shown"]`` (NODE_BOX's shownIn): on the page, with a size, inside its node, uncovered."""
    shown = state["shown"]
    assert shown["attached"] and min(shown["size"]) > 0, f"{what} not on the page: {state}"
    assert shown["inside"] and shown["uncovered"], f"{what} not whole inside its node, uncovered: {state}"


def both_nodes(tools) -> None:
    """The view on the sampling and the training node, as a person picking would have it: Nodes 2.0 takes
    no clicks on widgets when zoomed out below its low-quality threshold (the whole graph may be)."""
    assert tools.evaluate(f"({UI.FIT_VIEW})([{SAMPLE_ID}, {TRAIN_ID}], 1.0)")
    time.sleep(0.5)  # drawn on the next frame


def test_pick_leaves_on_the_node_then_train_from_the_picks(page, tmp_path: Path, capsys) -> None:
    view, tools, server = page
    shots = tmp_path / "screenshots" / view
    started = time.monotonic()
    ui_file = REPO / "workflows" / f"{_script('api_to_ui').TITLES[TEMPLATE]}.json"
    _, failures, _ = UI.check_file(tools, ui_file, server.url)  # opened as a file: the API file's graph
    assert not failures, failures
    assert tools.evaluate("Boolean(LiteGraph.vueNodesMode)") is VIEWS[view]
    answers = {"with": None}  # one route handler for the whole test: re-routing races with reads in flight

    def state_route(route) -> None:
        (answers["with"] or without_guidance)(route)

    tools.page.route(STATE, state_route)

    # 1. Run: the trees are sampled; training is refused for now (nothing picked yet), by name
    seen = run_graph(tools, TINY)
    assert seen["end"] == "success", seen
    refused = seen["refused"][str(TRAIN_ID)]["errors"][0]
    assert refused["details"].startswith("picks_folder: there is no picks folder 'my_taste' yet"), refused
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p and p["cells"] == 8 and p["loaded"] == 8)
    trees = tree_ids(server)
    assert len(trees) == TREES, trees
    time.sleep(0.5)  # the node's new size, and the nodes moved out of its way (read back in Nodes 2.0)
    UI.save_screenshot(tools, shots, "panel_after_sampling")  # the whole graph: nothing under the panel
    both_nodes(tools)
    panel = tools.evaluate(f"({PANEL})({SAMPLE_ID})")
    assert panel["count"] == f"0 labelled of {TREES} trees" and panel["cell"] >= 120, panel
    assert panel["tree"] == trees[0] and panel["advice"] == "", panel  # the oldest first, no advice line
    assert_shown(panel, "the picking panel")

    # 2. click two leaves (the second with shift: disliked), save with the button
    cells = tools.page.locator(".treerpo-picker .tp-cell")
    cells.nth(0).click()
    cells.nth(5).click()
    cells.nth(6).click(modifiers=["Shift"])
    cells.nth(5).click()  # again: undone
    cells.nth(2).click()
    panel = tools.evaluate(f"({PANEL})({SAMPLE_ID})")
    assert (panel["liked"], panel["disliked"]) == ([0, 2], [6]), panel
    UI.save_screenshot(tools, shots, "picks_panel", nodes=[SAMPLE_ID])
    tools.page.locator(".treerpo-picker .tp-save").click()
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["count"].startswith("1 labelled"))
    both_nodes(tools)
    assert panel["tree"] == trees[1] and panel["liked"] == [], panel  # the next oldest
    on_disk = picks_on_disk(server)
    assert on_disk == {trees[0]: on_disk[trees[0]]}, on_disk
    assert (on_disk[trees[0]]["liked"], on_disk[trees[0]]["disliked"]) == ([0, 2], [6]), on_disk
    status = wait_for(tools, f"({STATUS})({TRAIN_ID})", lambda s: s and s["text"].startswith("1 labelled"))
    assert status["text"] == f"1 labelled of {TREES} trees in my_taste" and status["advice"] == "", status
    assert_shown(status, "the training node's counter")

    # 3. the answer names the order of the next trees and gives advice. The panel reads the folder again
    # when the folder's name is set (here: to the same name); it keeps its place
    # the unlabelled ones, most useful first: another order once two trees are labelled
    orders = {1: [trees[4], trees[2], trees[1], trees[5], trees[3]],
              2: [trees[4], trees[5], trees[3], trees[2]]}

    def with_guidance(route) -> None:
        response = route.fetch()
        body = response.json()
        order = orders[min(body["labelled"], 2)]
        route.fulfill(response=response,
                      json={**body, "next_order": order, "advice": advice(body["labelled"])})

    answers["with"] = with_guidance
    tools.evaluate(f"""(() => {{ const w = app.graph.getNodeById({SAMPLE_ID}).widgets
                        .find((w) => w.name === 'picks_folder'); w.callback(w.value); return true; }})()""")
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["advice"] == advice(1)["text"])
    assert panel["tree"] == trees[1], panel  # still the tree shown before
    status = wait_for(tools, f"({STATUS})({TRAIN_ID})", lambda s: s["advice"] == advice(1)["text"])
    both_nodes(tools)
    assert_shown(panel := tools.evaluate(f"({PANEL})({SAMPLE_ID})"), "the picking panel with advice")
    assert_shown(status := tools.evaluate(f"({STATUS})({TRAIN_ID})"), "the counter with advice")
    UI.save_screenshot(tools, shots, "advice", nodes=[SAMPLE_ID, TRAIN_ID])

    # 4. this tree with the keys: 2 like (the mouse over the node's panel), then in the large view shift+4
    # dislike, Enter saves; the next tree is the first of the server's order not labelled yet. The panel then
    # reads the folder again by itself: the advice for two labelled trees on both counters, and the order
    # that comes with it, while the node's grid is not redrawn (one change of its leaves: the next tree)
    assert tools.evaluate(f"({GRID_CHANGES})({SAMPLE_ID})")
    tools.page.locator(".treerpo-picker .tp-count").hover()
    tools.page.keyboard.press("Digit2")
    assert tools.evaluate(f"({PANEL})({SAMPLE_ID})")["liked"] == [1]
    tools.page.locator(".treerpo-picker .tp-size").click()
    tools.page.keyboard.press("Shift+Digit4")
    UI.save_screenshot(tools, shots, "picks_large_view", fit=False)
    tools.page.keyboard.press("Enter")
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["count"].startswith("2 labelled"))
    assert panel["tree"] == trees[4], panel  # oldest first would have been trees[2]
    fresh = advice(2)["text"]
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["advice"] == fresh, timeout=30)
    status = wait_for(tools, f"({STATUS})({TRAIN_ID})", lambda s: s["advice"] == fresh, timeout=30)
    assert panel["tree"] == trees[4] and panel["liked"] == [], panel  # the tree shown stays
    assert tools.evaluate("window.__gridChanges.count") == 1, "the node's grid was redrawn by the refresh"
    assert sorted((p["liked"], p["disliked"]) for p in picks_on_disk(server).values()) == [([0, 2], [6]),
                                                                                         ([1], [3])]
    # a save that says nothing is refused, in one line on the panel, and nothing is written
    tools.page.keyboard.press("Enter")
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: "error" in p["kind"])
    assert panel["message"].startswith("Not saved: no leaf is marked"), panel
    UI.save_screenshot(tools, shots, "picks_refused", fit=False)
    # a single like, nothing else marked, is an answer: saved
    tools.page.keyboard.press("Digit7")
    tools.page.keyboard.press("Enter")
    panel = wait_for(tools, f"({PANEL})({SAMPLE_ID})", lambda p: p["count"].startswith("3 labelled"))
    # next in the order that came after the last save (the first order would have given trees[2])
    assert panel["tree"] == trees[5] and "error" not in panel["kind"], panel
    on_disk = picks_on_disk(server)
    assert (on_disk[trees[4]]["liked"], on_disk[trees[4]]["disliked"]) == ([6], []), on_disk
    tools.page.keyboard.press("Escape")
    assert len(picks_on_disk(server)) == 3
    status = wait_for(tools, f"({STATUS})({TRAIN_ID})", lambda s: s["text"].startswith("3 labelled"))

    # 5. Run again: sampling is cached, training runs on the picks under the guard, the LoRA is saved
    seen = run_graph(tools, {})
    assert seen["end"] == "success" and not seen["refused"], seen
    assert {str(TRAIN_ID), str(CHOOSE_ID)} <= set(seen["executing"]), seen
    lora = server.base / "output" / "loras" / "treerpo_my_taste.safetensors"
    assert lora.is_file() and lora.stat().st_size > 1000
    after = sorted((server.base / "output" / "treerpo").glob("picks_after_*.png"))
    assert len(after) == 4, after
    time.sleep(1.0)  # the Save Image nodes load their images
    UI.save_screenshot(tools, shots, "after_training")
    UI.save_screenshot(tools, shots, "before_and_after", nodes=[9, 12])  # base and trained, same seed

    # 6. the guard's images and line on the training node and on Choose Checkpoint, as the server sent them
    for node_id in (TRAIN_ID, CHOOSE_ID):
        sent = last_output(server, node_id)
        shot = shots / f"guard_{'training' if node_id == TRAIN_ID else 'choose'}_node"
        shown = guard_shown(tools, view, node_id, sent, shot)
        assert shown["base"] == ("base model is returned" in sent["treerpo_guard"][0]), shown

    # 7. another checkpoint and strength: only Choose Checkpoint runs again, the training node is cached
    trained = last_output(server, TRAIN_ID)
    seen = run_graph(tools, {CHOOSE_ID: {"checkpoint": 1, "strength": 0.5}})
    assert seen["end"] == "success" and not seen["refused"], seen
    assert str(TRAIN_ID) in seen["cached"] and str(TRAIN_ID) not in seen["executing"], seen
    assert str(CHOOSE_ID) in seen["executing"] and str(CHOOSE_ID) not in seen["cached"], seen
    sent = last_output(server, CHOOSE_ID)
    assert "iteration 1 at strength 0.5, as asked" in sent["treerpo_guard"][0], sent
    chosen = guard_shown(tools, view, CHOOSE_ID, sent)
    UI.save_screenshot(tools, shots, "guard_choose_node_round_1_half", nodes=[CHOOSE_ID])
    kept = guard_shown(tools, view, TRAIN_ID, trained)["line"]
    # kept, and under it which picks the run learned from
    assert kept == f"{trained['treerpo_guard'][0]}\nlearned from 3 labelled trees", kept

    # 8. a line saying that the base model was returned shows in red: its words as nodes/checkpoints.py sends
    # them, given to Choose Checkpoint as the server's executed message (a run of its own would train again)
    line = ("no checkpoint kept prompt-following within the limit (a fall of at most 0.02; the smallest fall "
            "was 0.031 at iteration 1): the base model is returned unchanged; allow more (loosely), or pick "
            "more consistently")
    output = json.dumps({"images": sent["images"], "treerpo_guard": [line]})
    tools.evaluate(f"({UI.FIT_VIEW})([{CHOOSE_ID}], 1.0)")
    tools.evaluate(f"""(() => {{ app.api.dispatchCustomEvent('executed', {{node: '{CHOOSE_ID}',
                       display_node: '{CHOOSE_ID}', output: {output}, prompt_id: 'treerpo-ui-test'}});
                       return true; }})()""")
    # the node grows to the longer line a frame or two after its text changes: wait for it to settle
    red = wait_for(tools, f"({GUARD})({CHOOSE_ID})",
                   lambda s: s["line"] == line and s["lineShown"]["uncovered"], timeout=30)
    assert red["base"] and red["color"] != chosen["color"], (red, chosen)
    assert_shown({"shown": red["lineShown"]}, "the guard's red line")
    UI.save_screenshot(tools, shots, "guard_choose_node_base_returned", nodes=[CHOOSE_ID])
    with capsys.disabled():
        print(f"\npicking in the frontend, {view} node view ({time.monotonic() - started:.0f} s); "
              f"screenshots in {shots}")
