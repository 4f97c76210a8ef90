// Pick the leaves you like: the picking panel of TreeRPO Sample Trees to Pick (and a counter with a
// "pick" button on TreeRPO Train LoRA from Picks).
//
// The graph never waits for a click: the sampling node stores its trees in a picks folder and ends; this
// panel shows that folder's trees one at a time, from the oldest one not labelled yet, as a grid of large
// images. Click = like (again: undo), shift-click or right-click = dislike, keys 1-9 like leaf 1-9
// (shift: dislike), Enter or Space = save and go to the next tree, Left = back, Right = skip, Esc = close the
// large view. Each save goes to the server at once (nodes/picks_routes.py writes it to disk), so a closed
// tab or a restarted server loses nothing: the panel reads the folder again when the page loads.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const SAMPLE_NODE = "TreeRPOSampleToPick";
const TRAIN_NODE = "TreeRPOTrainFromPicks";
const PANEL = "treerpo_picker";
const STATUS = "treerpo_picks_status";
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;  // nodes/picks_folders.py: a plain folder name
const GAP = 8;
const PANEL_WIDTH = 640;  // the sampling node's width with its panel: four leaves of about 145 px a row
const CHROME = 150;  // the panel's lines above and below the grid, in pixels
const STYLE = `
.treerpo-picker { box-sizing: border-box; display: flex; flex-direction: column; gap: 6px; padding: 6px 8px;
  color: #ddd; font: 13px sans-serif; background: #1c1c1c; border-radius: 6px; outline: none;
  overflow: hidden; height: 100%; }
.treerpo-picker:focus { box-shadow: 0 0 0 2px #7aa2f7 inset; }
.treerpo-picker .tp-head { display: flex; justify-content: space-between; gap: 10px; align-items: baseline; }
.treerpo-picker .tp-count { font-weight: bold; white-space: nowrap; }
.treerpo-picker .tp-prompt { color: #bbb; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.treerpo-picker .tp-grid { display: grid; gap: ${GAP}px; justify-content: center; }
.treerpo-picker .tp-cell { position: relative; cursor: pointer; border: 3px solid #444; border-radius: 4px;
  background: #111; user-select: none; }
.treerpo-picker .tp-cell img { display: block; width: 100%; height: 100%; object-fit: contain;
  pointer-events: none; }
.treerpo-picker .tp-cell.pixelated img { image-rendering: pixelated; }
.treerpo-picker .tp-cell:hover { border-color: #888; }
.treerpo-picker .tp-cell.liked { border-color: #4ade80; box-shadow: 0 0 0 2px #4ade80; }
.treerpo-picker .tp-cell.disliked { border-color: #f87171; }
.treerpo-picker .tp-cell.disliked img { opacity: 0.35; }
.treerpo-picker .tp-num { position: absolute; top: 3px; left: 3px; padding: 0 5px; border-radius: 3px;
  background: rgba(0, 0, 0, 0.65); font: bold 12px sans-serif; }
.treerpo-picker .tp-mark { position: absolute; bottom: 3px; right: 3px; padding: 1px 6px; border-radius: 3px;
  font: bold 12px sans-serif; }
.treerpo-picker .liked .tp-mark { background: #4ade80; color: #0b2e13; }
.treerpo-picker .disliked .tp-mark { background: #f87171; color: #3b0808; }
.treerpo-picker .tp-msg { min-height: 18px; color: #9ca3af; }
.treerpo-picker .tp-msg.error { color: #fca5a5; font-weight: bold; }
.treerpo-picker .tp-msg.done { color: #4ade80; }
.treerpo-picker .tp-bar { display: flex; gap: 6px; }
.treerpo-picker .tp-bar button { flex: 1; padding: 5px 0; border: 1px solid #555; border-radius: 4px;
  background: #2a2a2a; color: #ddd; cursor: pointer; font: 13px sans-serif; }
.treerpo-picker .tp-bar button:hover:not(:disabled) { background: #383838; }
.treerpo-picker .tp-bar button:disabled { opacity: 0.4; cursor: default; }
.treerpo-picker .tp-bar button.tp-save { flex: 2; background: #14532d; border-color: #4ade80; font-weight: bold; }
.treerpo-picker .tp-help { color: #888; font-size: 11px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; }
.treerpo-overlay { position: fixed; inset: 0; z-index: 10000; background: rgba(0, 0, 0, 0.75);
  display: flex; align-items: center; justify-content: center; }
.treerpo-overlay .treerpo-picker { width: min(96vw, 1500px); height: 94vh; font-size: 15px; }
.treerpo-overlay .tp-grid { flex: 1; align-content: center; }
.treerpo-status { box-sizing: border-box; display: flex; gap: 8px; align-items: center; padding: 2px 4px;
  color: #ddd; font: 12px sans-serif; height: 100%; }
.treerpo-status span { flex: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.treerpo-status button { padding: 3px 10px; border: 1px solid #555; border-radius: 4px; background: #2a2a2a;
  color: #ddd; cursor: pointer; }
`;

