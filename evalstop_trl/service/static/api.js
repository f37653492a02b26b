// The dashboard's only door to the data: the authenticated /v1 API of the same origin.
// The token lives in sessionStorage (this tab only) and travels only in the Authorization header.

const KEY = "evalstop.token";
const PAGE = 1000; // the API's largest page

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status; // 0: the coordinator could not be reached
  }
}

const RETRIES_429 = 6; // expensive reads are served a few at a time per tenant: wait and retry

export async function api(path, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await request(path, opts);
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 429 || attempt >= RETRIES_429) throw err;
      await new Promise((ok) => setTimeout(ok, Math.min(1000, (err.retryAfter || 0.05) * 1000) * (attempt + 1)));
    }
  }
}

async function request(path, { method = "GET", body, raw = false } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token.get() || ""}` };
  const init = { method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init); // relative: works behind a reverse proxy under a prefix too
  } catch (err) {
    // a token with characters a header cannot carry fails here too
    throw new ApiError(0, err instanceof TypeError && /header/i.test(err.message)
      ? "that token contains characters a token never has" : "the coordinator could not be reached");
  }
  if (raw && res.ok) return { data: await res.blob(), headers: res.headers };
  let data = null;
  try { data = await res.json(); } catch { /* empty or not JSON */ }
  if (!res.ok) {
    const detail = data && typeof data.detail === "string" ? data.detail : `${res.status} ${res.statusText}`;
    const err = new ApiError(res.status, detail);
    err.retryAfter = Number(res.headers.get("Retry-After")) || 0;
    throw err;
  }
  return { data, headers: res.headers };
}

// The filters of the run list, as the /v1/runs query string takes them (empty ones left out).
export const FILTERS = ["q", "status", "job_type", "detector", "tag", "sort", "order"];

function runsQuery(filters, extra = {}) {
  const q = new URLSearchParams();
  for (const k of FILTERS) if (filters[k]) q.set(k, filters[k]);
  for (const [k, v] of Object.entries(extra)) if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  return q;
}

// One page of runs: { jobs, total, next } (next: the cursor of the following page, or null).
export async function browseJobs(filters = {}, { limit = 50, after = null } = {}) {
  return (await api(`v1/runs?${runsQuery(filters, { limit, after })}`)).data;
}

// Download an export (CSV or JSON) through the authenticated API: fetched with the bearer header,
// then saved from a blob: URL (the token never appears in a URL).
export async function download(path, filename) {
  const { data } = await api(path, { raw: true });
  const url = URL.createObjectURL(data);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
  return data;
}

export const exportRunsPath = (filters, format) => `v1/runs/export?${runsQuery(filters, { format })}`;
export const exportReportsPath = (id, format) =>
  `v1/jobs/${encodeURIComponent(id)}/export?${new URLSearchParams({ format })}`;

const jobPath = (id) => `v1/jobs/${encodeURIComponent(id)}`;

export async function getJob(id) {
  return (await api(jobPath(id))).data;
}

// Reports after `afterStep` (all when null), in step order, following ?after_step pages of 1000.
// A server without paging answers everything each time; steps already seen are dropped.
export async function reportsAfter(id, afterStep = null, { maxPages = 50 } = {}) {
  const out = [];
  let after = afterStep;
  for (let page = 0; page < maxPages; page++) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (after !== null) q.set("after_step", String(after));
    const { data } = await api(`${jobPath(id)}/reports?${q}`);
    const fresh = after === null ? data : data.filter((r) => r.step > after);
    out.push(...fresh);
    if (fresh.length < PAGE) break;
    after = fresh[fresh.length - 1].step;
  }
  return out;
}

// The audit records of one job (the server filters with ?job_id; we filter again for older ones).
export async function jobAudit(id) {
  const { data } = await api(`v1/audit?${new URLSearchParams({ job_id: id })}`);
  return data.filter((a) => a.job_id === id);
}

export async function stopJob(id, reason) {
  return (await api(`${jobPath(id)}/stop`, { method: "POST", body: { reason } })).data;
}

// The tenant's jobs by outcome and what its detectors' stops saved.
export async function tenantSummary() {
  return (await api("v1/summary")).data;
}
