"""Load test of `evalstop serve` on loopback, with Optuna's RDBStorage as the anchor.

In one run, on the same report stream: `evalstop serve` on SQLite (one process), on PostgreSQL with
one replica and with two replicas (a throwaway cluster started here, fsync on; the jobs split across
the replicas as a load balancer would), and Optuna's RDBStorage on SQLite (`trial.report` +
`trial.should_prune` with a PatientPruner, one thread per job). Each evalstop backend gets N jobs
that report concurrently (each job sends its reports one after another, like a training loop):
first as fast as it can (saturation), then paced (one report per job per --interval). Bounded in
count and time; stops by itself; loopback only.

    python scripts/load_test.py [--jobs 200] [--reports 25] [--backends sqlite,pg1,pg2] [--json OUT]

``--router``: the servers answer every route through FastAPI's router (``ServiceSettings(hot_routes=())``,
set by a ``sitecustomize`` on the servers' path: ``evalstop serve`` has no switch for it), to measure
what the hot routes (``service/routes.py: HotRoutes``) save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalstop_trl.clients.local import LocalServer  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def score(job: int, step: int) -> float:
    return ((job * 31 + step * 17) % 100) / 100 + step * 0.01


class RawHTTP:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: the load generator must not be the
    bottleneck (httpx spends ~3 ms of client CPU per request on this machine)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port, self.token = host, port, token

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def evalstop_stream(host: str, ports: list[int], token: str, jobs: int, reports: int, deadline: float,
                          interval: float = 0.0, prefix: str = "job") -> dict:
    latencies: list[float] = []
    errors = 0

    async def job(j: int) -> None:
        nonlocal errors
        conn = RawHTTP(host, ports[j % len(ports)], token)  # jobs spread over the replicas
        await conn.connect()
        await asyncio.sleep(interval * j / jobs)  # paced jobs start spread over one interval
        status, _ = await conn.post("/v1/jobs", {"job_id": f"{prefix}-{j}", "job_type": "grpo", "planned_steps": reports,
                                                 "policy": {"detector": "never"}})
        if status not in (200, 201):
            raise RuntimeError(f"registration failed: HTTP {status}")
        try:
            for step in range(reports):
                if time.monotonic() > deadline:
                    return
                if interval:
                    await asyncio.sleep(interval)  # the job trains between evals
                t0 = time.perf_counter()
                try:
                    status, _ = await conn.post(f"/v1/jobs/{prefix}-{j}/reports", {
                        "step": step, "eval_score": score(j, step), "train_loss": 1.0 / (step + 1)})
                    ok = status == 200
                except (OSError, asyncio.IncompleteReadError):
                    ok = False
                    await conn.connect()
                latencies.append(time.perf_counter() - t0)
                errors += not ok
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(job(j) for j in range(jobs)))
    elapsed = time.perf_counter() - t0
    return {"reports": len(latencies), "seconds": elapsed, "rate": len(latencies) / elapsed,
            "p50_ms": 1000 * pct(latencies, 0.5), "p99_ms": 1000 * pct(latencies, 0.99), "errors": errors}


def optuna_stream(db: Path, jobs: int, reports: int, deadline: float, interval: float = 0.0,
                  name: str = "load") -> dict:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    study = optuna.create_study(storage=storage, study_name=name,
                                pruner=optuna.pruners.PatientPruner(None, patience=2))
    trials = [study.ask() for _ in range(jobs)]
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def job(j: int) -> None:
        nonlocal errors
        trial = trials[j]
        time.sleep(interval * j / jobs)
        for step in range(reports):
            if time.monotonic() > deadline:
                return
            if interval:
                time.sleep(interval)
            t0 = time.perf_counter()
            try:
                trial.report(score(j, step), step)
                trial.should_prune()
                ok = True
            except Exception:  # noqa: BLE001 - counted, e.g. 'database is locked'
                ok = False
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                errors += not ok

    threads = [threading.Thread(target=job, args=(j,)) for j in range(jobs)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"reports": len(latencies), "seconds": elapsed, "rate": len(latencies) / elapsed,
            "p50_ms": 1000 * pct(latencies, 0.5), "p99_ms": 1000 * pct(latencies, 0.99), "errors": errors}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux: /proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cluster_cpu_seconds(data_dir: Path) -> float:
    """User + system CPU time so far of a PostgreSQL cluster: its postmaster and every process it
    started (backends, WAL writer, checkpointer), found by parent pid in /proc. A backend that ended
    takes its time with it, so the servers keep their connections open across a measurement."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    total = cpu_seconds(postmaster)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


