// Pick the leaves you like: the picking panel of TreeRPO Sample Trees to Pick (and a counter with a
// "pick" button on TreeRPO Train LoRA from Picks).
//
// The graph never waits for a click: the sampling node stores its trees in a picks folder and ends; this
// panel shows that folder's trees one at a time, from the oldest one not labelled yet, as a grid of large
// images. Click = like (again: undo), shift-click or right-click = dislike, keys 1-9 like leaf 1-9
// (shift: dislike), Enter or Space = save and go to the next tree, Left = back, Right = skip, Esc = close the
// large view. Each save goes to the server at once (nodes/picks_routes.py writes it to disk), so a closed
// tab or a restarted server loses nothing: the panel reads the folder again when the page loads.
//
// When the server's answer names an order (``next_order``: the unlabelled trees, the most useful first), the
// tree shown first and after each save is the first of that list not labelled yet ("skip" goes on along it);
// without it, the oldest one not labelled yet. Its ``advice`` (one line, e.g. whether more picks still help)
// shows under the counters. After each save the folder is read again in the background (one GET of its state,
// not awaited): the advice and the order follow the new picks, and the tree shown stays where it is.
//
// Both node views of the frontend show the panel and the counter: the classic canvas places the DOM widgets
// over the nodes, and "Nodes 2.0" (the setting Comfy.VueNodes.Enabled) mounts each DOM widget in the node's
// own element. Nodes 2.0 (frontend 1.32.9) draws a node's widgets as they were when the node was added to the
// graph once any widget value has changed, so the widgets are added when the node is created, empty, and
// filled later; there the node is widened through its own CSS size (as its resize handle does) and the
// nodes around it are moved through the canvas's layout store (repositionNodesVueMode).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { addStyle, element } from "./dom.js";

