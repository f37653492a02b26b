"""``evalstop ray submit|watch``: stops delivered through a real local Ray head (Ray Jobs, token auth).

One head for the module (``tests/ray_head.py``: its own token and HOME, free loopback ports), a real
``evalstop serve``, the real CLI as a subprocess: a loop that ignores SIGTERM is stopped by Ray's own
escalation within the ack window + grace + a few seconds with no process left; a hacked tiny GRPO
job stops itself through its callback (the watcher sends nothing); another tenant's Ray job is
refused (nothing sent, it keeps running).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.launcher.remote import ACK_WINDOW_S
from tests.proc_helpers import alive

pytestmark = pytest.mark.slow
pytest.importorskip("ray.job_submission", reason="Ray Jobs needs pip install 'evalstop[ray]'")

GRACE_S = 2
JOB = Path(__file__).resolve().parent.parent / "composition_job.py"

STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    from evalstop_trl.clients.http import EvalStopClient
    signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring", flush=True))
    open(sys.argv[1], "w").write(str(os.getpid()))
    c = EvalStopClient(os.environ["EVALSTOP_URL"], os.environ["EVALSTOP_TOKEN"])
    job = os.environ["EVALSTOP_JOB_ID"]
    for i, s in enumerate([0.2, 0.5, 0.45, 0.2]):
        d = c.report(job, i, eval_score=s)
    print("decision", d.action.value, flush=True)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture(scope="module")
def head():
    from tests.ray_head import RayHead

    h = RayHead().start()
    yield h
    h.stop()


def _evalstop(head, server, token: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "evalstop_trl", *args[:2], "--url", server.url, "--address", head.address, *args[2:]]
    env = {**head.env(), "EVALSTOP_TOKEN": token}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_loop_that_ignores_sigterm_is_stopped_through_ray_and_nothing_survives(head, two, tmp_path):
    two.start()
    pid_file = tmp_path / "pid"
    done = _evalstop(head, two, two.alice, "ray", "submit", "--job-id", "stubborn", "--grace-s", str(GRACE_S),
                     "--export-token", "--", sys.executable, "-c", STUBBORN, str(pid_file))
    ended = time.time()
    assert done.returncode == 0, done.stderr  # EvalStop stopped it
    assert "Ray job stubborn ended (stopped)" in done.stderr, done.stderr
    pid = int(pid_file.read_text())
    assert not alive(pid)
    with EvalStopClient(two.url, two.alice) as c:
        audit = c.audit("stubborn")
        assert c.status("stubborn").status == "stopped"
    assert [a.kind.value for a in audit] == ["stop", "launcher_sigterm", "launcher_exit"], audit
    assert "stop_job(stubborn)" in audit[1].reason and audit[1].actor == "launcher"
    assert ended - audit[0].at < ACK_WINDOW_S + GRACE_S + 8, (ended - audit[0].at, done.stderr)
    info = head.client().get_job_info("stubborn")
    assert str(info.status.value) == "STOPPED" and info.metadata == {"evalstop_job_id": "stubborn", "tenant": "alice"}
    logs = head.client().get_job_logs("stubborn")
    assert "decision stop" in logs and "got SIGTERM, ignoring" in logs  # Ray's SIGTERM came, then its SIGKILL


def test_a_hacked_grpo_job_on_ray_stops_itself_and_the_watcher_sends_nothing(head, two, tmp_path):
    two.start()
    out = tmp_path / "grpo"
    entry = (f"{sys.executable} {JOB} --out {out} --mode callable --max-steps 90 --eval-every 10 "
             "--coordinator $EVALSTOP_URL --job-id $EVALSTOP_JOB_ID")
    done = _evalstop(head, two, two.alice, "ray", "submit", "--job-id", "grpo", "--grace-s", "30", "--export-token",
                     "--runtime-env-json", '{"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}', "--", "sh", "-c",
                     entry, timeout=300)
    assert done.returncode == 0, done.stderr + head.client().get_job_logs("grpo")[-3000:]
    with EvalStopClient(two.url, two.alice) as c:
        view, audit, reports = c.status("grpo"), c.audit("grpo"), c.reports("grpo")
    kinds = [a.kind.value for a in audit]
    assert view.status == "stopped" and view.decision.action.value == "stop", view
    # where the composition matrix's rows stop: decline (k=2) on the scores the coordinator recorded
    from tests.test_composition import replay

    stop_step, best_step, _, _ = replay([(r.step, r.eval_score) for r in reports if r.eval_score is not None])
    assert (view.last_step, view.best_step) == (stop_step, best_step), (view, stop_step, best_step)
    assert "ack" in kinds and "launcher_sigterm" not in kinds and kinds[-1] == "launcher_exit", kinds
    assert view.best_checkpoint and Path(view.best_checkpoint).exists(), view
    assert view.last_step < 90, view  # stopped before its plan
    assert str(head.client().get_job_status("grpo").value) == "SUCCEEDED"  # it ended on its own


def test_another_tenants_ray_job_is_refused_and_keeps_running(head, two, tmp_path):
    from evalstop_trl.launcher.ray_jobs import submit

    two.start()
    ray = head.client()
    submit(ray, "shared", "alice", [sys.executable, "-c", "import time; time.sleep(120)"], url=two.url, grace_s=1)
    with EvalStopClient(two.url, two.bob) as c:
        c.register_job("shared")  # bob's own job of the same name
        watcher = subprocess.Popen(
            [sys.executable, "-m", "evalstop_trl", "ray", "watch", "--url", two.url, "--address", head.address,
             "--job-id", "shared", "--grace-s", "1"], env={**head.env(), "EVALSTOP_TOKEN": two.bob},
            stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(2)
            c.stop("shared", "bob stops his own job")
            _, err = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
        audit = c.audit("shared")
    assert watcher.returncode == 2, err
    assert "names tenant 'alice', and this token speaks for 'bob'" in err, err
    assert [a.kind.value for a in audit][-1] == "launcher_exit" and "stop not delivered" in audit[-1].reason
    assert "launcher_sigterm" not in [a.kind.value for a in audit]
    assert str(ray.get_job_status("shared").value) == "RUNNING"  # alice's job was not touched
    # a submission id that is taken: refused before anything is registered (alice's running job keeps its state)
    with EvalStopClient(two.url, two.alice) as c:
        c.register_job("shared")
        taken = _evalstop(head, two, two.alice, "ray", "submit", "--job-id", "shared", "--", "true")
        assert taken.returncode == 2 and "Ray job shared exists already (RUNNING)" in taken.stderr, taken.stderr
        assert len(taken.stderr.strip().splitlines()) == 1, taken.stderr  # one line, no server traceback
        assert c.status("shared").status == "pending" and [a.kind.value for a in c.audit("shared")] == []
    ray.stop_job("shared")