function addStyle() {
  if (document.getElementById("treerpo-pick-style")) return;
  const style = document.createElement("style");
  style.id = "treerpo-pick-style";
  style.textContent = STYLE;
  document.head.appendChild(style);
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

/** Columns of a tree's grid: all in one row up to four leaves, four up to eight, then about square. */
function columnsFor(leaves) {
  return leaves <= 4 ? leaves : leaves <= 8 ? 4 : Math.ceil(Math.sqrt(leaves));
}

/** What one picks folder holds, and the person's place in it: shared by every view of that folder. */
class Picker {
  constructor(folder) {
    this.folder = folder;
    this.trees = [];
    this.index = -1;
    this.visited = [];  // indices shown before, for "back"
    this.marks = new Map();  // tree id -> {liked: Set, disliked: Set}, as clicked (saved or not)
    this.message = "";
    this.kind = "";  // "", "error" or "done"
    this.saving = false;
    this.listeners = new Set();
  }

  get tree() { return this.trees[this.index]; }
  get labelled() { return this.trees.filter((t) => t.labelled).length; }

  emit() { this.listeners.forEach((listener) => listener()); }

  url(path = "") { return `/treerpo/picks/${encodeURIComponent(this.folder)}${path}`; }

  leafUrl(tree, leaf) { return api.apiURL(this.url(`/${tree.id}/${leaf}.png`)); }

  /** Read the folder again (new trees after a run); keep the place when the current tree is still there.
   * Callers while a read is under way share it: a run's end and a loaded workflow ask from several places. */
  refresh() {
    this.pending ??= this.read().finally(() => { this.pending = null; });
    return this.pending;
  }

  async read() {
    const reply = await api.fetchApi(this.url("/state"));
    const body = await reply.json();
    if (!reply.ok) throw new Error(body.error ?? `HTTP ${reply.status}`);
    const current = this.tree?.id;
    this.trees = body.trees;
    for (const tree of this.trees) {
      if (!this.marks.has(tree.id) || tree.labelled) {
        this.marks.set(tree.id, { liked: new Set(tree.liked), disliked: new Set(tree.disliked) });
      }
    }
    const kept = this.trees.findIndex((t) => t.id === current);
    if (kept >= 0 && !this.trees[kept].labelled) this.index = kept;
    else this.goTo(this.nextUnlabelled(-1), false);
    this.emit();
  }

  /** The first unlabelled tree after ``from``, wrapping around; -1 when every tree is labelled. */
  nextUnlabelled(from) {
    for (let k = 1; k <= this.trees.length; k++) {
      const i = (from + k + this.trees.length) % this.trees.length;
      if (!this.trees[i].labelled) return i;
    }
    return -1;
  }

  goTo(index, remember = true) {
    if (remember && this.index >= 0 && index !== this.index) this.visited.push(this.index);
    if (index < 0) {
      this.index = this.trees.length ? Math.max(this.index, 0) : -1;
      this.say(this.trees.length ? `All ${this.trees.length} trees are labelled: train with TreeRPO Train `
        + "LoRA from Picks, or run the sampler with another seed for more." : "", "done");
      return;
    }
    this.index = index;
    this.say("");
  }

  say(message, kind = "") { this.message = message; this.kind = kind; }

  toggle(leaf, dislike) {
    const tree = this.tree;
    if (!tree || leaf < 0 || leaf >= tree.leaves) return;
    const marks = this.marks.get(tree.id);
    const [mine, other] = dislike ? [marks.disliked, marks.liked] : [marks.liked, marks.disliked];
    if (mine.has(leaf)) mine.delete(leaf);
    else { mine.add(leaf); other.delete(leaf); }
    if (this.kind === "error") this.say("");
    this.emit();
  }

  async save() {
    const tree = this.tree;
    if (!tree || this.saving) return;
    const marks = this.marks.get(tree.id);
    this.saving = true;
    try {
      const reply = await api.fetchApi(this.url(`/${tree.id}`), {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ liked: [...marks.liked].sort((a, b) => a - b),
                               disliked: [...marks.disliked].sort((a, b) => a - b) }),
      });
      const body = await reply.json();
      if (!reply.ok) {
        this.say(`Not saved: ${body.error ?? `HTTP ${reply.status}`}`, "error");
        return;
      }
      Object.assign(tree, { labelled: true, liked: body.liked, disliked: body.disliked });
      this.goTo(this.nextUnlabelled(this.index));
      if (this.kind !== "done") this.say(`Saved (${body.labelled} of ${body.total}).`);
    } catch (err) {
      this.say(`Not saved: ${err.message ?? err}`, "error");
    } finally {
      this.saving = false;
      this.emit();
      app.graph?.setDirtyCanvas(true, true);
    }
  }

  skip() {
    if (!this.trees.length) return;
    const next = this.nextUnlabelled(this.index);
    this.goTo(next >= 0 && next !== this.index ? next : (this.index + 1) % this.trees.length);
    this.emit();
  }

  back() {
    if (!this.visited.length) return;
    this.index = this.visited.pop();
    this.say(this.tree.labelled ? "Labelled before: change the marks and save again (the newest save counts)."
      : "");
    this.emit();
  }

  /** The panel's keys; true when ``event`` was one of them. */
  handleKey(event) {
    const digit = /^(Digit|Numpad)([1-9])$/.exec(event.code);
    if (digit) { this.toggle(Number(digit[2]) - 1, event.shiftKey); return true; }
    if (event.key === "Enter" || event.key === " ") { this.save(); return true; }
    if (event.key === "ArrowLeft" || event.key === "Backspace") { this.back(); return true; }
    if (event.key === "ArrowRight") { this.skip(); return true; }
    return false;
  }
}

