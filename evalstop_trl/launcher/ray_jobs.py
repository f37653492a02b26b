"""Ray Jobs: submit a job bound to its EvalStop job, and stop it through Ray (``pip install 'evalstop[ray]'``).

:func:`submit` submits with ``submission_id`` = the EvalStop job id and ``metadata`` =
``{"evalstop_job_id": ..., "tenant": ...}``; the entrypoint's runtime environment gets ``EVALSTOP_URL``
and ``EVALSTOP_JOB_ID`` (the token only when asked: Ray shows a job's runtime environment to every
holder of the cluster's token) and ``RAY_JOB_STOP_WAIT_TIME_S`` = the grace, so Ray's own SIGKILL
comes ``grace_s`` after its SIGTERM. :class:`RayJob` is the watcher's view of it
(:mod:`.remote`). Ray's authentication is one token for the whole cluster (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, read by Ray itself): whoever holds it may stop any
job, so the watcher checks the owner itself before every stop: the job's metadata must name this
EvalStop job and the token's tenant (for a job it submitted itself: be exactly what it submitted).
Ray's API: ``ray.job_submission.JobSubmissionClient`` (``submit_job``, ``get_job_info``, ``stop_job``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .remote import RemoteRefused, RemoteState, RemoteStatus

__all__ = ["RayJob", "submit"]

#: Ray's job states (``ray.job_submission.JobStatus`` values) as the watcher's
STATES: Mapping[str, RemoteState] = {"PENDING": RemoteState.PENDING, "RUNNING": RemoteState.RUNNING,
                                     "SUCCEEDED": RemoteState.SUCCEEDED, "FAILED": RemoteState.FAILED,
                                     "STOPPED": RemoteState.STOPPED}
_NOT_FOUND = "does not exist"  # in the 404 Ray's client raises as a RuntimeError


def connect(address: str) -> Any:
    """A ``JobSubmissionClient`` of the Ray cluster at ``address`` (its dashboard, ``http://HOST:8265``)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


class RayJob:
    """One Ray job as the watcher sees it.

    Args:
        ray: a ``JobSubmissionClient``.
        submission_id: the job's ``submission_id``.
        submitted: the metadata this process submitted it with (None: attached to a job submitted
            elsewhere, whose metadata must then name the EvalStop job and the token's tenant).
    """

    escalates = True  # stop_job: SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S

    def __init__(self, ray: Any, submission_id: str, submitted: Mapping[str, str] | None = None) -> None:
        self.ray, self.submission_id = ray, submission_id
        self.submitted = dict(submitted) if submitted is not None else None
        self.label = f"Ray job {submission_id}"

    def _info(self) -> Any:
        return self.ray.get_job_info(self.submission_id)

    def status(self) -> RemoteStatus:
        try:
            info = self._info()
        except RuntimeError as exc:
            if _NOT_FOUND in str(exc):
                return RemoteStatus(RemoteState.GONE, "no longer known to Ray")
            raise
        status = str(getattr(info.status, "value", info.status))
        return RemoteStatus(STATES.get(status, RemoteState.RUNNING), f"{status}: {info.message or ''}".rstrip(": "))

    def refusal(self, job_id: str, tenant: str) -> str | None:
        metadata = dict(self._info().metadata or {})
        if self.submitted is not None:  # this watcher's own submission (its job id may have become NAME-2 since)
            if metadata != self.submitted:
                return "its metadata is no longer what this watcher submitted (the submission id was reused)"
            return None
        if metadata.get("evalstop_job_id") != job_id:
            return (f"its metadata names EvalStop job {metadata.get('evalstop_job_id')!r}, not {job_id!r} "
                    "(submit it with evalstop ray submit, or with that metadata)")
        if not tenant or metadata.get("tenant") != tenant:
            return f"its metadata names tenant {metadata.get('tenant')!r}, and this token speaks for {tenant!r}"
        return None

    def terminate(self) -> str:
        try:
            self.ray.stop_job(self.submission_id)
        except RuntimeError as exc:
            if _NOT_FOUND in str(exc):
                raise RemoteRefused(f"{self.label} is no longer known to Ray") from None
            raise
        return f"Ray stop_job({self.submission_id}) asked for: SIGTERM to the entrypoint's processes, SIGKILL " \
               "after RAY_JOB_STOP_WAIT_TIME_S"

    def kill(self) -> str:  # pragma: no cover - Ray escalates by itself (escalates = True)
        return self.terminate()


def submit(ray: Any, job_id: str, tenant: str, entrypoint: Sequence[str] | str, *, url: str, grace_s: float,
           token: str | None = None, runtime_env: Mapping[str, Any] | None = None) -> RayJob:
    """Submit ``entrypoint`` as Ray job ``job_id`` bound to EvalStop job ``job_id`` of ``tenant``.

    ``token``: exported to the entrypoint as ``EVALSTOP_TOKEN`` when given (readable by every holder of
    the Ray cluster's token). ``runtime_env``: the job's own (its ``env_vars`` are kept; EvalStop's are
    added). Raises ValueError for a bad ``runtime_env``, and what Ray raises (a taken submission id).
    """
    import shlex

    env = dict(runtime_env or {})
    env_vars = env.get("env_vars", {})
    if not isinstance(env_vars, Mapping) or not all(isinstance(v, str) for v in env_vars.values()):
        raise ValueError(f"runtime_env.env_vars must map names to strings, but got {env_vars!r:.100}")
    env["env_vars"] = {**env_vars, "EVALSTOP_URL": url, "EVALSTOP_JOB_ID": job_id,
                       "RAY_JOB_STOP_WAIT_TIME_S": str(max(1, math.ceil(grace_s))),
                       **({"EVALSTOP_TOKEN": token} if token else {})}
    metadata = {"evalstop_job_id": job_id, "tenant": tenant}
    command = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
    ray.submit_job(entrypoint=command, submission_id=job_id, metadata=metadata, runtime_env=env)
    return RayJob(ray, job_id, metadata)
