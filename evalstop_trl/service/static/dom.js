// DOM helpers shared by the views: data goes in as text and attributes only, never as HTML.

import { fmtValue, fullValue } from "./util.js";

export const $ = (id) => document.getElementById(id);

export const h = (tag, props = {}, text = null) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  if (text !== null) node.textContent = text;
  return node;
};

export function statusBadge(node, status) {
  node.className = `badge status-${status}`;
  node.textContent = status;
}

// "shadow" when the job's policy only records what it would have stopped (shadow mode)
export const isShadow = (job) => Boolean(job && job.policy && job.policy.mode === "shadow");

export function shadowBadge() {
  return h("span", { class: "badge shadow", title: "Shadow mode: the detector decides, nothing is stopped" }, "shadow");
}

// "beta=0.04, lr=3.00e-4" from a mapping (hyperparameters or tags), keys sorted; numbers through
// fmtNum, times through fmtTime. full: every digit (for a title).
export function describeMap(map, { full = false } = {}) {
  if (!map || typeof map !== "object") return "";
  const show = full ? fullValue : fmtValue;
  return Object.keys(map).sort().map((k) => `${k}=${show(k, map[k])}`).join(", ");
}

// describeMap as nodes: each "key=value" an unbreakable item (a line breaks only between items; an item
// wider than the whole line wraps inside it, never past its column), ", " between them.
export function describeMapItems(map) {
  const out = document.createDocumentFragment();
  if (!map || typeof map !== "object") return out;
  Object.keys(map).sort().forEach((k, i) => {
    if (i) out.appendChild(document.createTextNode(", "));
    out.appendChild(h("span", { class: "map-item" }, `${k}=${fmtValue(k, map[k])}`));
  });
  return out;
}

// performance marks for scripts/bench_dashboard.py (one of each name is kept)
export function mark(name) {
  performance.clearMarks(name);
  performance.mark(name);
}

export function fmtDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return "\u2014";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d ${Math.round((seconds % 86400) / 3600)} h`;
}

// "12 s ago", "3 min ago", or a date for old times
export function fmtAgo(epochSeconds, now = Date.now() / 1000) {
  if (typeof epochSeconds !== "number") return "\u2014";
  const d = Math.max(0, now - epochSeconds);
  if (d < 86400) return `${fmtDuration(d).split(" ").slice(0, 2).join(" ")} ago`;
  return new Date(epochSeconds * 1000).toISOString().slice(0, 10);
}
