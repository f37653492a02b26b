"""Slurm: stop a batch job through Slurm itself, as the job's own user (no extra to install: Slurm's
``scontrol`` and ``scancel`` must be on PATH).

:class:`SlurmJob` is the watcher's view of one job (:mod:`.remote`). Its state comes from ``scontrol
show job -o ID``; a stop is ``scancel --signal=TERM --full ID`` (without ``--full`` the batch script
itself is not signalled, only its steps), then ``scancel ID`` ``grace_s`` later (Slurm then sends
SIGTERM and, ``KillWait`` seconds later, SIGKILL to every process of the job). Slurm lets only the
job's owner (or an operator) cancel it, and the watcher asks only for jobs of its own user: run as
root it still refuses another user's job.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from collections.abc import Mapping

from .remote import RemoteRefused, RemoteState, RemoteStatus

__all__ = ["SlurmJob"]

#: Slurm's job states (``JobState=``) as the watcher's; any other (CONFIGURING, COMPLETING,
#: SUSPENDED, REQUEUED, RESIZING, ...) counts as running
STATES: Mapping[str, RemoteState] = {
    "PENDING": RemoteState.PENDING, "RUNNING": RemoteState.RUNNING, "COMPLETED": RemoteState.SUCCEEDED,
    "CANCELLED": RemoteState.STOPPED, "PREEMPTED": RemoteState.STOPPED, "FAILED": RemoteState.FAILED,
    "TIMEOUT": RemoteState.FAILED, "NODE_FAIL": RemoteState.FAILED, "BOOT_FAIL": RemoteState.FAILED,
    "DEADLINE": RemoteState.FAILED, "OUT_OF_MEMORY": RemoteState.FAILED,
}
_FIELD = re.compile(r"(\w+)=(\S*)")
_ID = re.compile(r"[0-9]+(_[0-9]+)?")  # a job id, or an array task's JOB_TASK
_TIMEOUT_S = 30.0


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


class SlurmJob:
    """One Slurm job (``slurm_job``: its id, ``12`` or an array task's ``12_3``)."""

    escalates = False  # scancel --signal=TERM signals only; the forced stop is a second scancel

    def __init__(self, slurm_job: str) -> None:
        if not _ID.fullmatch(slurm_job):
            raise ValueError(f"a Slurm job id is digits (an array task: JOB_TASK), but got {slurm_job!r}")
        self.slurm_job, self.label = slurm_job, f"Slurm job {slurm_job}"

    def fields(self) -> dict[str, str]:
        """``scontrol show job -o``'s ``Key=Value`` fields ({} once Slurm no longer knows the job)."""
        done = _run("scontrol", "show", "job", "-o", self.slurm_job)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return {}
            raise OSError(f"scontrol show job {self.slurm_job} failed: {done.stderr.strip()[:300]}")
        return dict(_FIELD.findall(done.stdout.splitlines()[0] if done.stdout else ""))

    def status(self) -> RemoteStatus:
        f = self.fields()
        if not f:
            return RemoteStatus(RemoteState.GONE, "no longer known to Slurm")
        state = f.get("JobState", "")
        detail = f"{state} (exit code {f.get('ExitCode', '?')}, reason {f.get('Reason', 'None')})"
        return RemoteStatus(STATES.get(state, RemoteState.RUNNING), detail)

    def refusal(self, job_id: str, tenant: str) -> str | None:
        owner = self.fields().get("UserId", "")
        uid = re.search(r"\((\d+)\)", owner)
        me = os.getuid()
        if uid is None or int(uid.group(1)) != me:
            return (f"it belongs to user {owner or '?'}, and this watcher runs as {pwd.getpwuid(me).pw_name}({me}): "
                    "run it as the job's own user")
        return None

    def _scancel(self, *flags: str) -> None:
        done = _run("scancel", *flags, self.slurm_job)
        if done.returncode != 0:
            message = done.stderr.strip()[:300]
            if "permission denied" in message.lower() or "Invalid job id" in message:
                raise RemoteRefused(f"scancel refused: {message}")
            raise OSError(f"scancel failed: {message}")

    def terminate(self) -> str:
        self._scancel("--signal=TERM", "--full")
        return f"scancel --signal=TERM --full {self.slurm_job}: SIGTERM to the batch script and every step"

    def kill(self) -> str:
        self._scancel()
        return f"scancel {self.slurm_job}: the job cancelled (Slurm sends SIGKILL after its KillWait)"
