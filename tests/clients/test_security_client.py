"""Issue 17, item 9 (the client's and the boundary's part), each attack run for real: a real client
against a real `evalstop serve` on loopback, a real fake HTTP server on loopback, the real commands."""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.core.errors import EvalStopError, InvalidInput


@pytest.fixture
def lab(server):
    token = server.add_tenant("lab")
    server.start()
    with EvalStopClient(server.url, token, retries=0) as client:
        client.register_job("j", "grpo")
        yield server, token, client


# ---------------------------------------------------------------- NUL and control characters
_CALLS = {
    "report checkpoint": lambda c, s: c.report("j", 1, eval_score=0.5, checkpoint=f"/runs/a{s}b"),
    "snapshot path": lambda c, s: c.publish_snapshot("j", 2, f"/runs/a{s}b"),
    "stop reason": lambda c, s: c.stop("j", reason=f"why{s}"),
    "fail reason": lambda c, s: c.fail("j", reason=f"why{s}"),
    "ack checkpoint": lambda c, s: c.ack("j", checkpoint=f"/runs/a{s}b"),
    "heartbeat actor": lambda c, s: c.heartbeat("j", actor=f"me{s}"),
    "claim worker": lambda c, s: c.claim_eval(f"w{s}", 5),
    "event reason": lambda c, s: c.record_event("j", "launcher_exit", reason=f"why{s}", exit_code=0),
    "audit job_id": lambda c, s: c.audit(job_id=f"j{s}"),
}


@pytest.mark.parametrize("call", list(_CALLS))
def test_17_9_a_nul_in_a_string_is_422_never_stored(lab, call):
    """PostgreSQL cannot store a NUL: it was a 503 for ever (and the fail-open outbox never drained)."""
    _, _, client = lab
    with pytest.raises(InvalidInput, match="control characters"):
        _CALLS[call](client, "\x00")
    if call in ("report checkpoint", "snapshot path", "ack checkpoint", "heartbeat actor", "claim worker"):
        with pytest.raises(InvalidInput, match="control characters"):
            _CALLS[call](client, "\n")  # no line break in a path or a name either
    assert client.pending == 0
    assert [r.step for r in client.reports("j")] == []


def test_17_9_a_queued_nul_is_dropped_when_the_coordinator_returns(lab, tmp_path):
    server, token, _ = lab
    outbox = tmp_path / "outbox.jsonl"
    down = EvalStopClient("http://127.0.0.1:9", token, outbox=outbox, retries=0, connect_timeout_s=0.2)
    assert down.report("j", 1, eval_score=0.5, checkpoint="/a\x00b").action.value == "continue"  # kept (fail-open)
    down.close()
    with EvalStopClient(server.url, token, outbox=outbox) as client:
        assert client.report("j", 2, eval_score=0.5).action.value == "continue"
        assert client.pending == 0  # the 422 dropped it; it does not block the outbox for ever
        assert [r.step for r in client.reports("j")] == [2]


def test_17_9_free_text_keeps_its_line_breaks(lab):
    _, _, client = lab
    assert client.stop("j", reason="first line\n\tsecond line").status == "stopped"
    assert [a.reason for a in client.audit("j") if a.kind.value == "manual_stop"][0].endswith("first line\n\tsecond line")


# ---------------------------------------------------------------- outbox lines that cannot replay
def _op(op: str, body: dict | None, path: str = "/v1/jobs/j/reports") -> bytes:
    return json.dumps({"op": op, "job_id": "j", "path": path, "body": body}).encode()


BAD_LINES = {
    "nested": b'{"op": "report", "job_id": "j", "path": "/v1/jobs/j/reports", "body": ' + b"[" * 200_000 + b"]" * 200_000
              + b"}",
    "string step": _op("report", {"step": "5"}),
    "snapshot string step": _op("snapshot", {"step": "7", "path": "/runs/a"}, "/v1/jobs/j/snapshots"),
    "nan step": _op("snapshot", {"step": math.nan, "path": "/runs/a"}, "/v1/jobs/j/snapshots"),
    "bool step": _op("report", {"step": True}),
    "infinite score": _op("report", {"step": 3, "eval_score": math.inf}),
}


