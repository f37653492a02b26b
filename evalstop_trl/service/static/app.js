// The dashboard: sign-in, the job list and the job page, kept live by polling every 2 s.
// Data is only ever written into the page with textContent / attributes, never as HTML.

import { ApiError, getJob, jobAudit, listJobs, reportsAfter, stopJob, token } from "./api.js";
import { drawJobChart, legendItems, legendSwatch, sparkline } from "./chart.js";
import {
  AUDIT_LABELS, TERMINAL, describePolicy, fmtNum, fmtStep, fmtTime, stopEvidence, stopStep,
} from "./util.js";

const POLL_MS = 2000;
const PAGE_SIZE = 50;
const SPARK_CONCURRENCY = 6;

const $ = (id) => document.getElementById(id);
const h = (tag, props = {}, text = null) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  if (text !== null) node.textContent = text;
  return node;
};

// ------------------------------------------------------------------ routing and polling
let view = null;       // the current view: { refresh(), leave() }
let timer = null;
let generation = 0;    // bumps on every navigation: answers for an old view are dropped

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  const m = path.match(/^\/job\/(.+)$/);
  if (m) return { name: "job", id: decodeURIComponent(m[1]) };
  return { name: "jobs", status: params.get("status") || "", page: Math.max(0, (parseInt(params.get("page"), 10) || 1) - 1) };
}

export function jobsHash(status, page) {
  const q = new URLSearchParams();
  if (status) q.set("status", status);
  if (page > 0) q.set("page", String(page + 1));
  const s = q.toString();
  return `#/${s ? `?${s}` : ""}`;
}

function show(name) {
  for (const v of ["signin", "jobs", "job"]) $(`view-${v}`).hidden = v !== name;
  const signedIn = name !== "signin";
  $("signout").hidden = !signedIn;
  $("topnav").hidden = !signedIn;
  $("live-state").hidden = !signedIn;
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(tick, POLL_MS);
}

async function tick() {
  if (!view || document.hidden) return schedule();
  const gen = generation;
  try {
    await view.refresh(gen);
    if (gen === generation) setLive(true);
  } catch (err) {
    if (gen === generation) handleError(err);
  }
  if (gen === generation) schedule();
}

function setLive(ok, text = null) {
  $("live-state").classList.toggle("stale", !ok);
  $("live-text").textContent = text || (ok ? `Live \u00b7 updated ${new Date().toLocaleTimeString()}` : "Reconnecting\u2026");
  if (ok) banner(null);
}

function banner(message) {
  $("banner").hidden = !message;
  $("banner").textContent = message || "";
}

function handleError(err) {
  if (err instanceof ApiError && err.status === 401) {
    token.clear();
    navigate({ signinMessage: `Signed out: ${err.message}` });
    return;
  }
  setLive(false);
  banner(err instanceof ApiError && err.status === 0
    ? "The coordinator cannot be reached; retrying every 2 s."
    : `Error: ${err.message}`);
}

// performance marks for scripts/bench_dashboard.py (one of each name is kept)
function mark(name) {
  performance.clearMarks(name);
  performance.mark(name);
}

function navigate({ signinMessage = "" } = {}) {
  mark("evalstop:navigate");
  generation++;
  clearTimeout(timer);
  if (view) view.leave();
  view = null;
  if (!token.get()) {
    show("signin");
    $("signin-error").textContent = signinMessage;
    $("token").focus();
    return;
  }
  const route = parseRoute();
  view = route.name === "job" ? jobView(route.id) : jobsView(route.status, route.page);
  show(route.name);
  const gen = generation;
  view.refresh(gen, true).then(() => { if (gen === generation) setLive(true); })
    .catch((err) => { if (gen === generation) handleError(err); })
    .finally(() => { if (gen === generation) schedule(); });
}

// ------------------------------------------------------------------ sign in
function setupSignin() {
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    mark("evalstop:signin");
    $("signin-error").textContent = "";
    token.set(value);
    try {
      await listJobs({ limit: 1 });
    } catch (err) {
      token.clear();
      $("signin-error").textContent = err.status === 401
        ? "That token was not accepted (unknown or revoked)." : err.message;
      $("token").select();
      return;
    }
    $("token").value = "";
    navigate();
    $("main").focus();
  });
  $("signout").addEventListener("click", () => {
    token.clear();
    location.hash = "#/";
    navigate({ signinMessage: "Signed out." });
  });
}

// ------------------------------------------------------------------ the job list
const sparkCache = new Map(); // job_id -> { reports, lastStep }

function statusBadge(node, status) {
  node.className = `badge status-${status}`;
  node.textContent = status;
}

