"""Instructions per report and per registration on the coordinator's common path, counted by valgrind (callgrind).

Reports: an embedded coordinator on a MemoryStore with 50 running jobs (``decline`` with a ``k`` no
eval reaches, so every report continues: the common path) takes ``--evals`` reports per job; the
count of a run with 2 evals per job is subtracted from one with ``2 + --evals``, and so is the same
loop building the requests without reporting them. What is left, divided by the reports, is one
``Coordinator.report`` call: the check, the repository's one call, the pure step, the write and the
swap (the request record is built by the caller, counted apart).

Registrations: the same coordinator registers ``--registrations`` new jobs of one tenant after 2 of
warm-up, through ``register_job`` (the API: it answers the job's view) and through ``add_job`` (the
simulator's: no view), the loop building the ``JobRequest`` records subtracted the same way: one
common-path registration (the parse, the repository's one call: lookup, quotas, the records, the
insert and the swap). Needs ``valgrind``.

    python scripts/bench_report_instructions.py [--evals 20] [--registrations 500] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = 50


def _child(what: str, n: int, call: bool) -> None:
    import math

    sys.path.insert(0, str(ROOT))
    from evalstop_trl.core.coordinator import Coordinator
    from evalstop_trl.core.requests import JobRequest, ReportRequest

    coord = Coordinator()
    if what != "report":  # register_job or add_job: n new jobs
        register = getattr(coord, what)
        for i in range(n):
            request = JobRequest(f"r{i}", "grpo", planned_steps=1000)
            if call:
                register("t", request)
        return
    for j in range(JOBS):
        coord.register_job("t", JobRequest(f"j{j}", "grpo", planned_steps=10**9, policy={"detector": "decline", "k": 999}))
    names = [f"j{j}" for j in range(JOBS)]
    for i in range(1, n + 1):
        for j, name in enumerate(names):
            request = ReportRequest(i, 0.5 + 0.1 * math.sin(0.7 * i + j), 0.1, 0.2)
            if call:
                coord.report("t", name, request)


def instructions(what: str, n: int, call: bool) -> int:
    from bench_sim_instructions import callgrind_count  # the one callgrind counter (this script's folder)

    return callgrind_count([__file__, "--child", what, str(n), "1" if call else "0"])


def per_call(what: str, warmup: int, n: int, calls: int) -> tuple[float, float]:
    """(one call, the caller's loop and request record per call): instructions of ``warmup + n``
    minus ``warmup`` (the unit of ``what``: evals per job, or jobs), divided by ``calls``."""
    loop = (instructions(what, warmup + n, False) - instructions(what, warmup, False)) / calls
    total = (instructions(what, warmup + n, True) - instructions(what, warmup, True)) / calls
    return total - loop, loop


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=20, help="reports per job counted (after 2 of warm-up)")
    ap.add_argument("--registrations", type=int, default=500,
                    help="new jobs registered and counted (after 2 of warm-up; at most 998: max_active_jobs)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    n = args.evals * JOBS
    report, loop = per_call("report", 2, args.evals, n)
    result = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
              "python": platform.python_version(), "reports": n, "loop_and_request_per_report": round(loop),
              "report_call": round(report), "registrations": args.registrations}
    print(f"one common-path Coordinator.report: {result['report_call']:,} instructions "
          f"(the caller's loop and request record: {result['loop_and_request_per_report']:,} more)")
    for what in ("register_job", "add_job"):
        call, loop = per_call(what, 2, args.registrations, args.registrations)
        result[f"{what}_call"], result["loop_and_request_per_registration"] = round(call), round(loop)
        print(f"one common-path Coordinator.{what}: {round(call):,} instructions "
              f"(the caller's loop and request record: {round(loop):,} more)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
