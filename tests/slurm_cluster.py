"""A throwaway single-host Slurm cluster for the tests: munged, slurmctld and slurmd from the Debian
packages (``make test`` installs them), started by hand as root in a temporary folder with a munge
key and socket of their own, on free loopback ports, without systemd or cgroups
(``proctrack/linuxproc``, ``task/none``); ``env()`` points Slurm's commands at it (``SLURM_CONF``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from evalstop_trl.clients.local import free_loopback_port
from tests.proc_helpers import kill_marked

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why no cluster can start here (None: it can)."""
    for name in (*DAEMONS, "sbatch", "scancel", "scontrol", "squeue"):
        if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists():
            return f"{name} is not installed: apt-get install -y slurmctld slurmd slurm-client munge (make test does)"
    if os.geteuid() != 0:
        return "a test Slurm cluster starts its daemons as root"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="esslurm-", dir="/tmp"))
        self.root.chmod(0o755)
        self.work = self.root / "work"  # where jobs of any user may write
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        r = self.root
        for d in ("state", "spool", "work"):
            (r / d).mkdir()
        self.work.chmod(0o1777)
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctl_port, d_port = free_loopback_port(), free_loopback_port()
        self.conf.write_text("\n".join([
            "ClusterName=evalstoptest", f"SlurmctldHost={self.node}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={ctl_port}", f"SlurmdPort={d_port}", "AuthType=auth/munge",
            f"AuthInfo=socket={r}/munge.sock", "CredType=cred/munge", f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool", f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
            "KillWait=3", "MinJobAge=600",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4", ""]))
        subprocess.run([_bin("munged"), "--force", f"--socket={r}/munge.sock", f"--key-file={key}",
                        f"--pid-file={r}/munged.pid", f"--log-file={r}/munged.log", f"--seed-file={r}/munge.seed"],
                       check=True, capture_output=True)
        subprocess.run([_bin("slurmctld"), "-f", str(self.conf), "-i"], check=True, capture_output=True)
        subprocess.run([_bin("slurmd"), "-f", str(self.conf)], check=True, capture_output=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env(), capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.3)
        logs = "".join((r / f"{d}.log").read_text()[-1000:] for d in ("slurmctld", "slurmd") if (r / f"{d}.log").exists())
        self.stop()
        raise RuntimeError(f"the test Slurm cluster did not come up within {timeout:g} s: {logs}")

    def sbatch(self, script: str, *, user: str | None = None, name: str = "job") -> str:
        """Submit ``script`` (a shell script's text) as ``user`` (default: this one); its job id."""
        path = self.work / f"{name}.sh"
        path.write_text(script)
        path.chmod(0o755)
        cmd = ["sbatch", "--parsable", f"--chdir={self.work}", f"--output={self.work}/{name}-%j.out", str(path)]
        if user is not None:
            cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}", *cmd]
        done = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, check=True)
        return done.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], env=self.env(), capture_output=True,
                             text=True)
        return out.stdout.strip()

    def stop(self) -> None:
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True, text=True).stdout.split()
        if jobs:
            subprocess.run(["scancel", "--full", "--signal=KILL", *jobs], env=self.env(), capture_output=True)
            time.sleep(1)
        for name in reversed(DAEMONS):
            pid_file = self.root / f"{name}.pid"
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)
        for name in DAEMONS:  # and, if one did not end, for good
            try:
                os.kill(int((self.root / f"{name}.pid").read_text().split()[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        kill_marked(str(self.root))  # what left the group or outlived the daemons
        shutil.rmtree(self.root, ignore_errors=True)
