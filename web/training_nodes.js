// The pack's running nodes in both of the frontend's node views: the progress line in "Nodes 2.0", a
// node's ordinary images after a run in place of its last live preview, and the guard's line.
//
// Progress line. The nodes send "iteration 3/12: reward 0.4582" or "tree 2/3 stored in ..." as ComfyUI's
// progress text (nodes/comfy_door.py, send_node_text). The classic view shows it in a text widget the frontend
// adds to the node on the first message. Nodes 2.0 (the setting Comfy.VueNodes.Enabled; frontend 1.32.9)
// shows a node's widgets as they were when the node was added to the graph once a widget value has changed,
// and a widget's later values only through its own callbacks, so there that line stays empty or absent.
// This extension adds a line of its own, empty, when the node is created, and fills it in Nodes 2.0 only,
// when the node's element does not already show the text. In the classic view it stays empty, no height.
//
// Images. A training node shows its reward curve as the live preview while it trains (the progress bar's
// image). The frontend prefers a node's live preview to its "images" output, in both views, until the node
// runs again; so when a training node's run ends with ordinary images (a plot, a before/after grid), the
// stale preview is dropped (from app.nodePreviewImages, and from the reactive copy Nodes 2.0 draws from) so
// that the frontend shows those images. In the classic view the first of several images is then shown alone
// at the node's width, with the frontend's arrows to the others (see fitImages). TreeRPO Choose
// Checkpoint gives images too (the trade plot and the before/after grid): the same holds for it.
//
// The guard's line. TreeRPO Train LoRA from Picks (under the guard) and TreeRPO Choose Checkpoint end with
// one line saying which checkpoint was taken and why (nodes/checkpoints.py: the ui key "treerpo_guard", also
// sent as progress text). It shows on the node in a DOM widget of its own, added empty when the node is
// created (as above) and filled from the node's executed output, in both views, red when the base model
// was returned; it stays until the node runs again (a cached node's output comes again with the next run).
// The progress text that said the same is dropped: the classic view's text widget is removed (as the
// frontend itself removes it; the next progress text adds it again), and in Nodes 2.0 the pack's own
// progress line is emptied. Under it TreeRPO Train LoRA from Picks says which picks the run learned from
// (the ui key "treerpo_picks": "learned from 50 labelled trees (25 of them sampled by a trained model)"),
// so that after a second round of picks the node shows that the new picks were used.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const TEXT_NODES = new Set(["TreeRPOTrainLoRA", "TreeRPOTrainFromPicks", "TreeRPOSampleToPick"]);
const IMAGE_NODES = new Set(["TreeRPOTrainLoRA", "TreeRPOTrainFromPicks", "TreeRPOChooseCheckpoint"]);
const GUARD_NODES = new Set(["TreeRPOTrainFromPicks", "TreeRPOChooseCheckpoint"]);
const WIDGET_NAME = "treerpo_progress_text";
const GUARD_WIDGET = "treerpo_guard_line";
const GUARD_KEY = "treerpo_guard";  // the ui key of the guard's line (nodes/checkpoints.py, GUARD_TEXT)
const PICKS_KEY = "treerpo_picks";  // which picks a guarded run learned from (nodes/checkpoints.py, PICKS_TEXT)
const TEXT_PREVIEW = "$$node-text-preview";  // the frontend's progress text widget (classic view)
const IMAGE_PREVIEW = "$$canvas-image-preview";  // the frontend's image preview widget (classic view)
const BASE_RETURNED = /base model is returned unchanged/;  // the guard gave back the model it was given
const GUARD_MARGIN = 6;  // the DOM widget's margin in the classic view, each side (its height includes it)

function lineOf(node) {
  return node.widgets?.find((w) => w.name === WIDGET_NAME);
}

function addLine(node) {
  if (lineOf(node)) return;
  const line = document.createElement("div");
  line.className = "treerpo-progress-text";
  // wrapped at the node's width: its length never widens the node (contain: no intrinsic width)
  Object.assign(line.style, { display: "none", padding: "2px 4px", color: "#ddd", font: "12px sans-serif",
                              overflowWrap: "anywhere", contain: "inline-size" });
  const widget = node.addDOMWidget(WIDGET_NAME, "treerpo.progress_text", line, {
    serialize: false, hideOnZoom: false, getMinHeight: () => 0, getMaxHeight: () => 0,
  });
  widget.serialize = false;
  widget.options.serialize = false;
}

