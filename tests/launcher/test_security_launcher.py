"""Issue 17 (items 2 and 3) and issue 20 (the launcher's part), run as attacks on a real launcher.

Every test starts ``python -m evalstop_trl run`` as a real process over real process trees, against a
real ``evalstop serve`` on loopback, a port nobody listens on, or a fake coordinator on loopback that
answers garbage. After each, no process of the job may be left running.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.clients.local import free_loopback_port
from tests.proc_helpers import alive, until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="process trees are read from /proc")]

PY = sys.executable


# ------------------------------------------------------------------ helpers
def _wait_for(path: Path, count: int = 1, timeout: float = 30.0) -> list[int]:
    """The pids written to ``path`` (one a line), once there are ``count``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) >= count:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"{path} never listed {count} pid(s)")


class Launch:
    """``evalstop run ARGS -- CMD`` in the background, its output in files; kills what it leaves."""

    def __init__(self, tmp_path: Path, args: list[str], cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.out, self.err = tmp_path / "launcher.out", tmp_path / "launcher.err"
        base = {k: v for k, v in os.environ.items() if not k.startswith("EVALSTOP_")}
        self.proc = subprocess.Popen([PY, "-m", "evalstop_trl", "run", *args, "--", *cmd], stdout=open(self.out, "w"),
                                     stderr=open(self.err, "w"), env={**base, **(env or {})})
        self.pids: list[int] = []

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pid in self.pids:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def launches():
    made: list[Launch] = []
    yield made
    for launch in made:
        launch.cleanup()


@pytest.fixture
def coordinator(server):
    token = server.add_tenant("acme")
    server.start()
    return server, token


def _script(body: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(body)]


# ------------------------------------------------------------------ 17.2: a launcher that never lets go
def test_17_2_an_unreachable_coordinator_never_ends_the_supervision(tmp_path, launches):
    marker, done = tmp_path / "pids", tmp_path / "done"
    child = _script(f"""
        import os, time
        open({str(marker)!r}, "w").write(str(os.getpid()))
        time.sleep(3)
        open({str(done)!r}, "w").write("ran to its end")
    """)
    url = f"http://127.0.0.1:{free_loopback_port()}"  # nobody listens there
    launch = Launch(tmp_path, ["--url", url, "--token", "x", "--job-id", "j", "--grace-s", "1", "--lease-s", "2"],
                    child)
    launches.append(launch)
    launch.pids = _wait_for(marker)
    assert launch.wait() == 0, launch.stderr
    assert done.read_text() == "ran to its end"  # fail-open: the child ran to its end
    assert "Traceback" not in launch.stderr
    assert not alive(launch.pids[0])


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM])
def test_17_2_signals_reach_the_child_and_the_launcher_outlives_it(tmp_path, launches, sig):
    marker, got = tmp_path / "pids", tmp_path / "got"
    # the child takes 1 s to wind down after the signal: the launcher must wait for it
    child = _script(f"""
        import os, signal, sys, time
        def bye(signum, frame):
            open({str(got)!r}, "w").write(signal.Signals(signum).name)
            time.sleep(1)
            sys.exit(10)
        for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, bye)
        open({str(marker)!r}, "w").write(str(os.getpid()))
        while True:
            time.sleep(0.05)
    """)
    url = f"http://127.0.0.1:{free_loopback_port()}"
    launch = Launch(tmp_path, ["--url", url, "--token", "x", "--job-id", "sig", "--lease-s", "0"], child)
    launches.append(launch)
    launch.pids = _wait_for(marker)
    time.sleep(0.3)
    launch.proc.send_signal(sig)
    assert launch.wait(timeout=30) == 10, launch.stderr  # the child's own status
    assert got.read_text() == sig.name
    assert not alive(launch.pids[0])


GARBAGE = {
    "empty": (200, "application/json", b"{}"),
    "html": (200, "text/html", b"<html><body>502 from a proxy, with a 200</body></html>"),
    "list": (200, "application/json", b"[1, 2, 3]"),
    "unknown_action": (200, "application/json", json.dumps({
        "job_id": "j", "job_type": "rlhf", "status": "stopped", "policy": {}, "n_reports": 1, "acked": False,
        "decision": {"action": "explode", "reason": "unknown action", "best_step": None, "best_score": None,
                     "evidence": {}}, "best_step": None, "best_score": None, "best_checkpoint": None,
        "last_step": 1, "planned_steps": None, "created_at": 0.0, "last_seen": None, "ended_at": None}).encode()),
    "wrong_types": (200, "application/json", json.dumps({"job_id": "j", "status": ["stopped"], "acked": "yes"}).encode()),
    "null": (201, "application/json", b"null"),
    "string": (200, "application/json", b'"stopped"'),
}