#: put on the servers' PYTHONPATH by --router: every create_app() call sends every route through the router
_ROUTER_ONLY = """
import dataclasses

import evalstop_trl.service.app as app

_create_app = app.create_app


def create_app(coordinator, settings=None, *args, **kwargs):
    settings = dataclasses.replace(settings or app.ServiceSettings(), hot_routes=())
    return _create_app(coordinator, settings, *args, **kwargs)


app.create_app = create_app
"""


def router_only(tmp: Path) -> None:
    """Servers started from now on answer every route through FastAPI's router (see --router)."""
    shim = tmp / "router-only"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(_ROUTER_ONLY)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(shim), os.environ.get("PYTHONPATH"))))


def run_backend(db: str, replicas: int, args: argparse.Namespace, cluster_data: Path | None = None) -> dict:
    """Start ``replicas`` servers over ``db``, run the saturation and the paced stream, stop them."""
    # one tenant sends the whole stream: lift its report-rate quota (1,000/s by default) out of the way,
    # this measures the server, not the quota (tests/service/test_security.py tests the quota)
    # every job connects from 127.0.0.1 at once, as through a proxy: the per-address guards are the proxy's;
    # one tenant holds every job's keep-alive connection: its connection budget (64 by default) is lifted too
    lifted = ("--report-rate", "1000000", "--report-burst", "1000000", "--max-active-jobs", "100000",
              "--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0", "--max-connections-per-tenant", "0")
    servers = [LocalServer(db, tenants=("load",) if i == 0 else (), args=lifted) for i in range(replicas)]
    try:
        for server in servers:
            server.start(timeout_s=60)
        token, ports = servers[0].tokens["load"], [server.port for server in servers]
        cpu0 = sum(cpu_seconds(server.proc.pid) for server in servers)
        db0 = cluster_cpu_seconds(cluster_data) if cluster_data is not None else 0.0
        ours = asyncio.run(evalstop_stream("127.0.0.1", ports, token, args.jobs, args.reports,
                                           time.monotonic() + args.max_seconds))
        # the servers' CPU (all replicas) per report at saturation: the load-robust cost of a report
        requests = max(1, ours["reports"] + args.jobs)
        ours["server_cpu_ms_per_report"] = 1000 * (sum(cpu_seconds(s.proc.pid) for s in servers) - cpu0) / requests
        if cluster_data is not None:  # and PostgreSQL's own, for the same requests
            ours["database_cpu_ms_per_report"] = 1000 * (cluster_cpu_seconds(cluster_data) - db0) / requests
        paced = asyncio.run(evalstop_stream("127.0.0.1", ports, token, args.jobs, args.reports,
                                            time.monotonic() + args.max_seconds, args.interval, "paced"))
    finally:
        for server in servers:
            server.stop()
    return {"replicas": replicas, "evalstop": ours, "evalstop_paced": paced}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--reports", type=int, default=25, help="reports per job")
    ap.add_argument("--max-seconds", type=float, default=120, help="time budget of each stream")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="paced phase: seconds each job trains between reports (offered load = jobs / interval)")
    ap.add_argument("--skip-optuna", action="store_true")
    ap.add_argument("--backends", default="sqlite,pg1,pg2", help="sqlite, pg1 (PostgreSQL, one replica), pg2 (two)")
    ap.add_argument("--router", action="store_true",
                    help="no hot routes: every route through FastAPI's router (a measurement of HotRoutes)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not 1 <= args.jobs <= 2000 or not 1 <= args.reports <= 10_000:
        ap.error("--jobs must be in 1..2000 and --reports in 1..10000")

    tmp = Path(tempfile.mkdtemp(prefix="evalstop-load-"))
    if args.router:
        router_only(tmp)
    results = {"date": date.today().isoformat(), "hot_routes": not args.router,
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
               "jobs": args.jobs, "reports_per_job": args.reports, "interval_s": args.interval}
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - {"sqlite", "pg1", "pg2"}
    if unknown:
        ap.error(f"unknown backend(s) {', '.join(sorted(unknown))}; valid: sqlite, pg1, pg2")
    cluster = None
    try:
        for backend in backends:
            if backend == "sqlite":
                db = str(tmp / "coord.db")
            else:
                if cluster is None:
                    from tests.postgres_server import PostgresCluster

                    cluster = PostgresCluster(fsync=True).start()
                db = cluster.create_database(f"load_{backend}")
            replicas = 2 if backend == "pg2" else 1
            print(f"{backend}: {replicas} replica(s) over {db.split('@')[-1]}", file=sys.stderr, flush=True)
            results[backend] = run_backend(db, replicas, args, None if cluster is None or backend == "sqlite"
                                           else cluster.data)
    finally:
        if cluster is not None:
            cluster.stop()
    if not args.skip_optuna:
        results["optuna_rdb_sqlite"] = optuna_stream(tmp / "optuna.db", args.jobs, args.reports,
                                                     time.monotonic() + args.max_seconds)
        results["optuna_rdb_sqlite_paced"] = optuna_stream(tmp / "optuna.db", args.jobs, args.reports,
                                                           time.monotonic() + args.max_seconds, args.interval, "paced")
        if "sqlite" in results:
            results["ratio"] = results["sqlite"]["evalstop"]["rate"] / results["optuna_rdb_sqlite"]["rate"]
    print(f"{args.jobs} jobs x {args.reports} reports; saturation = no pause between reports, "
          f"paced = one report per job every {args.interval:g} s")
    print(f"{'system':<52}{'reports':>8}{'seconds':>9}{'reports/s':>11}{'p50 ms':>8}{'p99 ms':>8}{'errors':>7}")
    rows = []
    for phase, suffix in (("saturation", ""), ("paced", "_paced")):
        for backend, label in (("sqlite", "evalstop serve, SQLite"), ("pg1", "evalstop serve, PostgreSQL, 1 replica"),
                               ("pg2", "evalstop serve, PostgreSQL, 2 replicas")):
            if backend in results:
                rows.append((f"{label}, {phase}", results[backend]["evalstop" + suffix]))
        if "optuna_rdb_sqlite" + suffix in results:
            rows.append((f"Optuna RDBStorage (SQLite), {phase}", results["optuna_rdb_sqlite" + suffix]))
    for name, r in rows:
        print(f"{name:<52}{r['reports']:>8}{r['seconds']:>9.1f}{r['rate']:>11.0f}{r['p50_ms']:>8.1f}"
              f"{r['p99_ms']:>8.1f}{r['errors']:>7}")
    for backend in ("sqlite", "pg1", "pg2"):
        if backend in results:
            r = results[backend]["evalstop"]
            own = r.get("database_cpu_ms_per_report")
            database = "" if own is None else (f" + PostgreSQL's own {own:.3f} ms = {r['server_cpu_ms_per_report'] + own:.3f}"
                                               " ms (target with replicas: <= 0.6)")
            print(f"server CPU per report at saturation, {backend}: {r['server_cpu_ms_per_report']:.3f} ms"
                  f"{database}{' (target on SQLite: <= 0.3)' if backend == 'sqlite' else ''}")
    if "ratio" in results:
        print(f"saturation throughput, evalstop / optuna: {results['ratio']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