function jobsView(status, page) {
  const rows = new Map(); // job_id -> row element
  $("status-filter").value = status;
  $("jobs-body").replaceChildren();
  $("jobs-summary").textContent = "Loading\u2026";

  const onFilter = () => { location.hash = jobsHash($("status-filter").value, 0); };
  const onPrev = () => { location.hash = jobsHash(status, Math.max(0, page - 1)); };
  const onNext = () => { location.hash = jobsHash(status, page + 1); };
  $("status-filter").addEventListener("change", onFilter);
  $("prev-page").addEventListener("click", onPrev);
  $("next-page").addEventListener("click", onNext);

  function rowFor(job) {
    let tr = rows.get(job.job_id);
    if (!tr) {
      tr = h("tr", { dataset: { jobId: job.job_id } });
      const link = h("a", { href: `#/job/${encodeURIComponent(job.job_id)}`, class: "job-link" }, job.job_id);
      const first = h("th", { scope: "row" });
      first.appendChild(link);
      tr.appendChild(first);
      for (const cls of ["status", "type", "detector", "num last", "num best-step", "num best-score", "reason", "spark"]) {
        tr.appendChild(h("td", { class: cls }));
      }
      tr.lastChild.appendChild(sparkline([]));
      rows.set(job.job_id, tr);
    }
    const cells = tr.children;
    let badge = cells[1].firstChild;
    if (!badge) { badge = h("span"); cells[1].appendChild(badge); }
    if (badge.textContent !== job.status) statusBadge(badge, job.status);
    cells[2].textContent = job.job_type;
    const policy = describePolicy(job.policy);
    cells[3].textContent = job.policy && job.policy.detector ? job.policy.detector : policy;
    cells[3].title = policy;
    cells[4].textContent = fmtStep(job.last_step) + (job.planned_steps ? ` / ${fmtStep(job.planned_steps)}` : "");
    cells[5].textContent = fmtStep(job.best_step);
    cells[6].textContent = fmtNum(job.best_score);
    const reason = job.status === "stopped" && job.decision ? job.decision.reason : "";
    let clip = cells[7].firstChild;
    if (!clip) { clip = h("span", { class: "clip" }); cells[7].appendChild(clip); }
    clip.textContent = reason;
    cells[7].title = reason;
    return tr;
  }

  async function loadSparks(jobs, gen) {
    const todo = jobs.filter((j) => {
      const c = sparkCache.get(j.job_id);
      return j.n_reports > 0 && (!c || c.lastStep !== j.last_step || c.status !== j.status);
    });
    const one = async (job) => {
      const c = sparkCache.get(job.job_id);
      const after = c && c.reports.length ? c.reports[c.reports.length - 1].step : null;
      const fresh = await reportsAfter(job.job_id, after, { maxPages: 1 });
      const cached = sparkCache.get(job.job_id); // re-read: a concurrent refresh may have added some
      const seen = cached && cached.reports.length ? cached.reports[cached.reports.length - 1].step : -1;
      const reports = cached ? cached.reports.concat(fresh.filter((r) => r.step > seen)) : fresh;
      sparkCache.set(job.job_id, { reports, lastStep: job.last_step, status: job.status });
      if (gen !== generation) return;
      const tr = rows.get(job.job_id);
      if (tr) tr.lastChild.replaceChildren(sparkline(reports, {
        bestStep: job.best_step, stopStep: job.status === "stopped" ? job.last_step : null }));
    };
    const queue = todo.slice();
    const workers = Array.from({ length: Math.min(SPARK_CONCURRENCY, queue.length) }, async () => {
      while (queue.length && gen === generation) await one(queue.shift());
    });
    await Promise.all(workers);
  }

  return {
    async refresh(gen, first = false) {
      const { jobs, total } = await listJobs({ status, offset: page * PAGE_SIZE, limit: PAGE_SIZE });
      if (gen !== generation) return;
      const body = $("jobs-body");
      const ordered = jobs.map(rowFor);
      const same = ordered.length === body.children.length && ordered.every((tr, i) => body.children[i] === tr);
      if (!same) body.replaceChildren(...ordered);
      const keep = new Set(jobs.map((j) => j.job_id));
      for (const id of rows.keys()) if (!keep.has(id)) rows.delete(id);
      const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
      const from = total ? page * PAGE_SIZE + 1 : 0;
      const last = page * PAGE_SIZE + jobs.length;
      $("jobs-summary").textContent = total
        ? `${from.toLocaleString("en-US")}\u2013${last.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} ${status || ""} job${total === 1 ? "" : "s"}`.replace("  ", " ")
        : "";
      $("jobs-table").hidden = total === 0;
      $("jobs-empty").hidden = total !== 0;
      $("page-info").textContent = `Page ${page + 1} of ${pages}`;
      $("prev-page").disabled = page === 0;
      $("next-page").disabled = page + 1 >= pages;
      $("view-jobs").dataset.ready = "true";
      if (first) mark("evalstop:list-rendered");
      loadSparks(jobs, gen).then(() => { if (first && gen === generation) mark("evalstop:sparklines-rendered"); })
        .catch((err) => { if (gen === generation) handleError(err); });
    },
    leave() {
      $("status-filter").removeEventListener("change", onFilter);
      $("prev-page").removeEventListener("click", onPrev);
      $("next-page").removeEventListener("click", onNext);
      delete $("view-jobs").dataset.ready;
    },
  };
}

