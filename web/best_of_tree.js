// TreeRPO Best of Tree: show each leaf with its score, and which leaf won, on the node itself.
//
// The node's UI output (nodes/sampling.py, score_view) holds small previews of the leaves (PNGs in
// ComfyUI's temp folder), their scores, the best leaf and the reward's name. This extension shows them as
// a grid under the node's widgets: one cell per leaf (its image, its number and score, a bar for the
// score between the lowest and the highest), the best leaf framed in green with a "best" badge, and a
// line above the grid naming the best leaf. ComfyUI loads every .js file of the pack's web/ folder
// (WEB_DIRECTORY in __init__.py); registerExtension is its documented extension API.
//
// The grid is a DOM widget, so that both node views show it: the classic canvas places it over the node,
// and "Nodes 2.0" (the setting Comfy.VueNodes.Enabled, frontend 1.32.9) mounts it in the node's element
// but neither draws a canvas widget's drawing in its place nor shows a widget added to a node after a
// widget value changed. So the widget is added, empty, when the node is created, and filled after a run.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { addStyle, element } from "./dom.js";

const NODE_TYPE = "TreeRPOBestOfTree";
const WIDGET_NAME = "treerpo_leaf_scores";
const HEADER = 26;
const LABEL = 18;
const BAR = 5;
const GAP = 6;
const MARGIN = 10;  // the DOM widget's margin, each side, in the classic view
const BEST = "#4ade80";
const STYLE = `
.treerpo-scores { box-sizing: border-box; height: 100%; overflow: hidden; color: #ddd; font: 12px sans-serif;
  contain: inline-size; }
.treerpo-scores .ts-title { height: ${HEADER}px; line-height: ${HEADER}px; color: ${BEST}; font-weight: bold;
  font-size: 13px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.treerpo-scores .ts-grid { display: grid; gap: ${GAP}px; }
.treerpo-scores .ts-image { position: relative; box-sizing: border-box; border: 1px solid #555;
  background: #1b1b1b; }
.treerpo-scores .ts-image img { display: block; width: 100%; height: 100%; object-fit: contain; }
.treerpo-scores .ts-image img.pixelated { image-rendering: pixelated; }
.treerpo-scores .best .ts-image { border: 3px solid ${BEST}; }
.treerpo-scores .ts-badge { position: absolute; top: 0; left: 0; padding: 0 4px; background: ${BEST};
  color: #0b2e13; font: bold 11px/16px sans-serif; }
.treerpo-scores .ts-label { height: ${LABEL}px; line-height: ${LABEL}px; text-align: center; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; }
.treerpo-scores .best .ts-label { color: ${BEST}; font-weight: bold; }
.treerpo-scores .ts-bar { height: ${BAR - 2}px; margin-top: 1px; background: #333; }
.treerpo-scores .ts-bar div { height: 100%; background: #7aa2f7; }
.treerpo-scores .best .ts-bar div { background: ${BEST}; }
`;

/** The URL ComfyUI serves a saved or temporary image from. */
function viewUrl(file) {
  const query = new URLSearchParams({ filename: file.filename, subfolder: file.subfolder ?? "",
                                      type: file.type ?? "temp" });
  return api.apiURL(`/view?${query}`);
}

/** Columns of the grid: four for up to eight leaves, then about square, and cells of 24 px at least. */
function columns(count, width) {
  const wanted = count <= 8 ? Math.min(count, 4) : Math.ceil(Math.sqrt(count));
  return Math.max(1, Math.min(wanted, Math.floor((width + GAP) / (24 + GAP))));
}

/** Cell size, label height and the grid's whole height for ``count`` leaves shown ``width`` pixels wide. */
function layout(count, width) {
  const cols = columns(count, width);
  const cell = Math.max(1, Math.floor((width - (cols - 1) * GAP) / cols));
  const label = cell >= 56 ? LABEL : 0;  // too small for text: the bar alone tells the score
  const rows = Math.ceil(count / cols);
  return { cols, cell, label, height: HEADER + rows * (cell + label + BAR + GAP) };
}

/** The grid's width on the node: the widget's element as Nodes 2.0 lays it out, or the node's width less
 * the DOM widget's margins (the classic view sizes the element from it). */
