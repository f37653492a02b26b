"""One contract, three backends: every API call against the embedded client, HTTP + SQLite and
HTTP + PostgreSQL, compared field by field.

One script (:func:`_script`) drives a client of tenant ``alice`` and one of tenant ``bob`` through
every call of :class:`~evalstop_trl.clients.api.EvalStopAPI`: registration (re-registration, conflict,
bad input), reports (CONTINUE and STOP with their evidence, a duplicate, a conflict, an out-of-order
step, bad numbers), ack, finish, fail, stop, status, listing, paged reports, snapshots, claims,
posted evals, launcher events, the audit log, and another tenant's attempts (404). Each result is
flattened to plain data by :func:`_plain` (independent of the codec under test); an error becomes
its status code (and its detail, except for 422, whose wording differs between pydantic and the
coordinator). Only timestamps are left out of the comparison.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel

from evalstop_trl import Coordinator, MemoryStore, SQLiteStore
from evalstop_trl.clients.api import LOCAL_METHODS, EvalStopAPI
from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.clients.local import LocalServer
from evalstop_trl.core import requests as request_records
from evalstop_trl.core.api import REQUESTS, ROUTES
from evalstop_trl.core.coordinator import Coordinator as _Coordinator
from evalstop_trl.core.errors import EvalStopError
from evalstop_trl.core.requests import field_names
from evalstop_trl.service.app import ServiceSettings, create_app
from evalstop_trl.service.routes import QUERIES, body_model

#: fields that hold a time: their values differ between runs and are not compared
TIMESTAMPS = frozenset({"received_at", "created_at", "lease_until", "at", "last_seen", "ended_at"})
BACKENDS = ("embedded", "http-sqlite", "http-postgres")


def _plain(value: Any) -> Any:
    """A result as plain data: records field by field, enums by value, tuples as lists, no times."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in TIMESTAMPS}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple record
        return {name: _plain(getattr(value, name)) for name in value._fields if name not in TIMESTAMPS}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if k not in TIMESTAMPS}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # what strict JSON can carry
    return value


def _error(exc: EvalStopError) -> dict[str, Any]:
    status = exc.status_code
    detail = getattr(exc, "detail", None) or str(exc)  # the HTTP client's ClientError keeps the server's detail
    return {"error": status, "detail": None if status == 422 else detail}


#: columns of an export that hold a time (or a duration): not compared
EXPORT_TIMES = TIMESTAMPS | {"duration_s"}


