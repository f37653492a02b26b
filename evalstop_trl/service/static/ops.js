// Operator actions on one job, each behind a confirmation dialog with a reason (written to the
// audit trail): "Mark failed" for a dead job still shown as running, "Delete" for an ended job
// (with its reports; the audit line stays).

import { api } from "./api.js";
import { $ } from "./dom.js";

const jobPath = (id) => `v1/jobs/${encodeURIComponent(id)}`;
const ACTIVE = new Set(["pending", "running", "lost"]);
const ENDED = new Set(["stopped", "finished", "failed", "lost"]);

export const ACTIONS = {
  fail: {
    button: "fail-button",
    allowed: (job) => ACTIVE.has(job.status),
    title: (id) => `Mark ${id} failed?`,
    text: "For a job whose process died without saying so: it stops counting as active and its status " +
      "says why. Nothing is sent to the job.",
    confirm: "Mark failed",
    run: (id, reason) => api(`${jobPath(id)}/fail`, { method: "POST", body: { reason } }),
  },
  delete: {
    button: "delete-button",
    allowed: (job) => ENDED.has(job.status),
    title: (id) => `Delete ${id}?`,
    text: "The job and its reports, snapshots and webhook deliveries are deleted for good; a line in the " +
      "audit trail records who deleted it and why. Export its reports first if you need them.",
    confirm: "Delete job",
    run: (id, reason) => api(`${jobPath(id)}/delete`, { method: "POST", body: { reason } }),
  },
};

// Enable each action's button for what the job's status allows (a title says why not).
export function updateActionButtons(job) {
  for (const a of Object.values(ACTIONS)) {
    const b = $(a.button);
    b.hidden = false;
    b.disabled = !a.allowed(job);
    b.title = b.disabled ? `Not for a ${job.status} job.` : "";
  }
}

// Open the confirmation dialog for `name` on job `id`; `done(name, answer)` runs after it succeeded.
export function openAction(name, id, done) {
  const a = ACTIONS[name];
  const dialog = $("op-dialog");
  dialog.dataset.action = name;
  dialog.dataset.jobId = id;
  $("op-title").textContent = a.title(id);
  $("op-desc").textContent = a.text;
  $("op-confirm").textContent = a.confirm;
  $("op-reason").value = "";
  $("op-error").textContent = "";
  dialog.onsubmit = async (e) => {
    e.preventDefault();
    const reason = $("op-reason").value.trim();
    if (!reason) { $("op-error").textContent = "Please give a reason; it goes to the audit trail."; return; }
    $("op-confirm").disabled = true;
    try {
      const { data } = await a.run(id, reason);
      dialog.close(name);
      done(name, data);
    } catch (err) {
      $("op-error").textContent = `${a.confirm} failed: ${err.message}`;
    } finally {
      $("op-confirm").disabled = false;
    }
  };
  dialog.showModal();
  $("op-reason").focus();
}

export function setupActionDialog() {
  $("op-cancel").addEventListener("click", () => $("op-dialog").close("cancel"));
}
