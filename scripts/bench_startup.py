"""Benchmark: how long does a coordinator take to start over a long finished history?

Writes ``--jobs`` finished jobs with ``--reports`` reports each straight into a fresh SQLite
database, then times ``Coordinator(SQLiteStore(db))`` (what ``evalstop serve`` does before it
answers) twice: as it starts now (finished jobs lazily: their records only, their reports replayed
on first access) and replaying every job at start (as it did before issue 17: the time grew with
every report ever stored, 1M reports -> 8.1 s). Prints a table; ``--json OUT`` writes the numbers.

    python scripts/bench_startup.py [--jobs 100000] [--reports 10] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def seed(db: str | Path, jobs: int, reports_per_job: int, tenant: str = "alice") -> None:
    """``jobs`` finished jobs of ``tenant`` with ``reports_per_job`` reports each (the history's end state)."""
    from evalstop_trl import SQLiteStore

    SQLiteStore(db).close()  # the schema
    policy = json.dumps({"detector": "decline", "k": 2, "min_delta": 0.0, "direction": "max"})
    conn = sqlite3.connect(str(db))
    with conn:
        conn.executemany(
            "INSERT INTO jobs (tenant, job_id, job_type, policy, status, created_at, updated_at, finished_at) "
            "VALUES (?, ?, 'grpo', ?, 'finished', ?, ?, ?)",
            ((tenant, f"j{i}", policy, 1.0 + i, 2.0 + i, 2.0 + i) for i in range(jobs)))
        conn.executemany(
            "INSERT INTO reports (tenant, job_id, step, eval_score, train_loss, received_at) VALUES (?, ?, ?, ?, ?, ?)",
            ((tenant, f"j{i}", s, 0.5 + 0.01 * s, 1.0 / (s + 1), 1.0 + i) for i in range(jobs)
             for s in range(reports_per_job)))
    conn.close()


def start_up(db: str | Path, eager: bool = False) -> float:
    """Seconds to construct a coordinator over ``db`` (``eager``: and replay every job, as before)."""
    from evalstop_trl import Coordinator, SQLiteStore

    t0 = time.perf_counter()
    coord = Coordinator(SQLiteStore(db))
    if eager:
        for record in coord.store.jobs():
            coord.state(record.tenant, record.job_id)
    elapsed = time.perf_counter() - t0
    coord.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--reports", type=int, default=10, help="reports per finished job")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.db"
        t0 = time.perf_counter()
        seed(db, args.jobs, args.reports)
        seeded = time.perf_counter() - t0
        lazy = [start_up(db) for _ in range(args.repeat)]
        eager = [start_up(db, eager=True) for _ in range(args.repeat)]
    rows = {"lazy (now)": lazy, "replay every job (before)": eager}
    print(f"start-up over {args.jobs:,} finished jobs, {args.jobs * args.reports:,} reports "
          f"(seeded in {seeded:.1f} s; {args.repeat} runs each)")
    print(f"{'start-up':<28}{'median s':>10}{'min s':>8}{'max s':>8}")
    for name, times in rows.items():
        print(f"{name:<28}{statistics.median(times):>10.2f}{min(times):>8.2f}{max(times):>8.2f}")
    if args.json:
        out = {"jobs": args.jobs, "reports": args.jobs * args.reports, "python": platform.python_version(),
               "machine": platform.machine(), **{k: {"median_s": statistics.median(v), "runs_s": v}
                                                 for k, v in rows.items()}}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
