"""``evalstop run``: the launcher owns its child's process group and delivers the stop itself.

Real processes, real signals, a real ``evalstop serve`` on loopback (and the embedded default).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.launcher import child_exit_status

pytestmark = pytest.mark.slow

# A training loop that reports a hacked curve and IGNORES the stop decision (like old PPO loops).
STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    from evalstop_trl.clients.http import EvalStopClient
    mode = sys.argv[1]
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring", flush=True))
    elif mode == "term_exits":
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM, exiting", flush=True), sys.exit(0)))
    c = EvalStopClient(os.environ["EVALSTOP_URL"], os.environ["EVALSTOP_TOKEN"])
    job = os.environ["EVALSTOP_JOB_ID"]
    for i, s in enumerate([0.2, 0.5, 0.45, 0.2]):
        d = c.report(job, i, eval_score=s)
    print("decision", d.action.value, flush=True)
    if mode == "cooperative":
        c.ack(job)
        sys.exit(0)
    if mode == "crash":
        sys.exit(3)
    while True:   # ignores the cooperative stop flag
        time.sleep(0.05)
    """
)


def _run(url: str | None, token: str | None, job: str, mode: str, tmp_path, grace: float = 1.0,
         timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "evalstop_trl", "run", "--job-id", job, "--job-type", "grpo", "--grace-s", str(grace)]
    cmd += ["--url", url, "--token", token] if url else ["--db", str(tmp_path / "embedded.db")]
    cmd += ["--", sys.executable, "-c", STUBBORN, mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode, status, kinds", [
    ("term_exits", 0, ["stop", "launcher_sigterm", "launcher_exit"]),
    ("ignore_term", 137, ["stop", "launcher_sigterm", "launcher_sigkill", "launcher_exit"]),
    ("cooperative", 0, ["stop", "ack", "launcher_exit"]),
])
def test_the_launcher_stops_a_loop_that_ignores_the_stop_flag(server, tmp_path, mode, status, kinds):
    token = server.add_tenant("acme")
    server.start()
    done = _run(server.url, token, "stubborn", mode, tmp_path)
    assert "decision stop" in done.stdout
    assert done.returncode == 0, done.stderr  # a stop by EvalStop exits 0, however the command ended
    with EvalStopClient(server.url, token) as c:
        audit = c.audit("stubborn")
        job = c.status("stubborn")
    assert [a.kind for a in audit] == kinds
    assert all(a.actor == "launcher" for a in audit if a.kind.startswith("launcher_"))
    assert job.status == "stopped"  # the launcher never turns a stop into anything else
    assert audit[-1].evidence["exit_code"] == status  # the command's own status


def test_a_stopped_job_exits_with_the_chosen_code(server, tmp_path):
    token = server.add_tenant("acme")
    server.start()
    cmd = [sys.executable, "-m", "evalstop_trl", "run", "--url", server.url, "--token", token, "--job-id", "chosen",
           "--grace-s", "1", "--stopped-exit-code", "75", "--", sys.executable, "-c", STUBBORN, "term_exits"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stderr


def test_a_crashing_command_marks_its_job_failed(server, tmp_path):
    token = server.add_tenant("acme")
    server.start()
    # --k 5: the four-eval curve never stops, the child exits 3 while the job is running
    cmd = [sys.executable, "-m", "evalstop_trl", "run", "--url", server.url, "--token", token, "--job-id", "crashy",
           "--k", "5", "--", sys.executable, "-c", STUBBORN, "crash"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    with EvalStopClient(server.url, token) as c:
        assert c.status("crashy").status == "failed"
        assert [a.kind for a in c.audit("crashy")] == ["launcher_exit", "failed"]


def test_the_embedded_default_needs_no_server(tmp_path):
    done = _run(None, None, "alone", "ignore_term", tmp_path, grace=0.5)
    assert done.returncode == 0, done.stderr
    assert "stopped by its launcher (sigterm then sigkill); command status 137, exit status 0" in done.stderr


def test_signals_to_the_launcher_reach_the_whole_process_group(server, tmp_path):
    token = server.add_tenant("acme")
    server.start()
    marker = tmp_path / "grandchild.txt"
    child = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(marker)!r}, "w").write(str(gc.pid))
        while True:
            time.sleep(0.05)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "run", "--url", server.url, "--token", token,
                                 "--job-id", "forwarded", "--", sys.executable, "-c", child])
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(grandchild, 0)  # the grandchild, in the child's process group, got the signal too