// ------------------------------------------------------------------ one job
function setupStopDialog() {
  const dialog = $("stop-dialog");
  $("stop-cancel").addEventListener("click", () => dialog.close("cancel"));
  $("stop-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const id = dialog.dataset.jobId;
    const reason = $("stop-reason").value.trim();
    if (!reason) { $("stop-error").textContent = "Please give a reason; it goes to the audit trail."; return; }
    $("stop-confirm").disabled = true;
    try {
      const job = await stopJob(id, reason);
      dialog.close("stopped");
      if (view && view.jobId === id) view.applyJob(job);
      if (view) view.refresh(generation).catch(handleError);
      $("stop-button").focus();
    } catch (err) {
      $("stop-error").textContent = `The stop failed: ${err.message}`;
      if (err.status === 401) { dialog.close(); handleError(err); }
    } finally {
      $("stop-confirm").disabled = false;
    }
  });
}

function fact(dl, term, value) {
  const div = h("div");
  div.appendChild(h("dt", {}, term));
  div.appendChild(h("dd", {}, value));
  dl.appendChild(div);
}

function renderEvidence(dl, evidence) {
  dl.replaceChildren();
  if (!evidence) return;
  for (const [k, v] of Object.entries(evidence)) {
    dl.appendChild(h("dt", {}, k));
    dl.appendChild(h("dd", {}, typeof v === "number" ? fmtNum(v, 6) : typeof v === "string" ? v : JSON.stringify(v)));
  }
}

