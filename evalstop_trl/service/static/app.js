// The dashboard: sign-in, the job list and the job page, kept live by polling every 2 s.
// Data is only ever written into the page with textContent / attributes, never as HTML.

import {
  ApiError, browseJobs, download, exportReportsPath, getJob, jobAudit, reportsAfter, stopJob, token,
} from "./api.js";
import { drawJobChart, legendItems, legendSwatch } from "./chart.js";
import { compareView, parseCompareHash } from "./compare.js";
import { $, describeMap, describeMapItems, h, isShadow, mark, statusBadge } from "./dom.js";
import { jobsView, parseListHash } from "./list.js";
import { openAction, setupActionDialog, updateActionButtons } from "./ops.js";
import {
  AUDIT_LABELS, TERMINAL, describePolicy, fmtClock, fmtNum, fmtStep, fmtTime, fmtValue, fullValue, lastStepText,
  stopEvidence, stopStep,
} from "./util.js";

const POLL_MS = 2000;
const VIEWS = ["signin", "jobs", "job", "compare"];

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
  if (path === "/compare") return { name: "compare", ...parseCompareHash(params) };
  return { name: "jobs", ...parseListHash(params) };
}

// what the list and compare views need of the router
const ctx = {
  current: (gen) => gen === generation,
  handleError: (err) => handleError(err),
};