const SAMPLE_NODE = "TreeRPOSampleToPick";
const TRAIN_NODE = "TreeRPOTrainFromPicks";
const PANEL = "treerpo_picker";
const STATUS = "treerpo_picks_status";
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;  // nodes/picks_folders.py: a plain folder name
const GAP = 8;
const PANEL_WIDTH = 640;  // the sampling node's width with its panel: four leaves of about 145 px a row
const CHROME = 150;  // the panel's lines above and below the grid, in pixels
const ADVICE = 22;  // the advice line under the panel's counter, when the server gives one
const STATUS_HEIGHT = 30;  // the training node's counter line (and as much again for its advice)
// (contain: inline-size: the panel and the counter take the node's width, and long lines never widen the
// node in Nodes 2.0, which lays a widget out by its content)
const STYLE = `
.treerpo-picker { box-sizing: border-box; display: flex; flex-direction: column; gap: 6px; padding: 6px 8px;
  color: #ddd; font: 13px sans-serif; background: #1c1c1c; border-radius: 6px; outline: none;
  overflow: hidden; height: 100%; contain: inline-size; }
.treerpo-picker:focus { box-shadow: 0 0 0 2px #7aa2f7 inset; }
.treerpo-picker .tp-head { display: flex; justify-content: space-between; gap: 10px; align-items: baseline; }
.treerpo-picker .tp-count { font-weight: bold; white-space: nowrap; }
.treerpo-picker .tp-prompt { color: #bbb; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.treerpo-advice { color: #9ca3af; font-size: 12px; overflow: hidden; text-overflow: ellipsis;
  white-space: nowrap; }
.treerpo-advice.more { color: #fbbf24; }
.treerpo-advice.enough { color: #4ade80; }
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
.treerpo-status { box-sizing: border-box; display: flex; flex-direction: column; justify-content: center;
  padding: 2px 4px; color: #ddd; font: 12px sans-serif; height: 100%; min-height: 26px; contain: inline-size; }
.treerpo-status .tp-row { display: flex; gap: 8px; align-items: center; }
.treerpo-status .tp-row span { flex: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.treerpo-status button { padding: 3px 10px; border: 1px solid #555; border-radius: 4px; background: #2a2a2a;
  color: #ddd; cursor: pointer; }
`;

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
    this.reviewing = false;  // the tree shown was reached with "back": a read of the folder keeps it
    this.generation = 0;  // counts saves begun and ended: an answer read across one is read again
    this.order = null;  // the server's next_order, as tree indices; null: oldest first
    this.advice = null;  // the server's advice: {text, more_helps}; null: none
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
    let body, generation;
    do {  // an answer that a save overtook may not hold that save: asked again
      generation = this.generation;
      const reply = await api.fetchApi(this.url("/state"));
      body = await reply.json();
      if (!reply.ok) throw new Error(body.error ?? `HTTP ${reply.status}`);
    } while (generation !== this.generation);
    const current = this.tree?.id;
    const hadAdvice = Boolean(this.advice);
    this.trees = body.trees;
    this.order = orderOf(body.next_order, this.trees);
    this.advice = adviceOf(body.advice);
    for (const tree of this.trees) {
      if (!this.marks.has(tree.id) || tree.labelled) {
        this.marks.set(tree.id, { liked: new Set(tree.liked), disliked: new Set(tree.disliked) });
      }
    }
    const kept = this.trees.findIndex((t) => t.id === current);
    if (kept >= 0 && (!this.trees[kept].labelled || this.reviewing)) this.index = kept;
    else this.goTo(this.nextUnlabelled(-1), false);
    const boxes = hadAdvice !== Boolean(this.advice) ? boxesShowing(this) : null;
    this.emit();
    if (boxes) refit(this, boxes);  // the advice line came or went: the nodes showing it resized
  }

  /** After a save: the folder read again in the background, so that the advice and the order follow the
   * new picks (the route answers in well under a second); nothing waits for it. */
  refreshSoon() {
    this.refresh().catch((err) => console.warn(`TreeRPO picks: ${err.message ?? err}`));
  }

  /** The first unlabelled tree after ``from``, wrapping around; -1 when every tree is labelled. With the
   * server's order, in that order (the unlabelled trees it leaves out after it, oldest first): its first
   * tree not labelled yet for ``from`` -1, else the next one after ``from`` (skip). */
  nextUnlabelled(from) {
    if (this.order) {
      const rest = this.trees.map((_, i) => i).filter((i) => !this.order.includes(i));
      const order = [...this.order, ...rest].filter((i) => !this.trees[i].labelled || i === from);
      const at = order.indexOf(from);
      for (let k = 1; k <= order.length; k++) {
        const i = order[(at + k) % order.length];
        if (!this.trees[i].labelled) return i;
      }
      return -1;
    }
    for (let k = 1; k <= this.trees.length; k++) {
      const i = (from + k + this.trees.length) % this.trees.length;
      if (!this.trees[i].labelled) return i;
    }
    return -1;
  }

  goTo(index, remember = true) {
    this.reviewing = false;
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
    this.generation += 1;
    let saved = false;
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
      // (the folder may have been read again meanwhile: its own record of this tree)
      const record = this.trees.find((t) => t.id === tree.id) ?? tree;
      Object.assign(record, { labelled: true, liked: body.liked, disliked: body.disliked });
      saved = true;
      // next: the first of the server's order not labelled yet, else the next oldest after this one
      this.goTo(this.nextUnlabelled(this.order ? -1 : this.index));
      if (this.kind !== "done") this.say(`Saved (${body.labelled} of ${body.total}).`);
    } catch (err) {
      this.say(`Not saved: ${err.message ?? err}`, "error");
    } finally {
      this.saving = false;
      this.generation += 1;
      this.emit();
      app.graph?.setDirtyCanvas(true, true);
      if (saved) this.refreshSoon();
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
    this.reviewing = true;
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

/** The server's ``next_order`` (tree ids) as indices into ``trees``, unknown ids left out; null when it
 * gives none (an older server), so that the panel keeps its oldest-first rule. */
function orderOf(ids, trees) {
  if (!Array.isArray(ids)) return null;
  const index = new Map(trees.map((tree, i) => [tree.id, i]));
  return [...new Set(ids.filter((id) => index.has(id)).map((id) => index.get(id)))];
}

/** The server's ``advice`` ({text: one line, more_helps: true, false or null}), or null without a line. */
function adviceOf(advice) {
  const text = typeof advice?.text === "string" ? advice.text.trim() : "";
  if (!text) return null;
  return { text, more: typeof advice.more_helps === "boolean" ? advice.more_helps : null };
}

/** Show ``advice`` (or nothing) in the line ``el``: amber while more picks help, green once they do not. */
function showAdvice(el, advice) {
  el.textContent = advice?.text ?? "";
  el.title = advice?.text ?? "";
  el.className = `treerpo-advice ${advice?.more === true ? "more" : advice?.more === false ? "enough" : ""}`;
  el.style.display = advice ? "" : "none";
}

const pickers = new Map();  // folder name -> Picker

function pickerFor(folder) {
  if (!pickers.has(folder)) pickers.set(folder, new Picker(folder));
  return pickers.get(folder);
}

/** The panel: a view of a Picker drawn into ``root``, sized by ``size()`` ([width, height] for the grid);
 * with ``observe``, drawn again whenever the panel's width changes (the node resized, or the view switched). */
class PickerView {
  constructor(picker, size, { large = false, onClose = null, observe = false } = {}) {
    this.picker = picker;
    this.size = size;
    this.root = element("div", "treerpo-picker");
    this.root.tabIndex = 0;
    this.head = element("div", "tp-head");
    this.count = element("span", "tp-count");
    this.prompt = element("span", "tp-prompt");
    this.head.append(this.count, this.prompt);
    this.advice = element("div", "treerpo-advice");
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
    this.root.append(this.head, this.advice, this.grid, this.msg, bar, help);
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
    if (observe && typeof ResizeObserver === "function") {
      let width = -1;
      this.observer = new ResizeObserver(() => {
        if (this.root.clientWidth && this.root.clientWidth !== width) {
          width = this.root.clientWidth;
          this.render();
        }
      });
      this.observer.observe(this.root);
    }
  }

  dispose() {
    this.picker.listeners.delete(this.render);
    this.observer?.disconnect();
  }

  render() {
    const picker = this.picker;
    const tree = picker.tree;
    this.count.textContent = `${picker.labelled} labelled of ${picker.trees.length} trees`;
    showAdvice(this.advice, picker.advice);
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
                                             window.innerHeight * 0.94 - CHROME - 20
                                               - (picker.advice ? ADVICE : 0)],
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

/** Whether the frontend draws nodes as Vue components ("Nodes 2.0") rather than on the canvas. */
function vueNodes() {
  return Boolean(globalThis.LiteGraph?.vueNodesMode);
}

/** The node's own element in Nodes 2.0 (null in the classic view, or while it is not drawn). */
function nodeElement(node) {
  if (!vueNodes()) return null;
  return document.querySelector(`.lg-node[data-node-id="${CSS.escape(String(node.id))}"]`);
}

/** The node's size as the view draws it, below its title: [width, height] in graph units. */
function boxOf(node) {
  const el = nodeElement(node);
  if (!el) return [...node.size];
  return [el.offsetWidth, el.offsetHeight - (globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30)];
}

const nextFrame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));

