"""``evalstop shadow-report``: how would-stop decisions of shadow-mode jobs compare with how the runs ended.

Reads the tenant's shadow jobs from a running service (``--url``) or an embedded ``evalstop.db``
(``--db``), their reports, and prints one line per job with its verdict
(:mod:`evalstop_trl.analysis.shadow`: right / early / missed / quiet / running) and a summary; ``--json``
for scripts. Before enforcing, a platform runs in shadow mode for a while, then reads this report.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import CLIError
from .inspection import add_target_flags, open_client

__all__ = ["add_shadow_command"]

_PAGE = 1000  # reports read per request


def add_shadow_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shadow-report", help="compare shadow-mode would-stop steps with how each run ended",
                       description="For every shadow-mode job of the tenant: where it would have stopped, how the "
                                   "run ended, and a verdict (right, early, missed, quiet, running), judged on the "
                                   "run's own curve relative to its range.")
    add_target_flags(p)
    p.add_argument("--margin", type=float, default=0.2,
                   help="share of a run's own eval range that counts as a real loss or decline (default 0.2)")
    p.add_argument("--json", action="store_true", help="one JSON object: jobs and summary")
    p.set_defaults(func=_cmd_shadow_report)


def _all_reports(client: Any, job_id: str) -> list[Any]:
    out: list[Any] = []
    after = None
    while True:
        page = client.reports(job_id, after_step=after, limit=_PAGE)
        out.extend(page)
        if len(page) < _PAGE:
            return out
        after = page[-1].step


def _cmd_shadow_report(args: argparse.Namespace) -> int:
    from ..analysis.shadow import shadow_outcome, summarize
    from ..core.errors import EvalStopError

    client = open_client(args)
    outcomes = []
    try:
        for job in client.list_jobs():
            if job.policy.get("mode") != "shadow":
                continue
            outcomes.append(shadow_outcome(job.job_id, job.status, job.would_stop_step,
                                           _all_reports(client, job.job_id),
                                           direction=str(job.policy.get("direction", "max")), margin=args.margin))
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    finally:
        client.close()
    summary = summarize(outcomes)
    if args.json:
        print(json.dumps({"jobs": [o.to_dict() for o in outcomes], "summary": summary.to_dict()}))
        return 0
    if not outcomes:
        print("no shadow-mode jobs (register with policy mode 'shadow', EvalStopCallback(..., shadow=True), or set "
              "the tenant's default: evalstop tenants quota NAME --default-mode shadow)")
        return 0
    print(f"{'job':<24}{'status':<10}{'would stop':>11}{'last step':>10}{'saved':>7}{'gap':>7}  verdict")
    for o in outcomes:
        gap = "" if o.gap is None else f"{o.gap:.2f}"
        print(f"{o.job_id:<24}{o.status:<10}{_s(o.would_stop_step):>11}{_s(o.last_step):>10}{_s(o.steps_saved):>7}"
              f"{gap:>7}  {o.verdict.value}")
    c = summary.counts
    print(f"{summary.jobs} job(s): {c['right']} right, {c['early']} early, {c['missed']} missed, {c['quiet']} quiet, "
          f"{c['running']} running; would have saved {summary.steps_saved_right} of {summary.steps_trained} steps "
          f"trained by ended runs with right stops ({summary.steps_saved_all} counting early ones)")
    return 0


def _s(value: Any) -> str:
    return "" if value is None else str(value)
