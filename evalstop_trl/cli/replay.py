"""``evalstop replay``: what a detector would have done on a recorded eval curve."""

from __future__ import annotations

import argparse
import json
import sys

from ..analysis.logs import FORMATS as LOG_FORMATS
from ..core.detectors import DEFAULT_DETECTOR, DETECTORS, GATES, RECOMMENDED_POLICY
from .common import CLIError

__all__ = ["add_replay_command"]


def add_replay_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="what a detector would have done on a recorded eval curve",
        description="Replay a training log (a trainer_state.json, a JSONL from verl's file logger or W&B, verl's "
        "console log, a CSV such as W&B's export, a W&B JSON history, TensorBoard event files), or a job of an "
        "embedded coordinator's evalstop.db, through a detector and print whether and where it stops.",
    )
    p.add_argument("file", help="a log file (trainer_state.json, .jsonl, .csv, .json, a verl console .log), a "
                   "TensorBoard folder, or an evalstop.db (SQLite store)")
    p.add_argument("--job", help="evalstop.db: the job to replay (default: the tenant's only job)")
    p.add_argument("--tenant", default="local", help="evalstop.db: the jobs' tenant (default: local, the "
                   "embedded coordinator's)")
    p.add_argument("--metric", help="score column or key (default: the only numeric one, else the first eval_*)")
    p.add_argument("--format", dest="fmt", choices=(*LOG_FORMATS, "tensorboard"),
                   help="the log's format (default: detected from the file)")
    p.add_argument("--detector", default=DEFAULT_DETECTOR,
                   help=f"one of {', '.join(DETECTORS.names())} (default {DEFAULT_DETECTOR}; recommended for new "
                        f"users: {RECOMMENDED_POLICY['detector']} with --gate {RECOMMENDED_POLICY['gate']})")
    p.add_argument("--k", type=int, help="consecutive declines (decline) or evals without improvement (patience)")
    p.add_argument("--min-delta", type=float, dest="min_delta", help="a change must exceed this to count")
    p.add_argument("--direction", choices=("max", "min"), help="max (default): higher is better")
    p.add_argument("--fraction", type=float, help="stop_at: progress fraction to stop at")
    p.add_argument("--window", type=int, help="loss_plateau: window in evals")
    p.add_argument("--tolerance", type=float, help="loss_plateau: relative improvement threshold")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="any other detector parameter, e.g. --detector trend --param window=5 --param noise_prior=0.03")
    p.add_argument("--planned-steps", type=int, dest="planned_steps", help="planned steps (for progress)")
    p.add_argument("--gate", choices=sorted(GATES), help="kl_past_peak: a stop only past the KL clock's forecast peak "
                   "(reads the log's KL: objective/kl or kl, or --kl-metric); proxy_diverges: a stop only while "
                   "the proxy reward (the log's reward) is above its value at the best eval")
    p.add_argument("--kl-metric", dest="kl_metric", help="the log's key of the policy's KL to its reference model")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the curve with the best and stop steps (.png, .svg, .pdf)")
    p.set_defaults(func=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..analysis.replay import ReplayError, format_table, load_curve, replay_curve

    params = {
        k: getattr(args, k)
        for k in ("k", "min_delta", "direction", "fraction", "window", "tolerance")
        if getattr(args, k) is not None
    }
    for item in args.param:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise CLIError(f"--param must look like NAME=VALUE, got {item!r}")
        params[name.strip()] = _value(raw.strip())
    if args.planned_steps is not None and args.planned_steps < 1:
        raise CLIError(f"--planned-steps must be a positive number of steps, got {args.planned_steps}")
    try:
        curve = _store_curve(args) if _is_sqlite(args.file) else load_curve(args.file, args.metric, args.fmt,
                                                                            args.kl_metric)
        result = replay_curve(curve, args.detector, planned_steps=args.planned_steps, gate=args.gate, **params)
    except ReplayError as exc:
        raise CLIError(str(exc)) from None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.plot:
        from ..analysis.plots import plot_replay

        try:
            written = plot_replay(args.plot, curve, result, detector=args.detector)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        print(f"plot written to {written}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        desc = ", ".join(f"{k}={v}" for k, v in params.items())
        print(f"{args.file}: {curve.metric} ({curve.source}, {len(curve.steps)} evals), "
              f"detector {args.detector}{' ' + desc if desc else ''}")
        print(format_table(curve, result))
    return 0


def _is_sqlite(path: str) -> bool:
    """Whether ``path`` is a SQLite file (read only once it is known to be a regular file: a named pipe
    would block the read forever)."""
    import os
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _store_curve(args: argparse.Namespace):
    """The world-feedback curve of one job of an embedded coordinator's SQLite store."""
    from ..analysis.replay import Curve, ReplayError
    from ..stores.sqlite import SQLiteStore

    if args.metric not in (None, "eval_score"):
        raise CLIError(f"an evalstop.db holds each job's eval_score (world feedback), not {args.metric!r}")
    store = SQLiteStore(args.file)
    try:
        jobs = [j for j in store.jobs() if j.tenant == args.tenant]
        if args.job is None and len(jobs) != 1:
            names = ", ".join(j.job_id for j in jobs) or "(none)"
            raise CLIError(f"{args.file} has {len(jobs)} jobs of tenant {args.tenant!r} ({names}): pick one with --job")
        job = next((j for j in jobs if args.job in (None, j.job_id)), None)
        if job is None:
            raise CLIError(f"{args.file} has no job {args.job!r} of tenant {args.tenant!r}; its jobs: "
                           f"{', '.join(j.job_id for j in jobs) or '(none)'}")
        scored = [r for r in store.reports(job.tenant, job.job_id) if r.eval_score is not None]
    finally:
        store.close()
    if not scored:
        raise ReplayError(f"{args.file}: job {job.job_id!r} has no report with an eval score")
    if args.planned_steps is None:
        args.planned_steps = job.planned_steps
    def column(name: str) -> tuple:  # empty when no report has it
        values = tuple(getattr(r, name) for r in scored)
        return values if any(v is not None for v in values) else ()

    return Curve("eval_score", tuple(r.step for r in scored), tuple(r.eval_score for r in scored),
                 tuple(r.train_loss for r in scored), job.planned_steps, f"evalstop.db job {job.job_id}",
                 kls=column("kl"), proxies=column("proxy_reward"), lengths=column("length"))


def _value(raw: str):
    """A --param value: an int, a float, true/false, or the text itself."""
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
