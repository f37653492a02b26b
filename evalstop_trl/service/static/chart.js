// Hand-written SVG charts: the job page's three curves on one step axis, and the list's sparklines.
// Colours are the Okabe-Ito palette (safe for colour-blind readers); every series also differs
// by dash pattern, and the markers carry text labels, so nothing relies on colour alone.

import { extent, fmtNum, fmtStep, niceTicks } from "./util.js";

const NS = "http://www.w3.org/2000/svg";

export const COLORS = {
  eval_score: "#0072B2",   // blue
  proxy_reward: "#E69F00", // orange
  train_loss: "#CC79A7",   // reddish purple
  best: "#009E73",         // bluish green
  stop: "#D55E00",         // vermillion
  wouldStop: "#D55E00",    // vermillion too, dash-dotted: where a shadow-mode detector would have stopped
  ink: "#1f2328",
  grid: "#d8dee4",
};

export const SERIES = [
  { key: "eval_score", label: "World feedback (eval score)", dash: "" },
  { key: "proxy_reward", label: "Proxy reward", dash: "7 4" },
  { key: "train_loss", label: "Train loss", dash: "2 3" },
];

function el(name, attrs = {}, parent = null, text = null) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// An SVG path through (step, value) points that breaks at missing values.
function linePath(reports, key, x, y) {
  let d = "", pen = false;
  for (const r of reports) {
    const v = r[key];
    if (typeof v !== "number") { pen = false; continue; }
    d += `${pen ? "L" : "M"}${x(r.step).toFixed(1)} ${y(v).toFixed(1)}`;
    pen = true;
  }
  return d;
}

function scale(d0, d1, r0, r1) {
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  return (v) => r0 + (v - d0) * k;
}

// the markers' line styles (the legend shows the same)
const MARKERS = {
  best: { role: "best-marker", color: COLORS.best, dash: "5 3", label: "best" },
  stop: { role: "stop-marker", color: COLORS.stop, dash: "", label: "stop" },
  wouldStop: { role: "would-stop-marker", color: COLORS.wouldStop, dash: "8 3 2 3", label: "would stop" },
};

export function legendItems({ wouldStop = false } = {}) {
  return [
    ...SERIES.map((s) => ({ label: s.label, color: COLORS[s.key], dash: s.dash })),
    { label: "Best step", color: MARKERS.best.color, dash: MARKERS.best.dash },
    { label: "Stop step", color: MARKERS.stop.color, dash: MARKERS.stop.dash },
    ...(wouldStop ? [{ label: "Would stop (shadow mode)", color: MARKERS.wouldStop.color, dash: MARKERS.wouldStop.dash }] : []),
  ];
}

export function legendSwatch(item) {
  const svg = el("svg", { width: 28, height: 10, viewBox: "0 0 28 10", "aria-hidden": "true" });
  el("line", { x1: 1, y1: 5, x2: 27, y2: 5, stroke: item.color, "stroke-width": 2.5, "stroke-dasharray": item.dash || null }, svg);
  return svg;
}

