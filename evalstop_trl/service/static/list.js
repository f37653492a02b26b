// The run list: search, filters and sort (all done by the server, /v1/runs), keyset pages, the
// selection for the compare view, exports of the filtered list. State lives in the URL's hash.

import { browseJobs, download, exportRunsPath, jobAudit, reportsAfter, tenantSummary } from "./api.js";
import { sparkline } from "./chart.js";
import { $, describeMap, fmtAgo, fmtDuration, h, isShadow, mark, shadowBadge, statusBadge } from "./dom.js";
import { TERMINAL, describePolicy, fmtNum, fmtStep, fmtTime } from "./util.js";

export const PAGE_SIZE = 50;
export const MAX_COMPARE = 50;
const SPARK_CONCURRENCY = 2; // the server serves a tenant's expensive reads two at a time
const FIELDS = ["q", "status", "job_type", "detector", "tag", "sort", "order"];
const TYPED = ["q", "detector", "tag"]; // text fields: the list follows them as one types, after a pause
const SELECTS = ["status", "job_type", "sort", "order"]; // the list follows a change at once
const TYPING_MS = 250;

export const selected = new Set(); // job ids picked for the compare view (kept across pages)
const sparkCache = new Map(); // job_id -> { reports, lastStep, status }
const reasonCache = new Map(); // job_id -> the reason of a failed or lost job (from its audit trail)
let trail = { key: "", cursors: [] }; // cursors of the pages before this one (for "Previous")
const SUMMARY_MS = 15_000; // the summary reads every job of the tenant: refreshed less often than the list
let summaryAt = 0;

export function parseListHash(params) {
  const filters = {};
  for (const k of FIELDS) filters[k] = params.get(k) || "";
  return { filters, after: params.get("after") || "", page: Math.max(1, parseInt(params.get("page"), 10) || 1) };
}

export function listHash(filters, after = "", page = 1) {
  const q = new URLSearchParams();
  for (const k of FIELDS) if (filters[k]) q.set(k, filters[k]);
  if (after) { q.set("after", after); q.set("page", String(page)); }
  const s = q.toString();
  return `#/${s ? `?${s}` : ""}`;
}

export function compareHash(ids) {
  return `#/compare?${new URLSearchParams({ ids: ids.join(",") })}`;
}

const SUMMARY_ITEMS = [
  ["jobs", "Jobs"], ["active", "Active"], ["stopped_by_detector", "Stopped by a detector"],
  ["stopped_by_hand", "Stopped by hand"], ["finished", "Finished"], ["failed", "Failed"], ["lost", "Lost"],
  ["would_stop", "Would stop (shadow)"], ["steps_saved", "Steps saved by stops"], ["hours_saved", "Job-hours saved (est.)"],
];

function renderSummary(s) {
  const dl = $("tenant-summary");
  dl.replaceChildren(...SUMMARY_ITEMS.map(([k, label]) => {
    const div = h("div", { dataset: { key: k } });
    div.appendChild(h("dt", {}, label));
    div.appendChild(h("dd", {}, k === "hours_saved" ? fmtNum(Math.round(s[k] * 10) / 10) : fmtStep(s[k])));
    return div;
  }));
}

function reasonOf(job) {
  if (job.status === "stopped" && job.decision) return job.decision.reason;
  if (job.status === "failed" || job.status === "lost") return reasonCache.get(job.job_id) || "";
  return "";
}

