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

export async function api(path, { method = "GET", body } = {}) {
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
  let data = null;
  try { data = await res.json(); } catch { /* empty or not JSON */ }
  if (!res.ok) {
    const detail = data && typeof data.detail === "string" ? data.detail : `${res.status} ${res.statusText}`;
    throw new ApiError(res.status, detail);
  }
  return { data, headers: res.headers };
}

const jobPath = (id) => `v1/jobs/${encodeURIComponent(id)}`;

// One page of the tenant's jobs. The server pages and filters (?status, ?limit, ?offset, with
// X-Total-Count); an older server ignores those and answers every job, so we page here instead.
export async function listJobs({ status = "", offset = 0, limit = 50 } = {}) {
  const q = new URLSearchParams({ limit: String(limit), offset: String(offset) });
  if (status) q.set("status", status);
  const { data, headers } = await api(`v1/jobs?${q}`);
  const match = (j) => !status || j.status === status;
  const total = headers.get("X-Total-Count");
  if (total !== null && data.length <= limit && data.every(match)) {
    return { jobs: data, total: Number(total), serverPaged: true };
  }
  const all = data.filter(match);
  return { jobs: all.slice(offset, offset + limit), total: all.length, serverPaged: false };
}

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