const pickers = new Map();  // folder name -> Picker

function pickerFor(folder) {
  if (!pickers.has(folder)) pickers.set(folder, new Picker(folder));
  return pickers.get(folder);
}

/** The panel: a view of a Picker drawn into ``root``, sized by ``size()`` ([width, height] for the grid). */
class PickerView {
  constructor(picker, size, { large = false, onClose = null } = {}) {
    this.picker = picker;
    this.size = size;
    this.root = element("div", "treerpo-picker");
    this.root.tabIndex = 0;
    this.head = element("div", "tp-head");
    this.count = element("span", "tp-count");
    this.prompt = element("span", "tp-prompt");
    this.head.append(this.count, this.prompt);
    this.grid = element("div", "tp-grid");
    this.msg = element("div", "tp-msg");
    const bar = element("div", "tp-bar");
    this.backButton = element("button", "tp-back", "◀ back");
    this.skipButton = element("button", "tp-skip", "skip ▶");
    this.saveButton = element("button", "tp-save", "save and next ⏎");
    this.sizeButton = element("button", "tp-size", large ? "close ✕ (Esc)" : "larger ⤢");
    bar.append(this.backButton, this.skipButton, this.saveButton, this.sizeButton);
    const help = element("div", "tp-help", "click: like · shift-click or right-click: dislike · keys 1-9 "
      + "(shift: dislike) · Enter or Space: save and next · ← back · → skip");
    this.root.append(this.head, this.grid, this.msg, bar, help);
    this.backButton.onclick = () => picker.back();
    this.skipButton.onclick = () => picker.skip();
    this.saveButton.onclick = () => picker.save();
    this.sizeButton.onclick = () => (large ? onClose?.() : openLarge(picker));
    this.root.addEventListener("keydown", (event) => {
      if (event.ctrlKey || event.metaKey || event.altKey) return;
      if (event.key === "Escape" && large) { onClose?.(); event.preventDefault(); return; }
      if (picker.handleKey(event)) { event.preventDefault(); event.stopPropagation(); }
    });
    this.root.addEventListener("pointerenter", () => {  // keys work where the mouse is, without a click
      const active = document.activeElement;
      if (!active || !/^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) this.root.focus({ preventScroll: true });
    });
    this.root.addEventListener("contextmenu", (event) => { event.preventDefault(); event.stopPropagation(); });
    this.render = this.render.bind(this);
    picker.listeners.add(this.render);
  }

