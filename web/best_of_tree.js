// TreeRPO Best of Tree: show each leaf with its score, and which leaf won, on the node itself.
//
// The node's UI output (nodes/sampling.py, score_view) holds small previews of the leaves (PNGs in
// ComfyUI's temp folder), their scores, the best leaf and the reward's name. This extension draws them as
// a grid under the node's widgets: one cell per leaf (its image, its number and score, a bar for the
// score between the lowest and the highest), the best leaf framed in green with a "best" badge, and a
// line above the grid naming the best leaf. ComfyUI loads every .js file of the pack's web/ folder
// (WEB_DIRECTORY in __init__.py); registerExtension is its documented extension API.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODE_TYPE = "TreeRPOBestOfTree";
const WIDGET_NAME = "treerpo_leaf_scores";
const MARGIN = 10;
const HEADER = 26;
const LABEL = 18;
const BAR = 5;
const GAP = 6;
const BEST = "#4ade80";

/** The URL ComfyUI serves a saved or temporary image from. */
function viewUrl(file) {
  const query = new URLSearchParams({ filename: file.filename, subfolder: file.subfolder ?? "",
                                      type: file.type ?? "temp" });
  return api.apiURL(`/view?${query}`);
}

/** Columns of the grid: four for up to eight leaves, then about square, and cells of 24 px at least. */
function columns(count, width) {
  const wanted = count <= 8 ? Math.min(count, 4) : Math.ceil(Math.sqrt(count));
  return Math.max(1, Math.min(wanted, Math.floor((width - 2 * MARGIN + GAP) / (24 + GAP))));
}

/** Cell size and label height for ``view`` drawn ``width`` pixels wide. */
function layout(view, width) {
  const count = view.scores.length;
  const cols = columns(count, width);
  const cell = Math.floor((width - 2 * MARGIN - (cols - 1) * GAP) / cols);
  const label = cell >= 56 ? LABEL : 0;  // too small for text: the bar alone tells the score
  const rows = Math.ceil(count / cols);
  const height = HEADER + rows * (cell + label + BAR + GAP) + MARGIN;
  return { cols, cell, label, rows, height };
}

function fitText(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  while (text.length > 1 && ctx.measureText(`${text}…`).width > width) text = text.slice(0, -1);
  return `${text}…`;
}

/** A canvas widget (not saved with the workflow, not sent with the prompt) that draws ``node.treerpoView``. */
function scoreWidget(node) {
  return {
    name: WIDGET_NAME,
    type: "treerpo.leaf_scores",
    value: null,
    serialize: false,
    options: { serialize: false },
    computeSize() {  // the node lays widgets out at its own width (ComfyUI calls this without one)
      const view = node.treerpoView;
      return [node.size[0], view ? layout(view, node.size[0]).height : 0];
    },
    draw(ctx, drawnNode, width, y) {
      const view = drawnNode.treerpoView;
      if (!view) return;
      const { cols, cell, label } = layout(view, width);
      const { scores, best, images, reward } = view;
      const low = Math.min(...scores);
      const high = Math.max(...scores);
      ctx.save();
      ctx.textBaseline = "middle";
      ctx.font = "bold 13px sans-serif";
      ctx.fillStyle = BEST;
      ctx.textAlign = "left";
      const title = `best: leaf ${best} of ${scores.length}, ${reward} ${scores[best].toFixed(4)}`;
      ctx.fillText(fitText(ctx, title, width - 2 * MARGIN), MARGIN, y + HEADER / 2);
      scores.forEach((score, i) => {
        const x = MARGIN + (i % cols) * (cell + GAP);
        const top = y + HEADER + Math.floor(i / cols) * (cell + label + BAR + GAP);
        const image = images[i];
        ctx.fillStyle = "#1b1b1b";
        ctx.fillRect(x, top, cell, cell);
        if (image?.complete && image.naturalWidth) {
          const scale = Math.min(cell / image.naturalWidth, cell / image.naturalHeight);
          const w = image.naturalWidth * scale;
          const h = image.naturalHeight * scale;
          ctx.imageSmoothingEnabled = scale < 1;  // small leaves stay sharp when enlarged
          ctx.drawImage(image, x + (cell - w) / 2, top + (cell - h) / 2, w, h);
        }
        const share = high > low ? (score - low) / (high - low) : 1;
        ctx.fillStyle = "#333";
        ctx.fillRect(x, top + cell + label + 1, cell, BAR - 2);
        ctx.fillStyle = i === best ? BEST : "#7aa2f7";
        ctx.fillRect(x, top + cell + label + 1, Math.max(2, cell * share), BAR - 2);
        if (label) {
          ctx.font = i === best ? "bold 12px sans-serif" : "12px sans-serif";
          ctx.fillStyle = i === best ? BEST : "#ddd";
          ctx.textAlign = "center";
          ctx.fillText(fitText(ctx, `#${i}  ${score.toFixed(4)}`, cell), x + cell / 2, top + cell + label / 2);
        }
        ctx.lineWidth = i === best ? 3 : 1;
        ctx.strokeStyle = i === best ? BEST : "#555";
        ctx.strokeRect(x - 0.5, top - 0.5, cell + 1, cell + 1);
        if (i === best && cell >= 40) {
          ctx.font = "bold 11px sans-serif";
          const badge = ctx.measureText("best").width + 8;
          ctx.fillStyle = BEST;
          ctx.fillRect(x, top, badge, 16);
          ctx.fillStyle = "#0b2e13";
          ctx.textAlign = "left";
          ctx.fillText("best", x + 4, top + 8);
        }
      });
      ctx.restore();
    },
  };
}

/** Keep the view of a run's output on the node, grow the node to show it, redraw as images arrive. */
function showScores(node, output) {
  const scores = (output?.treerpo_scores ?? []).map(Number);
  if (!scores.length) return;
  const files = output.treerpo_leaves ?? [];
  const redraw = () => node.setDirtyCanvas(true, true);
  const images = files.map((file) => {
    const image = new Image();
    image.onload = redraw;
    image.src = viewUrl(file);
    return image;
  });
  const before = node.treerpoView ? layout(node.treerpoView, node.size[0]).height : 0;
  node.treerpoView = { scores, images, best: Number(output.treerpo_best?.[0] ?? 0),
                       reward: String(output.treerpo_reward?.[0] ?? "reward") };
  if (!node.widgets?.some((w) => w.name === WIDGET_NAME)) node.addCustomWidget(scoreWidget(node));
  // the grid below the widgets, the text boxes keeping their height
  const grown = node.size[1] - before + layout(node.treerpoView, node.size[0]).height + 4;
  node.setSize([node.size[0], Math.max(grown, node.computeSize()[1])]);
  redraw();
}

app.registerExtension({
  name: "dynamic_treerpo.best_of_tree",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE_TYPE) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      onExecuted?.apply(this, arguments);
      showScores(this, output);
    };
  },
});