// Draw the job's curves into `svg`. Returns a handle to move a read-out cursor: cursor.set(step).
// opts: bestStep, stopStep, wouldStopStep (a shadow-mode job's first would-stop), plannedSteps, onCursor(report|null)
export function drawJobChart(svg, reports, opts = {}) {
  const { bestStep = null, stopStep = null, wouldStopStep = null, plannedSteps = null, onCursor = () => {} } = opts;
  const W = 960, panelH = 132, gap = 30, top = 46, left = 70, right = 22, bottom = 40;
  const panels = SERIES;
  const H = top + panels.length * panelH + (panels.length - 1) * gap + bottom;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
  svg.classList.add("job-chart");

  const steps = reports.map((r) => r.step);
  const lastStep = steps.length ? steps[steps.length - 1] : 0;
  const x0 = Math.min(0, steps.length ? steps[0] : 0);
  const x1 = Math.max(lastStep, stopStep ?? 0, wouldStopStep ?? 0, plannedSteps ?? 0, x0 + 1);
  const x = scale(x0, x1, left, W - right);
  const plotBottom = top + panels.length * panelH + (panels.length - 1) * gap;

  const byKey = {};
  panels.forEach((s, i) => {
    const py = top + i * (panelH + gap);
    const g = el("g", { class: "panel", "data-series": s.key }, svg);
    const values = reports.map((r) => r[s.key]);
    const ext = extent(values);
    el("text", { x: left, y: py - 8, class: "panel-title" }, g, s.label);
    el("rect", { x: left, y: py, width: W - right - left, height: panelH, class: "plot-bg" }, g);
    if (stopStep !== null && x1 > stopStep) { // after a stop: the steps the job did not have to run
      el("rect", { x: x(stopStep), y: py, width: x(x1) - x(stopStep), height: panelH, class: "after-stop" }, g);
      if (i === 0 && plannedSteps && plannedSteps > stopStep && x(x1) - x(stopStep) > 150) {
        el("text", { x: (x(stopStep) + x(x1)) / 2, y: py + panelH - 10, class: "after-stop-label", "text-anchor": "middle" },
          g, "not run: saved by the stop");
      }
    }
    if (!ext) {
      el("text", { x: (left + W - right) / 2, y: py + panelH / 2, class: "no-data", "text-anchor": "middle" }, g,
        "no values reported");
      return;
    }
    const y = scale(ext[0], ext[1], py + panelH, py);
    byKey[s.key] = y;
    for (const t of niceTicks(ext[0], ext[1], 4)) {
      el("line", { x1: left, x2: W - right, y1: y(t), y2: y(t), class: "grid" }, g);
      el("text", { x: left - 8, y: y(t) + 4, class: "tick", "text-anchor": "end" }, g, fmtNum(t, 3));
    }
    el("path", { d: linePath(reports, s.key, x, y), fill: "none", stroke: COLORS[s.key], "stroke-width": 2.5,
      "stroke-dasharray": s.dash || null, "stroke-linejoin": "round", class: "series", "data-role": `series-${s.key}` }, g);
    if (s.key === "eval_score" && reports.length <= 120) {
      for (const r of reports) {
        if (typeof r.eval_score !== "number") continue;
        el("circle", { cx: x(r.step), cy: y(r.eval_score), r: 3, fill: COLORS.eval_score, class: "point" }, g);
      }
    }
  });

  // the shared step axis
  for (const t of niceTicks(x0, x1, 8)) {
    el("line", { x1: x(t), x2: x(t), y1: plotBottom, y2: plotBottom + 5, stroke: COLORS.ink }, svg);
    el("text", { x: x(t), y: plotBottom + 19, class: "tick", "text-anchor": "middle" }, svg, fmtStep(t));
  }
  el("text", { x: (left + W - right) / 2, y: H - 4, class: "axis-title", "text-anchor": "middle" }, svg, "step");

  // best, stop and would-stop markers across every panel, with text labels
  const evalAt = (step) => {
    const r = reports.find((q) => q.step === step);
    return r && typeof r.eval_score === "number" ? r.eval_score : null;
  };
  const marker = (step, { role, color, dash, label }, anchor, labelY = 18) => {
    const g = el("g", { class: "marker", "data-role": role, "data-step": step }, svg);
    el("line", { x1: x(step), x2: x(step), y1: 8, y2: plotBottom, stroke: color, "stroke-width": 2,
      "stroke-dasharray": dash || null }, g);
    el("text", { x: x(step) + (anchor === "end" ? -5 : 5), y: labelY, fill: color, class: "marker-label",
      "text-anchor": anchor }, g, `${label} ${fmtStep(step)}`);
    const v = evalAt(step);
    if (v !== null && byKey.eval_score) {
      const cx = x(step), cy = byKey.eval_score(v);
      if (role === "best-marker") {
        el("circle", { cx, cy, r: 7, fill: "#fff", stroke: color, "stroke-width": 3 }, g);
      } else if (role === "would-stop-marker") { // a dashed diamond, as in the compare view
        el("path", { d: `M${cx} ${cy - 8}L${cx + 8} ${cy}L${cx} ${cy + 8}L${cx - 8} ${cy}Z`, fill: "#fff", stroke: color,
          "stroke-width": 2.5, "stroke-dasharray": "2 2" }, g);
      } else {
        el("path", { d: `M${cx - 6} ${cy - 6}L${cx + 6} ${cy + 6}M${cx - 6} ${cy + 6}L${cx + 6} ${cy - 6}`,
          stroke: color, "stroke-width": 3 }, g);
      }
    }
    return g;
  };
  const close = (a, b) => a !== null && b !== null && Math.abs(x(a) - x(b)) < 90;
  const later = [stopStep, wouldStopStep].filter((s) => s !== null);
  if (bestStep !== null) marker(bestStep, MARKERS.best, later.some((s) => close(bestStep, s)) ? "end" : "start");
  if (stopStep !== null) marker(stopStep, MARKERS.stop, "start");
  if (wouldStopStep !== null) { // a shadow-mode job: where its detector would have stopped it
    const under = close(wouldStopStep, stopStep) || (close(wouldStopStep, bestStep) && wouldStopStep < bestStep);
    marker(wouldStopStep, MARKERS.wouldStop, "start", under ? 34 : 18);
  }

  // a read-out cursor: pointer or arrow keys
  const cursor = el("line", { y1: top, y2: plotBottom, class: "cursor", visibility: "hidden" }, svg);
  let index = -1;
  const set = (i) => {
    if (!reports.length) return;
    index = Math.max(0, Math.min(reports.length - 1, i));
    const r = reports[index];
    cursor.setAttribute("x1", x(r.step));
    cursor.setAttribute("x2", x(r.step));
    cursor.setAttribute("visibility", "visible");
    onCursor(r);
  };
  const nearest = (clientX) => {
    const box = svg.getBoundingClientRect();
    const sx = ((clientX - box.left) / box.width) * W;
    let best = 0, bestD = Infinity;
    for (let i = 0; i < reports.length; i++) {
      const d = Math.abs(x(reports[i].step) - sx);
      if (d < bestD) { bestD = d; best = i; }
    }
    return best;
  };
  svg.onpointermove = (e) => set(nearest(e.clientX));
  svg.onpointerleave = () => { cursor.setAttribute("visibility", "hidden"); onCursor(null); };
  svg.onkeydown = (e) => {
    const moves = { ArrowRight: 1, ArrowLeft: -1, PageUp: 10, PageDown: -10 };
    if (e.key in moves) set((index < 0 ? reports.length - 1 : index) + moves[e.key]);
    else if (e.key === "Home") set(0);
    else if (e.key === "End") set(reports.length - 1);
    else return;
    e.preventDefault();
  };
  svg.onblur = () => { cursor.setAttribute("visibility", "hidden"); };
  return { setStep: (step) => set(reports.findIndex((r) => r.step === step)) };
}