/** Show ``text`` on the node's own line in Nodes 2.0, unless the node's element shows it already. */
function showText(node, text) {
  const line = lineOf(node)?.element;
  if (!line) return;
  line.textContent = "";
  line.style.display = "none";
  if (!globalThis.LiteGraph?.vueNodesMode) return;
  requestAnimationFrame(() => {  // after the frontend has drawn its own line, if it does
    const el = document.querySelector(`.lg-node[data-node-id="${CSS.escape(String(node.id))}"]`);
    if (!el || el.textContent.includes(text)) return;
    line.textContent = text;
    line.title = text;
    line.style.display = "";
  });
}

function guardOf(node) {
  return node.widgets?.find((w) => w.name === GUARD_WIDGET);
}

/** The guard line's height in the classic view for its text at the node's width (0 while empty), margins
 * included, measured on a hidden copy of the element: the line wraps, so its height follows its length. */
function guardHeight(node) {
  const widget = guardOf(node);
  const el = widget?.element;
  const text = el?.textContent ?? "";
  if (!text) return 0;
  const width = Math.max(40, Math.round(node.size[0] - 2 * GUARD_MARGIN));
  if (widget.measured?.text !== text || widget.measured.width !== width) {
    const probe = el.cloneNode(true);
    Object.assign(probe.style, { position: "absolute", visibility: "hidden", left: "-10000px", top: "0",
                                 width: `${width}px`, height: "auto", display: "block", contain: "none" });
    document.body.append(probe);
    widget.measured = { text, width, height: probe.offsetHeight + 2 * GUARD_MARGIN };
    probe.remove();
  }
  return widget.measured.height;
}

function addGuardLine(node) {
  if (guardOf(node)) return;
  const line = document.createElement("div");
  line.className = "treerpo-guard-line";
  Object.assign(line.style, { display: "none", boxSizing: "border-box", padding: "3px 6px", color: "#d1d5db",
                              font: "12px/16px sans-serif", overflowWrap: "anywhere", contain: "inline-size",
                              whiteSpace: "pre-line",
                              borderLeft: "3px solid #60a5fa", background: "rgba(96, 165, 250, 0.08)" });
  const widget = node.addDOMWidget(GUARD_WIDGET, "treerpo.guard_line", line, {
    serialize: false, hideOnZoom: false, margin: GUARD_MARGIN,
    getMinHeight: () => guardHeight(node), getMaxHeight: () => guardHeight(node),
  });
  widget.serialize = false;
  widget.options.serialize = false;
}

/** Show the guard's ``text`` on the node (empty: none), red when the base model was returned, with
 * ``picks`` (which picks the run learned from) on a line of its own under it. */
function showGuard(node, text, picks = "") {
  const line = guardOf(node)?.element;
  const shown = text ? [text, picks].filter(Boolean).join("\n") : "";
  if (!line || line.textContent === shown) return;
  const base = BASE_RETURNED.test(text ?? "");
  line.textContent = shown;
  line.title = shown;
  line.classList.toggle("base", base);
  Object.assign(line.style, { display: text ? "" : "none", color: base ? "#fca5a5" : "#d1d5db",
                              borderLeftColor: base ? "#f87171" : "#60a5fa",
                              background: base ? "rgba(248, 113, 113, 0.10)" : "rgba(96, 165, 250, 0.08)" });
  if (text) {  // the progress text that said the same: not twice
    const own = lineOf(node)?.element;
    if (own?.textContent === text) { own.textContent = ""; own.style.display = "none"; }
    const index = node.widgets.findIndex((w) => w.name === TEXT_PREVIEW);
    if (index >= 0 && String(node.widgets[index].value ?? "") === text) {
      node.widgets[index].onRemove?.();
      node.widgets.splice(index, 1);
    }
  }
  if (!globalThis.LiteGraph?.vueNodesMode && node.computeSize) {  // classic: room for the line
    const height = node.computeSize()[1];
    if (height > node.size[1]) node.setSize([node.size[0], height]);
  }
  node.setDirtyCanvas?.(true, true);
}

/** The frontend's reactive copy of the live previews, which Nodes 2.0 draws from: the state of its
 * "nodeOutput" store, read through Pinia's public state tree (``pinia.state.value``) of the page's Vue app;
 * null when the page has none of these (another frontend version): then only the classic view's copy goes. */
function previewStore() {
  const pinia = document.getElementById("vue-app")?.__vue_app__?.config?.globalProperties?.$pinia;
  const previews = pinia?.state?.value?.nodeOutput?.nodePreviewImages;
  return previews && typeof previews === "object" ? previews : null;
}