class _Garbage(http.server.BaseHTTPRequestHandler):
    answer = GARBAGE["empty"]
    n = 0

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, ctype, body = _Garbage.answer
        _Garbage.n += 1
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def garbage_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_17_2_malformed_answers_never_end_the_supervision(tmp_path, launches, garbage_server, garbage):
    _Garbage.answer, _Garbage.n = GARBAGE[garbage], 0
    marker, done = tmp_path / "pids", tmp_path / "done"
    child = _script(f"""
        import os, time
        open({str(marker)!r}, "w").write(str(os.getpid()))
        time.sleep(2)
        open({str(done)!r}, "w").write("ran to its end")
    """)
    launch = Launch(tmp_path, ["--url", garbage_server, "--token", "x", "--job-id", "j", "--grace-s", "0.5",
                               "--lease-s", "1"], child)
    launches.append(launch)
    launch.pids = _wait_for(marker)
    assert launch.wait() == 0, launch.stderr
    assert done.read_text() == "ran to its end"  # a 'stopped' with an unknown action stops nothing
    assert "Traceback" not in launch.stderr
    assert _Garbage.n >= 2  # it asked, and asked again


# ------------------------------------------------------------------ 17.3: escalation reaches every descendant
def _stop_when_registered(url: str, token: str, job: str) -> None:
    with EvalStopClient(url, token) as c:
        assert until(lambda: any(v.job_id == job for v in c.list_jobs()))
        c.stop(job, "stopped by hand for the test")


TREES = {
    # a python grandchild that ignores SIGTERM, in the child's process group
    "ignoring_grandchild": """
        import os, signal, subprocess, sys, time
        gc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); open(" + repr(MARKER + ".ready") + ", 'w').close(); "
                               "time.sleep(600)"])
        while not os.path.exists(MARKER + ".ready"):
            time.sleep(0.02)
        open(MARKER, "w").write(f"{os.getpid()}\\n{gc.pid}\\n")
        while True:
            time.sleep(0.05)
    """,
    # a grandchild in a session of its own (setsid), out of the child's process group
    "setsid_grandchild": """
        import os, subprocess, time
        gc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        open(MARKER, "w").write(f"{os.getpid()}\\n{gc.pid}\\n")
        while True:
            time.sleep(0.05)
    """,
    # a daemon: double fork into a new session; its parent exits at once (the orphan is re-parented)
    "daemonized_grandchild": """
        import os, subprocess, time
        subprocess.run(["sh", "-c", "sleep 600 > /dev/null 2>&1 & echo $! > " + MARKER + ".gc"],
                       start_new_session=True, check=True)
        gc = int(open(MARKER + ".gc").read())
        open(MARKER, "w").write(f"{os.getpid()}\\n{gc}\\n")
        while True:
            time.sleep(0.05)
    """,
}


@pytest.mark.parametrize("tree", sorted(TREES))
def test_17_3_a_stop_reaches_every_descendant(coordinator, tmp_path, launches, tree):
    server, token = coordinator
    marker = tmp_path / "pids"
    body = TREES[tree].replace("MARKER", repr(str(marker)))
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "tree", "--grace-s", "1"],
                    _script(body))
    launches.append(launch)
    launch.pids = _wait_for(marker, 2)
    child, grandchild = launch.pids
    _stop_when_registered(server.url, token, "tree")
    assert launch.wait(timeout=60) == 0, launch.stderr  # stopped by EvalStop
    assert not alive(child)
    assert not alive(grandchild), f"{tree}: pid {grandchild} survived the stop"
    with EvalStopClient(server.url, token) as c:
        audit = c.audit("tree")
        assert c.status("tree").status == "stopped"
    kinds = [a.kind.value for a in audit]
    assert kinds[0] == "manual_stop" and kinds[-1] == "launcher_exit" and "launcher_sigterm" in kinds
    named = " ".join(a.reason for a in audit if a.kind.value.startswith("launcher_"))
    assert f"pid {grandchild} " in named  # the escaped or surviving process is named in the audit