function gridWidth(node, widget) {
  return globalThis.LiteGraph?.vueNodesMode && widget.element.clientWidth
    ? widget.element.clientWidth : node.size[0] - 2 * MARGIN;
}

/** The node's score widget (not saved with the workflow, not sent with the prompt), added empty. */
function scoreWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET_NAME);
  if (widget) return widget;
  const holder = element("div", "treerpo-scores");
  holder.style.display = "none";
  const height = () => (node.treerpoView
    ? layout(node.treerpoView.scores.length, gridWidth(node, widget)).height + 2 * MARGIN : 0);
  widget = node.addDOMWidget(WIDGET_NAME, "treerpo.leaf_scores", holder, {
    serialize: false, hideOnZoom: false, margin: MARGIN, getMinHeight: height, getMaxHeight: height,
  });
  widget.serialize = false;
  widget.options.serialize = false;
  new ResizeObserver(() => node.treerpoView?.render()).observe(holder);
  return widget;
}

/** The grid of ``view`` in the widget's element, sized to its width now. */
function render(node, widget, view, cells) {
  const { cols, cell, label } = layout(view.scores.length, gridWidth(node, widget));
  view.grid.style.gridTemplateColumns = `repeat(${cols}, ${cell}px)`;
  for (const { box, image, text } of cells) {
    box.style.width = box.style.height = `${cell}px`;
    image.classList.toggle("pixelated", image.naturalWidth > 0 && image.naturalWidth < cell);
    text.style.display = label ? "" : "none";
  }
}

/** Keep the view of a run's output on the node and show it there, the node grown to show it. */
function showScores(node, output) {
  const scores = (output?.treerpo_scores ?? []).map(Number);
  if (!scores.length) return;
  const files = output.treerpo_leaves ?? [];
  const best = Number(output.treerpo_best?.[0] ?? 0);
  const reward = String(output.treerpo_reward?.[0] ?? "reward");
  const widget = scoreWidget(node);
  const low = Math.min(...scores);
  const high = Math.max(...scores);
  const before = node.treerpoView
    ? layout(node.treerpoView.scores.length, gridWidth(node, widget)).height + 2 * MARGIN : 0;
  const grid = element("div", "ts-grid");
  const cells = scores.map((score, i) => {
    const cellEl = element("div", i === best ? "ts-cell best" : "ts-cell");
    cellEl.dataset.leaf = String(i);
    const box = element("div", "ts-image");
    const image = element("img");
    image.alt = `leaf ${i}`;
    image.draggable = false;
    if (files[i]) image.src = viewUrl(files[i]);
    box.append(image);
    if (i === best) box.append(element("span", "ts-badge", "best"));
    const text = element("div", "ts-label", `#${i}  ${score.toFixed(4)}`);
    text.title = `leaf ${i}: ${reward} ${score}`;
    const bar = element("div", "ts-bar");
    const fill = element("div");
    fill.style.width = `${Math.max(2, 100 * (high > low ? (score - low) / (high - low) : 1))}%`;
    bar.append(fill);
    cellEl.append(box, text, bar);
    grid.append(cellEl);
    return { box, image, text };
  });
  const title = element("div", "ts-title", `best: leaf ${best} of ${scores.length}, ${reward} `
                        + `${scores[best].toFixed(4)}`);
  const view = { scores, best, reward, grid, images: cells.map((c) => c.image) };
  view.render = () => render(node, widget, view, cells);
  cells.forEach(({ image }) => image.addEventListener("load", view.render));
  node.treerpoView = view;
  widget.element.replaceChildren(title, grid);
  widget.element.style.display = "";
  view.render();
  if (!globalThis.LiteGraph?.vueNodesMode) {  // the classic view: the grid below the widgets, the text
    // boxes keeping their height (Nodes 2.0 grows the node's element by itself)
    const height = layout(scores.length, gridWidth(node, widget)).height + 2 * MARGIN;
    const grown = node.size[1] - before + height + 4;
    node.setSize([node.size[0], Math.max(grown, node.computeSize()[1])]);
  }
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "dynamic_treerpo.best_of_tree",
  setup() {
    addStyle("treerpo-scores-style", STYLE);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE_TYPE) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      scoreWidget(this);  // empty until a run: see the top of this file
      return result;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      onExecuted?.apply(this, arguments);
      showScores(this, output);
    };
  },
});