/** After a run that gave ``output.images``: no stale live preview in their place (see the top). The
 * classic view reads ``app.nodePreviewImages``; Nodes 2.0 a reactive copy that only a change through it
 * redraws (deleting from the plain object leaves the old reward curve under the new images). */
function showImages(node, output) {
  if (!output?.images?.length) return;
  const graph = node.graph;
  const locator = graph && graph !== graph.rootGraph && graph.id ? `${graph.id}:${node.id}` : String(node.id);
  let dropped = false;
  for (const previews of [app.nodePreviewImages, previewStore()]) {
    if (previews && locator in previews) {
      delete previews[locator];
      dropped = true;
    }
  }
  node.treerpoImages = output.images.map((image) => String(image.filename));
  if (dropped) node.setDirtyCanvas?.(true, true);
}

/** Classic view, once the frontend has loaded the node's new images (it does when it draws the node): with
 * several, the first is shown alone at the node's width, the frontend's arrows stepping to the others (its
 * overview puts them side by side in equal square cells: a trade plot and a grid at a quarter of the
 * node's width each, too small to read), and the node grows until the image preview has room for each at
 * that width. The frontend shares a node's added height among its widgets that can grow (text boxes too),
 * so it grows a few times, on the frames after, until the preview has that room. */
function fitImages(node) {
  const imgs = node.imgs;
  const names = node.treerpoImages;
  if (!names || !imgs?.length || globalThis.LiteGraph?.vueNodesMode) return;
  if (node.treerpoFit?.imgs === imgs && node.treerpoFit.left <= 0) return;
  const preview = node.widgets?.find((w) => w.name === IMAGE_PREVIEW);
  if (node.treerpoFit?.imgs !== imgs) {  // the run's images, loaded and laid out: shown first alone
    const ours = (img, i) => img.complete && img.naturalWidth
      && decodeURIComponent(img.src).includes(names[i]);
    if (imgs.length !== names.length || !imgs.every(ours)) return;
    if (!preview?.computedHeight) return;  // laid out on a later frame
    node.treerpoFit = { imgs, left: 8 };
    if (imgs.length > 1 && node.imageIndex == null) node.imageIndex = 0;
  }
  const sizeLine = app.extensionManager?.setting?.get?.("Comfy.Node.AllowImageSizeDraw") ? 15 : 0;
  const width = node.size[0];
  const height = (img) => Math.min(img.naturalHeight, width * img.naturalHeight / img.naturalWidth);
  const room = sizeLine + Math.max(...imgs.map(height));  // each at the node's width, never enlarged
  const more = Math.ceil(room - (preview?.computedHeight ?? room));
  node.treerpoFit.left = more > 0 ? node.treerpoFit.left - 1 : 0;
  if (more > 0) node.setSize([width, node.size[1] + more]);
  node.setDirtyCanvas?.(true, true);
}

app.registerExtension({
  name: "dynamic_treerpo.training_nodes",
  setup() {
    api.addEventListener("progress_text", ({ detail }) => {
      if (!detail?.text || detail.nodeId == null) return;
      const node = app.graph?.getNodeById(detail.nodeId);
      if (node && TEXT_NODES.has(node.type)) showText(node, detail.text);
    });
    api.addEventListener("executing", ({ detail }) => {  // a guard node runs again: its old line goes
      const id = typeof detail === "object" && detail !== null ? detail.node ?? detail.display_node : detail;
      if (id == null) return;
      const node = app.graph?.getNodeById(id);
      if (node && GUARD_NODES.has(node.type)) showGuard(node, "");
    });
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (TEXT_NODES.has(nodeData.name)) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const result = onNodeCreated?.apply(this, arguments);
        addLine(this);
        if (GUARD_NODES.has(nodeData.name)) addGuardLine(this);
        return result;
      };
    }
    if (GUARD_NODES.has(nodeData.name) && !TEXT_NODES.has(nodeData.name)) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const result = onNodeCreated?.apply(this, arguments);
        addGuardLine(this);
        return result;
      };
    }
    if (IMAGE_NODES.has(nodeData.name)) {
      const onExecuted = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        showImages(this, output);  // before the frontend draws the node with its new output
        const result = onExecuted?.apply(this, arguments);
        if (GUARD_NODES.has(nodeData.name)) {
          showGuard(this, output?.[GUARD_KEY]?.[0] ?? "", output?.[PICKS_KEY]?.[0] ?? "");
        }
        return result;
      };
      const onDrawForeground = nodeType.prototype.onDrawForeground;
      nodeType.prototype.onDrawForeground = function () {
        const result = onDrawForeground?.apply(this, arguments);
        fitImages(this);
        return result;
      };
    }
  },
});
