// Pure helpers: formatting, the stop step, axis ticks. No DOM, no network.

export const TERMINAL = new Set(["stopped", "finished", "failed"]);

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "\u2014";
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e7 || a < 1e-3)) return v.toExponential(2);
  if (a >= 1000) return v.toLocaleString("en-US", { maximumFractionDigits: 1 });
  return String(Number(v.toPrecision(digits)));
}

export function fmtStep(v) {
  return v === null || v === undefined ? "\u2014" : v.toLocaleString("en-US");
}

export function fmtTime(epochSeconds) {
  if (typeof epochSeconds !== "number") return "\u2014";
  const d = new Date(epochSeconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// The clock time of a moment, 24-hour like fmtTime ("23:05:09"): the dashboard never shows AM/PM.
export function fmtClock(epochSeconds) {
  return typeof epochSeconds === "number" ? fmtTime(epochSeconds).slice(11) : "\u2014";
}

// The "Last step" of a job's facts. A job that ended says the step it trained to when its stop's
// acknowledgement names one (training goes on past the deciding eval, e.g. with external evals),
// else its last report's step; one that ended without any says so instead of a bare dash.
export function lastStepText(job, audit) {
  const ack = TERMINAL.has(job.status) ? (audit || []).find((a) => a.kind === "ack") : null;
  const acked = ack && ack.evidence && Number.isInteger(ack.evidence.step) ? ack.evidence.step : null;
  const step = acked !== null && (job.last_step === null || job.last_step === undefined || acked > job.last_step)
    ? acked : job.last_step ?? null;
  const planned = job.planned_steps ? fmtStep(job.planned_steps) : null;
  if (step === null) {
    if (TERMINAL.has(job.status)) return `none reported: it ended before its first report${planned ? ` (${planned} planned)` : ""}`;
    return planned ? `\u2014 of ${planned} planned` : "\u2014";
  }
  return fmtStep(step) + (planned ? ` of ${planned} planned` : "");
}

// A value named as a time (`at`, `*_at`, `last_seen`) that is a plausible epoch in seconds (1973 to
// 5138): such a number is a moment, shown with fmtTime, never as 1.80e+9. A step named `*_at` stays a number.
const TIME_KEY = /^(at|last_seen)$|_at$/;
export const isTime = (key, v) => typeof v === "number" && Number.isFinite(v) && TIME_KEY.test(String(key)) &&
  v >= 1e8 && v < 1e11;

// Any value of evidence, hyperparameters, tags or a policy, for reading: times with fmtTime, numbers
// with fmtNum (about 4 significant digits), lists and mappings item by item; text as it is.
export function fmtValue(key, v) {
  if (typeof v === "number") return isTime(key, v) ? fmtTime(v) : fmtNum(v);
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "\u2014";
  if (Array.isArray(v)) return `[${v.map((x) => fmtValue(key, x)).join(", ")}]`;
  if (typeof v === "object") return Object.entries(v).map(([k, x]) => `${k}=${fmtValue(k, x)}`).join(", ");
  return String(v);
}

// The same value in full (for a title): every digit of a number, a time with its epoch seconds too.
export function fullValue(key, v) {
  if (typeof v === "number") return isTime(key, v) ? `${fmtTime(v)} (${v})` : String(v);
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) return `[${v.map((x) => fullValue(key, x)).join(", ")}]`;
  if (typeof v === "object") return Object.entries(v).map(([k, x]) => `${k}=${fullValue(k, x)}`).join(", ");
  return String(v);
}

// "decline (k=2, min_delta=0, direction=max)"
export function describePolicy(policy) {
  if (!policy || typeof policy !== "object") return "\u2014";
  const skip = new Set(["detector", "enforce", "grace_s"]);
  const params = Object.entries(policy).filter(([k]) => !skip.has(k)).map(([k, v]) => `${k}=${fmtValue(k, v)}`);
  return `${policy.detector || "?"}${params.length ? ` (${params.join(", ")})` : ""}`;
}

export const AUDIT_LABELS = {
  stop: "Stopped by the detector",
  manual_stop: "Stopped by hand",
  ack: "Stop acknowledged",
  failed: "Job failed",
  launcher_sigterm: "Launcher escalation: SIGTERM",
  launcher_sigkill: "Launcher escalation: SIGKILL",
  launcher_exit: "Launcher: the job exited",
  sigterm: "Service sent SIGTERM",
  sigkill: "Service sent SIGKILL",
  webhook: "Webhook delivered",
  webhook_failed: "Webhook failed",
  lost: "Lost (silent past its lease)",
  seen_again: "Seen again",
  amended: "Registration amended",
  would_stop: "Would stop (shadow mode)",
  deleted: "Deleted",
};

// The step at which a stopped job was stopped: the step named in the stop's audit evidence
// (detector stops), else the last report received before the stop (manual stops), else the last
// step. null for a job that is not stopped. Mirrors evalstop_trl.analysis.plots.stop_step.
export function stopStep(job, reports, audit) {
  if (!job || job.status !== "stopped") return null;
  const rec = (audit || []).find((a) => a.kind === "stop" || a.kind === "manual_stop");
  if (rec) {
    const s = rec.evidence && rec.evidence.step;
    if (Number.isInteger(s)) return s;
    let before = null;
    for (const r of reports || []) if (r.received_at <= rec.at) before = r.step;
    if (before !== null) return before;
  }
  return job.last_step ?? null;
}

// The latest stop record's evidence, for a stopped job (the API's decision carries none).
export function stopEvidence(audit) {
  const rec = (audit || []).find((a) => a.kind === "stop" || a.kind === "manual_stop");
  return rec ? rec.evidence || {} : null;
}

// About `count` round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart).
export function niceTicks(lo, hi, count = 4) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

// [lo, hi] of the finite values, padded a little; null when there are none.
export function extent(values, pad = 0.06) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (typeof v === "number" && Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
  }
  if (lo === Infinity) return null;
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; return [lo - d, hi + d]; }
  const d = (hi - lo) * pad;
  return [lo - d, hi + d];
}
