// Small DOM helpers shared by the pack's panels (pick_leaves.js, best_of_tree.js). ComfyUI loads every
// .js file of the pack's web folder as an extension; this one registers nothing, it only exports.

// Add a <style> element with the given id once per page.
export function addStyle(id, css) {
  if (document.getElementById(id)) return;
  const style = document.createElement("style");
  style.id = id;
  style.textContent = css;
  document.head.appendChild(style);
}

// A new element with an optional class name and text.
export function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}
