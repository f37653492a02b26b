// The compare view's chart: the world-feedback curves of several runs on one axis (step, share of
// the plan, or wall-clock minutes), smoothed or not, zoomed to [from, to], with each run's best,
// stop and would-stop (shadow mode) points marked. Runs differ by colour and dash pattern, and
// markers by shape (circle: best, cross: stop, diamond: would stop), so nothing relies on colour.

import { extent, fmtNum, niceTicks } from "./util.js";

const NS = "http://www.w3.org/2000/svg";
export const RUN_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442"];
export const RUN_DASHES = ["", "7 4", "2 3", "10 3 2 3"];
export const AXES = {
  step: { label: "step", x: (r) => r.step },
  plan: { label: "share of the planned steps", x: (r, job) => (job.planned_steps ? r.step / job.planned_steps : null) },
  time: { label: "wall-clock minutes since the run started", x: (r, job) => (r.received_at - job.created_at) / 60 },
};

export const runStyle = (i) => ({ color: RUN_COLORS[i % RUN_COLORS.length],
  dash: RUN_DASHES[Math.floor(i / RUN_COLORS.length) % RUN_DASHES.length] });

function el(name, attrs = {}, parent = null, text = null) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined && v !== "") node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// Exponential moving average (debiased, as TensorBoard's): weight in [0, 1), 0 = raw values.
export function smooth(values, weight) {
  if (!(weight > 0)) return values.slice();
  let last = 0, n = 0;
  return values.map((v) => {
    if (typeof v !== "number") return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - weight ** n);
  });
}

// The points of one run on the chosen axis: [{x, y, raw, step}] (evals only, in step order).
export function runPoints(run, axis, weight) {
  const ax = AXES[axis] || AXES.step;
  const evals = run.reports.filter((r) => typeof r.eval_score === "number");
  const ys = smooth(evals.map((r) => r.eval_score), weight);
  return evals.map((r, i) => ({ x: ax.x(r, run.job), y: ys[i], raw: r.eval_score, step: r.step }))
    .filter((p) => typeof p.x === "number" && Number.isFinite(p.x));
}

