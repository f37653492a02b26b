"""Slurm: stop a batch job through Slurm itself, as the job's own user (no extra to install: Slurm's
``squeue`` and ``scancel`` must be on PATH).

:class:`SlurmJob` is the watcher's view of one job (:mod:`.remote`). Its owner and state come from
``squeue -h -t all -j ID -o %U|%T|%r`` (numeric uid, state, reason: fields the job's own text cannot
forge, as a ``--comment`` or ``--job-name`` holding ``UserId=root(0)`` forges ``scontrol``'s
``Key=Value`` lines); a stop is ``scancel --signal=TERM --full ID`` (without ``--full`` the batch script
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
_ID = re.compile(r"[0-9]+(_[0-9]+)?")  # a job id, or an array task's JOB_TASK
_TIMEOUT_S = 30.0


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name}({uid})"
    except KeyError:
        return str(uid)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


class SlurmJob:
    """One Slurm job (``slurm_job``: its id, ``12`` or an array task's ``12_3``)."""

    escalates = False  # scancel --signal=TERM signals only; the forced stop is a second scancel

    def __init__(self, slurm_job: str) -> None:
        if not _ID.fullmatch(slurm_job):
            raise ValueError(f"a Slurm job id is digits (an array task: JOB_TASK), but got {slurm_job!r}")
        self.slurm_job, self.label = slurm_job, f"Slurm job {slurm_job}"

    def query(self) -> tuple[int, str, str] | None:
        """(owner's uid, state, reason) from ``squeue`` (None once Slurm no longer knows the job)."""
        done = _run("squeue", "-h", "-t", "all", "-j", self.slurm_job, "-o", "%U|%T|%r")
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise OSError(f"squeue -j {self.slurm_job} failed: {done.stderr.strip()[:300]}")
        lines = done.stdout.splitlines()
        if not lines:
            return None
        uid, state, reason = (lines[0].split("|", 2) + ["", ""])[:3]
        if not uid.isdigit():
            raise OSError(f"squeue -j {self.slurm_job} answered {lines[0][:100]!r}, not UID|STATE|REASON")
        return int(uid), state, reason

    def status(self) -> RemoteStatus:
        got = self.query()
        if got is None:
            return RemoteStatus(RemoteState.GONE, "no longer known to Slurm")
        _, state, reason = got
        return RemoteStatus(STATES.get(state, RemoteState.RUNNING), f"{state} (reason {reason or 'None'})")

    def refusal(self, job_id: str, tenant: str) -> str | None:
        got = self.query()
        if got is None:
            return "Slurm no longer knows it"
        me = os.getuid()
        if got[0] != me:
            return (f"it belongs to user {_user(got[0])}, and this watcher runs as {_user(me)}: run it as the "
                    "job's own user")
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
