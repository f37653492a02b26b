// The compare view: several runs' world feedback on one chart (axis, smoothing, zoom) and a table
// of their hyperparameters and outcomes. Its state is the URL's hash (shareable; never the token):
// #/compare?ids=a,b&axis=step|plan|time&smooth=0.6&from=10&to=200

import { ApiError, getJob, reportsAfter } from "./api.js";
import { AXES, drawCompareChart, runStyle } from "./compare-chart.js";
import { $, describeMap, h, isShadow, mark, shadowBadge, statusBadge } from "./dom.js";
import { TERMINAL, describePolicy, fmtNum, fmtStep, stopStep } from "./util.js";
import { MAX_COMPARE } from "./list.js";

const CONCURRENCY = 2; // the server serves a tenant's expensive reads two at a time

export function parseCompareHash(params) {
  const ids = [...new Set((params.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean))].slice(0, MAX_COMPARE);
  const num = (k) => (params.get(k) === null || params.get(k) === "" ? null : Number(params.get(k)));
  const axis = AXES[params.get("axis")] ? params.get("axis") : "step";
  const smoothing = Math.min(0.99, Math.max(0, num("smooth") || 0));
  const from = num("from"), to = num("to");
  return { ids, axis, smooth: smoothing, from: Number.isFinite(from) ? from : null, to: Number.isFinite(to) ? to : null };
}

export function compareStateHash(s) {
  const q = new URLSearchParams({ ids: s.ids.join(",") });
  if (s.axis !== "step") q.set("axis", s.axis);
  if (s.smooth > 0) q.set("smooth", String(s.smooth));
  if (s.from !== null) q.set("from", String(s.from));
  if (s.to !== null) q.set("to", String(s.to));
  return `#/compare?${q}`;
}

function swatch(i) {
  const { color, dash } = runStyle(i);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  for (const [k, v] of Object.entries({ width: 26, height: 10, viewBox: "0 0 26 10", "aria-hidden": "true" })) svg.setAttribute(k, v);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
  for (const [k, v] of Object.entries({ x1: 1, y1: 5, x2: 25, y2: 5, stroke: color, "stroke-width": 2.5 })) line.setAttribute(k, v);
  if (dash) line.setAttribute("stroke-dasharray", dash);
  svg.appendChild(line);
  return svg;
}