def test_17_3_a_child_that_backgrounds_a_process_and_exits_0_leaves_nothing_behind(coordinator, tmp_path, launches):
    server, token = coordinator
    marker = tmp_path / "pids"
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {marker}\nsleep 600 &\necho $! >> {marker}\nexit 0\n")
    script.chmod(0o755)
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "bg", "--grace-s", "1"],
                    [str(script)])
    launches.append(launch)
    launch.pids = _wait_for(marker, 2)
    assert launch.wait(timeout=60) == 0, launch.stderr
    assert not alive(launch.pids[1]), "the backgrounded sleep escaped"
    with EvalStopClient(server.url, token) as c:
        audit = c.audit("bg")
        assert c.status("bg").status == "finished"
    assert [a.kind.value for a in audit] == ["launcher_sigterm", "launcher_exit"]
    # The name is the one at the moment the launcher looked: the forked shell may not have exec'd sleep yet.
    assert re.search(rf"pid {launch.pids[1]} \((sleep|train\.sh)\)", audit[0].reason), audit[0].reason
    assert "left 1 process(es) running" in audit[1].reason


def test_17_3_what_ignores_sigterm_after_the_child_exits_is_killed(coordinator, tmp_path, launches):
    server, token = coordinator
    marker = tmp_path / "pids"
    ready = tmp_path / "ready"
    child = _script(f"""
        import os, subprocess, sys, time
        gc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); open({str(ready)!r}, 'w').close(); time.sleep(600)"],
                              start_new_session=True)
        while not os.path.exists({str(ready)!r}):
            time.sleep(0.02)
        open({str(marker)!r}, "w").write(f"{{os.getpid()}}\\n{{gc.pid}}\\n")
        os._exit(0)
    """)
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "left", "--grace-s", "1"], child)
    launches.append(launch)
    launch.pids = _wait_for(marker, 2)
    assert launch.wait(timeout=60) == 0, launch.stderr
    assert not alive(launch.pids[1])
    with EvalStopClient(server.url, token) as c:
        kinds = [a.kind.value for a in c.audit("left")]
    assert kinds == ["launcher_sigterm", "launcher_sigkill", "launcher_exit"]


# ------------------------------------------------------------------ 17.9: tenant text in the launcher's log
def test_17_9_tenant_text_in_the_launcher_log_is_escaped(coordinator, tmp_path, launches):
    server, token = coordinator
    marker = tmp_path / "pids"
    child = _script(f"""
        import os, time
        open({str(marker)!r}, "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "forge", "--grace-s", "0.5"], child)
    launches.append(launch)
    launch.pids = _wait_for(marker)
    with EvalStopClient(server.url, token) as c:
        assert until(lambda: any(v.job_id == "forge" for v in c.list_jobs()))
        c.stop("forge", "bye\nERROR evalstop: forged line")
    assert launch.wait(timeout=60) == 0, launch.stderr
    lines = launch.stderr.splitlines()
    assert not any(line.startswith("ERROR evalstop: forged") for line in lines), launch.stderr
    assert any("bye\\nERROR evalstop: forged line" in line for line in lines), launch.stderr


# ------------------------------------------------------------------ issue 20: liveness and the child's exit
def test_20_the_launcher_keeps_its_job_alive_with_heartbeats(server, tmp_path, launches):
    token = server.add_tenant("acme")
    server.start(args=("--lease-s", "1"))
    marker = tmp_path / "pids"
    child = _script(f"""
        import os, time
        open({str(marker)!r}, "w").write(str(os.getpid()))
        time.sleep(3.5)   # never reports: only the launcher's heartbeats keep the lease
    """)
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "quiet", "--lease-s", "1"], child)
    launches.append(launch)
    launch.pids = _wait_for(marker)
    assert launch.wait(timeout=60) == 0, launch.stderr
    with EvalStopClient(server.url, token) as c:
        assert [a.kind.value for a in c.audit("quiet")] == ["launcher_exit"]  # never 'lost'
        assert c.status("quiet").status == "finished"


def test_20_a_child_killed_by_a_signal_is_reported_and_its_job_lost_after_its_lease(server, tmp_path, launches):
    """Killed from outside (preempted, OOM-killed): not a failure of the job's own, so the launcher
    leaves it to its lease (lost), and a resumed attempt that reports brings it back."""
    token = server.add_tenant("acme")
    server.start(args=("--lease-s", "1"))
    child = _script("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    launch = Launch(tmp_path, ["--url", server.url, "--token", token, "--job-id", "oom", "--lease-s", "1"], child)
    launches.append(launch)
    assert launch.wait(timeout=60) == 137, launch.stderr
    with EvalStopClient(server.url, token) as c:
        deadline = time.monotonic() + 30
        while c.status("oom").status != "lost" and time.monotonic() < deadline:
            time.sleep(0.2)
        audit = c.audit("oom")
        assert c.status("oom").status == "lost"
        c.report("oom", 10, eval_score=0.5)  # a resumed attempt
        assert c.status("oom").status == "running"
    assert [a.kind.value for a in audit] == ["launcher_exit", "lost"]
    assert "killed by SIGKILL" in audit[0].reason and audit[0].evidence["exit_code"] == 137
