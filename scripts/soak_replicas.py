"""Soak: one job's trainer, launcher and watcher on different replicas over one PostgreSQL, plus a
heartbeat flood, while another tenant works and every replica's ``/readyz`` is polled.

What it checks (the hardening issue's replica findings): no request takes longer than ``--max-s``
(5 s), ``/readyz`` answers throughout on every replica, no ordinary version conflict reaches a client
as a 503, and every report a replica acknowledged is stored.

    python scripts/soak_replicas.py --seconds 600            # a throwaway PostgreSQL, 3 replicas
    python scripts/soak_replicas.py --dsn postgresql://... --replicas 2 --seconds 60

``make test`` runs :func:`soak` for 45 s (``tests/stores/test_replicas.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalstop_trl.clients.local import free_loopback_port, wait_until_healthy  # noqa: E402

__all__ = ["Replicas", "SoakResult", "soak"]


@dataclass
class SoakResult:
    """What a soak saw. :attr:`ok` is the pass rule."""

    seconds: float
    max_s: float
    requests: Counter = field(default_factory=Counter)  # role -> requests made
    statuses: Counter = field(default_factory=Counter)  # (role, status) -> count (status 0: no answer)
    slowest: dict = field(default_factory=dict)  # role -> slowest request (s)
    readyz_failures: list = field(default_factory=list)  # (replica, what)
    acked: int = 0  # reports acknowledged with 200
    missing: list = field(default_factory=list)  # acknowledged steps not stored

    def note(self, role: str, status: int, took: float) -> None:
        self.requests[role] += 1
        self.statuses[(role, status)] += 1
        self.slowest[role] = max(self.slowest.get(role, 0.0), took)

    @property
    def failures(self) -> dict:
        """Every answer that is not a success (the flood's 429s from the rate limit excepted)."""
        return {f"{role} {status}": n for (role, status), n in self.statuses.items()
                if not (200 <= status < 300 or (role == "flood" and status == 429))}

    @property
    def ok(self) -> bool:
        return (not self.failures and not self.readyz_failures and not self.missing
                and max(self.slowest.values(), default=0.0) <= self.max_s and self.acked > 0)

    def table(self) -> str:
        lines = ["| role | requests | slowest (s) | not 2xx |", "|---|---:|---:|---|"]
        for role in sorted(self.requests):
            bad = {s: n for (r, s), n in self.statuses.items() if r == role and not 200 <= s < 300}
            lines.append(f"| {role} | {self.requests[role]} | {self.slowest.get(role, 0):.3f} | {bad or '-'} |")
        lines.append(f"\nacknowledged reports {self.acked}, missing {len(self.missing)}; "
                     f"readyz failures {len(self.readyz_failures)}; pass: {self.ok}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "max_s": self.max_s, "ok": self.ok, "acked": self.acked,
                "missing": self.missing[:20], "readyz_failures": self.readyz_failures[:20],
                "requests": dict(self.requests), "slowest": self.slowest, "failures": self.failures}


class Replicas:
    """``evalstop serve`` replicas over one PostgreSQL database, each on a free loopback port."""

    def __init__(self, dsn: str, n: int, log_dir: Path) -> None:
        self.dsn, self.n, self.log_dir = dsn, n, log_dir
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def token(self, tenant: str) -> str:
        out = subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "add", tenant, "--db", self.dsn,
                              "--json"], check=True, capture_output=True, text=True).stdout
        return json.loads(out)["token"]

    def __enter__(self) -> Replicas:
        for i in range(self.n):
            port = free_loopback_port()
            log = open(self.log_dir / f"replica-{i}.log", "a")
            proc = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "serve", "--db", self.dsn, "--port",
                                     str(port), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
            if not wait_until_healthy(self.urls[-1], 30, proc):
                raise RuntimeError(f"replica {i} did not start: {(self.log_dir / f'replica-{i}.log').read_text()}")
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def soak(urls: list[str], token: str, other_token: str, seconds: float, max_s: float = 5.0,
         flood_threads: int = 6, job_id: str = "soak") -> SoakResult:
    """Run the soak against running replicas (see the module docstring) and return what it saw."""
    result = SoakResult(seconds, max_s)
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    acked: list[int] = []
    timeout = httpx.Timeout(max_s * 3)

    def client(i: int, tok: str = token) -> httpx.Client:
        return httpx.Client(base_url=urls[i % len(urls)], headers={"Authorization": f"Bearer {tok}"},
                            timeout=timeout)

    def call(c: httpx.Client, role: str, method: str, path: str, **kw) -> httpx.Response | None:
        t0 = time.monotonic()
        try:
            r = c.request(method, path, **kw)
            status = r.status_code
        except httpx.HTTPError:
            r, status = None, 0
        with lock:
            result.note(role, status, time.monotonic() - t0)
        return r

    with client(0) as c:
        r = c.post("/v1/jobs", json={"job_id": job_id, "job_type": "grpo", "planned_steps": 10**9})
        r.raise_for_status()

    def trainer() -> None:  # reports every 20 ms through replica 0; the score climbs, so it never stops
        with client(0) as c:
            step = 0
            while time.monotonic() < deadline:
                step += 1
                r = call(c, "trainer", "POST", f"/v1/jobs/{job_id}/reports",
                         json={"step": step, "eval_score": 0.001 * step, "train_loss": 1.0 / step})
                if r is not None and r.status_code == 200:
                    with lock:
                        acked.append(step)
                time.sleep(0.02)

    def launcher() -> None:  # heartbeats every 50 ms through replica 1
        with client(1) as c:
            while time.monotonic() < deadline:
                call(c, "launcher", "POST", f"/v1/jobs/{job_id}/heartbeat", json={"actor": "launcher"})
                time.sleep(0.05)

    def watcher() -> None:  # the evaluator's side through the last replica: decision and reports
        with client(len(urls) - 1) as c:
            while time.monotonic() < deadline:
                call(c, "watcher", "GET", f"/v1/jobs/{job_id}/decision", params={"wait": 0.2})
                call(c, "watcher", "GET", f"/v1/jobs/{job_id}/reports", params={"limit": 50})
                time.sleep(0.1)

    def flood(i: int) -> None:  # heartbeats as fast as they are answered, alternating replicas
        clients = [client(j) for j in range(len(urls))]
        n = 0
        while time.monotonic() < deadline:
            call(clients[(i + n) % len(clients)], "flood", "POST", f"/v1/jobs/{job_id}/heartbeat",
                 json={"actor": f"flood-{i}"})
            n += 1
        for c in clients:
            c.close()

    def other_tenant() -> None:  # another tenant registers and reports, alternating replicas
        clients = [client(j, other_token) for j in range(len(urls))]
        n = 0
        while time.monotonic() < deadline:
            c = clients[n % len(clients)]
            call(c, "other", "POST", "/v1/jobs", json={"job_id": f"b{n % 20}", "job_type": "dpo"})
            call(c, "other", "POST", f"/v1/jobs/b{n % 20}/reports", json={"step": n, "eval_score": 0.5 + 0.001 * n})
            n += 1
            time.sleep(0.1)
        for c in clients:
            c.close()

    def readyz(i: int) -> None:
        with httpx.Client(base_url=urls[i], timeout=max_s) as c:
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                try:
                    r = c.get("/readyz")
                    if r.status_code != 200:
                        result.readyz_failures.append((i, f"HTTP {r.status_code}: {r.text[:200]}"))
                except httpx.HTTPError as exc:
                    result.readyz_failures.append((i, f"{type(exc).__name__} after {time.monotonic() - t0:.1f} s"))
                time.sleep(0.2)

    threads = [threading.Thread(target=f, daemon=True) for f in (trainer, launcher, watcher, other_tenant)]
    threads += [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(flood_threads)]
    threads += [threading.Thread(target=readyz, args=(i,), daemon=True) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 4 * max_s)
        if t.is_alive():
            result.readyz_failures.append(("soak", f"a client thread was still waiting {4 * max_s:.0f} s after the end"))
            break
    result.acked = len(acked)
    with client(0) as c:  # every acknowledged report is stored (read through a replica, paged)
        stored: set[int] = set()
        after = None
        while True:
            params = {"limit": 1000, **({} if after is None else {"after_step": after})}
            page = c.get(f"/v1/jobs/{job_id}/reports", params=params).raise_for_status().json()
            if not page:
                break
            stored.update(r["step"] for r in page)
            after = page[-1]["step"]
    result.missing = sorted(set(acked) - stored)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--flood-threads", type=int, default=6)
    ap.add_argument("--max-s", type=float, default=5.0, help="the slowest request allowed (s)")
    ap.add_argument("--dsn", help="an empty PostgreSQL database (default: a throwaway cluster)")
    ap.add_argument("--json", type=Path, help="write the result here too")
    ap.add_argument("--logs", type=Path, help="keep the replicas' logs in this folder")
    args = ap.parse_args()
    cluster = None
    if args.dsn is None:
        from tests.postgres_server import PostgresCluster

        cluster = PostgresCluster().start()
        dsn = cluster.create_database("soak")
    else:
        dsn = args.dsn
    try:
        logs = args.logs or Path(tempfile.mkdtemp(prefix="evalstop-soak-"))
        logs.mkdir(parents=True, exist_ok=True)
        with Replicas(dsn, args.replicas, logs) as reps:
            tokens = reps.token("alice"), reps.token("bob")
            result = soak(reps.urls, *tokens, seconds=args.seconds, max_s=args.max_s,
                          flood_threads=args.flood_threads)
    finally:
        if cluster is not None:
            cluster.stop()
    print(result.table())
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
