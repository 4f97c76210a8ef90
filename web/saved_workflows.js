// Saved workflows across releases: a graph saved with an earlier release of the pack loads with every
// widget value in the widget it was saved for.
//
// The frontend restores a node's widget values by position (widgets_values), so an input added to a node,
// or one moved from required to optional, would shift every later value into the wrong widget. Before the
// frontend configures a loaded graph (the beforeConfigureGraph hook of frontend 1.32.9, which it awaits),
// this extension reads each of the pack's nodes' values by input name in the layout of the release they
// were saved with, and writes them in today's layout. An input that release lacked gets the value that
// keeps the graph doing what it did (TreeRPO Train LoRA from Picks' "keep following the prompt": off, the
// fixed picks weight of graphs saved before the guard). The layouts are web/node_layouts.json, written by
// scripts/record_node_layouts.py; trainer/comfyui_host/layouts.py does the same for `treerpo run-workflow`.
//
// Which release: the node property treerpo_layout, stamped on every node of the pack this extension sees
// created (so graphs saved from now on say it), else the newest release whose slots the values fit, by
// count and by kind of value. Values that fit no release are left as they are, and one line says so on
// the node itself (a red badge above its title, in both node views), in a toast and in the console; the
// server's validation then names the value it refuses.
import { app } from "../../scripts/app.js";

const STAMP = "treerpo_layout";
const CONTROL = ":control";
const CONTROL_VALUES = new Set(["fixed", "increment", "decrement", "randomize"]);

let record = null;
async function layouts() {
  if (!record) {
    const response = await fetch(new URL("./node_layouts.json", import.meta.url));
    record = await response.json();
  }
  return record;
}

function fits(kind, value) {
  if (kind === CONTROL) return CONTROL_VALUES.has(value);
  if (kind === "INT" || kind === "FLOAT") return typeof value === "number";
  if (kind === "BOOLEAN") return typeof value === "boolean";
  return typeof value === "string"; // STRING, COMBO
}

function fitsLayout(layout, values) {
  return layout.widgets.length === values.length && layout.widgets.every(([, kind], i) => fits(kind, values[i]));
}

// [release, layout] of a saved node's values, or null
function savedLayout(data, type, values, stamp) {
  const stamped = data.releases.find((r) => r.version === stamp)?.nodes[type];
  if (stamped && fitsLayout(stamped, values)) return [stamp, stamped];
  for (const release of [...data.releases].reverse()) {
    const layout = release.nodes[type];
    if (layout && fitsLayout(layout, values)) return [release.version, layout];
  }
  return null;
}

// the values in today's layout, or a line saying why they cannot be
export function migrateValues(data, type, values, stamp) {
  const current = data.releases[data.releases.length - 1].nodes[type];
  if (!current || !Array.isArray(values)) return { values };
  const found = savedLayout(data, type, values, stamp);
  if (!found) {
    return { values, problem: `${type}: its ${values.length} saved values fit no release of this pack: add ` +
                              "the node again" };
  }
  const [version, saved] = found;
  const byName = new Map(saved.widgets.map(([name], i) => [name, values[i]]));
  const added = data.added[type] ?? {};
  const out = [];
  for (const [name] of current.widgets) {
    if (byName.has(name)) out.push(byName.get(name));
    else if (name in added) out.push(added[name]);
    else return { values, problem: `${type}.${name}: graphs saved with ${version} lack it` };
  }
  return { values: out, from: version };
}

// A badge above the node's title with one line. LiteGraph draws whatever getWidth/draw a badge has (its
// own LGraphBadge class is not exported to extensions); the Vue node view shows its text and colours.
function warningBadge(text) {
  const font = "12px sans-serif";
  return {
    text, fgColor: "#ffffff", bgColor: "#b3261e", height: 20, visible: true,
    getWidth(ctx) {
      const saved = ctx.font;
      ctx.font = font;
      const width = ctx.measureText(text).width + 12;
      ctx.font = saved;
      return width;
    },
    draw(ctx, x, y) {
      const { font: savedFont, fillStyle, textBaseline, textAlign } = ctx;
      ctx.font = font;
      ctx.fillStyle = this.bgColor;
      ctx.beginPath();
      ctx.roundRect ? ctx.roundRect(x, y, this.getWidth(ctx), this.height, 5) : ctx.rect(x, y, this.getWidth(ctx), this.height);
      ctx.fill();
      Object.assign(ctx, { fillStyle: this.fgColor, textBaseline: "middle", textAlign: "left" });
      ctx.fillText(text, x + 6, y + this.height / 2 + 1);
      Object.assign(ctx, { font: savedFont, fillStyle, textBaseline, textAlign });
    },
  };
}

// node id -> the line that says why its saved values were left as they are (the graph being loaded)
const unread = new Map();

function nodesOf(graph) {
  const groups = [graph?.nodes ?? []];
  for (const subgraph of graph?.definitions?.subgraphs ?? []) groups.push(subgraph.nodes ?? []);
  return groups.flat();
}

app.registerExtension({
  name: "dynamic_treerpo.saved_workflows",

  async beforeConfigureGraph(graph) {
    unread.clear();
    const data = await layouts();
    const current = data.releases[data.releases.length - 1];
    for (const node of nodesOf(graph)) {
      if (!(node?.type in current.nodes)) continue;
      const { values, from, problem } = migrateValues(data, node.type, node.widgets_values,
                                                      node.properties?.[STAMP]);
      if (problem) {
        console.warn(`[TreeRPO] node ${node.id}: ${problem}`);
        app.extensionManager?.toast?.add({ severity: "warn", summary: "TreeRPO saved workflow",
                                           detail: `node ${node.id}: ${problem}`, life: 15000 });
        if (graph.nodes?.includes(node)) unread.set(node.id, problem);
        continue;
      }
      node.widgets_values = values;
      if (from !== undefined) node.properties = { ...(node.properties ?? {}), [STAMP]: current.version };
    }
  },

  loadedGraphNode(node) {
    const problem = unread.get(node.id);
    if (problem === undefined || !Array.isArray(node.badges)) return;
    unread.delete(node.id);
    const badge = warningBadge(`⚠ ${problem.slice(problem.indexOf(": ") + 2)}`);
    node.badges.push(() => badge);
  },

  async nodeCreated(node) {
    const data = await layouts();
    const current = data.releases[data.releases.length - 1];
    if (node.comfyClass in current.nodes && node.properties && !(STAMP in node.properties)) {
      node.properties[STAMP] = current.version;
    }
  },
});