def _poisoned(tmp_path) -> tuple:
    outbox = tmp_path / "outbox.jsonl"
    good = [_op("report", {"step": 1, "eval_score": 0.5}), _op("snapshot", {"step": 4, "path": "/runs/b"},
                                                              "/v1/jobs/j/snapshots")]
    outbox.write_bytes(b"\n".join([good[0], *BAD_LINES.values(), good[1]]) + b"\n")
    return outbox, tmp_path / "outbox.jsonl.quarantine"


def test_17_9_outbox_lines_that_cannot_replay_are_quarantined_at_connect(lab, tmp_path, caplog):
    """A deeply nested line raised RecursionError out of the client's constructor (the training crashed
    at start); a string or NaN step blocked the replay for ever."""
    server, token, _ = lab
    outbox, quarantine = _poisoned(tmp_path)
    with caplog.at_level(logging.WARNING, "evalstop.client"):
        with EvalStopClient(server.url, token, outbox=outbox) as client:
            assert client.pending == 2
            assert client.report("j", 5, eval_score=0.4).action.value == "continue"
            assert client.pending == 0
            assert [r.step for r in client.reports("j")] == [1, 5]
            assert [t.step for t in client.evals("j")] == [4]
    kept = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert len(kept) == len(BAD_LINES) and all(k["reason"] and isinstance(k["line"], str) for k in kept)
    assert "nests deeper" in kept[0]["reason"] and "step" in kept[1]["reason"]
    assert sum("invalid line" in r.getMessage() for r in caplog.records) == 1
    assert not outbox.exists()