  dispose() { this.picker.listeners.delete(this.render); }

  render() {
    const picker = this.picker;
    const tree = picker.tree;
    this.count.textContent = `${picker.labelled} labelled of ${picker.trees.length} trees`;
    this.prompt.textContent = tree ? `tree ${picker.index + 1}: “${tree.prompt}”` : "";
    this.prompt.title = tree?.prompt ?? "";
    this.msg.textContent = picker.message;
    this.msg.className = `tp-msg ${picker.kind}`;
    this.backButton.disabled = !picker.visited.length;
    this.saveButton.disabled = !tree || picker.saving;
    this.skipButton.disabled = picker.trees.length < 2;
    if (!tree) { this.grid.replaceChildren(); return; }
    const cols = columnsFor(tree.leaves);
    const rows = Math.ceil(tree.leaves / cols);
    const [width, height] = this.size();
    const cell = Math.max(40, Math.floor(Math.min((width - (cols - 1) * GAP) / cols,
                                                  (height - (rows - 1) * GAP) / rows)));
    this.grid.style.gridTemplateColumns = `repeat(${cols}, ${cell}px)`;
    this.grid.style.gridAutoRows = `${cell}px`;
    const marks = picker.marks.get(tree.id);
    if (this.grid.dataset.tree !== tree.id || this.grid.children.length !== tree.leaves) {
      this.grid.dataset.tree = tree.id;
      this.grid.replaceChildren(...Array.from({ length: tree.leaves }, (_, leaf) => this.cell(tree, leaf)));
      this.preload();
    }
    [...this.grid.children].forEach((cellEl, leaf) => {
      const state = marks.liked.has(leaf) ? "liked" : marks.disliked.has(leaf) ? "disliked" : "";
      cellEl.className = `tp-cell ${state} ${tree.size[0] * 2 <= cell ? "pixelated" : ""}`;
      cellEl.querySelector(".tp-mark").textContent = state === "liked" ? "♥ like" : state ? "✕ no" : "";
      cellEl.querySelector(".tp-mark").style.display = state ? "" : "none";
    });
  }

  cell(tree, leaf) {
    const cellEl = element("div", "tp-cell");
    cellEl.dataset.leaf = String(leaf);
    const img = element("img");
    img.src = this.picker.leafUrl(tree, leaf);
    img.alt = `leaf ${leaf + 1}`;
    img.draggable = false;
    cellEl.append(img, element("span", "tp-num", String(leaf + 1)), element("span", "tp-mark"));
    cellEl.addEventListener("click", (event) => {
      event.stopPropagation();
      this.picker.toggle(leaf, event.shiftKey);
    });
    cellEl.addEventListener("contextmenu", (event) => {
      event.preventDefault();
      event.stopPropagation();
      this.picker.toggle(leaf, true);
    });
    return cellEl;
  }