// runs: [{ job, reports, stopStep }]; opts: axis, smooth, from, to, onZoom(from, to)
export function drawCompareChart(svg, runs, opts = {}) {
  const { axis = "step", smooth: weight = 0, from = null, to = null, onZoom = () => {} } = opts;
  const W = 960, H = 440, top = 24, left = 64, right = 18, bottom = 48;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.classList.add("compare-chart");
  const series = runs.map((run) => ({ run, pts: runPoints(run, axis, weight) }));
  const xs = series.flatMap((s) => s.pts.map((p) => p.x));
  let [x0, x1] = xs.length ? [Math.min(...xs), Math.max(...xs)] : [0, 1];
  if (typeof from === "number" && Number.isFinite(from)) x0 = from;
  if (typeof to === "number" && Number.isFinite(to)) x1 = to;
  if (!(x1 > x0)) x1 = x0 + 1;
  const visible = (p) => p.x >= x0 && p.x <= x1;
  const ext = extent(series.flatMap((s) => s.pts.filter(visible).flatMap((p) => [p.y, p.raw]))) || [0, 1];
  const x = (v) => left + ((v - x0) / (x1 - x0)) * (W - left - right);
  const y = (v) => top + (1 - (v - ext[0]) / (ext[1] - ext[0])) * (H - top - bottom);
  const clipId = "compare-clip";
  const defs = el("defs", {}, svg);
  const clip = el("clipPath", { id: clipId }, defs);
  el("rect", { x: left, y: top, width: W - left - right, height: H - top - bottom }, clip);
  el("rect", { x: left, y: top, width: W - left - right, height: H - top - bottom, class: "plot-bg" }, svg);
  for (const t of niceTicks(ext[0], ext[1], 6)) {
    el("line", { x1: left, x2: W - right, y1: y(t), y2: y(t), class: "grid" }, svg);
    el("text", { x: left - 8, y: y(t) + 4, class: "tick", "text-anchor": "end" }, svg, fmtNum(t, 3));
  }
  for (const t of niceTicks(x0, x1, 8)) {
    el("line", { x1: x(t), x2: x(t), y1: H - bottom, y2: H - bottom + 5, class: "axis" }, svg);
    el("text", { x: x(t), y: H - bottom + 19, class: "tick", "text-anchor": "middle" }, svg, fmtNum(t, 3));
  }
  el("text", { x: (left + W - right) / 2, y: H - 6, class: "axis-title", "text-anchor": "middle" }, svg,
    (AXES[axis] || AXES.step).label);
  el("text", { x: 14, y: top + (H - top - bottom) / 2, class: "axis-title", "text-anchor": "middle",
    transform: `rotate(-90 14 ${top + (H - top - bottom) / 2})` }, svg, "world feedback");

  const plot = el("g", { "clip-path": `url(#${clipId})` }, svg);
  series.forEach(({ run, pts }, i) => {
    const { color, dash } = runStyle(i);
    const g = el("g", { class: "run", "data-job-id": run.job.job_id }, plot);
    let d = "";
    for (const p of pts) d += `${d ? "L" : "M"}${x(p.x).toFixed(1)} ${y(p.y).toFixed(1)}`;
    el("path", { d, fill: "none", stroke: color, "stroke-width": 2, "stroke-dasharray": dash, class: "series",
      "data-role": "run-curve" }, g);
    const at = (step) => pts.find((p) => p.step === step) || null;
    const markers = [
      ["best-marker", run.job.best_step],
      ["stop-marker", run.stopStep],
      ["would-stop-marker", run.job.would_stop_step ?? null],
    ];
    for (const [role, step] of markers) {
      const p = step === null || step === undefined ? null : at(step);
      if (!p) continue;
      const cx = x(p.x), cy = y(p.y);
      const m = el("g", { class: "marker", "data-role": role, "data-step": step }, g);
      el("title", {}, m, `${run.job.job_id}: ${role.replace("-marker", "").replace("-", " ")} at step ${step}`);
      if (role === "best-marker") el("circle", { cx, cy, r: 5, fill: "#fff", stroke: color, "stroke-width": 2.5 }, m);
      else if (role === "stop-marker") {
        el("path", { d: `M${cx - 5} ${cy - 5}L${cx + 5} ${cy + 5}M${cx - 5} ${cy + 5}L${cx + 5} ${cy - 5}`, stroke: color,
          "stroke-width": 3 }, m);
      } else {
        el("path", { d: `M${cx} ${cy - 7}L${cx + 7} ${cy}L${cx} ${cy + 7}L${cx - 7} ${cy}Z`, fill: "none", stroke: color,
          "stroke-width": 2.5, "stroke-dasharray": "2 2" }, m);
      }
    }
  });

  // drag across the plot to zoom in on that range
  const brush = el("rect", { y: top, height: H - top - bottom, class: "brush", visibility: "hidden" }, svg);
  let start = null;
  const toX = (clientX) => {
    const box = svg.getBoundingClientRect();
    const sx = ((clientX - box.left) / box.width) * W;
    return x0 + ((Math.max(left, Math.min(W - right, sx)) - left) / (W - left - right)) * (x1 - x0);
  };
  svg.onpointerdown = (e) => { start = toX(e.clientX); svg.setPointerCapture?.(e.pointerId); };
  svg.onpointermove = (e) => {
    if (start === null) return;
    const a = x(Math.min(start, toX(e.clientX))), b = x(Math.max(start, toX(e.clientX)));
    brush.setAttribute("x", a);
    brush.setAttribute("width", Math.max(0, b - a));
    brush.setAttribute("visibility", "visible");
  };
  svg.onpointerup = (e) => {
    if (start === null) return;
    const end = toX(e.clientX);
    const [a, b] = [Math.min(start, end), Math.max(start, end)];
    start = null;
    brush.setAttribute("visibility", "hidden");
    if (b - a > (x1 - x0) / 100) onZoom(Number(a.toPrecision(6)), Number(b.toPrecision(6)));
  };
  return { x0, x1, series };
}