function jobView(id) {
  let job = null;
  let reports = [];
  let audit = [];
  let drawnKey = "";
  let cursorStep = null;
  let chart = null;
  $("job-id").textContent = id;
  $("job-status").textContent = "";
  $("job-status").className = "badge";
  $("job-missing").hidden = true;
  $("job-body").hidden = false;
  $("stop-button").hidden = true;
  $("job-facts").replaceChildren();
  $("chart").replaceChildren();
  $("chart-readout").textContent = "";
  $("audit-body").replaceChildren();
  $("data-body").replaceChildren();
  document.title = `${id} \u00b7 EvalStop`;

  const legend = $("legend");
  if (!legend.children.length) {
    for (const item of legendItems()) {
      const li = h("li");
      li.appendChild(legendSwatch(item));
      li.appendChild(document.createTextNode(item.label));
      legend.appendChild(li);
    }
  }

  const onStop = () => {
    const dialog = $("stop-dialog");
    dialog.dataset.jobId = id;
    $("stop-job-id").textContent = id;
    $("stop-reason").value = "";
    $("stop-error").textContent = "";
    dialog.showModal();
    $("stop-reason").focus();
  };
  $("stop-button").addEventListener("click", onStop);
  const onCopy = () => {
    if (job && job.best_checkpoint && navigator.clipboard) navigator.clipboard.writeText(job.best_checkpoint).catch(() => {});
  };
  $("copy-checkpoint").addEventListener("click", onCopy);

  function readout(r) {
    cursorStep = r ? r.step : null;
    $("chart-readout").textContent = r
      ? `step ${fmtStep(r.step)}: world feedback ${fmtNum(r.eval_score)}, proxy reward ${fmtNum(r.proxy_reward)}, ` +
        `train loss ${fmtNum(r.train_loss)}${r.checkpoint ? `, checkpoint ${r.checkpoint}` : ""}`
      : "";
  }

  function applyJob(j) {
    job = j;
    statusBadge($("job-status"), j.status);
    $("stop-button").hidden = false;
    $("stop-button").disabled = TERMINAL.has(j.status);
    $("stop-button").title = TERMINAL.has(j.status) ? `This job is ${j.status}.` : "";
    const dl = $("job-facts");
    dl.replaceChildren();
    fact(dl, "Type", j.job_type);
    fact(dl, "Detector", describePolicy(j.policy));
    fact(dl, "Last step", fmtStep(j.last_step) + (j.planned_steps ? ` of ${fmtStep(j.planned_steps)} planned` : ""));
    fact(dl, "Reports", fmtStep(j.n_reports));
    fact(dl, "Best", j.best_step === null ? "\u2014" : `${fmtNum(j.best_score)} at step ${fmtStep(j.best_step)}`);
    if (j.status === "stopped") fact(dl, "Stop acknowledged", j.acked ? "yes" : "not yet");
    const d = j.decision;
    const act = $("decision-action");
    act.className = `badge action-${d ? d.action : "none"}`;
    act.textContent = d ? d.action.toUpperCase() : "no decision yet";
    $("decision-reason").textContent = d ? d.reason : "The job has not reported an eval yet.";
    $("job-checkpoint").textContent = j.best_checkpoint || "none reported yet";
    $("copy-checkpoint").hidden = !j.best_checkpoint;
  }

  function renderAudit() {
    const body = $("audit-body");
    body.replaceChildren(...audit.map((a) => {
      const tr = h("tr", { dataset: { kind: a.kind } });
      tr.appendChild(h("td", { class: "nowrap" }, fmtTime(a.at)));
      tr.appendChild(h("td", {}, AUDIT_LABELS[a.kind] || a.kind));
      tr.appendChild(h("td", {}, a.actor));
      tr.appendChild(h("td", { class: "reason" }, a.reason));
      const ev = h("td", { class: "ev" });
      const dl = h("dl", { class: "evidence" });
      renderEvidence(dl, a.evidence);
      ev.appendChild(dl);
      tr.appendChild(ev);
      return tr;
    }));
    $("audit-empty").hidden = audit.length > 0;
    const d = job && job.decision;
    renderEvidence($("decision-evidence"), (d && d.evidence) || (job && job.status === "stopped" ? stopEvidence(audit) : null));
  }

  function renderChart() {
    const stop = stopStep(job, reports, audit);
    const key = `${reports.length}:${job.best_step}:${stop}:${job.planned_steps}`;
    if (key === drawnKey) return;
    drawnKey = key;
    chart = drawJobChart($("chart"), reports, {
      bestStep: job.best_step, stopStep: stop, plannedSteps: job.planned_steps, onCursor: readout,
    });
    $("chart").dataset.stopStep = stop === null ? "" : String(stop);
    $("chart").dataset.bestStep = job.best_step === null ? "" : String(job.best_step);
    $("chart").setAttribute("aria-label", `Curves of ${id} over ${reports.length} reports` +
      (job.best_step !== null ? `; best step ${job.best_step}` : "") + (stop !== null ? `; stopped at step ${stop}` : ""));
    if (cursorStep !== null && document.activeElement === $("chart")) chart.setStep(cursorStep);
    const tail = reports.slice(-200).reverse();
    $("data-body").replaceChildren(...tail.map((r) => {
      const tr = h("tr");
      tr.appendChild(h("td", { class: "num" }, fmtStep(r.step)));
      for (const k of ["eval_score", "proxy_reward", "train_loss"]) tr.appendChild(h("td", { class: "num" }, fmtNum(r[k])));
      tr.appendChild(h("td", { class: "path" }, r.checkpoint || ""));
      return tr;
    }));
  }

  return {
    jobId: id,
    applyJob,
    async refresh(gen, first = false) {
      let j;
      try {
        j = await getJob(id);
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) {
          if (gen !== generation) return;
          $("job-missing").hidden = false;
          $("job-missing").textContent = `No job ${id} for this tenant.`;
          $("job-body").hidden = true;
          $("stop-button").hidden = true;
          return;
        }
        throw err;
      }
      const after = reports.length ? reports[reports.length - 1].step : null;
      const [fresh, aud] = await Promise.all([reportsAfter(id, after), jobAudit(id)]);
      if (gen !== generation) return;
      const lastSeen = reports.length ? reports[reports.length - 1].step : -1;
      reports = reports.concat(fresh.filter((r) => r.step > lastSeen)); // a concurrent refresh may have them
      audit = aud;
      applyJob(j);
      renderAudit();
      renderChart();
      $("view-job").dataset.ready = "true";
      if (first) mark("evalstop:job-rendered");
    },
    leave() {
      $("stop-button").removeEventListener("click", onStop);
      $("copy-checkpoint").removeEventListener("click", onCopy);
      delete $("view-job").dataset.ready;
      document.title = "EvalStop";
      const dialog = $("stop-dialog");
      if (dialog.open) dialog.close("cancel");
    },
  };
}

// ------------------------------------------------------------------ start
function start() {
  setupSignin();
  setupStopDialog();
  window.addEventListener("hashchange", () => { navigate(); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden && view) tick(); });
  navigate();
}

start();