  /** The next unlabelled tree's leaves, fetched ahead so that the next tree shows at once. */
  preload() {
    const picker = this.picker;
    const next = picker.trees[picker.nextUnlabelled(picker.index)];
    if (!next || next === picker.tree) return;
    for (let leaf = 0; leaf < next.leaves; leaf++) new Image().src = picker.leafUrl(next, leaf);
  }
}

/** The panel over the whole window, for long sessions: Esc or "close" goes back to the node. */
function openLarge(picker) {
  const overlay = element("div", "treerpo-overlay");
  const view = new PickerView(picker, () => [Math.min(window.innerWidth * 0.96, 1500) - 24,
                                             window.innerHeight * 0.94 - CHROME - 20],
                              { large: true, onClose: close });
  function close() {
    view.dispose();
    overlay.remove();
    window.removeEventListener("resize", view.render);
  }
  overlay.addEventListener("pointerdown", (event) => { if (event.target === overlay) close(); });
  overlay.append(view.root);
  document.body.append(overlay);
  window.addEventListener("resize", view.render);
  view.render();
  view.root.focus();
}

function folderWidget(node) {
  return node.widgets?.find((w) => w.name === "picks_folder");
}

function folderName(node) {
  const name = String(folderWidget(node)?.value ?? "").trim();
  return NAME.test(name) && !name.includes("..") ? name : null;
}

/** Grow ``node`` so that its widgets (the panel among them) fit, and move the nodes right of it right and
 * those below it down by as much as it grew, so that the panel hides none of them. */
function fit(node, width) {
  const [x, y] = node.pos;
  const [oldWidth, oldHeight] = node.size;
  node.setSize([width, node.size[1]]);  // first the width: the panel's height follows from it
  node.setSize([width, node.computeSize()[1]]);
  const [dx, dy] = [node.size[0] - oldWidth, node.size[1] - oldHeight];
  for (const other of node.graph?.nodes ?? []) {
    if (other === node) continue;
    if (dx > 0 && other.pos[0] >= x + oldWidth) other.pos[0] += dx;
    else if (dy > 0 && other.pos[1] >= y + oldHeight && other.pos[0] < x + oldWidth
             && other.pos[0] + other.size[0] > x) other.pos[1] += dy;
  }
  node.setDirtyCanvas(true, true);
}

/** The grid's room on the sampling node: the node's width, and rows of square cells. */
function panelHeight(node, picker) {
  const tree = picker.tree;
  if (!tree) return CHROME;
  const cols = columnsFor(tree.leaves);
  const width = node.size[0] - 36;
  const cell = Math.floor((width - (cols - 1) * GAP) / cols);
  return CHROME + Math.ceil(tree.leaves / cols) * (cell + GAP);
}

/** The folder's picker with its trees read again from the server; null (and a console line) when the
 * server could not answer, so a node keeps what it shows. */
async function refreshedPicker(name) {
  const picker = pickerFor(name);
  try {
    await picker.refresh();
  } catch (err) {
    console.warn(`TreeRPO picks: ${err.message ?? err}`);
    return null;
  }
  return picker;
}

/** Show the picking panel of the node's folder on the sampling node (once the folder holds trees). */
async function showPanel(node) {
  const name = folderName(node);
  if (!name) return;
  const picker = await refreshedPicker(name);
  if (!picker) return;
  if (!picker.trees.length && !node.treerpoPanel) return;
  if (node.treerpoPanel?.picker !== picker) {
    node.treerpoPanel?.view.dispose();
    const view = new PickerView(picker, () => [node.size[0] - 36, panelHeight(node, picker) - CHROME]);
    let widget = node.widgets?.find((w) => w.name === PANEL);
    if (widget) {
      widget.element.replaceChildren(view.root);
    } else {
      const holder = element("div");
      holder.style.height = "100%";
      holder.append(view.root);
      widget = node.addDOMWidget(PANEL, "treerpo.picker", holder, {
        serialize: false, hideOnZoom: false,
        getMinHeight: () => panelHeight(node, node.treerpoPanel.picker),
        getMaxHeight: () => panelHeight(node, node.treerpoPanel.picker),
      });
      widget.serialize = false;
      widget.options.serialize = false;
    }
    node.treerpoPanel = { picker, view, widget };
  }
  fit(node, Math.max(node.size[0], PANEL_WIDTH));
  node.treerpoPanel.view.render();  // at the node's new width
  for (const other of node.graph?.nodes ?? []) {  // a training node of this folder: its counter
    if (other.type === TRAIN_NODE && folderName(other) === name) showStatus(other);
  }
}

