"""Benchmark: one tenant lists 20,000 jobs as fast as the server lets it; how long does another
tenant's report take? (The scenario of tests/service/test_security.py test 6, with the tail measured.)

Tenant A's 20,000 registrations are written straight into a fresh SQLite database; `evalstop serve`
starts over it on loopback; tenant B sends ``--reports`` reports (10 ms apart) while the server is
idle, then again while A pages through its jobs (1,000 a page) in another process. Prints B's
report latency (median, p90, p99, max) in both phases and how many of A's pages were served or
answered 429. Before the fix a listing held the event loop: B's median went from 13 to 380 ms.

The unit test bounds only the median (a tail on a shared machine says little about the loop); the
tail is measured here:

    python scripts/bench_listing.py [--jobs 20000] [--reports 300] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Tenant A's loop, in its own process (in a thread of the measuring process, parsing 1,000-job pages
#: would hold its GIL and slow the very report timings it is compared with).
FLOOD = """
import json, sys, time, httpx
url, token, stop_file, jobs = sys.argv[1:]
pages = {}
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}, timeout=30) as c:
    while True:
        for offset in range(0, int(jobs), 1000):
            r = c.get(f"/v1/jobs?limit=1000&offset={offset}")
            pages[str(r.status_code)] = pages.get(str(r.status_code), 0) + 1  # 429: over its read budget
            if r.status_code == 429:  # as fast as the server lets it: back again after Retry-After
                time.sleep(float(r.headers["retry-after"]))
            try:
                open(stop_file).close()
                print(json.dumps(pages))
                sys.exit(0)
            except FileNotFoundError:
                pass
"""


def seed_jobs(db: str | Path, tenant: str, n: int) -> None:
    """``n`` registrations of ``tenant`` written straight into the SQLite database (the attack's end state)."""
    import sqlite3

    from evalstop_trl import SQLiteStore

    SQLiteStore(db).close()  # create the schema
    con = sqlite3.connect(db)
    con.executemany(
        "INSERT INTO jobs (tenant, job_id, job_type, planned_steps, policy, status, created_at, updated_at) "
        "VALUES (?, ?, 'grpo', 100, '{\"detector\": \"decline\", \"k\": 2, \"min_delta\": 0.0, "
        "\"direction\": \"max\"}', 'pending', ?, ?)",
        [(tenant, f"flood-{i}", float(i), float(i)) for i in range(n)])
    con.commit()
    con.close()


def report_latencies(url: str, token: str, job: str, n: int, start: int) -> list[float]:
    """Seconds each of ``n`` reports of ``job`` took (10 ms apart, steps from ``start``), sorted."""
    import httpx

    out = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as c:
        for step in range(start, start + n):
            t = time.perf_counter()
            r = c.post(f"/v1/jobs/{job}/reports", json={"step": step, "eval_score": 0.5})
            out.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise RuntimeError(f"POST /v1/jobs/{job}/reports: HTTP {r.status_code}: {r.text}")
            time.sleep(0.01)
    return sorted(out)


def measure(url: str, token_a: str, token_b: str, jobs: int, reports: int, workdir: Path, job: str = "b") -> dict:
    """Register B's ``job``, time ``reports`` of its reports idle, then while A lists its ``jobs``.

    Returns ``{"idle": [...], "busy": [...], "pages": {"200": ..., "429": ...}}`` (latencies in
    seconds, sorted); raises RuntimeError if the lister fails.
    """
    import httpx

    r = httpx.post(f"{url}/v1/jobs", json={"job_id": job}, headers={"Authorization": f"Bearer {token_b}"})
    if r.status_code not in (200, 201):
        raise RuntimeError(f"POST /v1/jobs: HTTP {r.status_code}: {r.text}")
    idle = report_latencies(url, token_b, job, reports, 0)
    stop_file = workdir / f"stop-{job}"
    lister = subprocess.Popen([sys.executable, "-c", FLOOD, url, token_a, str(stop_file), str(jobs)],
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the flood is under way (its first pages are A's burst)
        busy = report_latencies(url, token_b, job, reports, reports)
    finally:
        stop_file.touch()
        out, _ = lister.communicate(timeout=60)
    if lister.returncode != 0:
        raise RuntimeError(f"the lister exited with {lister.returncode}: {out}")
    return {"idle": idle, "busy": busy, "pages": {"200": 0, "429": 0, **json.loads(out)}}


def quantile(sorted_xs: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank below; the test's convention)."""
    return sorted_xs[int(q * (len(sorted_xs) - 1))]


def summary(latencies: list[float]) -> dict:
    xs = sorted(latencies)
    return {"n": len(xs), **{f"{name}_ms": 1e3 * quantile(xs, q) for name, q in
                             (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000, help="tenant A's registrations")
    ap.add_argument("--reports", type=int, default=300, help="tenant B's reports per phase")
    ap.add_argument("--repeat", type=int, default=1, help="runs (one server each)")
    ap.add_argument("--json", metavar="OUT", help="write the results (and every latency) as JSON")
    args = ap.parse_args()
    if not 1_000 <= args.jobs <= 200_000 or not 10 <= args.reports <= 10_000 or not 1 <= args.repeat <= 50:
        ap.error("--jobs must be in 1000..200000, --reports in 10..10000 and --repeat in 1..50")

    from evalstop_trl.clients.local import LocalServer

    runs = []
    for i in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="evalstop-listing-"))
        db = tmp / "coord.db"
        seed_jobs(db, "alice", args.jobs)
        with LocalServer(db, tenants=("alice", "bob"), args=("--max-active-jobs", str(10 * args.jobs))) as srv:
            got = measure(srv.url, srv.tokens["alice"], srv.tokens["bob"], args.jobs, args.reports, tmp)
        runs.append(got)
        print(f"run {i + 1}/{args.repeat}: done", file=sys.stderr, flush=True)

    print(f"tenant B's report latency (ms; {args.reports} reports a phase) while tenant A lists {args.jobs:,} jobs")
    print(f"{'run':>4} {'phase':<6}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}   A's pages (200 / 429)")
    for i, got in enumerate(runs, 1):
        for phase in ("idle", "busy"):
            s = summary(got[phase])
            pages = f"   {got['pages']['200']} / {got['pages']['429']}" if phase == "busy" else ""
            print(f"{i:>4} {phase:<6}{s['p50_ms']:>8.1f}{s['p90_ms']:>8.1f}{s['p99_ms']:>8.1f}{s['max_ms']:>8.1f}{pages}")
    if args.repeat > 1:
        for phase in ("idle", "busy"):
            med = {k: statistics.median(summary(g[phase])[k] for g in runs) for k in ("p50_ms", "p99_ms")}
            print(f"median over runs, {phase}: p50 {med['p50_ms']:.1f} ms, p99 {med['p99_ms']:.1f} ms")
    if args.json:
        results = {
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "jobs": args.jobs, "reports": args.reports,
            "runs": [{"idle": summary(g["idle"]), "busy": summary(g["busy"]), "pages": g["pages"],
                      "idle_s": g["idle"], "busy_s": g["busy"]} for g in runs],
        }
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