def test_17_9_outbox_flush_quarantines_instead_of_a_traceback(lab, tmp_path):
    server, token, _ = lab
    outbox, quarantine = _poisoned(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    done = subprocess.run([sys.executable, "-m", "evalstop_trl", "outbox", "flush", str(outbox), "--url", server.url,
                           "--token-file", str(token_file)], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "EVALSTOP_TOKEN"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "2 of 2 queued operation(s) sent" in done.stdout and "quarantine" in done.stderr
    assert "replayed" not in done.stderr  # issue 20: what was sent is said once
    assert len(quarantine.read_text().splitlines()) == len(BAD_LINES)


# ---------------------------------------------------------------- a malformed 2xx
class _Fake(BaseHTTPRequestHandler):
    answer: tuple[int, str, bytes] = (200, "application/json", b"{}")

    def _reply(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        status, kind, body = type(self).answer
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args) -> None:
        pass


GOOD = json.dumps({"decision": {"action": "stop", "reason": "2 declines", "best_step": 1, "best_score": 0.5,
                                "evidence": {}}}).encode()
MALFORMED = {"empty object": b"{}", "html": b"<html><body>proxy login</body></html>", "a list": b"[1, 2]",
             "unknown action": json.dumps({"decision": {"action": "explode", "reason": "x"}}).encode(),
             "decision is a list": b'{"decision": []}', "reason is a number": json.dumps(
                 {"decision": {"action": "stop", "reason": 3}}).encode(),
             "deeply nested": b"[" * 100_000 + b"]" * 100_000, "null": b"null", "a string": b'"ok"'}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_17_9_a_malformed_2xx_is_an_outage_never_an_exception(tmp_path, kind, caplog):
    handler = type("Fake", (_Fake,), {"answer": (200, "application/json", MALFORMED[kind])})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with EvalStopClient(url, "es_x", outbox=tmp_path / "outbox.jsonl", retries=1, backoff_s=0.01,
                            probe_interval_s=0) as client:
            decision = client.report("j", 1, eval_score=0.5)  # fail open: CONTINUE, kept for the replay
            assert decision.action.value == "continue" and "outbox" in decision.reason
            assert client.pending == 1 and client.unreachable
            with pytest.raises(EvalStopError, match="unreachable"):
                client.status("j")  # not fail-open: the one error an outage raises
            handler.answer = (200, "application/json", GOOD)  # the coordinator answers properly again
            assert client.report("j", 2, eval_score=0.4).action.value == "stop"
            assert client.pending == 0 and not client.unreachable
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---------------------------------------------------------------- strict JSON out of /v1/jobs and /v1/audit
def _reject(name: str):
    raise ValueError(f"{name} is not JSON")


def test_17_9_non_finite_evidence_never_makes_invalid_json(lab):
    """Evidence with -Infinity/NaN (a detector's, or an old database's) must not reach the wire."""
    server, token, client = lab
    client.report("j", 1, eval_score=0.5)
    client.stop("j", reason="by hand")
    server.stop()
    db = sqlite3.connect(server.db)
    evidence = '{"z": -Infinity, "n": NaN, "deep": {"x": [Infinity, 1.5]}, "ok": 2}'
    db.execute("INSERT INTO audit (tenant, job_id, at, kind, actor, reason, evidence) VALUES "
               "('lab', 'j', 1.0, 'manual_stop', 'detector', 'old', ?)", (evidence,))
    row = db.execute("SELECT decision FROM jobs WHERE tenant = 'lab' AND job_id = 'j'").fetchone()
    if row[0]:
        decision = json.loads(row[0])
        decision["evidence"] = {"z": -math.inf, "n": math.nan}
        db.execute("UPDATE jobs SET decision = ? WHERE tenant = 'lab' AND job_id = 'j'", (json.dumps(decision),))
    db.commit()
    db.close()
    server.start()
    headers = {"Authorization": f"Bearer {token}"}
    for path in ("/v1/jobs", "/v1/jobs/j", "/v1/audit", "/v1/audit?job_id=j"):
        r = httpx.get(server.url + path, headers=headers, timeout=10)
        assert r.status_code == 200, (path, r.text)
        json.loads(r.text, parse_constant=_reject)  # strict JSON: no NaN, Infinity, -Infinity
    [old] = [a for a in client.audit("j") if a.reason == "old"]
    assert dict(old.evidence) == {"z": None, "n": None, "deep": {"x": [None, 1.5]}, "ok": 2}


# ---------------------------------------------------------------- the token out of `ps`
def test_17_9_status_reads_its_token_from_a_file_or_the_environment(lab, tmp_path):
    server, token, _ = lab
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "EVALSTOP_TOKEN"}
    base = [sys.executable, "-m", "evalstop_trl", "status", "--url", server.url, "--json"]
    by_file = subprocess.run([*base, "--token-file", str(token_file)], capture_output=True, text=True, env=env,
                             timeout=60)
    assert by_file.returncode == 0 and '"j"' in by_file.stdout and "warning" not in by_file.stderr, by_file.stderr
    by_env = subprocess.run(base, capture_output=True, text=True, env={**env, "EVALSTOP_TOKEN": token}, timeout=60)
    assert by_env.returncode == 0 and by_env.stdout == by_file.stdout
    by_flag = subprocess.run([*base, "--token", token], capture_output=True, text=True, env=env, timeout=60)
    assert by_flag.returncode == 0 and "visible to every user" in by_flag.stderr
    both = subprocess.run([*base, "--token", token, "--token-file", str(token_file)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert both.returncode == 2 and "not both" in both.stderr
    token_file.chmod(0o644)
    loose = subprocess.run([*base, "--token-file", str(token_file)], capture_output=True, text=True, env=env,
                           timeout=60)
    assert loose.returncode == 0 and "chmod 600" in loose.stderr


# ---------------------------------------------------------------- issue 25 item 9: surrogates, the auth scheme
@pytest.fixture(params=["sqlite", "postgres"])
def on_each_store(request, tmp_path):
    """A real `evalstop serve` over a SQLite file or a PostgreSQL database, tenant ``lab``."""
    from evalstop_trl.clients.local import LocalServer

    db = tmp_path / "coord.db" if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    with LocalServer(db, tenants=("lab",), log=tmp_path / "serve.log") as srv:
        yield srv, srv.tokens["lab"]


def _raw(srv, path: str, body: str, token: str) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", content=body.encode(), timeout=10,
                      headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


@pytest.mark.parametrize("path, body", [
    ("/v1/jobs", '{"job_id": "t", "tags": {"team": "a\\ud800b"}}'),
    ("/v1/jobs", '{"job_id": "t", "hparams": {"model": "\\udc00"}}'),
    ("/v1/jobs/j/stop", '{"reason": "why \\ud83d"}'),
    ("/v1/jobs/j/reports", '{"step": 1, "checkpoint": "/runs/\\udfff"}'),
])
def test_25_9_a_lone_surrogate_is_422_and_never_stored(on_each_store, path, body):
    """JSON can carry a lone surrogate, UTF-8 cannot: PostgreSQL refused the write for ever (a 503)."""
    srv, token = on_each_store
    assert _raw(srv, "/v1/jobs", '{"job_id": "j"}', token).status_code == 201
    r = _raw(srv, path, body, token)
    assert r.status_code == 422 and "control characters" in r.json()["detail"], r.text
    listed = httpx.get(f"{srv.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
    assert [j["job_id"] for j in listed] == ["j"] and listed[0]["status"] == "pending"


def test_25_9_the_auth_scheme_is_case_insensitive(on_each_store):
    srv, token = on_each_store
    for scheme, status in (("bearer", 200), ("BEARER", 200), ("Bearer", 200), ("Basic", 401), ("", 401)):
        r = httpx.get(f"{srv.url}/v1/jobs", headers={"Authorization": f"{scheme} {token}".strip()}, timeout=10)
        assert r.status_code == status, (scheme, r.text)


# ---------------------------------------------------------------- issue 25 item 4: the audit log's growth
@pytest.fixture(params=["sqlite", "postgres"])
def small_budget(request, tmp_path):
    """A real `evalstop serve` over each store, tenant ``lab`` allowed 20 launcher events and amendments per job."""
    from evalstop_trl.clients.local import LocalServer

    db = tmp_path / "coord.db" if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    with LocalServer(db, tenants=("lab",), log=tmp_path / "serve.log",
                     quotas={"lab": {"max_events_per_job": 20}}) as srv:
        yield srv, srv.tokens["lab"]


def test_25_4_re_registrations_cannot_grow_the_audit_log_without_bound(small_budget):
    """Every re-registration that changed 32 tags of 256 characters appended ~25 KB of audit (118 MB
    in 10 s). Now an amendment's line names at most 8 changed labels, each cut to 64 characters, and
    amendments count against max_events_per_job with the launcher's events (then 429)."""
    srv, token = small_budget
    refused = 0
    with EvalStopClient(srv.url, token, retries=0) as client:
        for i in range(30):
            tags = {f"t{k:02d}": f"{i}-{'x' * 250}" for k in range(32)}
            try:
                client.register_job("j", "grpo", tags=tags)
            except EvalStopError as exc:
                assert "max_events_per_job=20" in str(exc) and "start a new job" in str(exc), exc
                refused += 1
        lines = [a for a in client.audit("j") if a.kind.value == "amended"]
    assert len(lines) == 20 and refused == 9  # the first registration creates; 20 amendments; 9 refused
    sizes = [len(str(a.evidence)) + len(a.reason) for a in lines]
    assert max(sizes) < 2_000, max(sizes)
    ev = lines[-1].evidence["tags"]
    assert len(ev["set"]) == 8 and ev["more"] == 24 and all(len(v) <= 67 for v in ev["set"].values())
    assert "and 24 more" in lines[-1].reason
