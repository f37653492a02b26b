"""The remote watcher's logic (:mod:`evalstop_trl.launcher.remote`) against a scripted backend and an
in-process coordinator: when it asks for a stop, what it writes, how it settles the job. The real
backends: ``test_ray_jobs.py`` and ``test_slurm.py``."""

from __future__ import annotations

import threading
import time

import pytest

from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.memory_store import MemoryStore
from evalstop_trl.launcher import remote
from evalstop_trl.launcher.link import JobLink
from evalstop_trl.launcher.remote import RemoteRefused, RemoteState, RemoteStatus, RemoteWatcher
from tests.proc_helpers import until


@pytest.fixture(autouse=True)
def fast_ticks(monkeypatch):
    monkeypatch.setattr(remote, "_TICK_S", 0.02)
    monkeypatch.setattr(remote, "_STOPPING_TICK_S", 0.02)
    monkeypatch.setattr(remote, "_RETRY_S", 0.05)


class Scripted:
    """A backend whose job runs until it is stopped (or ``end()``), recording what was asked."""

    label = "Fake job 1"

    def __init__(self, escalates: bool = False, refuse: str | None = None, fail_first: int = 0,
                 ends_on: str = "kill") -> None:
        self.escalates, self.refuse, self.fail_first, self.ends_on = escalates, refuse, fail_first, ends_on
        self.asked: list[str] = []
        self.state = RemoteState.RUNNING
        self.status_errors = self.owner_errors = 0

    def status(self) -> RemoteStatus:
        if self.status_errors:
            self.status_errors -= 1
            raise OSError("backend down")
        return RemoteStatus(self.state, self.state.value.upper())

    def refusal(self, job_id: str, tenant: str) -> str | None:
        if self.owner_errors:
            self.owner_errors -= 1
            raise OSError("cannot read the owner")
        return self.refuse if tenant == "local" else f"unexpected tenant {tenant!r}"

    def _ask(self, what: str) -> str:
        if self.fail_first:
            self.fail_first -= 1
            raise OSError("no answer")
        self.asked.append(what)
        if what == self.ends_on:
            self.state = RemoteState.STOPPED
        return f"{what} asked"

    def terminate(self) -> str:
        return self._ask("terminate")

    def kill(self) -> str:
        return self._ask("kill")


def _watch(job: Scripted, grace_s: float = 0.2, client=None, **kw):
    client = client or EmbeddedClient(Coordinator(MemoryStore()))
    link = JobLink(client, "j", who="test")
    assert link.register()
    watcher = RemoteWatcher(client, link, job, grace_s=grace_s, heartbeat_s=None, ack_window_s=0.2, poll_s=0.2, **kw)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", watcher.run()), daemon=True)
    thread.start()
    return client, thread, out


def _kinds(client) -> list[str]:
    return [a.kind.value for a in client.audit("j")]


def test_an_unacknowledged_stop_is_terminated_then_killed():
    job = Scripted()
    client, thread, out = _watch(job)
    client.stop("j", "by hand")
    thread.join(10)
    assert job.asked == ["terminate", "kill"]
    assert _kinds(client) == ["manual_stop", "launcher_sigterm", "launcher_sigkill", "launcher_exit"]
    assert out["result"].exit_status == 0 and out["result"].stop_seen and out["result"].escalations == ("sigterm", "sigkill")


def test_a_backend_that_escalates_by_itself_is_asked_once():
    job = Scripted(escalates=True, ends_on="terminate")
    client, thread, out = _watch(job)
    client.stop("j")
    thread.join(10)
    assert job.asked == ["terminate"] and out["result"].escalations == ("sigterm",)


def test_an_acknowledged_job_gets_the_grace_to_end_on_its_own():
    job = Scripted()
    client, thread, out = _watch(job, grace_s=5.0)
    client.stop("j")
    client.ack("j", checkpoint="/ckpt/3")
    time.sleep(0.6)  # past the ack window: it acknowledged, so nothing is sent
    assert job.asked == []
    job.state = RemoteState.SUCCEEDED  # it saved and ended
    thread.join(10)
    assert job.asked == [] and out["result"].exit_status == 0 and out["result"].stop_seen
    assert _kinds(client) == ["manual_stop", "ack", "launcher_exit"]
    assert client.status("j").status == "stopped"


def test_a_refusal_sends_nothing_and_exits_2():
    job = Scripted(refuse="it belongs to someone else")
    client, thread, out = _watch(job)
    client.stop("j")
    thread.join(10)
    assert job.asked == [] and out["result"].exit_status == 2 and out["result"].refused == "it belongs to someone else"
    assert "stop not delivered to Fake job 1: it belongs to someone else" in client.audit("j")[-1].reason


def test_a_backend_that_refuses_the_request_for_good_is_a_refusal():
    job = Scripted()
    job.terminate = lambda: (_ for _ in ()).throw(RemoteRefused("scancel refused: permission denied"))
    client, thread, out = _watch(job)
    client.stop("j")
    thread.join(10)
    assert out["result"].exit_status == 2 and "permission denied" in out["result"].refused


def test_requests_and_readings_that_fail_are_retried():
    job = Scripted(fail_first=2)
    job.status_errors, job.owner_errors = 3, 2
    client, thread, out = _watch(job)
    client.stop("j")
    thread.join(10)
    assert job.asked == ["terminate", "kill"] and out["result"].exit_status == 0