/** The node's element in Nodes 2.0 once the view has drawn it (a workflow just loaded: a few frames
 * later); null in the classic view, or when it does not come. */
async function drawnElement(node) {
  for (let frame = 0; vueNodes() && frame < 60; frame++) {
    const el = nodeElement(node);
    if (el) return el;
    await nextFrame();
  }
  return null;
}

/** Grow ``node`` to ``width`` with its widgets (the panel among them) fitted, and move the nodes right of it
 * right and those below it down by as much as it grew (``before``: its box before the change), or further
 * when one of them would still lie under it, so that the panel hides none of them. ``shrink``: its height
 * may also fall to what its widgets need. In Nodes 2.0 the node's element sets its size: it is widened as
 * its resize handle does (its CSS width; the frontend then reads the size back), and the others are moved
 * through the canvas's layout store. */
async function fit(node, width, before = boxOf(node), shrink = true) {
  const el = await drawnElement(node);
  if (vueNodes() && !el) return;  // not drawn (another graph shown): the view sizes it when it draws it
  const [x, y] = node.pos;
  if (el) {
    if (el.offsetWidth < width) el.style.setProperty("--node-width", `${width}px`);
    await nextFrame();  // the element's new layout, read back by the frontend's ResizeObserver
    await nextFrame();
  } else {
    node.setSize([width, node.size[1]]);  // first the width: the panel's height follows from it
    const height = node.computeSize()[1];
    node.setSize([width, shrink ? height : Math.max(height, node.size[1])]);
  }
  const after = boxOf(node);
  const title = globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  const others = (node.graph?.nodes ?? []).filter((other) => other !== node);
  // right of it: starting right of its middle; below it: starting below its middle, across its width
  const right = others.filter((other) => other.pos[0] > x + before[0] / 2);
  const below = others.filter((other) => !right.includes(other) && other.pos[1] > y + before[1] / 2
                                         && other.pos[0] < x + after[0] && other.pos[0] + other.size[0] > x);
  const beside = right.filter((other) => other.pos[1] - title < y + after[1]
                                         && other.pos[1] + other.size[1] > y);
  const dx = Math.max(0, after[0] - before[0], ...beside.map((other) => x + after[0] + 10 - other.pos[0]));
  const dy = Math.max(0, after[1] - before[1],
                      ...below.map((other) => y + after[1] + title + 10 - other.pos[1]));
  const moves = [...(dx > 0 ? right.map((other) => [other, other.pos[0] + dx, other.pos[1]]) : []),
                 ...(dy > 0 ? below.map((other) => [other, other.pos[0], other.pos[1] + dy]) : [])];
  if (el && moves.length && app.canvas?.repositionNodesVueMode) {
    app.canvas.repositionNodesVueMode(moves.map(([other, nx, ny]) => ({ node: other,
                                                                      newPos: { x: nx, y: ny } })));
  } else {
    for (const [other, nx, ny] of moves) other.pos = [nx, ny];
  }
  node.setDirtyCanvas(true, true);
}