export function compareView(ctx, initial) {
  const state = { ...initial };
  const runs = new Map(); // job_id -> { job, reports, stopStep } | { missing: true }
  $("cmp-axis").value = state.axis;
  $("cmp-smooth").value = String(state.smooth);
  $("cmp-smooth-value").textContent = state.smooth ? state.smooth.toFixed(2) : "off";
  $("cmp-from").value = state.from ?? "";
  $("cmp-to").value = state.to ?? "";
  $("compare-chart").replaceChildren();
  $("compare-body").replaceChildren();
  $("compare-missing").textContent = "";
  $("compare-summary").textContent = state.ids.length ? "Loading\u2026" : "No runs selected: pick some in the list.";
  document.title = `Compare ${state.ids.length} runs \u00b7 EvalStop`;

  const save = () => { history.replaceState(null, "", compareStateHash(state)); draw(); };
  const onAxis = () => { state.axis = $("cmp-axis").value; state.from = state.to = null; $("cmp-from").value = $("cmp-to").value = ""; save(); };
  const onSmooth = () => {
    state.smooth = Number($("cmp-smooth").value) || 0;
    $("cmp-smooth-value").textContent = state.smooth ? state.smooth.toFixed(2) : "off";
    save();
  };
  const onZoomForm = (e) => {
    e.preventDefault();
    const f = $("cmp-from").value, t = $("cmp-to").value;
    state.from = f === "" ? null : Number(f);
    state.to = t === "" ? null : Number(t);
    save();
  };
  const onReset = () => { state.from = state.to = null; $("cmp-from").value = $("cmp-to").value = ""; save(); };
  const listeners = [["cmp-axis", "change", onAxis], ["cmp-smooth", "input", onSmooth], ["cmp-zoom", "submit", onZoomForm],
    ["cmp-reset", "click", onReset]];
  for (const [id, ev, fn] of listeners) $(id).addEventListener(ev, fn);

  function loaded() {
    return state.ids.map((id) => runs.get(id)).filter((r) => r && !r.missing);
  }

  function draw() {
    const shown = loaded();
    const drawn = drawCompareChart($("compare-chart"), shown, {
      axis: state.axis, smooth: state.smooth, from: state.from, to: state.to,
      onZoom: (a, b) => { state.from = a; state.to = b; $("cmp-from").value = a; $("cmp-to").value = b; save(); },
    });
    $("compare-chart").setAttribute("aria-label", `World feedback of ${shown.length} runs by ${AXES[state.axis].label}` +
      (state.from !== null || state.to !== null ? `, zoomed to ${fmtNum(drawn.x0)} to ${fmtNum(drawn.x1)}` : ""));
    $("compare-chart").dataset.axis = state.axis;
    const noPlan = shown.filter((r) => !r.job.planned_steps).map((r) => r.job.job_id);
    $("compare-note").textContent = state.axis === "plan" && noPlan.length
      ? `Not on this axis (no planned steps): ${noPlan.join(", ")}.` : "";
  }

  function renderTable() {
    const body = $("compare-body");
    body.replaceChildren(...loaded().map((run, i) => {
      const j = run.job;
      const tr = h("tr", { dataset: { jobId: j.job_id } });
      const th = h("th", { scope: "row" });
      th.appendChild(swatch(i));
      th.appendChild(h("a", { href: `#/job/${encodeURIComponent(j.job_id)}` }, j.job_id));
      if (isShadow(j)) th.appendChild(shadowBadge());
      tr.appendChild(th);
      const st = h("td", { class: "status" });
      const badge = h("span");
      statusBadge(badge, j.status);
      st.appendChild(badge);
      tr.appendChild(st);
      tr.appendChild(h("td", {}, j.job_type));
      tr.appendChild(h("td", { title: describePolicy(j.policy) }, describePolicy(j.policy)));
      tr.appendChild(h("td", j.best_step === null ? { class: "num best" } : { class: "num best", title: `${j.best_score} at step ${j.best_step}` },
        j.best_step === null ? "\u2014" : `${fmtNum(j.best_score)} @ ${fmtStep(j.best_step)}`));
      tr.appendChild(h("td", { class: "num stop" }, fmtStep(run.stopStep)));
      tr.appendChild(h("td", { class: "num would-stop" }, fmtStep(j.would_stop_step ?? null)));
      tr.appendChild(h("td", { class: "reason" }, j.decision && j.status === "stopped" ? j.decision.reason : ""));
      tr.appendChild(h("td", { class: "hparams", title: describeMap(j.hparams, { full: true }) }, describeMap(j.hparams)));
      tr.appendChild(h("td", { class: "tags", title: describeMap(j.tags, { full: true }) }, describeMap(j.tags)));
      return tr;
    }));
    const missing = state.ids.filter((id) => runs.get(id) && runs.get(id).missing);
    $("compare-missing").textContent = missing.length ? `No run ${missing.join(", ")} for this tenant.` : "";
    const n = loaded().length;
    $("compare-summary").textContent = `${n} run${n === 1 ? "" : "s"} compared`;
  }

  async function load(id, gen) {
    const have = runs.get(id);
    if (have && (have.missing || TERMINAL.has(have.job.status))) return;
    let job;
    try {
      job = await getJob(id);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) { runs.set(id, { missing: true }); return; }
      throw err;
    }
    const after = have && have.reports.length ? have.reports[have.reports.length - 1].step : null;
    const fresh = await reportsAfter(id, after, { maxPages: 10 });
    if (!ctx.current(gen)) return;
    const reports = have ? have.reports.concat(fresh.filter((r) => r.step > (after ?? -1))) : fresh;
    runs.set(id, { job, reports, stopStep: stopStep(job, reports, []) });
  }

  return {
    async refresh(gen, first = false) {
      const queue = state.ids.slice();
      await Promise.all(Array.from({ length: Math.min(CONCURRENCY, queue.length) }, async () => {
        while (queue.length && ctx.current(gen)) await load(queue.shift(), gen);
      }));
      if (!ctx.current(gen)) return;
      draw();
      renderTable();
      $("view-compare").dataset.ready = "true";
      if (first) mark("evalstop:compare-rendered");
    },
    leave() {
      for (const [id, ev, fn] of listeners) $(id).removeEventListener(ev, fn);
      delete $("view-compare").dataset.ready;
      document.title = "EvalStop";
    },
  };
}