@pytest.mark.parametrize("state, exit_status, status", [
    (RemoteState.SUCCEEDED, 0, "finished"),
    (RemoteState.FAILED, 1, "failed"),
    (RemoteState.STOPPED, 1, "pending"),  # stopped by someone else: left to its lease
    (RemoteState.GONE, 1, "pending"),
])
def test_a_job_that_ends_by_itself_settles_its_evalstop_job(state, exit_status, status):
    job = Scripted()
    client, thread, out = _watch(job)
    time.sleep(0.1)
    job.state = state
    thread.join(10)
    assert out["result"].exit_status == exit_status and not out["result"].stop_seen
    assert client.status("j").status == status and job.asked == []
    assert "launcher_exit" in _kinds(client)


@pytest.mark.parametrize("argv, message", [
    (["ray", "submit", "--job-id", "x", "--", "echo"], "needs the coordinator's URL (--url or $EVALSTOP_URL)"),
    (["ray", "submit", "--job-id", "x", "--url", "http://127.0.0.1:9"], "no entrypoint: write it after '--'"),
    (["ray", "submit", "--job-id", "x", "--url", "http://127.0.0.1:9", "--runtime-env-json", "[1]", "--", "echo"],
     "--runtime-env-json must be a JSON object, got list"),
    (["ray", "submit", "--job-id", "x", "--url", "http://127.0.0.1:9", "--runtime-env-json", "{", "--", "echo"],
     "--runtime-env-json is not JSON"),
    (["ray", "watch", "--job-id", "x", "--url", "http://127.0.0.1:9", "--address", "http://127.0.0.1:9"],
     "cannot reach the Ray cluster at http://127.0.0.1:9"),
    (["slurm", "watch", "--job-id", "x", "--slurm-job", "12;rm"], "a Slurm job id is digits"),
    (["ray", "watch", "--job-id", "x", "--ray-job", "../version"], "--ray-job must be a Ray submission id"),
    (["ray", "watch", "--job-id", "x", "--ray-job", "."], "--ray-job must be a Ray submission id"),
    (["ray", "watch", "--job-id", "x", "--ray-job", ".."], "--ray-job must be a Ray submission id"),
    (["ray", "watch", "--job-id", "x", "--ray-job", ""], "--ray-job must be a Ray submission id"),
    (["slurm", "watch", "--job-id", "x", "--slurm-job", "12", "--url", "http://[::1"], "is not a valid URL"),
    (["slurm", "watch", "--job-id", "x", "--slurm-job", "12", "--url", "http://127.0.0.1:99999"],
     "a port in [1, 65535]"),
    (["slurm", "watch", "--job-id", "bad id", "--slurm-job", "12", "--url", "http://127.0.0.1:9"], "--job-id"),
    (["slurm", "watch", "--job-id", "x", "--slurm-job", "12", "--grace-s", "-1"], "--grace-s must be in [0, 86400]"),
])
def test_bad_input_to_the_watchers_is_one_clear_line(argv, message, capsys, monkeypatch):
    from evalstop_trl.cli import main

    for name in ("EVALSTOP_URL", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EVALSTOP_TOKEN", "es_" + "x" * 43)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"evalstop {argv[0]}: error: "), err


def test_a_stop_that_never_takes_gives_up_with_exit_3(monkeypatch):
    monkeypatch.setattr(remote, "_SETTLE_S", 0.2)
    job = Scripted(escalates=True, ends_on="nothing")
    client, thread, out = _watch(job)
    client.stop("j")
    thread.join(10)
    assert out["result"].exit_status == 3 and job.asked == ["terminate"]
    assert "the watcher gave up on it" in client.audit("j")[-1].reason


def test_an_outage_while_stopping_is_logged_once(caplog):
    job = Scripted()
    job.owner_errors = 10**6  # the owner cannot be read, ever
    client, thread, out = _watch(job)
    with caplog.at_level("WARNING", logger="evalstop.launcher"):
        client.stop("j")
        time.sleep(1.0)  # about 15 retries
    assert job.asked == [] and thread.is_alive()  # nothing sent while the owner is unknown
    assert sum("cannot check who owns" in r.getMessage() for r in caplog.records) == 1
    job.owner_errors = 0
    thread.join(10)
    assert job.asked == ["terminate", "kill"]


def test_a_registration_deferred_by_an_outage_never_takes_an_ended_runs_stop():
    from evalstop_trl.launcher.watch import JobWatch

    client = EmbeddedClient(Coordinator(MemoryStore()))
    client.register_job("rr")
    client.stop("rr", "the earlier run")
    link = JobLink(client, "rr", who="test")
    watch = JobWatch(client, "rr", poll_s=0.1, heartbeat_s=None, register=link.register_deferred).start()
    try:
        assert until(lambda: watch.job_id == "rr-2", 5)  # the next run, as a confirmed registration names it
        time.sleep(0.3)
        assert link.job_id == "rr-2" and not watch.state.stopped
        client.stop("rr-2")
        assert until(lambda: watch.state.stopped, 5)
    finally:
        watch.close()
    attach = JobLink(client, "rr", who="test", next_run=False)
    assert attach.register() and attach.job_id == "rr"  # a watcher attaching keeps the job (and its stop)