function show(name) {
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== name;
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
  $("live-text").textContent = text || (ok ? `Live \u00b7 updated ${fmtClock(Date.now() / 1000)}` : "Reconnecting\u2026");
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
  view = route.name === "job" ? jobView(route.id)
    : route.name === "compare" ? compareView(ctx, route) : jobsView(ctx, route);
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
      await browseJobs({}, { limit: 1 });
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

function fact(dl, term, value, title = null) {
  const div = h("div");
  div.appendChild(h("dt", {}, term));
  div.appendChild(h("dd", title && title !== value ? { title } : {}, value));
  dl.appendChild(div);
}

// A mapping (tags, hyperparameters) as a fact of the whole row, its items never broken mid-word.
function mapFact(dl, term, map) {
  const div = h("div", { class: "wide" });
  div.appendChild(h("dt", {}, term));
  const dd = h("dd", { title: describeMap(map, { full: true }) });
  dd.appendChild(describeMapItems(map));
  div.appendChild(dd);
  dl.appendChild(div);
}

// Evidence as read (times with fmtTime, numbers with fmtNum); the full value in each one's title.
function renderEvidence(dl, evidence) {
  dl.replaceChildren();
  if (!evidence) return;
  for (const [k, v] of Object.entries(evidence)) {
    const shown = fmtValue(k, v), full = fullValue(k, v);
    dl.appendChild(h("dt", {}, k));
    dl.appendChild(h("dd", full !== shown ? { title: full } : {}, shown));
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
  $("legend").replaceChildren();
  $("chart-readout").textContent = "";
  $("audit-body").replaceChildren();
  $("data-body").replaceChildren();
  document.title = `${id} \u00b7 EvalStop`;

  let legendKey = null;
  const renderLegend = (wouldStop) => { // the would-stop marker is in the legend of a job that has one
    if (legendKey === wouldStop) return;
    legendKey = wouldStop;
    $("legend").replaceChildren(...legendItems({ wouldStop }).map((item) => {
      const li = h("li");
      li.appendChild(legendSwatch(item));
      li.appendChild(document.createTextNode(item.label));
      return li;
    }));
  };

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
  $("job-export-status").textContent = "";
  const onExport = (format) => async () => {
    try {
      const blob = await download(exportReportsPath(id, format), `${id}-reports.${format}`);
      $("job-export-status").textContent = `Exported ${format.toUpperCase()} (${blob.size.toLocaleString("en-US")} bytes).`;
    } catch (err) {
      $("job-export-status").textContent = `The export failed: ${err.message}`;
    }
  };
  const exportCsv = onExport("csv"), exportJson = onExport("json");
  $("job-export-csv").addEventListener("click", exportCsv);
  $("job-export-json").addEventListener("click", exportJson);
  const afterAction = (name, answer) => {
    if (name === "delete") {
      $("flash").textContent = `Deleted ${id} (${answer.n_reports} reports); the audit trail keeps a line.`;
      $("flash").dataset.keep = "1";
      location.hash = "#/";
      return;
    }
    applyJob(answer);
    if (view) view.refresh(generation).catch(handleError);
    $("fail-button").focus();
  };
  const onFail = () => openAction("fail", id, afterAction);
  const onDelete = () => openAction("delete", id, afterAction);
  $("fail-button").addEventListener("click", onFail);
  $("delete-button").addEventListener("click", onDelete);
  $("fail-button").hidden = $("delete-button").hidden = true;

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
    if (isShadow(j) && !$("job-shadow")) $("job-status").after(h("span", { class: "badge shadow", id: "job-shadow" }, "shadow"));
    else if (!isShadow(j) && $("job-shadow")) $("job-shadow").remove();
    $("stop-button").hidden = false;
    $("stop-button").disabled = TERMINAL.has(j.status);
    $("stop-button").title = TERMINAL.has(j.status) ? `This job is ${j.status}.` : "";
    updateActionButtons(j);
    const dl = $("job-facts");
    dl.replaceChildren();
    fact(dl, "Type", j.job_type);
    if (isShadow(j)) fact(dl, "Mode", "shadow: the detector decides, nothing is stopped");
    if (j.would_stop_step !== null && j.would_stop_step !== undefined) fact(dl, "Would have stopped", `at step ${fmtStep(j.would_stop_step)}`);
    fact(dl, "Detector", describePolicy(j.policy));
    fact(dl, "Last step", lastStepText(j, audit));
    fact(dl, "Reports", fmtStep(j.n_reports));
    fact(dl, "Best", j.best_step === null ? "\u2014" : `${fmtNum(j.best_score)} at step ${fmtStep(j.best_step)}`);
    if (j.status === "stopped") fact(dl, "Stop acknowledged", j.acked ? "yes" : "not yet");
    if (j.tags && Object.keys(j.tags).length) mapFact(dl, "Tags", j.tags);
    if (j.hparams && Object.keys(j.hparams).length) mapFact(dl, "Hyperparameters", j.hparams);
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
    const wouldStop = job.would_stop_step ?? null;
    const key = `${reports.length}:${job.best_step}:${stop}:${wouldStop}:${job.planned_steps}`;
    if (key === drawnKey) return;
    drawnKey = key;
    renderLegend(wouldStop !== null);
    chart = drawJobChart($("chart"), reports, {
      bestStep: job.best_step, stopStep: stop, wouldStopStep: wouldStop, plannedSteps: job.planned_steps, onCursor: readout,
    });
    $("chart").dataset.stopStep = stop === null ? "" : String(stop);
    $("chart").dataset.bestStep = job.best_step === null ? "" : String(job.best_step);
    $("chart").setAttribute("aria-label", `Curves of ${id} over ${reports.length} reports` +
      (job.best_step !== null ? `; best step ${job.best_step}` : "") + (stop !== null ? `; stopped at step ${stop}` : "") +
      (wouldStop !== null ? `; would have stopped at step ${wouldStop} (shadow mode)` : ""));
    if (cursorStep !== null && document.activeElement === $("chart")) chart.setStep(cursorStep);
    const tail = reports.slice(-200).reverse();
    $("data-body").replaceChildren(...tail.map((r) => {
      const tr = h("tr");
      tr.appendChild(h("td", { class: "num" }, fmtStep(r.step)));
      for (const k of ["eval_score", "proxy_reward", "train_loss"]) {
        tr.appendChild(h("td", typeof r[k] === "number" ? { class: "num", title: String(r[k]) } : { class: "num" }, fmtNum(r[k])));
      }
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
          $("fail-button").hidden = $("delete-button").hidden = true;
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
      $("job-export-csv").removeEventListener("click", exportCsv);
      $("fail-button").removeEventListener("click", onFail);
      $("delete-button").removeEventListener("click", onDelete);
      if ($("op-dialog").open) $("op-dialog").close("cancel");
      $("job-export-json").removeEventListener("click", exportJson);
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
  setupActionDialog();
  window.addEventListener("hashchange", () => { navigate(); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden && view) tick(); });
  navigate();
}

start();
