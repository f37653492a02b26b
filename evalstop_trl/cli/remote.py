"""``evalstop ray submit|watch`` and ``evalstop slurm watch``: stops for jobs that run on Ray or Slurm.

``evalstop ray submit --address URL --job-id J -- ENTRYPOINT`` submits ENTRYPOINT as Ray job J (its
``submission_id``), bound to EvalStop job J of the token's tenant, registers J and watches both until
the Ray job ends; ``evalstop ray watch --job-id J`` attaches to a Ray job submitted elsewhere (its
metadata must name J and the tenant). ``evalstop slurm watch --job-id J --slurm-job ID`` watches a
Slurm job as its own user, from outside it (a login node): ``scancel --full`` signals every process
of the job, a watcher inside it too; inside a batch script, run the training under ``evalstop run``. How a stop is delivered, and the exit status: :mod:`evalstop_trl.launcher.remote`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any

from .common import CLIError, add_job_flags, add_token_flags, after_dashes, job_policy, read_token

__all__ = ["add_remote_commands"]

_SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # goes into Ray's /api/jobs/{id}: no '/', '.', '..'

_EPILOG = """{stop}

exit status:
  0 (or --stopped-exit-code N)  EvalStop stopped the job
  0 / 1                         the job succeeded / failed or was stopped outside EvalStop
  2                             bad input, a refused registration, or a stop refused (not this
                                {owner}'s job: nothing was sent)
  3                             the stop was asked for and the job still ran after its grace"""


def _watch(args: argparse.Namespace, who: str, make: Callable[[Any, Any, str | None], Any], *, attach: bool) -> int:
    """Register the job, let ``make(client, link, tenant)`` give the remote job, and watch it to its
    end. ``attach``: the remote job runs already (an ended EvalStop job stays itself, its stop is
    delivered), else it is a new run (an ended job's next run, ``NAME-2``, is registered)."""
    from ..clients.http import EvalStopClient
    from ..core.errors import EvalStopError
    from ..core.records import check_name
    from ..launcher import heartbeat_interval, log_text
    from ..launcher.link import JobLink
    from ..launcher.remote import RemoteWatcher

    policy = job_policy(args)
    try:
        check_name("--job-id", args.job_id)
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    url, token = _coordinator(args, who)
    try:
        client = EvalStopClient(url, token, retries=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        link = JobLink(client, args.job_id, job_type=args.job_type, planned_steps=args.planned_steps,
                       policy=policy, who=who, next_run=not attach)
        try:
            confirmed = link.register()
        except EvalStopError as exc:
            raise CLIError(f"cannot register job {log_text(args.job_id)}: {log_text(exc)}") from None
        tenant = _tenant(client)
        remote = make(client, link, tenant)
        print(f"{who}: EvalStop job {link.job_id} watches {remote.label}", file=sys.stderr, flush=True)
        result = RemoteWatcher(client, link, remote, grace_s=args.grace_s, confirmed=confirmed, tenant=tenant,
                               heartbeat_s=heartbeat_interval(args.lease_s),
                               stopped_exit_code=args.stopped_exit_code).run()
        if result.refused:
            print(f"{who}: error: the stop was not delivered to {remote.label}: {result.refused}", file=sys.stderr)
        else:
            print(f"{who}: {remote.label} ended ({result.final.state.value}); exit status {result.exit_status}",
                  file=sys.stderr, flush=True)
        return result.exit_status
    finally:
        client.close()


def _coordinator(args: argparse.Namespace, who: str) -> tuple[str, str]:
    """The coordinator's URL and the token (CLIError when either is missing)."""
    url = args.url or os.environ.get("EVALSTOP_URL")
    if not url:
        raise CLIError(f"{who} needs the coordinator's URL (--url or $EVALSTOP_URL): the job must reach it too")
    return url, read_token(args)


def _tenant(client: Any) -> str | None:
    try:
        return client.summary().tenant or None
    except Exception:  # noqa: BLE001 - fail-open: asked again when a stop needs it
        return None


def _cmd_ray_submit(args: argparse.Namespace) -> int:
    from ..launcher import log_text
    from ..launcher.ray_jobs import connect, submit

    entrypoint = after_dashes(args.entrypoint, "entrypoint", "evalstop ray submit --job-id j1 -- python train.py")
    runtime_env = _runtime_env(args.runtime_env_json)
    url, token = _coordinator(args, "evalstop ray submit")
    ray = _connect(connect, args.address)

    taken = _ray_job_exists(ray, args.job_id)
    if taken:
        raise CLIError(f"Ray job {args.job_id} exists already ({taken}): pass another --job-id, or follow it with "
                       f"evalstop ray watch --job-id {args.job_id}")

    def make(client: Any, link: Any, tenant: str | None) -> Any:
        try:
            return submit(ray, link.job_id, tenant or "", entrypoint, url=url, grace_s=args.grace_s,
                          token=token if args.export_token else None, runtime_env=runtime_env)
        except (ValueError, RuntimeError) as exc:
            why = f"Ray refused job {log_text(link.job_id)}: {_last_line(exc)}"
            if link.fresh:  # registered by this command and never started: failed, not left to its lease
                link.settle(1, why)
            raise CLIError(why) from None

    return _watch(args, "evalstop ray submit", make, attach=False)


def _ray_job_exists(ray: Any, submission_id: str) -> str:
    """The state of Ray job ``submission_id`` ("" when there is none, or it cannot be told)."""
    try:
        return str(getattr(ray.get_job_status(submission_id), "value", "")) or "known"
    except Exception:  # noqa: BLE001 - Ray's 404 (and an answer that cannot be told): submit decides
        return ""


def _last_line(exc: BaseException) -> str:
    """An error's last non-empty line (Ray puts the server's traceback in its message), fit for one line."""
    from ..launcher import log_text

    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return log_text(lines[-1] if lines else type(exc).__name__, 300)


def _cmd_ray_watch(args: argparse.Namespace) -> int:
    from ..launcher.ray_jobs import RayJob, connect

    submission_id = args.job_id if args.ray_job is None else args.ray_job
    if not _SUBMISSION_ID.fullmatch(submission_id):
        raise CLIError(f"--ray-job must be a Ray submission id (a letter or digit, then letters, digits, '_', '-', "
                       "'.', ':'; at most 128), "
                       f"got {submission_id[:60]!r}")
    _coordinator(args, "evalstop ray watch")
    ray = _connect(connect, args.address)
    return _watch(args, "evalstop ray watch", lambda client, link, tenant: RayJob(ray, submission_id), attach=True)


def _cmd_slurm_watch(args: argparse.Namespace) -> int:
    from ..launcher.slurm import SlurmJob

    try:
        remote = SlurmJob(args.slurm_job)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return _watch(args, "evalstop slurm watch", lambda client, link, tenant: remote, attach=True)


def _connect(connect: Callable[[str], Any], address: str | None) -> Any:
    address = address or os.environ.get("RAY_ADDRESS") or "http://127.0.0.1:8265"
    try:
        return connect(address)
    except Exception as exc:  # noqa: BLE001 - Ray's own errors (unreachable, authentication) as one line
        raise CLIError(f"cannot reach the Ray cluster at {address}: {type(exc).__name__}: {str(exc)[:400]}") from None


def _runtime_env(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        env = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIError(f"--runtime-env-json is not JSON: {exc}") from None
    if not isinstance(env, dict):
        raise CLIError(f"--runtime-env-json must be a JSON object, got {type(env).__name__}")
    return env


def _common(p: argparse.ArgumentParser, backend: str, how: str, check: str, owner: str) -> None:
    from ..launcher.remote import ACK_WINDOW_S

    stop = textwrap.fill(f"a stop: a job that acknowledged it (its callback saves the best checkpoint) gets --grace-s "
                         f"to end on its own; else, {ACK_WINDOW_S:g} s after the stop, the watcher checks that "
                         f"{check}, and asks {backend} to stop it: {how}.", 96)
    p.epilog = _EPILOG.format(stop=stop, owner=owner)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL)")
    add_token_flags(p)
    p.add_argument("--job-id", required=True, help="the EvalStop job")
    add_job_flags(p, grace=f"seconds an acknowledged job has to end, and between {backend}'s SIGTERM and SIGKILL")


def add_remote_commands(sub: argparse._SubParsersAction) -> None:
    ray = sub.add_parser("ray", help="run and stop jobs on Ray Jobs").add_subparsers(dest="ray_command",
                                                                                   required=True, metavar="ACTION")
    how = "stop_job, SIGTERM to the entrypoint's processes and SIGKILL --grace-s later"
    check = "the Ray job's metadata names this EvalStop job and the token's tenant"
    p = ray.add_parser("submit", help="submit a Ray job bound to an EvalStop job, and stop it when EvalStop does",
                       description="Submit ENTRYPOINT to Ray Jobs with submission_id = --job-id and metadata "
                       "{evalstop_job_id, tenant}, EVALSTOP_URL and EVALSTOP_JOB_ID in its environment, register "
                       "the job, and watch both until the Ray job ends.")
    _common(p, "Ray", how, check, "tenant")
    p.add_argument("--address", help="the Ray dashboard (default: $RAY_ADDRESS, else http://127.0.0.1:8265); "
                   "Ray's token comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")
    p.add_argument("--runtime-env-json", metavar="JSON", help="the job's runtime environment (EvalStop's "
                   "variables are added to its env_vars)")
    p.add_argument("--export-token", action="store_true", help="also export EVALSTOP_TOKEN to the entrypoint; "
                   "every holder of the Ray cluster's token can read a job's runtime environment")
    p.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- ENTRYPOINT [ARGS...]")
    p.set_defaults(func=_cmd_ray_submit)
    p = ray.add_parser("watch", help="watch a Ray job submitted elsewhere and stop it when EvalStop does",
                       description="Attach to a running Ray job whose metadata names the EvalStop job "
                       "(evalstop_job_id) and this token's tenant (tenant), and stop it when EvalStop does.")
    _common(p, "Ray", how, check, "tenant")
    p.add_argument("--address", help="the Ray dashboard (default: $RAY_ADDRESS, else http://127.0.0.1:8265)")
    p.add_argument("--ray-job", metavar="SUBMISSION_ID", help="the Ray job (default: --job-id)")
    p.set_defaults(func=_cmd_ray_watch)

    slurm = sub.add_parser("slurm", help="stop Slurm jobs").add_subparsers(dest="slurm_command", required=True,
                                                                           metavar="ACTION")
    p = slurm.add_parser("watch", help="watch a Slurm job and stop it (as its own user) when EvalStop does",
                         description="Register the EvalStop job, send its heartbeats and follow the Slurm job "
                         "(squeue); on a stop, scancel --signal=TERM --full, then scancel --grace-s "
                         "later. Only the job's own user may: run it as that user, outside the job (inside a batch "
                         "script, run the training under evalstop run instead: scancel --full signals every process "
                         "of the job).")
    _common(p, "Slurm", "scancel --signal=TERM --full, then scancel --grace-s later",
            "the Slurm job belongs to the user the watcher runs as", "user")
    p.add_argument("--slurm-job", metavar="ID", required=True, help="the Slurm job (sbatch --parsable prints it)")
    p.set_defaults(func=_cmd_slurm_watch)
