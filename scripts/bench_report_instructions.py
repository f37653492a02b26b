"""Instructions per report on the coordinator's common path, counted by valgrind (callgrind).

An embedded coordinator on a MemoryStore with 50 running jobs (``decline`` with a ``k`` no eval
reaches, so every report continues: the common path) takes ``--evals`` reports per job; the count of
a run with 2 evals per job is subtracted from one with ``2 + --evals``, and so is the same loop
building the requests without reporting them. What is left, divided by the reports, is one
``Coordinator.report`` call: the check, the repository's one call, the pure step, the write and the
swap (the request record is built by the caller, counted apart). Needs ``valgrind``.

    python scripts/bench_report_instructions.py [--evals 20] [--json OUT]
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


def _child(evals: int, report: bool) -> None:
    import math

    sys.path.insert(0, str(ROOT))
    from evalstop_trl.core.coordinator import Coordinator
    from evalstop_trl.core.requests import JobRequest, ReportRequest

    coord = Coordinator()
    for j in range(JOBS):
        coord.register_job("t", JobRequest(f"j{j}", "grpo", planned_steps=10**9, policy={"detector": "decline", "k": 999}))
    names = [f"j{j}" for j in range(JOBS)]
    for i in range(1, evals + 1):
        for j, name in enumerate(names):
            request = ReportRequest(i, 0.5 + 0.1 * math.sin(0.7 * i + j), 0.1, 0.2)
            if report:
                coord.report("t", name, request)


def instructions(evals: int, report: bool) -> int:
    from bench_sim_instructions import callgrind_count  # the one callgrind counter (this script's folder)

    return callgrind_count([__file__, "--child", str(evals), "1" if report else "0"])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(int(sys.argv[2]), sys.argv[3] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evals", type=int, default=20, help="reports per job counted (after 2 of warm-up)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    n = args.evals * JOBS
    loop = (instructions(2 + args.evals, False) - instructions(2, False)) / n
    total = (instructions(2 + args.evals, True) - instructions(2, True)) / n
    result = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
              "python": platform.python_version(), "reports": n, "loop_and_request_per_report": round(loop),
              "report_call": round(total - loop)}
    print(f"one common-path Coordinator.report: {result['report_call']:,} instructions "
          f"(the caller's loop and request record: {result['loop_and_request_per_report']:,} more)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
