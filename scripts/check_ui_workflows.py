"""Open the UI-format workflows (``workflows/*.json``) in the real ComfyUI web frontend, headless.

The tests check the UI files against our own reading of ComfyUI's formats; this script checks them
against the frontend itself, the way a user meets them. It starts ComfyUI (``main.py --cpu``) with
this checkout linked as the node pack (``tests/comfyui_server.py``), opens the page in headless
Chromium driven by Playwright for Python (the ``test`` extra; it drives the system's Chromium, given by
``executable_path``, so ``playwright install`` and its browser download are not needed; checked with
Playwright 1.65 and Debian 12's ``chromium-headless-shell`` 156), and loads each file through
``app.handleFile`` - the code path of dropping the file on the canvas or Workflow > Open. In the page
it then checks that:

* no node type is missing (no "missing nodes" dialog; every type is in ``LiteGraph.registered_node_types``
  and each node was built from its registered class);
* the nodes, their widget values, their links and the link count are those of the file;
* the frontend logged no error or warning and showed no error dialog or toast while loading;
* ``app.graphToPrompt()`` (what Queue Prompt sends) gives the graph of its API file
  (``workflows/api/<id>.api.json``, ``scripts/api_to_ui.py`` names the pair): same node ids, class types,
  inputs and titles;
* the pack's nodes show plain-words labels: no widget or socket labelled with a raw input id (one
  with an underscore).

Missing model files (the FLUX template's loaders) are reported, not failed: the dialog offering
their downloads is the expected behaviour on a machine without them. So are requests the page
makes to other hosts (api.comfy.org, huggingface.co), which ComfyUI's content security policy
blocks; what the page logs while starting, before any file is loaded, is not counted either.

With ``--templates`` it then opens the template browser (Workflow > Browse Templates) on this
pack's category, where ComfyUI lists the pack's ``workflows/*.json`` (``GET /workflow_templates``):
its cards must be exactly those files, each showing its thumbnail (``workflows/<name>.jpg``, served
as a JPEG and loaded on the card, not the placeholder the frontend shows for a missing one: a 404
fails) and its file name, in plain words, as title and description. It then opens each workflow by
clicking its card (the frontend fetches it from ``/api/workflow_templates/<pack>/``), checks it as a
file is checked, and checks that every node, title bar included, is whole in the window where the
frontend placed it and not under a menu, toolbar or dialog (``IN_VIEW``: points along each node's
edges must be on the canvas).

With ``--run-previews`` ComfyUI runs with ``--preview-method auto`` and the page runs two workflows as
a user does (opened as a file, queued with the Run button's command, Comfy.QueuePrompt), watching what
the frontend makes of the server's messages about one node: ``train_embedded`` until TreeRPO Train
LoRA (steps) shows its reward curve (the node's ``imgs``, from ``app.nodePreviewImages``; in Nodes 2.0 the
preview image in the node's element) and its progress text "iteration k/K: reward ..." (on the page: the
frontend's text widget on the node, or in Nodes 2.0 the pack's own line, ``web/training_nodes.js``) from
iteration 3 on, then interrupted (the Interrupt command; the whole training takes half a minute on
two idle cores, minutes on busy ones); and
``best_of_tree``, with 100 steps instead of 10, until TreeRPO Best of Tree shows its branches tiled
side by side (the latent previewer's image) at half its steps, then left to finish; after it,
the node must show what the pack's web extension (``web/best_of_tree.js``) shows: every leaf's preview
loaded and drawn, the scores and the best leaf the server sent (framed, and named over the grid), the grid
inside the node and not covered. Each node is
photographed mid-run, zoomed on it (``run_<id>.png``), and Best of Tree after its run
(``scores_best_of_tree.png``, and its grid close up, ``scores_best_of_tree_grid.png``); the run must end
as expected (interrupted, or success), the server's queue empty, with nothing logged by the page.

    .venv/bin/python scripts/check_ui_workflows.py                     # every workflows/*.json
    .venv/bin/python scripts/check_ui_workflows.py workflows/Embedded*best*.json --browser /usr/bin/chromium
    .venv/bin/python scripts/check_ui_workflows.py --templates --screenshots shots/
    .venv/bin/python scripts/check_ui_workflows.py --run-previews --screenshots shots/
    .venv/bin/python scripts/check_ui_workflows.py --run-previews --vue-nodes --screenshots shots/

With ``--vue-nodes`` the page draws its nodes as Vue components ("Nodes 2.0", the user setting
``Comfy.VueNodes.Enabled``, set through ``POST /settings`` before the page opens) instead of on the LiteGraph
canvas: the pack's web extensions must show the same there (a node's live preview is then the image in the
node's own element, and Best of Tree's grid a widget mounted in it). tests/test_ui_frontend.py runs
``--run-previews`` in both views; the template checks are made in the classic view.

``--screenshots DIR`` saves a 1400x900 PNG of the page with each workflow fitted into view
(``<id>.png``: the API id), of the template browser (``template_browser.png``) and of each workflow
opened from it as the frontend shows it (``template_<id>.png``), and of the live previews
(``run_<id>.png``); with ``--saved``, ``<commit folder>_<id>.png`` and a close-up of the nodes whose
values the pack's migration moved or could not read (``<commit folder>_<id>_migrated.png``);
tests/test_ui_frontend.py runs ``--templates --screenshots DIR`` and (a test of its own, the slowest)
``--run-previews --screenshots DIR`` on the two workflows it runs, under ``make test``.

Prints one line per workflow (name, nodes, links, OK or the differences); exit status 1 when any
check failed, 2 when ComfyUI or the browser cannot be started. ``--find-browser`` only prints the
Chromium it would use (``make test`` asks it before installing one).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test-suite's server helpers

from comfyui_server import PACK_NAME, Server, comfyui_dir, start_server, stop_server  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))  # api_to_ui: the UI files' names and their API files
from api_to_ui import api_path, ui_path  # noqa: E402

from dynamic_treerpo.trainer.comfyui_host.layouts import (  # noqa: E402
    migrate_values,
    migrate_workflow,
    read_record,
    with_added_inputs,
)

try:  # --find-browser needs no Playwright (`make` asks it before the test extra may be installed)
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None
    PlaywrightError = RuntimeError

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome",
            "headless_shell")
MISSING_MODELS_TITLE = "Missing Models"  # the frontend's dialog listing model files to download
SETTINGS = {"Comfy.TutorialCompleted": True}  # no template browser over the canvas on first start
# screenshots: node text stays drawn when a whole graph is fitted into view (default threshold 0.6),
# and no minimap over the graph's bottom right corner
SCREENSHOT_SETTINGS = {"LiteGraph.Canvas.LowQualityRenderingZoomThreshold": 0.2,
                       "Comfy.Minimap.Visible": False}
VUE_NODES = "Comfy.VueNodes.Enabled"  # the node view: Vue components ("Nodes 2.0") or the canvas (classic)

# In the page (pasted into other snippets): where node ``node`` is on the screen, title bar included,
# in either node view: its own element in Nodes 2.0, else its bounding box on the canvas.
NODE_BOX = r"""
const nodeBox = (node) => {
  if (LiteGraph.vueNodesMode) {
    const el = document.querySelector(`.lg-node[data-node-id="${CSS.escape(String(node.id))}"]`);
    const r = el?.getBoundingClientRect();
    return r ? {left: r.left, top: r.top, right: r.right, bottom: r.bottom} : null;
  }
  const ds = app.canvas.ds, box = app.canvas.canvas.getBoundingClientRect();
  const [x, y, w, h] = node.boundingRect;
  const left = (x + ds.offset[0]) * ds.scale + box.left, top = (y + ds.offset[1]) * ds.scale + box.top;
  return {left, top, right: left + w * ds.scale, bottom: top + h * ds.scale};
};
// whether element ``el`` is on the page with a size, inside node ``node``'s box, and whether what the page
// shows at the centre of ``probe`` (an element inside it) is that element: nothing covers it
const shownIn = (el, node, probe = el) => {
  const r = el?.getBoundingClientRect(), box = nodeBox(node);
  if (!el || !el.isConnected || !r || !box) return {attached: Boolean(el?.isConnected), size: [0, 0]};
  const p = probe.getBoundingClientRect();
  const hit = document.elementFromPoint((p.left + p.right) / 2, (p.top + p.bottom) / 2);
  return {attached: true, size: [Math.round(r.width), Math.round(r.height)],
          inside: r.left >= box.left - 2 && r.right <= box.right + 2 && r.top >= box.top - 2
                  && r.bottom <= box.bottom + 2,
          uncovered: Boolean(hit && probe.contains(hit))};
};
"""

# In the page: load one workflow as a user does and describe what the frontend made of it.
# ``load`` is an async function of no arguments that opens the workflow (as a file, or as a template).
PAGE_CHECK = r"""
async (load) => {
  const seen = {missingNodes: [], missingModels: [], fileErrors: [], thrown: []};
  const wrap = (method, key) => {
    const original = app[method];
    app[method] = function (...args) { seen[key].push(args[0]); return original.apply(this, args); };
    return () => { app[method] = original; };
  };
  const restore = [wrap('showMissingNodesError', 'missingNodes'),
                   wrap('showMissingModelsError', 'missingModels'),
                   wrap('showErrorOnFileLoad', 'fileErrors')];
  try {
    await load();
  } catch (err) {
    seen.thrown.push(`loading: ${err}`);
  } finally {
    restore.forEach((undo) => undo());
  }
  await new Promise((resolve) => setTimeout(resolve, 500));  // dialogs and toasts render
  const graph = app.graph.serialize();
  const nodes = app.graph.nodes.map((node) => ({
    id: node.id, type: node.type, registered: node.type in LiteGraph.registered_node_types,
    ownClass: LiteGraph.registered_node_types[node.type] === node.constructor,
    hasErrors: Boolean(node.has_errors), title: node.title,
    badges: (node.badges || []).map((b) => (typeof b === 'function' ? b() : b)?.text).filter(Boolean),
    widgets: (node.widgets || []).map((w) => ({name: w.name, value: w.value})),
    // what the node shows as each widget's and socket's label (the frontend's own fallbacks)
    labels: [...(node.widgets || []).filter((w) => w.serialize !== false).map((w) => w.label ?? w.name),
             ...(node.inputs || []).filter((i) => !i.widget)
               .map((i) => i.label || i.localized_name || i.name)],
  }));
  const shown = (selector) => [...document.querySelectorAll(selector)]
    .filter((el) => el.offsetParent !== null);
  const words = (el) => (el ? el.innerText.trim().replace(/\s+/g, ' ') : '');
  const dialogs = shown('.p-dialog').map((el) => ({title: words(el.querySelector('.p-dialog-title')),
                                                   text: words(el)}));
  const toasts = shown('.p-toast-message').map(words);
  let output = {};
  try {
    output = (await app.graphToPrompt()).output;
  } catch (err) {
    seen.thrown.push(`graphToPrompt: ${err}`);
  }
  // close what this file opened, so that the next file starts on a bare canvas; a dialog's closing
  // animation takes longer on a loaded machine, so wait for it (up to 5 s), clicking again meanwhile
  const closers = '.p-dialog .p-dialog-close-button, .p-toast-message .p-toast-close-button';
  for (let tries = 0; tries < 25 && shown(closers).length; tries++) {
    shown(closers).forEach((b) => b.click());
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  return {seen, graph, nodes, output, dialogs, toasts,
          left: shown('.p-dialog').length};
}
"""

# In the page: the whole graph (nodes and groups; ``ids`` null), or the nodes of ``ids`` alone, fitted
# into the part of the canvas that the menus and toolbars leave free, at most ``most`` times life size,
# so that a screenshot shows it as large as it goes. The frontend's own "fit view" (the "." key) keeps
# a quarter of the canvas as margin and centres the graph behind the sidebar and top bars.
FIT_VIEW = r"""
(ids, most) => {
  const canvas = window.app && app.canvas;
  const nodes = ids ? ids.map((id) => app.graph.getNodeById(id)).filter(Boolean) : app.graph.nodes;
  const groups = ids ? [] : (app.graph.groups || []).map((group) => group._bounding || group.boundingRect);
  const rects = [...nodes.map((node) => node.boundingRect), ...groups].filter((r) => r && r.length === 4);
  if (!canvas || !rects.length) return false;
  const x0 = Math.min(...rects.map((r) => r[0])), x1 = Math.max(...rects.map((r) => r[0] + r[2]));
  const y0 = Math.min(...rects.map((r) => r[1])) - 30;  // badges and titles over the nodes
  const y1 = Math.max(...rects.map((r) => r[1] + r[3]));
  const width = canvas.canvas.width / devicePixelRatio, height = canvas.canvas.height / devicePixelRatio;
  const [left, top, right, bottom] = [80, 140, width - 30, height - 80];  // sidebar, bars, zoom controls
  const ds = canvas.ds;
  ds.scale = Math.min((right - left) / (x1 - x0), (bottom - top) / (y1 - y0), most);
  ds.offset[0] = (left + right) / 2 / ds.scale - (x0 + x1) / 2;  // screen = (graph + offset) * scale
  ds.offset[1] = (top + bottom) / 2 / ds.scale - (y0 + y1) / 2;
  canvas.setDirty(true, true);
  return true;
}
"""

# In the page: Workflow > Browse Templates (the command behind the menu item and the sidebar button),
# then the pack's category under "Extensions"; the names of the cards it shows, once they stop changing.
TEMPLATE_BROWSER = r"""
async (pack) => {
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const until = async (test, what, ms = 30000) => {
    for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) {
      const value = test();
      if (value) return value;
    }
    throw new Error(`the template browser: no ${what} after ${ms / 1000} s`);
  };
  await app.extensionManager.command.execute('Comfy.BrowseTemplates');
  const dialog = await until(() => document.querySelector('[data-testid="template-workflows-content"]')
    ?.closest('.p-dialog'), 'dialog');
  const leaves = () => [...dialog.querySelectorAll('nav *')]
    .filter((el) => el.children.length === 0 && el.textContent.trim());
  const category = await until(() => leaves().find((el) => el.textContent.trim() === pack),
                               `category named ${pack}`);
  category.click();
  const cards = () => [...dialog.querySelectorAll('[data-testid^="template-workflow-"]')]
    .map((el) => el.dataset.testid.slice('template-workflow-'.length));
  let names = [], stable = 0;
  await until(() => {
    const now = cards();
    stable = now.length && now.join() === names.join() ? stable + 1 : 0;
    names = now;
    return stable >= 3;
  }, 'cards');
  // each card scrolled into view (its thumbnail loads when seen) until its image has loaded or failed
  const cardsShown = [];
  for (const name of names) {
    const card = dialog.querySelector(`[data-testid="template-workflow-${name}"]`);
    card.scrollIntoView({block: 'center'});
    const image = () => [...card.querySelectorAll('img')].find((img) => img.complete && img.naturalWidth);
    try {
      await until(image, `thumbnail of ${name}`, 10000);
    } catch (err) { /* reported below: no image */ }
    await sleep(200);  // a failed fetch swaps in the placeholder
    const words = (el) => (el ? el.textContent.trim().replace(/\s+/g, ' ') : '');
    const loaded = [...card.querySelectorAll('img')].filter((img) => img.complete && img.naturalWidth);
    cardsShown.push({name, title: words(card.querySelector('h3')),
                     description: words(card.querySelector('p')),
                     images: loaded.map((img) => ({src: img.currentSrc || img.src,
                                                   size: [img.naturalWidth, img.naturalHeight]}))});
  }
  dialog.querySelector('[data-testid="template-workflows-content"]').scrollIntoView({block: 'start'});
  await sleep(300);
  return {names, cards: cardsShown};
}
"""

# In the page: every node of the graph (title bar included) whole in the window and not under the menus,
# toolbars or dialogs: points along each node's edges must be on the canvas (or on one of the graph's own
# text boxes) when the page is asked what is there.
IN_VIEW = r"""
() => {
  const canvas = app.canvas, element = canvas.canvas, ds = canvas.ds;
  const box = element.getBoundingClientRect();
  const onGraph = (hit) => hit === element || Boolean(hit?.closest('.dom-widget, .comfy-multiline-input'));
  const hidden = [];
  for (const node of app.graph.nodes) {
    const [x, y, w, h] = node.boundingRect;  // the title bar included
    const left = (x + ds.offset[0]) * ds.scale + box.left, top = (y + ds.offset[1]) * ds.scale + box.top;
    const right = left + w * ds.scale, bottom = top + h * ds.scale;
    const points = [];
    for (const fx of [0, 0.25, 0.5, 0.75, 1]) {
      const px = left + 2 + fx * (right - left - 4);
      points.push([px, top + 2], [px, bottom - 2]);
    }
    for (const fy of [0.25, 0.5, 0.75]) {
      points.push([left + 2, top + fy * (bottom - top)], [right - 2, top + fy * (bottom - top)]);
    }
    let off = 0;
    const under = new Set();
    for (const [px, py] of points) {
      if (px < 0 || py < 0 || px > innerWidth || py > innerHeight) { off += 1; continue; }
      const hit = document.elementFromPoint(px, py);
      const kind = hit && String(hit.className?.baseVal ?? hit.className).split(' ')[0];
      if (!onGraph(hit)) under.add(hit ? `${hit.tagName.toLowerCase()}.${kind}` : 'nothing');
    }
    if (off || under.size) hidden.push({id: node.id, title: node.title, off, under: [...under]});
  }
  return {nodes: app.graph.nodes.length, hidden, scale: ds.scale};
}
"""

SETTLE_TRIES, SETTLE_SECONDS = 10, 0.5
"""How long a node found under an overlay is looked at again before it counts: on a 2-core machine busy
with other runs, a Save Image node was once reported under a ``div.absolute`` that the next run of the
check, on the same files, did not find."""

# In the page: click a template's card; resolves once the dialog is gone and the workflow is open.
TEMPLATE_LOAD = r"""
async () => {
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const name = %(name)s, count = %(count)d;
  const card = document.querySelector(`[data-testid="template-workflow-${name}"]`);
  if (!card) throw new Error(`no card for ${name} in the template browser`);
  const workflows = app.extensionManager.workflow, before = workflows.activeWorkflow;
  card.click();
  // a new tab ("<name> (2)" when the file is open already) with the template's nodes
  for (const end = Date.now() + 60000; Date.now() < end; await sleep(100)) {
    if (!document.querySelector('[data-testid="template-workflows-content"]')
        && workflows.activeWorkflow !== before && workflows.activeWorkflow?.filename.startsWith(name)
        && app.graph.nodes.length === count) return;
  }
  throw new Error(`template ${name}: not opened in 60 s`);
}
"""


# In the page: set widgets of node ``id`` (``{name: value}``), listen to what the server sends about
# that node while the graph runs (the frontend's own api events: previews, progress, progress text,
# the end of the run), and queue the graph as the Run button does (command Comfy.QueuePrompt).
RUN_START = r"""
async (id, widgets) => {
  const node = app.graph.getNodeById(id);
  if (!node) throw new Error(`no node ${id} in the graph`);
  for (const [name, value] of Object.entries(widgets)) {
    const widget = (node.widgets || []).find((w) => w.name === name);
    if (!widget) throw new Error(`node ${id} has no widget ${name}`);
    widget.value = value;
    widget.callback?.(value);
  }
  const queued = Date.now();
  const seen = {previews: 0, firstPreview: null, texts: 0, lastText: null, progress: null, end: null};
  const mine = (nodeId) => String(nodeId) === String(id);
  const listeners = {
    b_preview_with_metadata: ({detail}) => {
      if (!mine(detail.displayNodeId)) return;
      seen.previews += 1;
      seen.firstPreview ??= (Date.now() - queued) / 1000;  // seconds after queueing
    },
    progress_text: ({detail}) => {
      if (mine(detail.nodeId)) { seen.texts += 1; seen.lastText = detail.text; }
    },
    progress: ({detail}) => { if (mine(detail.node)) seen.progress = [detail.value, detail.max]; },
    execution_success: () => { seen.end = 'success'; },
    execution_interrupted: () => { seen.end = 'interrupted'; },
    execution_error: ({detail}) => {
      seen.end = `error in node ${detail.node_id}: ${detail.exception_type}: ${detail.exception_message}`;
    },
  };
  for (const [type, listener] of Object.entries(listeners)) app.api.addEventListener(type, listener);
  window.__previewRun = {seen, stop: () => Object.entries(listeners)
    .forEach(([type, listener]) => app.api.removeEventListener(type, listener))};
  await app.extensionManager.command.execute('Comfy.QueuePrompt');
  return true;
}
"""

# In the page: what node ``id`` shows now (its preview image, as the canvas draws it from ``node.imgs``,
# and the text of its progress-text widget, and whether that text is on the page), with what RUN_START
# has heard so far and the dialogs open.
RUN_STATE = r"""
(id) => {
  const node = app.graph.getNodeById(id);
  // the classic canvas draws node.imgs; Nodes 2.0 shows the newest preview as an image in the node's element
  const latest = app.nodePreviewImages?.[String(id)]?.at(-1);
  const own = document.querySelector(`.lg-node[data-node-id="${id}"]`);
  const img = LiteGraph.vueNodesMode
    ? [...(own?.querySelectorAll('img') ?? [])].find((i) => latest && i.src === latest && i.offsetWidth > 0)
    : node?.imgs?.[0];
  const widget = (node?.widgets || []).find((w) => w.name === '$$node-text-preview');
  const text = widget ? String(widget.value ?? '') : null;
  const dialogs = [...document.querySelectorAll('.p-dialog')].filter((el) => el.offsetParent !== null)
    .map((el) => el.innerText.trim().replace(/\s+/g, ' ').slice(0, 300));
  return {...window.__previewRun.seen,
          image: img && img.complete && img.naturalWidth ? [img.naturalWidth, img.naturalHeight] : null,
          previewUrl: Boolean(app.nodePreviewImages?.[String(id)]?.length),
          text, textOnPage: Boolean(text) && document.body.innerText.includes(text),
          nodeSize: node ? node.size.map(Math.round) : null, dialogs};
}
"""

# In the page: what the pack's extension (web/best_of_tree.js) shows on Best of Tree node ``id`` after a run:
# the scores and best leaf it holds, how many leaf previews have loaded and are shown with a size, the leaf
# framed as the best, the line over the grid, and whether the grid is on the page inside the node, uncovered.
SCORE_STATE = r"""
(id) => {""" + NODE_BOX + r"""
  const node = app.graph.getNodeById(id);
  const view = node?.treerpoView;
  const widget = (node?.widgets || []).find((w) => w.name === 'treerpo_leaf_scores');
  const images = view ? view.images : [];
  const framed = widget ? [...widget.element.querySelectorAll('.best img')] : [];
  return {scores: view ? view.scores : null, best: view ? view.best : null, images: images.length,
          loaded: images.filter((img) => img.complete && img.naturalWidth > 0).length,
          drawn: images.filter((img) => img.isConnected && img.offsetWidth && img.offsetHeight).length,
          framed: framed.length === 1 ? images.indexOf(framed[0]) : null,
          title: widget?.element.querySelector('.ts-title')?.textContent ?? null,
          grid: widget && images.length ? shownIn(widget.element, node, images[0]) : null,
          vue: Boolean(LiteGraph.vueNodesMode)};
}
"""


class BrowserError(RuntimeError):
    """The browser could not be started or stopped answering."""


class Browser:
    """Headless Chromium (``executable``) driven by Playwright, one page of ``size``, and what that
    page logged: console messages (Chromium's log entries, such as failed requests, among them) and
    uncaught exceptions."""

    def __init__(self, executable: str, size: tuple[int, int]) -> None:
        if sync_playwright is None:
            raise BrowserError("Playwright is not installed: pip install playwright (the test extra); "
                               "its browser download (`playwright install`) is not needed")
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=executable, headless=True,
                                                             args=["--disable-gpu"], timeout=60_000)
        except PlaywrightError as err:
            self._playwright.stop()
            raise BrowserError(f"{executable}: Playwright cannot start it: "
                               f"{str(err).strip().splitlines()[0]}") from None
        self.page = self._browser.new_page(viewport={"width": size[0], "height": size[1]},
                                           device_scale_factor=1)
        self.events: list[dict] = []
        self.page.on("console", lambda m: self.events.append(  # log entries come without arguments
            {"kind": "console" if m.args else "log", "type": m.type, "text": m.text, **m.location}))
        self.page.on("pageerror", lambda err: self.events.append(
            {"kind": "exception", "text": err.stack or str(err)}))

    def evaluate(self, expression: str, timeout: float = 60.0):
        """The JSON value of ``expression`` in the page (a promise awaited for at most ``timeout``
        seconds); page errors raise."""
        late = f"new Error('no answer from the page in {timeout:.0f} s')"
        try:
            return self.page.evaluate(f"() => Promise.race([({expression}), new Promise((_, no) => "
                                      f"setTimeout(() => no({late}), {timeout * 1000:.0f}))])")
        except PlaywrightError as err:
            raise BrowserError(str(err).removeprefix("Page.evaluate: ")) from None

    def take_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()


def find_browser(given: str | None) -> str:
    if given:
        path = shutil.which(given)
        if path is None:
            raise FileNotFoundError(f"browser not found: {given} (give a Chromium executable)")
        return path
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("no Chromium found on PATH: install one (Debian: apt-get install "
                            "chromium-headless-shell) or pass --browser PATH")


def problems_in_log(events: Iterable[dict], origin: str) -> tuple[list[str], int]:
    """Console errors and warnings, uncaught exceptions and failed requests, one line each, and the
    count of those left out because they are about other hosts: this machine may be offline, and
    ComfyUI's content security policy blocks the frontend's calls to its registry and to model
    hosts anyway (it asks api.comfy.org about node packs, huggingface.co for file sizes)."""
    found, offline = [], 0
    for event in events:
        text, url = event.get("text") or "", event.get("url", "")
        if event["kind"] == "exception":
            found.append(f"exception: {text}")
        elif event["type"] not in ("error", "warning", "assert"):
            continue
        elif event["kind"] == "console":
            if "Failed to fetch" in text:  # the JS side of a blocked request to another host
                offline += 1
                continue
            where = f" (at {url.rsplit('/', 1)[-1]}:{event['lineNumber'] + 1})" if url else ""
            found.append(f"console.{event['type']}: {(text.splitlines() or [''])[0]}{where}")
        elif "Content Security Policy" in text or (url and not url.startswith(origin)):
            offline += 1
        else:
            found.append(f"log.{event['type']}: {text} {url}".rstrip())
    return [line.splitlines()[0][:300] for line in found], offline


def compare_graph(ui: dict, page: dict) -> list[str]:
    """What the frontend's graph has that differs from the UI file."""
    diffs = []
    for kind in ("missingNodes", "fileErrors", "thrown"):
        if page["seen"][kind]:
            diffs.append(f"{kind}: {page['seen'][kind]}")
    mine = {n["id"]: n for n in ui["nodes"]}
    built = {n["id"]: n for n in page["nodes"]}
    saved = {n["id"]: n for n in page["graph"]["nodes"]}
    if set(mine) != set(built):
        diffs.append(f"node ids: file {sorted(mine)}, page {sorted(built)}")
    for node_id in sorted(set(mine) & set(built)):
        file_node, node, serial = mine[node_id], built[node_id], saved[node_id]
        where = f"node {node_id} ({file_node['type']})"
        if node["type"] != file_node["type"] or not node["registered"] or not node["ownClass"]:
            diffs.append(f"{where}: built as {node['type']!r} (registered: {node['registered']}, "
                         f"own class: {node['ownClass']})")
        if node["hasErrors"]:
            diffs.append(f"{where}: marked has_errors")
        raw = [label for label in node["labels"] if "_" in label]
        if node["type"].startswith("TreeRPO") and raw:
            diffs.append(f"{where}: labelled with raw input ids {raw}")
        if serial.get("widgets_values") != file_node.get("widgets_values"):
            diffs.append(f"{where}: widgets_values {file_node.get('widgets_values')} -> "
                         f"{serial.get('widgets_values')} (widgets: {node['widgets']})")
        if "title" in file_node and node["title"] != file_node["title"]:
            diffs.append(f"{where}: title {file_node['title']!r} -> {node['title']!r}")
        if serial.get("mode", 0) != file_node.get("mode", 0):
            diffs.append(f"{where}: mode {file_node.get('mode', 0)} -> {serial.get('mode', 0)}")
        links_in = {i["name"]: (i["type"], i.get("link")) for i in file_node.get("inputs", [])}
        page_in = {i["name"]: (i["type"], i.get("link")) for i in serial.get("inputs", [])}
        for name, slot in links_in.items():
            if page_in.get(name) != slot:
                diffs.append(f"{where}: input {name} {slot} -> {page_in.get(name)}")
        for name, (_, link) in page_in.items():
            if link is not None and name not in links_in:
                diffs.append(f"{where}: extra linked input {name}")
        outs = [(o["name"], o["type"], sorted(o.get("links") or [])) for o in file_node.get("outputs", [])]
        page_outs = [(o["name"], o["type"], sorted(o.get("links") or [])) for o in serial.get("outputs", [])]
        if outs != page_outs:
            diffs.append(f"{where}: outputs {outs} -> {page_outs}")
    file_links = sorted(map(list, ui["links"]))
    page_links = sorted(map(list, page["graph"]["links"]))
    if len(file_links) != len(page_links):
        diffs.append(f"links: {len(file_links)} in the file, {len(page_links)} in the page")
    elif file_links != page_links:
        changed = [(a, b) for a, b in zip(file_links, page_links, strict=True) if a != b]
        diffs.append(f"links changed (file -> page): {changed}")
    return diffs


def compare_prompt(api: dict, output: dict) -> list[str]:
    """``graphToPrompt().output`` against the API file: ids, class types, inputs, titles."""
    diffs = []
    if set(api) != set(output):
        diffs.append(f"prompt node ids: api {sorted(api)}, page {sorted(output)}")
    for node_id in sorted(set(api) & set(output), key=lambda k: (len(k), k)):
        want, got = api[node_id], output[node_id]
        where = f"prompt node {node_id} ({want['class_type']})"
        if got.get("class_type") != want["class_type"]:
            diffs.append(f"{where}: class_type {got.get('class_type')!r}")
        got_inputs = got.get("inputs", {})
        for name in sorted(set(want["inputs"]) | set(got_inputs)):
            a, b = want["inputs"].get(name, "<absent>"), got_inputs.get(name, "<absent>")
            if a != b:
                diffs.append(f"{where}: input {name} {a!r} -> {b!r}")
        title = want.get("_meta", {}).get("title")
        if title is not None and got.get("_meta", {}).get("title") != title:
            diffs.append(f"{where}: title {title!r} -> {got.get('_meta', {}).get('title')!r}")
    return diffs


def open_frontend(server: Server, browser: str, size: tuple[int, int] = (1400, 900),
                  screenshots: bool = True, vue_nodes: bool = False) -> tuple[Browser, int]:
    """The frontend of ``server`` in a new page of ``size``, with the check's settings (and the
    screenshots' when ``screenshots``; the nodes drawn as Vue components, "Nodes 2.0", with ``vue_nodes``,
    else on the canvas), once it is set up: the page and its node types' count."""
    settings = {**SETTINGS, **(SCREENSHOT_SETTINGS if screenshots else {}), VUE_NODES: vue_nodes}
    request = urllib.request.Request(server.url + "/settings", data=json.dumps(settings).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()
    tools = Browser(browser, size)
    try:
        tools.page.goto(server.url + "/", wait_until="domcontentloaded", timeout=120_000)
        count = wait_for_app(tools)
        if tools.evaluate("Boolean(LiteGraph.vueNodesMode)") != vue_nodes:
            raise BrowserError(f"the page did not take the setting {VUE_NODES}={vue_nodes}")
        return tools, count
    except BaseException:
        tools.close()
        raise


def wait_for_app(tools: Browser, timeout: float = 180.0) -> int:
    """Wait for the frontend's setup: ``app.positionConversion`` is the last thing ``app.setup`` sets,
    and the registered node types stop changing."""
    probe = ("(() => { const a = window.app, L = window.LiteGraph;"
             " if (!a || !a.vueAppReady || !a.positionConversion || !L || !a.graph) return -1;"
             " return Object.keys(L.registered_node_types).length; })()")
    deadline, last, stable = time.monotonic() + timeout, -1, 0
    while time.monotonic() < deadline:
        count = tools.evaluate(probe)
        stable = stable + 1 if count == last and count > 0 else 0
        if stable >= 2:
            return count
        last = count
        time.sleep(0.5)
    raise BrowserError(f"the ComfyUI page did not finish loading in {timeout:.0f} s")


def check_file(tools: Browser, ui_file: Path, origin: str, saved: bool = False
               ) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of loading ``ui_file`` in the page as a dropped or opened file;
    ``saved``: a workflow saved with an earlier release (see :func:`check_loaded`)."""
    text = ui_file.read_text(encoding="utf-8")
    load = (f"() => app.handleFile(new File([{json.dumps(text)}], {json.dumps(ui_file.name)}, "
            "{type: 'application/json'}))")
    return check_loaded(tools, ui_file, origin, load, saved)


def check_loaded(tools: Browser, ui_file: Path, origin: str, load: str, saved: bool = False
                 ) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of opening the workflow of ``ui_file`` with ``load`` (an async
    JavaScript function of no arguments, run in the page). ``saved``: the file was saved with an earlier
    release of the pack, so the page must hold its values as the pack's migration writes them
    (``trainer/comfyui_host/layouts.py``, as ``web/saved_workflows.js`` does), and queue its API file with
    the inputs added since filled with their old-behaviour values."""
    ui = json.loads(ui_file.read_text(encoding="utf-8"))
    unread = unreadable_nodes(ui) if saved else {}
    if saved and not unread:
        ui = migrate_workflow(ui)
    api_file = api_path(ui_file)
    tools.take_events()
    page = tools.evaluate(f"({PAGE_CHECK})({load})", timeout=120)
    if unread:  # values no release fits: the page must say so on each such node, and may toast it
        return check_unread(ui_file, page, unread)
    failures = compare_graph(ui, page)
    logged, offline = problems_in_log(tools.take_events(), origin)
    failures += logged
    models = [m for batch in page["seen"]["missingModels"] for m in batch]
    for dialog in page["dialogs"]:
        if not (models and (dialog["title"] or dialog["text"]).startswith(MISSING_MODELS_TITLE)):
            failures.append(f"dialog: {dialog['text'][:200]}")
    failures += [f"toast: {text[:200]}" for text in page["toasts"]]
    if page["left"]:
        failures.append(f"{page['left']} dialog(s) could not be closed")
    if api_file.is_file():
        api = json.loads(api_file.read_text(encoding="utf-8"))
        failures += compare_prompt(with_added_inputs(api) if saved else api, page["output"])
    else:
        failures.append(f"no {api_file.name} to compare graphToPrompt() with")
    notes = []
    if models:
        notes.append("missing models dialog: " + ", ".join(f"{m.get('directory')}/{m.get('name')}"
                                                           for m in models))
    if offline:
        notes.append(f"{offline} blocked request(s) to other hosts left out")
    summary = f"{short_name(ui_file)}: {len(page['nodes'])} nodes, {len(page['graph']['links'])} links"
    return summary, failures, notes


UNREAD_BADGE = "fit no release"
"""Words of the badge web/saved_workflows.js puts on a node whose saved values fit no release."""


def unreadable_nodes(ui: dict) -> dict[int, str]:
    """Node id -> the one line of the pack's migration, for each node of a saved workflow whose values it
    cannot read (no release's layout fits them)."""
    record = read_record()
    found = {}
    for node in ui["nodes"]:
        values = node.get("widgets_values")
        if node.get("type") in record.current[1] and isinstance(values, list):
            try:
                migrate_values(record, node["type"], values)
            except ValueError as err:
                found[node["id"]] = str(err)
    return found


def check_unread(ui_file: Path, page: dict, unread: dict[int, str]) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of a saved workflow with values the migration cannot read: each such node
    shows a badge that says so (its values are left as they were, for the server to refuse by name)."""
    badges = {node["id"]: node["badges"] for node in page["nodes"]}
    failures = [f"node {i}: no badge says its values were not read ({line})" for i, line in unread.items()
                if not any(UNREAD_BADGE in text for text in badges.get(i, []))]
    failures += [f"toast: {text[:200]}" for text in page["toasts"] if UNREAD_BADGE not in text]
    failures += [f"{kind}: {page['seen'][kind]}" for kind in ("missingNodes", "fileErrors", "thrown")
                 if page["seen"][kind]]
    notes = [f"node {i}: {text}" for i in unread for text in badges.get(i, []) if UNREAD_BADGE in text]
    return f"{short_name(ui_file)}: {len(page['nodes'])} nodes, values not read", failures, notes


def migrated_nodes(ui_file: Path) -> list[int]:
    """Ids of the nodes of a saved workflow whose values the pack's migration moves or cannot read: what
    a close-up screenshot of a saved workflow shows."""
    record = read_record()
    ui = json.loads(ui_file.read_text(encoding="utf-8"))
    unread = unreadable_nodes(ui)
    return [node["id"] for node in ui["nodes"] if node["id"] in unread or (
        node.get("type") in record.current[1] and isinstance(node.get("widgets_values"), list)
        and migrate_values(record, node["type"], node["widgets_values"]) != node["widgets_values"])]


def short_name(ui_file: Path) -> str:
    """The workflow's API id (``best_of_tree`` for ``workflows/Embedded shapes model, best of 8...json``):
    the name of its lines and screenshots."""
    return api_path(ui_file).name[: -len(".api.json")]


def save_screenshot(tools: Browser, folder: Path, name: str, fit: bool = True,
                    nodes: list[int] | None = None, settle: float = 0.5) -> Path:
    """The page as it shows now, as ``<folder>/<name>.png``; with ``fit``, the whole graph in view
    first (FIT_VIEW), or with ``nodes``, those nodes alone, up to twice life size; ``settle`` seconds
    later (the canvas draws on the next frame)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (fit or nodes) and not tools.evaluate(f"({FIT_VIEW})({json.dumps(nodes)}, {2.0 if nodes else 1.25})"):
        raise BrowserError(f"{name}: the graph could not be fitted into view (no nodes?)")
    time.sleep(settle)
    path = folder / f"{name}.png"
    tools.page.screenshot(path=path)
    return path


def check_template_browser(tools: Browser, origin: str,
                           shots: Path | None) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of opening the template browser on this pack's category (the
    dialog stays open): its cards must be the pack's UI workflows, which ``GET /workflow_templates``
    lists, each with its thumbnail (``<name>.jpg``, loaded, not the placeholder the frontend shows for a
    missing one) and its name as title and description, in plain words. A PNG of the dialog,
    ``template_browser.png``, goes into ``shots``."""
    with urllib.request.urlopen(origin + "/workflow_templates", timeout=30) as reply:
        listed = sorted(json.load(reply).get(PACK_NAME, []))
    ours = sorted(p.name[: -len(".json")] for p in ui_files([]))
    failures, notes, names = [], [], []
    if listed != ours:
        failures.append(f"GET /workflow_templates lists {listed} for {PACK_NAME}, workflows/ has {ours}")
    tools.take_events()
    thumbnails = f"{origin}/api/workflow_templates/{PACK_NAME}/"
    try:
        page = tools.evaluate(f"({TEMPLATE_BROWSER})({json.dumps(PACK_NAME)})", timeout=150)
        names = sorted(page["names"])
        if names != listed:
            failures.append(f"the template browser shows {names} under {PACK_NAME}, "
                            f"the server lists {listed}")
        for card in page["cards"]:
            failures += check_card(card, thumbnails)
    except BrowserError as err:
        failures.append(str(err).strip().splitlines()[0])
    finally:
        if shots is not None:
            notes.append(f"screenshot: {save_screenshot(tools, shots, 'template_browser', fit=False)}")
    events = tools.take_events()
    missing = [e for e in events if e.get("url", "").startswith(thumbnails) and "404" in e["text"]]
    failures += [f"thumbnail not found (404): {urllib.parse.unquote(e['url'][len(thumbnails):])}"
                 for e in missing]
    logged, offline = problems_in_log([e for e in events if e not in missing], origin)
    failures += logged
    if offline:
        notes.insert(0, f"{offline} blocked request(s) to other hosts left out")
    if names and not failures:
        notes.insert(0, "every card with its thumbnail, title and description")
    return f"template browser: {len(names)} templates under {PACK_NAME}", failures, notes


def check_card(card: dict, thumbnails: str) -> list[str]:
    """A template's card: its thumbnail, fetched from the server (a JPEG of the size the page shows) and
    shown (an image loaded from that URL, not the placeholder), and its title and description, which
    frontend 1.32.9 takes from the file name (the description with '-' and '_' as spaces)."""
    name, failures = card["name"], []
    url = thumbnails + urllib.parse.quote(f"{name}.jpg")
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            kind, data = reply.headers.get("Content-Type", ""), reply.read()
        with Image.open(io.BytesIO(data)) as image:
            size = list(image.size)
        if "jpeg" not in kind:
            failures.append(f"card {name!r}: its thumbnail is served as {kind!r}, not image/jpeg")
    except (urllib.error.URLError, OSError) as err:
        return [f"card {name!r}: thumbnail {name}.jpg: {err}"]
    shown = [i for i in card["images"] if i["src"].startswith("blob:") or i["src"] == url]
    if not any(i["size"] == size for i in shown):
        failures.append(f"card {name!r}: its thumbnail is not shown (images on the card: "
                        f"{[(i['src'][:60], i['size']) for i in card['images']]})")
    if card["title"] != name:
        failures.append(f"card {name!r}: title {card['title']!r}")
    if card["description"] != name.replace("-", " ").replace("_", " ").strip():
        failures.append(f"card {name!r}: description {card['description']!r}")
    if "_" in name:
        failures.append(f"card {name!r}: a raw file name as title (name the UI file in plain words: "
                        "scripts/api_to_ui.py TITLES)")
    return failures


def check_template(tools: Browser, ui_file: Path, origin: str,
                   shots: Path | None) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of opening ``ui_file`` by clicking its card in the template browser
    (opened again unless it is open; the frontend fetches the file from ``/api/workflow_templates/<pack>/``),
    checked as a file is; then every node must be whole in the window, not under a menu or toolbar
    (IN_VIEW), as the frontend placed it; photographed as ``template_<id>.png``."""
    name = ui_file.name[: -len(".json")]
    count = len(json.loads(ui_file.read_text(encoding="utf-8"))["nodes"])
    if not tools.evaluate("Boolean(document.querySelector('[data-testid=\"template-workflows-content\"]'))"):
        tools.evaluate(f"({TEMPLATE_BROWSER})({json.dumps(PACK_NAME)})", timeout=150)
    summary, failures, notes = check_loaded(tools, ui_file, origin,
                                            TEMPLATE_LOAD % {"name": json.dumps(name), "count": count})
    view = tools.evaluate(f"({IN_VIEW})()")
    for _ in range(SETTLE_TRIES):  # an overlay a busy machine has not yet taken away
        if not view["hidden"]:
            break
        time.sleep(SETTLE_SECONDS)
        view = tools.evaluate(f"({IN_VIEW})()")
    for node in view["hidden"]:
        where = (f"{node['off']} of its edge points off the window" if node["off"] else "") + (
            f"{' and ' if node['off'] else ''}under {', '.join(node['under'])}" if node["under"] else "")
        failures.append(f"node {node['id']} ({node['title']}) not whole in view: {where}")
    if not view["hidden"]:
        notes.append(f"all {view['nodes']} nodes whole in view at zoom {view['scale']:.2f}")
    if shots is not None:
        path = save_screenshot(tools, shots, f"template_{short_name(ui_file)}", fit=False)
        notes.append(f"screenshot: {path}")
    return f"template {summary}", failures, notes


def training_curve_shown(state: dict) -> bool:
    """The training node shows a reward curve and, on the page, its progress text from iteration 3 on
    (or the last, for fewer iterations): a curve of a few points."""
    match = re.search(r"iteration (\d+)/(\d+)", state["text"] or "")
    return bool(state["image"] and state["previewUrl"] and match and state["textOnPage"]
                and int(match[1]) >= min(3, int(match[2])))


def tree_preview_shown(state: dict) -> bool:
    """The Best of Tree node shows a live preview of its branches from half its steps on, when they
    are mostly drawn (and half are left to photograph them: 3 s of 100 steps on two idle cores)."""
    done, steps = state["progress"] or (0, 1)
    return bool(state["image"] and state["previewUrl"] and state["previews"] >= 2 and done >= 0.5 * steps)


PREVIEW_OPTIONS = ("--preview-method", "auto")  # latent previews while sampling (latent2rgb here)
# workflow, the node whose live preview is photographed, widgets changed first, when to photograph it,
# whether to interrupt the run then (all 12 iterations: half a minute on two idle cores) or let it end
PREVIEW_RUNS = (
    ("train_embedded", "TreeRPOTrainLoRA", {}, training_curve_shown, True),
    # more steps than the file's 10, so that the tree grows long enough for its previews to be caught
    ("best_of_tree", "TreeRPOBestOfTree", {"steps": 100}, tree_preview_shown, False),
)


def run_with_previews(tools: Browser, server: Server, ui_file: Path, node_type: str, widgets: dict,
                      shown, interrupt: bool, shots: Path | None,
                      timeout: float = 600.0) -> tuple[str, list[str], list[str]]:
    """(summary, failures, notes) of running ``ui_file`` from the page as a user does (opened as a file,
    queued with the Run button's command) until the node of ``node_type`` shows its live preview
    (``shown(state)`` of RUN_STATE), when the page is photographed zoomed on that node
    (``run_<name>.png`` in ``shots``); then, with ``interrupt``, the run is interrupted (the Interrupt
    command), and the check waits for its end and for the server's queue to be empty."""
    name = short_name(ui_file)
    _, failures, _ = check_file(tools, ui_file, server.url)  # opened as a file, and checked as one
    notes: list[str] = []
    node_id = next(n["id"] for n in json.loads(ui_file.read_text(encoding="utf-8"))["nodes"]
                   if n["type"] == node_type)
    summary = f"run {name}: {node_type} (node {node_id})" + "".join(f", {k}={v}" for k, v in widgets.items())
    tools.take_events()
    started = time.monotonic()
    tools.evaluate(f"({RUN_START})({node_id}, {json.dumps(widgets)})")
    probe = f"({RUN_STATE})({node_id})"
    state: dict = tools.evaluate(probe)
    while time.monotonic() < started + timeout and not (state["dialogs"] or state["end"] or shown(state)):
        time.sleep(0.25)
        state = tools.evaluate(probe)
    if state["image"]:
        progress = ", progress {}/{}".format(*state["progress"]) if state["progress"] else ""
        notes.append(f"preview {state['image'][0]}x{state['image'][1]} shown on the node "
                     f"({state['previews']} preview(s) received{progress}, the first "
                     f"{state['firstPreview']:.0f} s after queueing)")
    else:
        failures.append(f"no preview image shown on node {node_id} ({state['previews']} preview(s) received "
                        f"in {time.monotonic() - started:.0f} s; run: {state['end'] or 'not ended'})")
    if state["text"] is not None:
        notes.append(f"progress text {'on the page' if state['textOnPage'] else 'NOT on the page'}: "
                     f"{state['text']!r} ({state['texts']} received)")
    if state["image"] and shots is not None:
        path = save_screenshot(tools, shots, f"run_{name}", nodes=[node_id], settle=0.25)  # still running
        end = tools.evaluate(probe)["end"]
        notes.append(f"photographed {time.monotonic() - started:.0f} s after queueing, "
                     + ("while the node ran" if end is None else f"after the run ended ({end})"))
        notes.append(f"screenshot: {path}")
    if not shown(state):
        why = (f"the run ended ({state['end']})" if state["end"] else "a dialog opened" if state["dialogs"]
               else f"{time.monotonic() - started:.0f} s passed")
        failures.append(f"{why} before the node showed what {shown.__name__} waits for")
    failures += [f"dialog: {text}" for text in state["dialogs"]]
    if interrupt and state["end"] is None:  # stop it where it is, as the Interrupt button does
        tools.evaluate("app.extensionManager.command.execute('Comfy.Interrupt')")
    while state["end"] is None and not state["dialogs"] and time.monotonic() < started + timeout:
        time.sleep(0.25)  # (a dialog without an end: the prompt was refused, nothing runs)
        state = tools.evaluate(probe)
    tools.evaluate("window.__previewRun.stop()")
    while time.monotonic() < started + timeout:
        queue = server.get("/queue")
        if not queue.get("queue_running") and not queue.get("queue_pending"):
            break
        time.sleep(0.25)
    else:
        failures.append(f"the server's queue is not empty {timeout:.0f} s after queueing")
    expected = ("interrupted", "success") if interrupt else ("success",)  # it may end before the interrupt
    if state["end"] not in expected:
        failures.append(f"the run: {state['end'] or 'no end heard'} (expected: {' or '.join(expected)})")
    time.sleep(0.5)  # the canvas draws what the end of the run changed
    last = tools.evaluate(probe)
    shows = "a {}x{} image".format(*last["image"]) if last["image"] else "no image"
    notes.append(f"run {state['end'] or 'not ended'} {time.monotonic() - started:.0f} s after queueing; "
                 f"then the node shows {shows}" + (f" and text {last['text']!r}" if last["text"] else ""))
    if node_type == "TreeRPOBestOfTree" and state["end"] == "success":
        shown_failures, shown_notes = scores_shown(tools, server, name, node_id, shots)
        failures += shown_failures
        notes += shown_notes
    failures += problems_in_log(tools.take_events(), server.url)[0]
    time.sleep(1.5)  # the "interrupted" toast goes by itself; close what is left (an error's dialog)
    tools.evaluate("[...document.querySelectorAll('.p-dialog .p-dialog-close-button, "
                   ".p-toast-message .p-toast-close-button')].forEach((b) => b.click())")
    return summary, failures, notes


# In the page: the view centred on the score grid of node ``id`` (and the widgets just above it), as large as
# fits, at most twice life size.
GRID_VIEW = r"""
(id) => {
  const node = app.graph.getNodeById(id), canvas = app.canvas, ds = canvas.ds;
  const widget = (node?.widgets || []).find((w) => w.name === 'treerpo_leaf_scores');
  if (!widget || !widget.element.isConnected) return false;
  const width = canvas.canvas.width / devicePixelRatio, height = canvas.canvas.height / devicePixelRatio;
  // the grid's element, where either node view put it, back in graph units
  const box = canvas.canvas.getBoundingClientRect(), r = widget.element.getBoundingClientRect();
  const top = (r.top - box.top) / ds.scale - ds.offset[1];
  const bottom = (r.bottom - box.top) / ds.scale - ds.offset[1];
  const [x0, x1] = [node.pos[0] - 10, node.pos[0] + node.size[0] + 10];
  const [y0, y1] = [top - 60, bottom + 10];
  ds.scale = Math.min((width - 220) / (x1 - x0), (height - 260) / (y1 - y0), 2);
  ds.offset[0] = (width / 2 + 25) / ds.scale - (x0 + x1) / 2;
  ds.offset[1] = (height / 2 + 30) / ds.scale - (y0 + y1) / 2;
  canvas.setDirty(true, true);
  return true;
}
"""


def scores_shown(tools: Browser, server: Server, name: str, node_id: int,
                 shots: Path | None) -> tuple[list[str], list[str]]:
    """(failures, notes) of Best of Tree's scores on the node after its run (web/best_of_tree.js): the scores
    and best leaf the server sent for it (its history), every leaf's preview loaded, the grid inside the
    node; photographed zoomed on the node (``scores_<name>.png``) and on the grid
    (``scores_<name>_grid.png``)."""
    failures, notes = [], []
    probe = f"({SCORE_STATE})({node_id})"
    deadline = time.monotonic() + 30
    state = tools.evaluate(probe)
    while (state["scores"] is None or state["loaded"] < state["images"]) and time.monotonic() < deadline:
        time.sleep(0.25)
        state = tools.evaluate(probe)
    runs = [entry["outputs"][str(node_id)] for entry in server.get("/history").values()
            if "treerpo_scores" in entry.get("outputs", {}).get(str(node_id), {})]
    if not runs:
        return [f"the server's history holds no scores of node {node_id}"], notes
    sent, best = runs[-1]["treerpo_scores"], runs[-1]["treerpo_best"][0]
    if state["scores"] is None:
        return [f"node {node_id} shows no scores after its run (web/best_of_tree.js not loaded?)"], notes
    if len(state["scores"]) != len(sent) or any(abs(a - b) > 1e-9
                                                for a, b in zip(state["scores"], sent, strict=True)):
        failures.append(f"node {node_id} shows scores {state['scores']}, the server sent {sent}")
    if state["best"] != best:
        failures.append(f"node {node_id} marks leaf {state['best']} as best, the server said {best}")
    if state["images"] != len(sent) or state["loaded"] != len(sent) or state["drawn"] != len(sent):
        failures.append(f"{state['loaded']} of {len(sent)} leaf previews loaded on node {node_id}, "
                        f"{state['drawn']} shown with a size")
    if state["framed"] != best:
        failures.append(f"node {node_id} frames leaf {state['framed']} as the best, the server said {best}")
    if not (state["title"] or "").startswith(f"best: leaf {best} of {len(sent)}, "):
        failures.append(f"node {node_id}'s line over the grid: {state['title']!r}")
    grid = state["grid"] or {"attached": False, "size": [0, 0]}
    if not (grid["attached"] and min(grid["size"]) > 0 and grid.get("inside") and grid.get("uncovered")):
        failures.append(f"the score grid is not shown whole inside node {node_id}, uncovered: {grid} "
                        f"({'Nodes 2.0' if state['vue'] else 'classic'} view)")
    notes.append(f"after the run the node shows {len(sent)} leaves with their scores, leaf {best} framed as "
                 f"the best ({sent[best]:.4f}), {state['loaded']} previews loaded, the grid "
                 f"{grid['size'][0]}x{grid['size'][1]} inside the node")
    if shots is not None:
        notes.append(f"screenshot: {save_screenshot(tools, shots, f'scores_{name}', nodes=[node_id])}")
        tools.evaluate(f"({GRID_VIEW})({node_id})")
        notes.append(f"screenshot: {save_screenshot(tools, shots, f'scores_{name}_grid', fit=False)}")
    return failures, notes


def report(summary: str, failures: list[str], notes: list[str]) -> str:
    """A check's lines: summary, OK or the count of problems, notes (screenshots on lines of their
    own), then one line per problem."""
    shots = [note for note in notes if note.startswith("screenshot: ")]
    lines = [f"{summary}: " + ("OK" if not failures else f"{len(failures)} problem(s)")
             + "".join(f" ({note})" for note in notes if note not in shots)]
    return "\n".join(lines + [f"  - {line}" for line in failures] + [f"  {note}" for note in shots])


def ui_files(given: list[Path]) -> list[Path]:
    files = given or sorted(p for p in (REPO / "workflows").glob("*.json")
                            if not p.name.endswith(".api.json"))
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"no such workflow file: {file}")
        if file.name.endswith(".api.json"):
            raise ValueError(f"{file}: an API-format file; give the UI file <name>.json")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="UI workflows (default: workflows/*.json)")
    parser.add_argument("--comfyui", type=Path, default=None,
                        help="ComfyUI folder (default: $TREERPO_COMFYUI, else the checkout's .comfyui)")
    parser.add_argument("--browser", default=None, help="Chromium executable (default: first on PATH)")
    parser.add_argument("--verbose", action="store_true", help="also list what the page logged on start")
    parser.add_argument("--screenshots", type=Path, default=None,
                        help="also save a PNG of each loaded workflow (1400x900, fitted to view) "
                             "into this folder")
    parser.add_argument("--templates", action="store_true",
                        help="also open the template browser on this pack's templates (check its cards) and "
                             "open the first workflow from there; with --screenshots, PNGs of both")
    parser.add_argument("--run-previews", action="store_true",
                        help="also run train_embedded and best_of_tree from the page (ComfyUI started with "
                             "--preview-method auto) until their nodes show live previews; with "
                             "--screenshots, PNGs of those nodes mid-run (run_<name>.png)")
    parser.add_argument("--saved", action="store_true",
                        help="the files were saved with an earlier release (tests/fixtures/saved_workflows): "
                             "expect their values migrated to today's nodes")
    parser.add_argument("--vue-nodes", action="store_true",
                        help='draw the nodes as Vue components ("Nodes 2.0", the setting '
                             'Comfy.VueNodes.Enabled) instead of on the canvas')
    parser.add_argument("--find-browser", action="store_true",
                        help="only print the Chromium the check would use (exit status 2 when none)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.find_browser:
        try:
            print(find_browser(args.browser))
            return 0
        except FileNotFoundError as err:
            print(f"check_ui_workflows: {err}", file=sys.stderr)
            return 2
    try:
        files = ui_files(args.files)
        browser = find_browser(args.browser)
        comfyui = args.comfyui or comfyui_dir() or REPO / ".comfyui"
        if not (comfyui / "main.py").is_file():
            raise FileNotFoundError(f"{comfyui}: no ComfyUI there (`make comfyui` installs it)")
    except (FileNotFoundError, ValueError) as err:
        print(f"check_ui_workflows: error: {err}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="treerpo_ui_check_") as tmp:
        server: Server | None = None
        tools: Browser | None = None
        try:
            server = start_server(comfyui.resolve(), Path(tmp) / "comfyui",
                                  options=PREVIEW_OPTIONS if args.run_previews else ())
            shots = args.screenshots is not None
            tools, count = open_frontend(server, browser, (1400, 900) if shots else (1600, 1000), shots,
                                         args.vue_nodes)
            boot, _ = problems_in_log(tools.take_events(), server.url)
            view = "Nodes 2.0" if args.vue_nodes else "classic"
            print(f"frontend ready ({view} node view): {count} node types, "
                  f"{time.monotonic() - started:.0f} s "
                  f"({len(boot)} message(s) logged while starting, not counted"
                  + (")" if args.verbose else "; --verbose lists them)"))
            for line in boot if args.verbose else ():
                print(f"  . {line}")
            for file in files:
                summary, failures, notes = check_file(tools, file, server.url, args.saved)
                failed |= bool(failures)
                print(report(summary, failures, notes))
                if args.screenshots is not None:  # saved ones: <commit folder>_<id>, as releases share ids
                    name = f"{file.parent.name}_{short_name(file)}" if args.saved else short_name(file)
                    print(f"  screenshot: {save_screenshot(tools, args.screenshots, name)}")
                    if args.saved and (moved := migrated_nodes(file)):
                        path = save_screenshot(tools, args.screenshots, f"{name}_migrated", nodes=moved)
                        print(f"  screenshot: {path}")
            if args.templates:
                summary, failures, notes = check_template_browser(tools, server.url, args.screenshots)
                failed |= bool(failures)
                print(report(summary, failures, notes))
                for file in files if not failures else ():  # each opened from its card
                    summary, failures, notes = check_template(tools, file, server.url, args.screenshots)
                    failed |= bool(failures)
                    print(report(summary, failures, notes))
            for name, node_type, widgets, shown, interrupt in PREVIEW_RUNS if args.run_previews else ():
                ui_file = ui_path(REPO / "workflows" / "api" / f"{name}.api.json")
                summary, failures, notes = run_with_previews(tools, server, ui_file, node_type, widgets,
                                                             shown, interrupt, args.screenshots)
                failed |= bool(failures)
                print(report(summary, failures, notes))
        except (BrowserError, PlaywrightError, AssertionError, OSError) as err:
            print(f"check_ui_workflows: error: {str(err).strip()}", file=sys.stderr)
            return 2
        finally:
            if tools is not None:
                tools.close()
            if server is not None:
                stop_server(server)
    print(f"{'FAILED' if failed else 'all OK'} in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
