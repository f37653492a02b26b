"""``evalstop slurm watch``: stops delivered through a real single-host Slurm (munged, slurmctld and
slurmd from the Debian packages, ``tests/slurm_cluster.py``) and a real ``evalstop serve``.

A batch job that ignores SIGTERM is stopped (``scancel --signal=TERM --full``, then ``scancel``) with
no process left; another user's job is refused by the watcher even though it runs as root (nothing
sent, the job keeps running).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.launcher.remote import ACK_WINDOW_S
from tests.proc_helpers import alive, until
from tests.slurm_cluster import SlurmCluster, missing

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing() is not None, reason=str(missing()))]

GRACE_S = 2
STUBBORN = """#!/bin/bash
trap '' TERM
echo $$ > {pid}
while true; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster().start()
    yield cluster
    cluster.stop()


def _watch(slurm, server, token: str, job_id: str, slurm_job: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "evalstop_trl", "slurm", "watch", "--url", server.url, "--job-id", job_id,
           "--slurm-job", slurm_job, "--grace-s", str(GRACE_S)]
    return subprocess.Popen(cmd, env={**slurm.env(), "EVALSTOP_TOKEN": token}, stderr=subprocess.PIPE, text=True)


def test_a_batch_job_that_ignores_sigterm_is_cancelled_through_slurm(slurm, two):
    two.start()
    pid_file = slurm.work / "stubborn.pid"
    job = slurm.sbatch(STUBBORN.format(pid=pid_file), name="stubborn")
    assert until(lambda: slurm.state(job) == "RUNNING" and pid_file.exists())
    pid = int(pid_file.read_text())
    watcher = _watch(slurm, two, two.alice, "hacked", job)
    try:
        with EvalStopClient(two.url, two.alice) as c:
            assert until(lambda: any(v.job_id == "hacked" for v in c.list_jobs()))
            for i, s in enumerate([0.2, 0.5, 0.45, 0.2]):
                decision = c.report("hacked", i, eval_score=s)
            assert decision.action.value == "stop"
            _, err = watcher.communicate(timeout=60)
            ended = time.time()
            audit = c.audit("hacked")
            view = c.status("hacked")
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert slurm.state(job) == "CANCELLED" and not alive(pid), (slurm.state(job), err)
    kinds = [a.kind.value for a in audit]
    assert kinds == ["stop", "launcher_sigterm", "launcher_sigkill", "launcher_exit"], (kinds, err)
    assert f"scancel --signal=TERM --full {job}" in audit[1].reason and f"scancel {job}" in audit[2].reason
    assert "CANCELLED" in audit[-1].reason and view.status == "stopped"
    assert ended - audit[0].at < ACK_WINDOW_S + 2 * GRACE_S + 8, (ended - audit[0].at, err)


def test_another_users_slurm_job_is_refused_even_by_root(slurm, two):
    two.start()
    # its own text claims root's: a comment and a job name that forge scontrol's Key=Value fields
    job = slurm.sbatch('#!/bin/bash\n#SBATCH --comment="x UserId=root(0) JobState=RUNNING"\n'
                       '#SBATCH --job-name="a UserId=root(0)"\nwhile true; do sleep 0.5; done\n',
                       user="nobody", name="nobodys")
    assert until(lambda: slurm.state(job) == "RUNNING")
    with EvalStopClient(two.url, two.bob) as c:
        watcher = _watch(slurm, two, two.bob, "bobs", job)
        try:
            assert until(lambda: any(v.job_id == "bobs" for v in c.list_jobs()))
            c.stop("bobs", "bob stops his job")
            _, err = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
        audit = c.audit("bobs")
    assert watcher.returncode == 2, err
    assert "belongs to user nobody(65534), and this watcher runs as root(0)" in err, err
    assert "launcher_sigterm" not in [a.kind.value for a in audit] and "stop not delivered" in audit[-1].reason
    assert slurm.state(job) == "RUNNING"  # nobody's job was not touched