@pytest.mark.parametrize("argv, message", [
    ([], "no command"),
    (["--grace-s", "1e10", "--", "true"], "--grace-s must be in [0, 86400]"),
    (["--job-id", "bad id", "--", "true"], "--job-id must be"),
    (["--url", "http://127.0.0.1:9", "--", "true"], "no token"),
])
def test_bad_launcher_input_is_a_one_line_error(argv, message, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALSTOP_")}
    done = subprocess.run([sys.executable, "-m", "evalstop_trl", "run", "--db", str(tmp_path / "x.db"), *argv],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert "evalstop run: error: " in done.stderr, done.stderr  # the command's name, not its arguments


@pytest.mark.parametrize("code, status", [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_child_exit_status(code, status):
    assert child_exit_status(code) == status


@pytest.mark.parametrize("command, stem", [
    (["python", "train.py", "--lr", "1e-5"], "train"),
    (["python", "-m", "pkg.sub.grpo_run"], "grpo_run"),
    (["torchrun", "--nproc_per_node", "2", "scripts/ppo.py", "--lr", "1"], "ppo"),
    (["/usr/bin/bash", "jobs/run me.sh"], "run-me"),
    (["sleep", "60"], "sleep"),
    (["./--weird"], "weird"),
])
def test_a_default_job_id_is_the_script_name_and_a_random_suffix(command, stem):
    import re

    from evalstop_trl.cli.run import _default_job_id
    from evalstop_trl.core.records import check_name

    first, second = _default_job_id(command), _default_job_id(command)
    assert re.fullmatch(re.escape(stem) + r"-[0-9a-f]{6}", first) and first != second
    assert check_name("job id", first) == first


PRINT_JOB = "import os; print('job', os.environ['EVALSTOP_JOB_ID'])"


def test_job_ids_come_from_the_flag_the_environment_or_the_script(server, tmp_path):
    token = server.add_tenant("acme")
    server.start()
    script = tmp_path / "train.py"
    script.write_text(PRINT_JOB)
    (tmp_path / "token").write_text(token + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALSTOP_")}
    base = [sys.executable, "-m", "evalstop_trl", "run", "--url", server.url, "--token-file", str(tmp_path / "token")]
    named = subprocess.run([*base, "--", sys.executable, str(script)], capture_output=True, text=True, env=env,
                           timeout=60)
    assert named.returncode == 0, named.stderr
    job = named.stdout.split()[-1]
    assert job.startswith("train-") and f"job id {job}" in named.stderr
    from_env = subprocess.run([*base, "--", sys.executable, str(script)], capture_output=True, text=True,
                              env={**env, "EVALSTOP_JOB_ID": "from-env"}, timeout=60)
    assert from_env.stdout.split() == ["job", "from-env"], from_env.stderr
    flag = subprocess.run([*base, "--job-id", "from-flag", "--", sys.executable, str(script)], capture_output=True,
                          text=True, env={**env, "EVALSTOP_JOB_ID": "from-env"}, timeout=60)
    assert flag.stdout.split() == ["job", "from-flag"], flag.stderr
    with EvalStopClient(server.url, token) as c:
        assert {v.job_id: v.status for v in c.list_jobs()} == {job: "finished", "from-env": "finished",
                                                               "from-flag": "finished"}


def test_an_unreadable_token_file_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALSTOP_")}
    done = subprocess.run([sys.executable, "-m", "evalstop_trl", "run", "--url", "http://127.0.0.1:9", "--token-file",
                           str(tmp_path / "missing"), "--", "true"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "cannot read --token-file" in done.stderr and "Traceback" not in done.stderr


def test_a_launch_onto_an_ended_job_is_a_new_run(server, tmp_path):
    """Rerunning `evalstop run --job-id J` after J was stopped: the new launch is J-2 (as the callback
    names a rerun), and J's old stop is never enforced on it."""
    token = server.add_tenant("acme")
    server.start()
    with EvalStopClient(server.url, token) as c:
        c.register_job("again", "grpo")
        c.stop("again", "the first run was stopped")
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "run", "--url", server.url, "--job-id", "again",
                          "--grace-s", "1", "--", sys.executable, "-c",
                          "import os, time; time.sleep(2); print(os.environ['EVALSTOP_JOB_ID'])"],
                         env={**os.environ, "EVALSTOP_TOKEN": token}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "again-2", out.stderr
    with EvalStopClient(server.url, token) as c:
        assert c.status("again-2").status == "finished" and c.status("again").status == "stopped"
        assert [a.kind.value for a in c.audit("again-2")] == ["launcher_exit"]


@pytest.mark.parametrize("text, logged", [
    ("2 consecutive declines: 0.7 → 0.6 → 0.5", "2 consecutive declines: 0.7 → 0.6 → 0.5"),  # printable: as it is
    ("forged\nevalstop run: job x stopped", "forged\\nevalstop run: job x stopped"),  # no second log line
    ("a\u2028b\x00c\\n", "a\\u2028b\\x00c\\\\n"),  # line separators, NUL, and the escape itself
])
def test_tenant_text_in_the_launchers_log_is_readable_and_cannot_forge_a_line(text, logged):
    from evalstop_trl.launcher.watch import log_text

    assert log_text(text) == logged