/** The nodes showing ``picker`` (its panel, or its counter) with their boxes now: before the advice line
 * comes or goes. */
function boxesShowing(picker) {
  return (app.graph?.nodes ?? []).filter((node) => node.treerpoPanel?.picker === picker
                                                  || node.treerpoStatus?.picker === picker)
    .map((node) => [node, boxOf(node)]);
}

/** The nodes of ``boxes`` ([node, box before]) fitted to the panel or counter ``picker`` now draws. */
function refit(picker, boxes) {
  for (const [node, before] of boxes) {
    if (node.treerpoPanel?.picker === picker) fit(node, Math.max(boxOf(node)[0], PANEL_WIDTH), before);
    const status = node.treerpoStatus;
    if (status?.picker === picker) {
      const lines = picker.advice ? 2 : 1;
      if (lines > status.lines) {
        status.lines = lines;
        fit(node, boxOf(node)[0], before, false);
      }
    }
  }
}

/** The panel's width on the sampling node: the widget's element as the view lays it out (Nodes 2.0), or
 * the node's width less the DOM widget's margins (classic: the frontend sizes the element from it). */
function panelWidth(node) {
  const element = node.treerpoPanel?.widget.element;
  return vueNodes() && element?.clientWidth ? element.clientWidth : node.size[0] - 20;
}

/** The grid's room on the sampling node: the panel's width, and rows of square cells. */
function panelHeight(node, picker) {
  const tree = picker.tree;
  const chrome = CHROME + (picker.advice ? ADVICE : 0);
  if (!tree) return chrome;
  const cols = columnsFor(tree.leaves);
  const width = panelWidth(node) - 16;
  const cell = Math.floor((width - (cols - 1) * GAP) / cols);
  return chrome + Math.ceil(tree.leaves / cols) * (cell + GAP);
}

/** The node's DOM widget ``name``, added now when it has none: empty (no height) until it is filled. Added
 * when the node is created, so that both node views show it (see the top of this file). ``height()``: its
 * height in the classic view, ``margin`` (each side) included. */
function domWidget(node, name, type, height, margin = 10) {
  let widget = node.widgets?.find((w) => w.name === name);
  if (widget) return widget;
  const holder = element("div");
  holder.style.height = "100%";
  holder.style.display = "none";
  widget = node.addDOMWidget(name, type, holder, {
    serialize: false, hideOnZoom: false, margin, getMinHeight: height, getMaxHeight: height,
  });
  widget.serialize = false;
  widget.options.serialize = false;
  return widget;
}

function panelWidget(node) {
  return domWidget(node, PANEL, "treerpo.picker",
                   () => (node.treerpoPanel ? panelHeight(node, node.treerpoPanel.picker) : 0));
}

function statusWidget(node) {
  const height = () => (node.treerpoStatus
    ? STATUS_HEIGHT + (node.treerpoStatus.picker?.advice ? ADVICE : 0) : 0);
  return domWidget(node, STATUS, "treerpo.picks_status", height, 2);
}

/** The counter above the training node's own lines (its progress and the guard's line, added by
 * web/training_nodes.js), whichever extension added its widgets first: the guard's line then sits right
 * above the images it speaks of, in both views. */