export function jobsView(ctx, { filters, after, page }) {
  const rows = new Map(); // job_id -> row element
  const key = JSON.stringify(filters);
  if (trail.key !== key || !after) trail = { key, cursors: [] };
  let next = null;

  // (a field that already says the same, up to spaces at its ends, is left as it is: one typing in it
  // keeps the space just typed)
  for (const k of FIELDS) if ($(`f-${k}`).value.trim() !== filters[k]) $(`f-${k}`).value = filters[k];
  if ($("flash").dataset.keep) { // a message from the previous view (a deletion), shown once, focused
    delete $("flash").dataset.keep;
    setTimeout(() => $("flash").focus(), 0);
  } else $("flash").textContent = "";
  $("jobs-body").replaceChildren();
  $("jobs-summary").textContent = "Loading\u2026";

  const read = () => Object.fromEntries(FIELDS.map((k) => [k, $(`f-${k}`).value.trim()]));
  let typing = null; // the pending filter of what is being typed
  const onFilter = (e) => { e.preventDefault(); clearTimeout(typing); location.hash = listHash(read()); };
  const onChange = () => { clearTimeout(typing); location.hash = listHash(read()); };
  const onType = () => { // a new list after a pause in typing; it replaces the history entry (Back skips the keystrokes)
    clearTimeout(typing);
    typing = setTimeout(() => {
      const hash = listHash(read());
      if (hash !== location.hash && !(hash === "#/" && location.hash === "")) location.replace(hash);
    }, TYPING_MS);
  };
  const onPrev = () => {
    const prev = trail.cursors.pop();
    location.hash = listHash(filters, prev || "", Math.max(1, page - 1));
  };
  const onNext = () => {
    if (!next) return;
    trail.cursors.push(after);
    location.hash = listHash(filters, next, page + 1);
  };
  const onCompare = () => { if (selected.size) location.hash = compareHash([...selected]); };
  const onClear = () => { selected.clear(); for (const tr of rows.values()) tr.querySelector("input").checked = false; updateSelection(); };
  const onExport = (format) => async () => {
    const status = $("export-status");
    status.textContent = `Exporting ${format.toUpperCase()}\u2026`;
    try {
      const blob = await download(exportRunsPath(filters, format), `runs.${format}`);
      status.textContent = `Exported ${format.toUpperCase()} (${blob.size.toLocaleString("en-US")} bytes).`;
    } catch (err) {
      status.textContent = `The export failed: ${err.message}`;
    }
  };
  const exportCsv = onExport("csv"), exportJson = onExport("json");
  const listeners = [
    ["filter-form", "submit", onFilter], ...SELECTS.map((k) => [`f-${k}`, "change", onChange]),
    ...TYPED.map((k) => [`f-${k}`, "input", onType]), ["prev-page", "click", onPrev],
    ["next-page", "click", onNext], ["compare-button", "click", onCompare], ["clear-selection", "click", onClear],
    ["export-csv", "click", exportCsv], ["export-json", "click", exportJson],
  ];
  for (const [id, ev, fn] of listeners) $(id).addEventListener(ev, fn);

  function updateSelection() {
    const n = selected.size;
    $("compare-button").disabled = n === 0;
    $("compare-button").textContent = n ? `Compare ${n} selected` : "Compare selected";
    $("clear-selection").hidden = n === 0;
    $("selection-info").textContent = n >= MAX_COMPARE ? `At most ${MAX_COMPARE} runs can be compared.` : "";
  }

  function rowFor(job) {
    let tr = rows.get(job.job_id);
    if (!tr) {
      tr = h("tr", { dataset: { jobId: job.job_id } });
      const pick = h("td", { class: "pick" });
      const box = h("input", { type: "checkbox", "aria-label": `Select ${job.job_id} to compare` });
      box.checked = selected.has(job.job_id);
      box.addEventListener("change", () => {
        if (box.checked && selected.size >= MAX_COMPARE) box.checked = false;
        else if (box.checked) selected.add(job.job_id);
        else selected.delete(job.job_id);
        updateSelection();
      });
      pick.appendChild(box);
      tr.appendChild(pick);
      const first = h("th", { scope: "row" });
      first.appendChild(h("a", { href: `#/job/${encodeURIComponent(job.job_id)}`, class: "job-link" }, job.job_id));
      tr.appendChild(first);
      for (const cls of ["status", "type", "detector", "tags", "started nowrap", "num duration", "seen nowrap",
        "num last", "num best-step", "num best-score", "reason", "spark"]) {
        tr.appendChild(h("td", { class: cls }));
      }
      tr.lastChild.appendChild(sparkline([]));
      rows.set(job.job_id, tr);
    }
    const c = tr.children;
    const name = c[1];
    const shadow = name.querySelector(".shadow");
    if (isShadow(job) && !shadow) name.appendChild(shadowBadge());
    else if (!isShadow(job) && shadow) shadow.remove();
    let badge = c[2].firstChild;
    if (!badge) { badge = h("span"); c[2].appendChild(badge); }
    if (badge.textContent !== job.status) statusBadge(badge, job.status);
    c[3].textContent = job.job_type;
    const policy = describePolicy(job.policy);
    c[4].textContent = job.policy && job.policy.detector ? job.policy.detector : policy;
    c[4].title = policy;
    c[5].textContent = describeMap(job.tags);
    c[5].title = describeMap(job.tags, { full: true });
    c[6].textContent = fmtTime(job.created_at).slice(5, 16); // "12-01 15:20" (the full time in its title)
    c[6].title = fmtTime(job.created_at);
    const end = typeof job.ended_at === "number" ? job.ended_at : Date.now() / 1000;
    c[7].textContent = fmtDuration(end - job.created_at);
    c[8].textContent = fmtAgo(job.last_seen);
    c[8].title = fmtTime(job.last_seen);
    // an ended job without a report says so, not a bare dash (as the job page's facts do)
    const ended = (job.last_step === null || job.last_step === undefined) && TERMINAL.has(job.status);
    c[9].textContent = (ended ? "none" : fmtStep(job.last_step)) +
      (job.planned_steps ? ` / ${fmtStep(job.planned_steps)}` : "");
    c[10].textContent = fmtStep(job.best_step);
    c[11].textContent = fmtNum(job.best_score);
    c[11].title = typeof job.best_score === "number" ? String(job.best_score) : "";
    const reason = reasonOf(job);
    let clip = c[12].firstChild;
    if (!clip) { clip = h("span", { class: "clip" }); c[12].appendChild(clip); }
    clip.textContent = reason;
    c[12].title = reason;
    return tr;
  }

  async function pool(items, worker, gen) {
    const queue = items.slice();
    await Promise.all(Array.from({ length: Math.min(SPARK_CONCURRENCY, queue.length) }, async () => {
      while (queue.length && ctx.current(gen)) await worker(queue.shift());
    }));
  }

  async function loadReasons(jobs, gen) {
    const todo = jobs.filter((j) => (j.status === "failed" || j.status === "lost") && !reasonCache.has(j.job_id));
    await pool(todo, async (job) => {
      const audit = await jobAudit(job.job_id);
      const rec = audit.filter((a) => a.kind === job.status || (job.status === "failed" && a.kind === "failed")).pop();
      reasonCache.set(job.job_id, rec ? rec.reason : "");
      if (ctx.current(gen) && rows.has(job.job_id)) rowFor(job);
    }, gen);
  }

  async function loadSparks(jobs, gen) {
    const todo = jobs.filter((j) => {
      const c = sparkCache.get(j.job_id);
      return j.n_reports > 0 && (!c || c.lastStep !== j.last_step || c.status !== j.status);
    });
    await pool(todo, async (job) => {
      const c = sparkCache.get(job.job_id);
      const from = c && c.reports.length ? c.reports[c.reports.length - 1].step : null;
      const fresh = await reportsAfter(job.job_id, from, { maxPages: 1 });
      const cached = sparkCache.get(job.job_id);
      const seen = cached && cached.reports.length ? cached.reports[cached.reports.length - 1].step : -1;
      const reports = cached ? cached.reports.concat(fresh.filter((r) => r.step > seen)) : fresh;
      sparkCache.set(job.job_id, { reports, lastStep: job.last_step, status: job.status });
      if (!ctx.current(gen)) return;
      const tr = rows.get(job.job_id);
      if (tr) tr.lastChild.replaceChildren(sparkline(reports, {
        bestStep: job.best_step, stopStep: job.status === "stopped" ? job.last_step : null,
        wouldStopStep: job.would_stop_step ?? null }));
    }, gen);
  }

  updateSelection();
  return {
    async refresh(gen, first = false) {
      const { jobs, total, next: more } = await browseJobs(filters, { limit: PAGE_SIZE, after: after || null });
      if (!ctx.current(gen)) return;
      next = more;
      const body = $("jobs-body");
      const ordered = jobs.map(rowFor);
      const same = ordered.length === body.children.length && ordered.every((tr, i) => body.children[i] === tr);
      if (!same) body.replaceChildren(...ordered);
      const keep = new Set(jobs.map((j) => j.job_id));
      for (const id of rows.keys()) if (!keep.has(id)) rows.delete(id);
      const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
      const from = total ? (page - 1) * PAGE_SIZE + 1 : 0;
      const last = (page - 1) * PAGE_SIZE + jobs.length;
      const what = filters.status ? `${filters.status} job` : "job";
      $("jobs-summary").textContent = total
        ? `${from.toLocaleString("en-US")}\u2013${last.toLocaleString("en-US")} of ${total.toLocaleString("en-US")} ${what}${total === 1 ? "" : "s"}`
        : "";
      $("jobs-table").hidden = total === 0;
      $("jobs-empty").hidden = total !== 0;
      $("page-info").textContent = `Page ${page} of ${pages}`;
      $("prev-page").disabled = !after;
      $("next-page").disabled = !next;
      $("view-jobs").dataset.ready = "true";
      if (first) mark("evalstop:list-rendered");
      if (first || Date.now() - summaryAt > SUMMARY_MS) {
        summaryAt = Date.now();
        tenantSummary().then((s) => { if (ctx.current(gen)) renderSummary(s); })
          .catch((err) => { if (ctx.current(gen)) ctx.handleError(err); });
      }
      Promise.all([loadSparks(jobs, gen), loadReasons(jobs, gen)])
        .then(() => { if (first && ctx.current(gen)) mark("evalstop:sparklines-rendered"); })
        .catch((err) => { if (ctx.current(gen)) ctx.handleError(err); });
    },
    leave() {
      clearTimeout(typing);
      for (const [id, ev, fn] of listeners) $(id).removeEventListener(ev, fn);
      delete $("view-jobs").dataset.ready;
    },
  };
}