// A small line of the world feedback, with the best point marked, for the job list.
export function sparkline(reports, { bestStep = null, stopStep = null, wouldStopStep = null } = {}) {
  const W = 120, H = 28, pad = 3;
  const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img" });
  const pts = reports.filter((r) => typeof r.eval_score === "number");
  if (!pts.length) {
    svg.setAttribute("aria-label", "no world feedback yet");
    el("line", { x1: pad, x2: W - pad, y1: H / 2, y2: H / 2, stroke: COLORS.grid, "stroke-dasharray": "3 3" }, svg);
    return svg;
  }
  const ext = extent(pts.map((r) => r.eval_score), 0.1);
  const s0 = pts[0].step, s1 = pts[pts.length - 1].step;
  const x = scale(s0, s1 === s0 ? s0 + 1 : s1, pad, W - pad);
  const y = scale(ext[0], ext[1], H - pad, pad);
  el("path", { d: linePath(pts, "eval_score", x, y), fill: "none", stroke: COLORS.eval_score, "stroke-width": 1.6,
    "stroke-linejoin": "round" }, svg);
  const best = pts.find((r) => r.step === bestStep);
  if (best) el("circle", { cx: x(best.step), cy: y(best.eval_score), r: 3, fill: COLORS.best, class: "spark-best" }, svg);
  if (stopStep !== null && stopStep >= s0 && stopStep <= s1) {
    el("line", { x1: x(stopStep), x2: x(stopStep), y1: 1, y2: H - 1, stroke: COLORS.stop, "stroke-width": 1.5,
      class: "spark-stop" }, svg);
  }
  if (wouldStopStep !== null && wouldStopStep >= s0 && wouldStopStep <= s1) {
    el("line", { x1: x(wouldStopStep), x2: x(wouldStopStep), y1: 1, y2: H - 1, stroke: COLORS.stop, "stroke-width": 1.5,
      "stroke-dasharray": "2 2", class: "spark-would-stop" }, svg);
  }
  const last = pts[pts.length - 1];
  svg.setAttribute("aria-label", `world feedback over ${pts.length} evals, from ${fmtNum(pts[0].eval_score)} ` +
    `to ${fmtNum(last.eval_score)}` + (best ? `, best ${fmtNum(best.eval_score)} at step ${fmtStep(best.step)}` : ""));
  return svg;
}