function statusFirst(node, widget) {
  const widgets = node.widgets ?? [];
  const at = widgets.indexOf(widget);
  const first = widgets.findIndex((w) => ["treerpo_progress_text", "treerpo_guard_line"].includes(w.name));
  if (at < 0 || first < 0 || first > at) return;
  widgets.splice(at, 1);
  widgets.splice(first, 0, widget);
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

/** Say once, when Nodes 2.0 draws the node (open, in the graph shown) but did not put its panel on the page,
 * what to do instead. */
function checkMounted(node, root, what) {
  setTimeout(() => {
    if (!vueNodes() || root.isConnected || checkMounted.said) return;
    if (node.flags?.collapsed || !nodeElement(node)) return;
    checkMounted.said = true;
    const detail = `Nodes 2.0 does not show the ${what} on the node here: switch "Modern Node Design `
      + "(Nodes 2.0)\" off in Settings (Comfy > Nodes 2.0), then pick on the node.";
    console.warn(`TreeRPO picks: ${detail}`);
    app.extensionManager?.toast?.add({ severity: "warn", summary: "TreeRPO picking", detail, life: 15000 });
  }, 1000);
}

/** Show the picking panel of the node's folder on the sampling node (once the folder holds trees). */
async function showPanel(node) {
  const name = folderName(node);
  if (!name) return;
  await drawnElement(node);
  const before = boxOf(node);  // before the panel (re)draws
  const picker = await refreshedPicker(name);
  if (!picker) return;
  if (!picker.trees.length && !node.treerpoPanel) return;
  const widget = panelWidget(node);
  if (node.treerpoPanel?.picker !== picker) {
    node.treerpoPanel?.view.dispose();
    const view = new PickerView(picker, () => [panelWidth(node) - 16, Infinity], { observe: true });
    widget.element.replaceChildren(view.root);
    widget.element.style.display = "";
    node.treerpoPanel = { picker, view, widget };
    checkMounted(node, view.root, "picking panel");
  }
  node.treerpoPanel.view.render();
  await fit(node, Math.max(boxOf(node)[0], PANEL_WIDTH), before);
  node.treerpoPanel.view.render();  // at the node's new width
  for (const other of node.graph?.nodes ?? []) {  // a training node of this folder: its counter
    if (other.type === TRAIN_NODE && folderName(other) === name) showStatus(other);
  }
}

/** The train node's line: how many trees of its folder are labelled, the server's advice under it, and a
 * button to pick more. */
async function showStatus(node) {
  const name = folderName(node);
  const widget = statusWidget(node);
  if (!name) {
    if (node.treerpoStatus) node.treerpoStatus.text.textContent = "";
    return;
  }
  await drawnElement(node);
  const before = boxOf(node);
  const picker = await refreshedPicker(name);
  if (!picker) return;
  if (!picker.trees.length && !node.treerpoStatus) return;
  let status = node.treerpoStatus;
  if (!status) {  // the first folder with trees: the line, once (another call may have made it meanwhile)
    const box = element("div", "treerpo-status");
    const row = element("div", "tp-row");
    const text = element("span");
    const button = element("button", "", "pick ⤢");
    button.onclick = () => node.treerpoStatus?.picker.trees.length && openLarge(node.treerpoStatus.picker);
    row.append(text, button);
    const advice = element("div", "treerpo-advice");
    box.append(row, advice);
    widget.element.replaceChildren(box);
    widget.element.style.display = "";
    status = node.treerpoStatus = { picker: null, update: null, text, advice, lines: 0 };
  }
  if (status.picker !== picker) {
    status.picker?.listeners.delete(status.update);
    status.picker = picker;
    status.update = () => {
      status.text.textContent = picker.trees.length
        ? `${picker.labelled} labelled of ${picker.trees.length} trees in ${name}`
        : `no trees in ${name} yet`;
      showAdvice(status.advice, picker.advice);
    };
    picker.listeners.add(status.update);
  }
  status.update();
  const lines = picker.advice ? 2 : 1;
  if (lines > status.lines) {  // the line appeared, or its advice did: make room
    status.lines = lines;
    await fit(node, boxOf(node)[0], before, false);
  }
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
    addStyle("treerpo-pick-style", STYLE);
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
      if (nodeData.name === SAMPLE_NODE) panelWidget(this);  // empty for now: see the top of this file
      else statusFirst(this, statusWidget(this));
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
      this.treerpoStatus?.picker?.listeners.delete(this.treerpoStatus.update);
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