/** The train node's line: how many trees of its folder are labelled, and a button to pick more. */
async function showStatus(node) {
  const name = folderName(node);
  let widget = node.widgets?.find((w) => w.name === STATUS);
  if (!name) { if (widget) widget.element.firstChild.textContent = ""; return; }
  const picker = await refreshedPicker(name);
  if (!picker) return;
  // another call may have added the line while this one waited (created, then configured): use it
  widget = node.widgets?.find((w) => w.name === STATUS);
  if (!picker.trees.length && !widget) return;
  if (!widget) {
    const row = element("div", "treerpo-status");
    const text = element("span");
    const button = element("button", "", "pick ⤢");
    button.onclick = () => node.treerpoStatus?.picker.trees.length && openLarge(node.treerpoStatus.picker);
    row.append(text, button);
    widget = node.addDOMWidget(STATUS, "treerpo.picks_status", row, {
      serialize: false, hideOnZoom: false, getMinHeight: () => 30, getMaxHeight: () => 30,
    });
    widget.serialize = false;
    widget.options.serialize = false;
    fit(node, node.size[0]);
  }
  const update = () => {
    widget.element.firstChild.textContent = picker.trees.length
      ? `${picker.labelled} labelled of ${picker.trees.length} trees in ${name}`
      : `no trees in ${name} yet`;
  };
  if (node.treerpoStatus?.picker !== picker) {
    if (node.treerpoStatus) node.treerpoStatus.picker.listeners.delete(node.treerpoStatus.update);
    picker.listeners.add(update);
    node.treerpoStatus = { picker, update };
  }
  update();
}

function watchFolder(node, show) {
  const widget = folderWidget(node);
  if (!widget) return;
  const callback = widget.callback;
  widget.callback = function (...args) {
    const result = callback?.apply(this, args);
    show(node);
    return result;
  };
}

/** Show the node's panel or line once, on the next turn: a later call replaces an earlier one. */
function showSoon(node, show) {
  clearTimeout(node.treerpoShow);
  node.treerpoShow = setTimeout(() => show(node), 0);
}

app.registerExtension({
  name: "dynamic_treerpo.pick_leaves",
  setup() {
    addStyle();
    // a run may have added trees (sampling) or used the picks (training): read the folders again
    api.addEventListener("execution_success", () => {
      for (const node of app.graph?.nodes ?? []) {
        if (node.type === TRAIN_NODE) showStatus(node);
      }
    });
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== SAMPLE_NODE && nodeData.name !== TRAIN_NODE) return;
    const show = nodeData.name === SAMPLE_NODE ? showPanel : showStatus;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = onNodeCreated?.apply(this, arguments);
      watchFolder(this, show);
      showSoon(this, show);  // a node added by hand: its folder may hold trees already
      return result;
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function () {  // a loaded workflow: its folder's trees, if any
      const result = onConfigure?.apply(this, arguments);
      showSoon(this, show);  // replaces onNodeCreated's: the loaded folder name wins
      return result;
    };
    const onRemoved = nodeType.prototype.onRemoved;
    nodeType.prototype.onRemoved = function () {
      this.treerpoPanel?.view.dispose();
      if (this.treerpoStatus) this.treerpoStatus.picker.listeners.delete(this.treerpoStatus.update);
      return onRemoved?.apply(this, arguments);
    };
    if (nodeData.name === SAMPLE_NODE) {
      const onExecuted = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        onExecuted?.apply(this, arguments);
        if (output?.treerpo_picks?.length) showPanel(this);
      };
    }
  },
});