def _page(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A page of runs as plain data; its cursor only as "is there a next page" (it holds a time)."""
    page = fn(*args, **kwargs)
    return {"jobs": _plain(list(page.jobs)), "total": page.total, "has_next": page.next is not None}


def _export(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An export (CSV or JSON text) as plain rows, without its times."""
    import csv
    import io
    import json

    text = fn(*args, **kwargs)
    assert isinstance(text, str)
    if text.startswith("["):
        return _plain(json.loads(text))
    return [{k: v for k, v in r.items() if k not in EXPORT_TIMES} for r in csv.DictReader(io.StringIO(text))]


def _summary(fn: Callable[[], Any]) -> dict[str, Any]:
    """A tenant summary as plain data, without its job-hours (they depend on the clock)."""
    return {k: v for k, v in _plain(fn()).items() if k != "hours_saved"}


#: the quotas of tenant ``carol`` on every backend: the script runs into them
CAPPED = {"max_jobs": 2, "max_events_per_job": 1}


def _script(c: Any, other: Any, capped: Any, stranger: Any) -> list[tuple[str, Any]]:
    """Every API call, in one order; returns ``[(label, plain result or error)]``. ``capped`` is a
    client of a tenant with the quotas :data:`CAPPED`; ``stranger`` one with a token nobody issued."""
    out: list[tuple[str, Any]] = []

    def call(label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            out.append((label, _plain(fn(*args, **kwargs))))
        except EvalStopError as exc:
            out.append((label, _error(exc)))

    grpo = {"detector": "decline", "k": 2}
    call("register", c.register_job, "j1", "grpo", planned_steps=100, policy=grpo)
    call("re-register", c.register_job, "j1", "grpo", planned_steps=100, policy=grpo)
    call("register conflict", c.register_job, "j1", "dpo", planned_steps=100, policy=grpo)
    call("register amend", c.register_job, "j1", planned_steps=120)
    call("heartbeat", c.heartbeat, "j1", "launcher")
    call("register tags", c.register_job, "j1", tags={"team": "rl", "sweep": 7},
         hparams={"learning_rate": 3e-4, "beta": 0.04, "model_name": "tiny-llama", "bf16": True})
    call("re-register same tags", c.register_job, "j1", tags={"sweep": "7", "team": "rl"})
    for label, tags, hparams in [("too many tags", {f"k{i}": "v" for i in range(33)}, None),
                                 ("tag key too long", {"k" * 65: "v"}, None),
                                 ("tag value too long", {"k": "v" * 257}, None),
                                 ("tag control char", {"k": "a\x00b"}, None),
                                 ("tag bad key", {"a b": "v"}, None),
                                 ("hparam nested", None, {"opt": {"lr": 1}}),
                                 ("hparam huge int", None, {"n": 2**60}),
                                 ("hparams not an object", None, ["lr"])]:
        call(f"register {label}", c.register_job, "x", tags=tags, hparams=hparams)
    call("heartbeat unknown", c.heartbeat, "nope")
    call("register bad id", c.register_job, "a b")
    call("register bad detector", c.register_job, "x", policy={"detector": "nope"})
    call("register bad type", c.register_job, "x", "pretrain")
    call("report 10", c.report, "j1", 10, eval_score=0.5, train_loss=1.0, proxy_reward=0.1)
    call("report 20", c.report, "j1", 20, eval_score=0.7, train_loss=0.9, checkpoint="/ckpt/20")
    call("report 20 again", c.report, "j1", 20, eval_score=0.7, train_loss=0.9, checkpoint="/ckpt/20")
    call("report 20 different", c.report, "j1", 20, eval_score=0.9)
    call("report out of order", c.report, "j1", 15, eval_score=0.6)
    call("report 25 no score", c.report, "j1", 25, train_loss=0.8)
    call("report 30 decline", c.report, "j1", 30, eval_score=0.6)
    call("report negative step", c.report, "j1", -1)
    call("report nan", c.report, "j1", 31, eval_score=float("nan"))
    call("status running", c.status, "j1")
    call("ack running", c.ack, "j1", "/ckpt/20")  # an illegal transition: IllegalTransition, a Conflict (409)
    call("report 40 stop", c.report, "j1", 40, eval_score=0.5)
    call("report 50 after stop", c.report, "j1", 50, eval_score=0.9)
    call("status stopped", c.status, "j1")
    call("wait_decision", c.wait_decision, "j1", 5.0, stopped=True)
    call("ack", c.ack, "j1", "/ckpt/20", step=50)
    call("ack again", c.ack, "j1", "/ckpt/20", step=50)
    call("register j2", c.register_job, "j2", "sft", planned_steps=10)
    call("finish", c.finish, "j2")
    call("finish again", c.finish, "j2")
    call("register j3", c.register_job, "j3", "ppo")
    call("report j3", c.report, "j3", 1, eval_score=0.1)
    call("fail", c.fail, "j3", "CUDA out of memory")
    call("fail again", c.fail, "j3", "again")
    call("register j4", c.register_job, "j4", policy={"detector": "patience", "k": 3})
    call("stop", c.stop, "j4", "budget")
    call("stop again", c.stop, "j4", "again")
    call("status unknown", c.status, "nope")
    call("list_jobs", c.list_jobs)
    call("list_jobs stopped", c.list_jobs, "stopped")
    call("list_jobs bad status", c.list_jobs, "bogus")
    call("reports", c.reports, "j1")
    call("reports after 20", c.reports, "j1", after_step=20)
    call("reports limit 2", c.reports, "j1", limit=2)
    call("register e1", c.register_job, "e1", "grpo", planned_steps=40, policy=grpo)
    call("publish 10", c.publish_snapshot, "e1", 10, "/snap/10", train_loss=1.0)
    call("publish 10 again", c.publish_snapshot, "e1", 10, "/snap/10", train_loss=1.0)
    call("publish 10 elsewhere", c.publish_snapshot, "e1", 10, "/snap/other")
    call("publish 20", c.publish_snapshot, "e1", 20, "/snap/20", train_loss=0.9, proxy_reward=0.3)
    call("publish 30", c.publish_snapshot, "e1", 30, "/snap/30")
    call("evals before", c.evals, "e1")
    call("claim 1", c.claim_eval, "w1", 60.0)
    call("claim 2", c.claim_eval, "w2", 60.0)
    call("claim bad lease", c.claim_eval, "w3", 0.5)
    call("post 20 first", c.post_eval, "e1", 20, 0.8, "w2", eval_n=64, eval_noise=0.02)
    call("post 10", c.post_eval, "e1", 10, 0.9, "w1")
    call("claim 3", c.claim_eval, "w3", 60.0)
    call("claim none left", c.claim_eval, "w4", 60.0)
    call("post 30 failed", c.post_eval, "e1", 30, None, "w3", "loader crashed")
    call("post unknown step", c.post_eval, "e1", 99, 0.5, "w1")
    call("post bad evidence", c.post_eval, "e1", 30, 0.5, "w3", eval_n=0)
    call("post evidence without a score", c.post_eval, "e1", 30, None, "w3", "x", eval_noise=0.1)
    call("evals after", c.evals, "e1")
    call("reports e1", c.reports, "e1")
    call("status e1", c.status, "e1")
    call("event sigterm", c.record_event, "j1", "launcher_sigterm", "grace over")
    call("event exit", c.record_event, "j1", "launcher_exit", "", exit_code=-15)
    call("event bad kind", c.record_event, "j1", "stop", "forged")
    call("event bad exit code", c.record_event, "j1", "launcher_exit", "", exit_code=999)
    call("audit j1", c.audit, "j1")
    call("audit", c.audit)
    # the run browser: search, filters, sort, keyset pages, exports (times left out: see _export)
    call("browse", _page, c.browse_jobs)
    call("browse by id asc", _page, c.browse_jobs, sort="job_id", order="asc", limit=2)
    first = c.browse_jobs(sort="job_id", order="asc", limit=2)
    call("browse next page", _page, c.browse_jobs, sort="job_id", order="asc", limit=2, after=first.next)
    call("browse search", _page, c.browse_jobs, q="J")
    call("browse filters", _page, c.browse_jobs, status="stopped", job_type="grpo", detector="decline")
    call("browse tag", _page, c.browse_jobs, tag="team=rl")
    call("browse tag key", _page, c.browse_jobs, tag="sweep")
    call("browse search tag value", _page, c.browse_jobs, q="rl")
    call("browse bad sort", c.browse_jobs, sort="nope")
    call("browse bad cursor", c.browse_jobs, after="nope")
    call("browse bad limit", c.browse_jobs, limit=5000)
    call("export reports csv", _export, c.export_reports, "j1")
    call("export reports json", _export, c.export_reports, "j1", "json")
    call("export reports bad format", c.export_reports, "j1", "xlsx")
    call("export reports unknown", c.export_reports, "nope")
    call("export jobs csv", _export, c.export_jobs, "csv", status="stopped", sort="job_id", order="asc")
    call("export jobs json", _export, c.export_jobs, "json", q="e1")
    call("summary", _summary, c.summary)
    # another tenant sees none of it
    for name, fn, args in [("status", other.status, ("j1",)), ("report", other.report, ("j1", 60, 0.1)),
                           ("stop", other.stop, ("j1", "mine")), ("ack", other.ack, ("j1",)),
                           ("finish", other.finish, ("j2",)), ("fail", other.fail, ("j3",)),
                           ("reports", other.reports, ("j1",)), ("evals", other.evals, ("e1",)),
                           ("publish", other.publish_snapshot, ("e1", 40, "/snap/40")),
                           ("post", other.post_eval, ("e1", 10, 0.1)),
                           ("event", other.record_event, ("j1", "launcher_exit")),
                           ("list_jobs", other.list_jobs, ()), ("audit", other.audit, ()),
                           ("browse", lambda: _page(other.browse_jobs), ()),
                           ("export reports", other.export_reports, ("j1",)),
                           ("export jobs", lambda: _export(other.export_jobs, "json"), ()),
                           ("summary", lambda: _summary(other.summary), ()),
                           ("claim", other.claim_eval, ("w", 60.0))]:
        call(f"bob {name}", fn, *args)
    call("list_jobs at the end", c.list_jobs)
    # operators: delete an ended job (its audit line stays); a running one is refused
    call("bob delete", other.delete_job, "j2", "not mine")
    call("delete running", c.delete_job, "e1", "still running")
    call("delete unknown", c.delete_job, "nope")
    call("delete bad reason", c.delete_job, "j2", "a\x00b")
    call("delete finished", c.delete_job, "j2", "clean-up")
    call("delete again", c.delete_job, "j2")
    call("status deleted", c.status, "j2")
    call("reports deleted", c.reports, "j2")
    call("export deleted", c.export_reports, "j2")
    call("audit deleted", c.audit, "j2")
    call("re-register deleted", c.register_job, "j2", "sft")
    call("list_jobs after delete", c.list_jobs)
    shadow = {"detector": "decline", "k": 2, "mode": "shadow"}
    call("register shadow", c.register_job, "sh", "grpo", planned_steps=60, policy=shadow)
    for step, score in ((10, 0.2), (20, 0.5), (30, 0.45), (40, 0.2), (50, 0.3)):  # would stop at 40
        call(f"report shadow {step}", c.report, "sh", step, eval_score=score)
    call("status shadow", c.status, "sh")
    call("audit shadow", c.audit, "sh")
    call("register bad mode", c.register_job, "sh2", policy={"detector": "decline", "mode": "dry-run"})
    call("summary with shadow", _summary, c.summary)
    # per-example evidence (issue 28): k=2 declines within the eval's paired noise go on, a fall beyond it stops
    call("register pe", c.register_job, "pe", "grpo")
    call("report pe 10", c.report, "pe", 10, eval_score=0.5, eval_n=100)
    call("report pe 20 within noise", c.report, "pe", 20, eval_score=0.46, eval_n=100, eval_noise=0.05)
    call("report pe 30 within noise", c.report, "pe", 30, eval_score=0.42, eval_n=100, eval_noise=0.05)
    call("report pe 40 beyond", c.report, "pe", 40, eval_score=0.30, eval_n=100, eval_noise=0.02)
    call("report pe 40 again", c.report, "pe", 40, eval_score=0.30, eval_n=100, eval_noise=0.02)
    call("report pe 40 other noise", c.report, "pe", 40, eval_score=0.30, eval_n=100, eval_noise=0.01)
    call("report pe n 0", c.report, "pe", 45, eval_score=0.3, eval_n=0)
    call("report pe n float", c.report, "pe", 45, eval_score=0.3, eval_n=2.5)
    call("report pe negative noise", c.report, "pe", 45, eval_score=0.3, eval_noise=-1.0)
    call("report pe noise no score", c.report, "pe", 45, eval_noise=0.1)
    call("report pe 50 after stop", c.report, "pe", 50, eval_score=0.20, eval_n=100, eval_noise=0.01)
    call("reports pe", c.reports, "pe")
    # a quota is the same refusal from both clients (QuotaExceeded, 429), and nothing is kept for later
    call("capped register 1", capped.register_job, "c1", "grpo")
    call("capped register 2", capped.register_job, "c2", "grpo")
    call("capped register over max_jobs", capped.register_job, "c3", "grpo")
    call("capped pending after the refusal", lambda: capped.pending)
    call("capped re-register (attach)", capped.register_job, "c1", "grpo")
    call("capped event", capped.record_event, "c1", "launcher_exit", "", exit_code=0)
    call("capped event over max_events_per_job", capped.record_event, "c1", "launcher_exit", "", exit_code=0)
    call("capped report (no quota)", capped.report, "c1", 1, eval_score=0.5)
    call("capped pending at the end", lambda: capped.pending)
    # a token nobody issued: the same refusal (Unauthorized, 401) for a read and a fail-open write
    call("stranger status", stranger.status, "j1")
    call("stranger report", stranger.report, "j1", 60, eval_score=0.1)
    call("stranger register", stranger.register_job, "s1")
    call("stranger pending", lambda: stranger.pending)
    # the KL clock as a gate (issue 44): a fall of the paper's rule (noise: none, so each fall is one) before
    # the forecast peak is held, one past it stops with the clock's evidence; a bad KL is refused
    call("register gated", c.register_job, "kl", "grpo",
         policy={"detector": "decline", "k": 1, "noise": "none", "gate": "kl_past_peak"})
    call("register bad gate", c.register_job, "kl2", "grpo", policy={"detector": "decline", "gate": "kl_before"})
    call("report kl not a number", c.report, "kl", 1, eval_score=0.9, kl="0.5")
    for step, (kl, score) in enumerate(KL_EVALS, start=1):
        call(f"report kl {step}", c.report, "kl", step, eval_score=score, kl=kl)
    call("audit gated", lambda: [a for a in c.audit("kl") if a.kind.value == "stop"])
    call("reports gated", lambda: [r.kl for r in c.reports("kl")])
    # the proxy gate: a fall with the proxy down too is held, one with the proxy up since the best stops,
    # its audit line saying how far the proxy rose (once: the gate's clause, not the coordinator's again)
    call("register proxy gated", c.register_job, "px", "grpo",
         policy={"detector": "decline", "k": 1, "noise": "none", "gate": "proxy_diverges"})
    for step, (score, proxy) in enumerate(PROXY_EVALS, start=1):
        call(f"report proxy {step}", c.report, "px", step, eval_score=score, proxy_reward=proxy)
    call("audit proxy gated", lambda: [a for a in c.audit("px") if a.kind.value == "stop"])
    return out


#: (world feedback, proxy reward): a fall with the proxy (held), then a fall while the proxy rises (a stop)
PROXY_EVALS = [(0.50, 0.40), (0.60, 0.50), (0.55, 0.45), (0.65, 0.60), (0.58, 0.72)]


#: (KL, world feedback) of a run on Gao's form with a dip at KL 2 (before its peak near KL 10)
KL_EVALS = [(0.5, 0.93), (1.0, 1.1), (2.0, 1.05), (3.0, 1.356), (5.0, 1.436), (8.0, 1.458), (12.0, 1.412)]


STRANGER = "es_" + "x" * 43  # a well-formed token that no tenant has


def _run(make: Callable[[str], Any]) -> list[tuple[str, Any]]:
    clients = make("alice"), make("bob"), make("carol"), make(None)
    try:
        return _script(*clients)
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="module")
def results(tmp_path_factory, request) -> dict[str, list[tuple[str, Any]]]:
    tmp = tmp_path_factory.mktemp("contract")
    out: dict[str, list[tuple[str, Any]]] = {}
    coordinator = Coordinator(SQLiteStore(tmp / "embedded.db"))
    coordinator.tenants.add("carol")
    coordinator.tenants.set_quotas("carol", CAPPED)
    out["embedded"] = _script(*(EmbeddedClient(coordinator, name) for name in ("alice", "bob", "carol")),
                              EmbeddedClient(coordinator, token=STRANGER))
    coordinator.close()
    tenants, quotas = ("alice", "bob", "carol"), {"carol": CAPPED}
    with LocalServer(tmp / "http.db", tenants=tenants, quotas=quotas, log=tmp / "http.log") as srv:
        out["http-sqlite"] = _run(lambda name: EvalStopClient(srv.url, srv.tokens.get(name, STRANGER), retries=0))
    dsn = request.getfixturevalue("postgres_cluster").create_database("contract")
    with LocalServer(dsn, tenants=tenants, quotas=quotas, log=tmp / "pg.log") as srv:
        out["http-postgres"] = _run(lambda name: EvalStopClient(srv.url, srv.tokens.get(name, STRANGER), retries=0))
    return out


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{where}.{k}: only in {'the first' if k in a else 'the second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            found += _differences(a[k], b[k], f"{where}.{k}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{where}[{i}]")]
    if a != b or type(a) is not type(b):
        return [f"{where}: {a!r} != {b!r}"]
    return []


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_every_call_answers_as_the_embedded_client_does(results, backend):
    expected, got = results["embedded"], results[backend]
    assert [label for label, _ in got] == [label for label, _ in expected]
    for (label, want), (_, have) in zip(expected, got, strict=True):
        diffs = _differences(want, have)
        assert not diffs, f"{backend}, call {label!r} differs from the embedded client: {'; '.join(diffs)}"


@pytest.mark.slow
def test_the_script_means_what_it_says(results):
    """The embedded run checked against the rules (so the backends agree on the right answers)."""
    r = dict(results["embedded"])
    assert r["register"]["status"] == "pending" and r["re-register"] == r["register"]
    assert r["register conflict"]["error"] == 409 and r["register bad id"]["error"] == 422
    assert r["register amend"]["planned_steps"] == 120 and r["heartbeat"]["status"] == "running"  # a beat: its process runs
    assert r["heartbeat unknown"]["error"] == 404
    assert r["report 30 decline"]["action"] == "continue" and r["report 30 decline"]["evidence"]["declines"] == 1
    assert r["report 20 again"] == r["report 20"]
    assert r["report 20 different"]["error"] == 409 and r["report out of order"]["error"] == 409
    assert r["report negative step"]["error"] == 422 and r["report nan"]["error"] == 422
    assert r["ack running"]["error"] == 409
    stop = r["report 40 stop"]
    assert stop["action"] == "stop" and stop["best_step"] == 20 and stop["evidence"]["declines"] == 2
    assert r["report 50 after stop"] == stop and r["status stopped"]["decision"] == stop
    assert r["ack"]["acked"] and r["ack"]["best_checkpoint"] == "/ckpt/20"
    assert r["finish"]["status"] == "finished" and r["fail"]["status"] == "failed"
    assert r["stop"]["status"] == "stopped" and r["stop"]["decision"]["evidence"] == {"manual": True}
    assert r["status unknown"]["error"] == 404 and r["list_jobs bad status"]["error"] == 422
    assert [j["job_id"] for j in r["list_jobs stopped"]] == ["j1", "j4"]
    assert r["register bad gate"]["error"] == 422 and r["report kl not a number"]["error"] == 422
    assert r["report kl 3"]["action"] == "continue" and r["report kl 3"]["evidence"]["held"]  # before the peak
    gated = r["report kl 7"]
    assert gated["action"] == "stop" and "past the forecast peak" in gated["reason"], gated
    assert gated["evidence"]["kl"] == 12.0 and gated["evidence"]["kl_peak"] < 12.0 <= r["reports gated"][-1]
    assert r["audit gated"][0]["evidence"]["kl_peak"] == gated["evidence"]["kl_peak"]  # the stop's audit line
    held = r["report proxy 3"]
    assert held["action"] == "continue" and held["reason"].startswith("held by the proxy gate"), held
    assert held["evidence"]["proxy_since_best"] == pytest.approx(-0.05)
    diverged = r["report proxy 5"]
    assert diverged["action"] == "stop" and diverged["evidence"]["proxy_since_best"] == pytest.approx(0.12)
    assert diverged["reason"].count("since the best eval") == 1, diverged["reason"]
    assert r["audit proxy gated"][0]["evidence"]["proxy_since_best"] == pytest.approx(0.12)
    # two declines of 0.04, 0.08 in all: within 2 x sqrt(2) x the paired noise 0.05 (the paper's rule would stop)
    within = r["report pe 30 within noise"]
    assert r["report pe 20 within noise"]["action"] == "continue" and "noise 0.05, paired per-example" in r[
        "report pe 20 within noise"]["reason"]
    assert within["action"] == "continue" and within["reason"].startswith("2 consecutive declines, within the noise")
    assert (within["evidence"]["declines"], within["evidence"]["noise"], within["evidence"]["noise_source"]) == (
        2, 0.05, "paired per-example")
    pe = r["report pe 40 beyond"]  # 0.2 in all, beyond 2 x sqrt(2) x the paired noise 0.02
    assert pe["action"] == "stop" and pe["evidence"]["declines"] == 3 and pe["best_step"] == 10
    assert (pe["evidence"]["noise"], pe["evidence"]["noise_source"]) == (0.02, "paired per-example")
    assert r["report pe 40 again"] == pe and r["report pe 50 after stop"] == pe
    assert r["report pe 40 other noise"]["error"] == 409
    for label in ("report pe n 0", "report pe n float", "report pe negative noise", "report pe noise no score"):
        assert r[label]["error"] == 422, label
    assert [(x["eval_n"], x["eval_noise"]) for x in r["reports pe"]] == [(100, None), (100, 0.05), (100, 0.05),
                                                                        (100, 0.02), (100, 0.01)]
    assert [x["step"] for x in r["reports"]] == [10, 20, 25, 30, 40, 50]
    assert [x["step"] for x in r["reports after 20"]] == [25, 30, 40, 50]
    assert [x["step"] for x in r["reports limit 2"]] == [10, 20]
    assert r["publish 10 again"] == r["publish 10"] and r["publish 10 elsewhere"]["error"] == 409
    assert (r["claim 1"]["step"], r["claim 1"]["worker"], r["claim 1"]["state"]) == (10, "w1", "leased")
    assert r["claim 2"]["step"] == 20 and r["claim none left"] is None
    assert r["post 20 first"]["reason"] == "no eval yet"  # step 10 has no score yet: nothing fed
    assert r["post 10"]["best_step"] == 10 and r["post unknown step"]["error"] == 404
    assert [(t["step"], t["state"], t["fed"], t["eval_n"], t["eval_noise"]) for t in r["evals after"]] == [
        (10, "done", True, None, None), (20, "done", True, 64, 0.02), (30, "missing", True, None, None)]
    assert [(x["step"], x["eval_n"], x["eval_noise"]) for x in r["reports e1"]] == [(10, None, None), (20, 64, 0.02),
                                                                                   (30, None, None)]
    assert r["post bad evidence"]["error"] == 422 and r["post evidence without a score"]["error"] == 422
    assert r["event bad kind"]["error"] == 422 and r["event bad exit code"]["error"] == 422
    assert [a["kind"] for a in r["audit j1"]] == ["amended", "amended", "stop", "ack", "launcher_sigterm",
                                                 "launcher_exit"]
    assert r["audit j1"][1]["evidence"]["tags"] == {"set": {"sweep": "7", "team": "rl"}, "removed": [], "more": 0}
    assert r["audit j1"][3]["evidence"] == {"checkpoint": "/ckpt/20", "step": 50, "stop_lag": 10}
    for name in ("status", "report", "stop", "ack", "finish", "fail", "reports", "evals", "publish", "post", "event"):
        assert r[f"bob {name}"]["error"] == 404, name
    assert r["bob list_jobs"] == [] and r["bob audit"] == [] and r["bob claim"] is None
    assert r["bob browse"] == {"jobs": [], "total": 0, "has_next": False} and r["bob export jobs"] == []
    assert r["bob export reports"]["error"] == 404 and r["bob summary"]["jobs"] == 0
    assert r["bob summary"]["tenant"] == "bob"  # a token's holder learns whose it is
    assert r["bob delete"]["error"] == 404 and r["delete running"]["error"] == 409
    assert r["delete unknown"]["error"] == 404 and r["delete bad reason"]["error"] == 422
    assert r["delete finished"]["status"] == "finished" and r["delete again"]["error"] == 404
    for label in ("status deleted", "reports deleted", "export deleted"):
        assert r[label]["error"] == 404, label
    assert [(a["kind"], a["reason"]) for a in r["audit deleted"]][-1] == ("deleted", "clean-up")
    assert r["audit deleted"][-1]["evidence"] == {"status": "finished", "n_reports": 0, "last_step": None}
    assert r["re-register deleted"]["n_reports"] == 0 and r["re-register deleted"]["status"] == "pending"
    assert r["register tags"]["tags"] == {"sweep": "7", "team": "rl"}
    assert r["register tags"]["hparams"] == {"beta": 0.04, "bf16": True, "learning_rate": 3e-4, "model_name": "tiny-llama"}
    assert r["re-register same tags"] == r["register tags"]
    for label in ("too many tags", "tag key too long", "tag value too long", "tag control char", "tag bad key",
                  "hparam nested", "hparam huge int", "hparams not an object"):
        assert r[f"register {label}"]["error"] == 422, label
    for label in ("browse tag", "browse tag key", "browse search tag value"):
        assert [j["job_id"] for j in r[label]["jobs"]] == ["j1"], label
    assert r["summary"] == {"tenant": "alice", "jobs": 5, "active": 1, "lost": 0, "finished": 1, "failed": 1, "stopped": 2,
                            "stopped_by_detector": 1, "stopped_by_hand": 1, "would_stop": 0, "steps_saved": 70}
    assert [j["job_id"] for j in r["browse"]["jobs"]] == ["e1", "j4", "j3", "j2", "j1"]  # newest first
    assert [j["job_id"] for j in r["browse by id asc"]["jobs"]] == ["e1", "j1"] and r["browse by id asc"]["has_next"]
    assert [j["job_id"] for j in r["browse next page"]["jobs"]] == ["j2", "j3"]
    assert r["browse search"]["total"] == 4 and [j["job_id"] for j in r["browse filters"]["jobs"]] == ["j1"]
    assert r["report shadow 40"]["action"] == "continue" and r["report shadow 40"]["evidence"]["would_stop"] == 40
    assert r["status shadow"]["status"] == "running" and r["status shadow"]["would_stop_step"] == 40
    assert r["status shadow"]["would_stop"]["action"] == "stop" and r["status shadow"]["policy"]["mode"] == "shadow"
    assert [a["kind"] for a in r["audit shadow"]] == ["would_stop"] and r["register bad mode"]["error"] == 422
    assert r["summary with shadow"]["would_stop"] == 1
    assert r["capped register 2"]["status"] == "pending" and r["capped re-register (attach)"]["job_id"] == "c1"
    for label in ("stranger status", "stranger report", "stranger register"):
        assert r[label]["error"] == 401, label
    assert r["stranger pending"] == 0
    for label in ("capped register over max_jobs", "capped event over max_events_per_job"):
        assert r[label]["error"] == 429, label
    assert r["capped pending after the refusal"] == 0 and r["capped pending at the end"] == 0
    assert r["capped report (no quota)"]["action"] == "continue"
    for bad in ("browse bad sort", "browse bad cursor", "browse bad limit", "export reports bad format"):
        assert r[bad]["error"] == 422, bad
    assert [x["step"] for x in r["export reports csv"]] == ["10", "20", "25", "30", "40", "50"]
    assert [x["step"] for x in r["export reports json"]] == [10, 20, 25, 30, 40, 50]
    assert r["export reports unknown"]["error"] == 404
    assert [x["job_id"] for x in r["export jobs csv"]] == ["j1", "j4"]
    assert [x["job_id"] for x in r["export jobs json"]] == ["e1"]


# ------------------------------------------------------------------ one API, one route table
def _api_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(EvalStopAPI).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


def test_every_remote_method_of_the_api_has_a_route_and_an_endpoint():
    remote = set(_api_methods()) - LOCAL_METHODS
    assert set(ROUTES) == remote
    app = create_app(Coordinator(MemoryStore()), ServiceSettings(run_webhooks=False))
    mounted = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods}
    assert {(r.method, r.path) for r in ROUTES.values()} <= mounted
    assert set(QUERIES) == {name for name, r in ROUTES.items() if r.query}
    for route in ROUTES.values():  # the route's arguments are the client method's parameters (or their wire names)
        names = set(_api_methods()[route.name].parameters) - {"self"}
        wire = set(route.path_args) | set(route.query) | set(route.body)
        assert wire - {"limit", "offset", "wait"} <= names, route.name
        assert set(route.query) <= set(QUERIES.get(route.name, BaseModel).model_fields), route.name


def _params(fn: Callable[..., Any], skip: int) -> list[str]:
    return [p.name for p in list(inspect.signature(fn).parameters.values())[skip:]
            if p.kind is not inspect.Parameter.VAR_KEYWORD]


@pytest.mark.parametrize("name", [n for n, r in ROUTES.items() if r.request is not None])
def test_a_request_record_is_the_body_the_client_method_and_the_coordinator_method(name):
    """One declaration of a write's fields: the record. The body model is derived from it, the client
    method's keywords are tied to it here, and the coordinator's method takes the record itself (after
    the tenant and the path's arguments; only coordinator-side options such as ``actor`` follow)."""
    route = ROUTES[name]
    fields = list(field_names(route.request))
    assert list(body_model(route.request).model_fields) == fields
    client = [p for p in _params(getattr(EvalStopAPI, name), 1) if p not in route.path_args]
    assert client == fields, name
    method = getattr(_Coordinator, name)
    params = _params(method, 2)
    assert params[:len(route.path_args) + 1] == [*[a for a in params if a in route.path_args], "request"], name
    assert typing.get_type_hints(method)["request"] is route.request, name


def test_every_request_record_is_named_by_a_route():
    """REQUESTS derives from ROUTES; no record of core/requests.py is left without a route."""
    import dataclasses

    defined = {v for v in vars(request_records).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
               and v.__module__ == request_records.__name__}
    assert set(REQUESTS) == defined


def test_both_clients_are_the_one_facade(tmp_path):
    for client in (EmbeddedClient(Coordinator(MemoryStore())),
                   EvalStopClient("http://127.0.0.1:9", "es_token", outbox=tmp_path / "outbox.jsonl")):
        assert isinstance(client, EvalStopAPI)
        for name in _api_methods():  # no transport redeclares a typed method
            assert getattr(type(client), name) is getattr(EvalStopAPI, name) or name in LOCAL_METHODS, name
        client.close()


def test_connect_takes_any_client_of_the_protocol_and_nothing_else(tmp_path):
    from evalstop_trl.train.connect import connect

    client = EmbeddedClient(Coordinator(MemoryStore()))
    assert connect(client, None, tmp_path) is client
    with pytest.raises(ValueError, match="coordinator must be None, a URL, a client or a Coordinator"):
        connect(object(), None, tmp_path)


class _LoopWatch(SQLiteStore):
    """A SQLite store that notes each of its methods looked up on an event loop's thread."""

    on_loop: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if not name.startswith("_") and callable(value) and name not in SQLiteStore.QUEUED_WRITES:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass  # a worker thread (or the store's own writer)
            else:
                type(self).on_loop.append(name)
        return value


def test_no_store_call_runs_on_the_event_loop(tmp_path):
    """Authentication, the report's decision and every other handler reach the store from the
    thread pool only (a store read on the loop would stall every other request behind it); on the
    loop a report only queues its write (``Store.QUEUED_WRITES``)."""
    import httpx
    from fastapi.testclient import TestClient

    coordinator = Coordinator(_LoopWatch(tmp_path / "watch.db"))
    tokens = {name: coordinator.tenants.add(name) for name in ("alice", "bob", "carol")}
    coordinator.tenants.set_quotas("carol", CAPPED)

    class Via(httpx.BaseTransport):  # the client's requests, served by the app in process
        def __init__(self, tc: TestClient) -> None:
            self.tc = tc

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            r = self.tc.request(request.method, str(request.url), content=request.content,
                                headers=dict(request.headers))
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    _LoopWatch.on_loop.clear()
    with TestClient(create_app(coordinator, ServiceSettings(run_webhooks=False))) as tc:
        results = _run(lambda name: EvalStopClient("http://testserver", tokens.get(name, STRANGER), transport=Via(tc),
                                                   retries=0))
    assert dict(results)["report 40 stop"]["action"] == "stop"
    assert _LoopWatch.on_loop == []
