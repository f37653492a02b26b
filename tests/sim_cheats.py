"""The audit's cheats, each written as a real overlay (a subclass of the real ``DetectorOverlay``),
and a driver that runs one of them in-process or sealed (``tests/sim/test_sim_sealed.py``).

Every cheat tries to learn each job's truth (hacked? gold peak?) and, if it can, stops the job at the
first eval at or past its true peak: the Oracle's decision at eval granularity. It never uses the
detector, so its decisions show exactly what it learned.

Driver (prints JSON: every job's outcome and truth, after the run)::

    python -m tests.sim_cheats CHEAT --mode inproc|sealed --seed-start 41

``inproc`` is the old behaviour (unsalted workload, overlay in the engine's process); ``sealed`` runs
the cheat in a sealed process on a workload drawn with a fresh secret salt (drawn here, never on a
command line). The seed is on this driver's command line on purpose: ``platform-sim run
--seed-start N`` puts it there too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import struct
import sys
import time
import types
import zlib
from typing import Any

from platform_sim.config import load_config
from platform_sim.overlays import DetectorOverlay, Overlay
from platform_sim.workload import generate_workload

SEEDS = range(64)  # the candidate seeds a rebuilding cheat tries
MATCH = 24  # job types matched (the audit's first 24)


def oracle_step(hacked: bool, peak: float, n: int) -> int | None:
    """The eval at which the Oracle's decision, at eval granularity, stops a job (None: never)."""
    if not hacked:
        return None
    return next((i for i in range(1, n + 1) if i / n >= peak), None)


def _truth_map(workload: Any) -> dict[int, tuple[bool, float]]:
    return {s.job_id: (t.hacked, t.peak_progress) for s, t in zip(workload.jobs, workload.truths, strict=True)}


def _is_workload(obj: Any) -> bool:
    return hasattr(obj, "truths") and hasattr(obj, "jobs") and not isinstance(obj, type)


def _visible(spec: Any) -> tuple:
    return spec.job_type, spec.gpus, spec.arrival_s, spec.est_duration_s


class Cheat(DetectorOverlay):
    """The EvalStop overlay, cheating: stops a job at its true peak if :meth:`learn` finds the truth."""

    def __init__(self) -> None:
        super().__init__("decline", {"k": 2}, "rlhf", name="evalstop")
        self.truth: dict[int, tuple[bool, float]] | None = None
        self.attempts = 0  # a cheat that found nothing tries again twice, then gives up (speed)

    def learn(self, job: Any) -> dict[int, tuple[bool, float]] | None:
        raise NotImplementedError

    def ready(self) -> bool:
        return True

    def on_eval(self, job, step, score, loss, proxy):
        if (self.truth is None or job.job_id not in self.truth) and self.attempts < 3 and self.ready():
            self.attempts += 1
            try:
                self.truth = self.learn(job)
            except Exception:  # noqa: BLE001 - a cheat that finds nothing just does not stop
                self.truth = None
        if not self.truth or job.job_id not in self.truth:
            return False
        return oracle_step(*self.truth[job.job_id], self.n_evals) == step

    @staticmethod
    def from_frames(frame: types.FrameType | None) -> dict[int, tuple[bool, float]] | None:
        """Walk up the stack; any local that is (or holds) a workload gives the truth."""
        while frame is not None:
            for value in list(frame.f_locals.values()):
                for obj in (value, getattr(value, "workload", None)):
                    if _is_workload(obj):
                        return _truth_map(obj)
            frame = frame.f_back
        return None


class FrameCheat(Cheat):
    """``sys._getframe`` walking up the call stack."""

    def learn(self, job):
        return self.from_frames(sys._getframe(1))


class TracebackCheat(Cheat):
    """Raise, catch, and walk the traceback's frames."""

    def learn(self, job):
        try:
            raise LookupError("where am I?")
        except LookupError as exc:
            return self.from_frames(exc.__traceback__.tb_frame)


class GcObjectsCheat(Cheat):
    """``gc.get_objects``: every workload in the process; the one whose job matches this job."""

    def learn(self, job):
        for obj in gc.get_objects():
            if _is_workload(obj) and len(obj.jobs) > job.job_id and _visible(obj.jobs[job.job_id]) == (
                    job.job_type, job.gpus, job.arrival_s, job.est_duration_s):
                return _truth_map(obj)
        return None


class GcReferrersCheat(Cheat):
    """``gc.get_referrers`` of this overlay (frames skipped): whoever holds it holds the workload."""

    def learn(self, job):
        frontier, seen = [self], {id(self)}
        for _ in range(3):
            nxt = []
            for obj in frontier:
                for ref in gc.get_referrers(obj):
                    if isinstance(ref, types.FrameType) or id(ref) in seen or ref is frontier:
                        continue
                    seen.add(id(ref))
                    candidates = [ref, getattr(ref, "workload", None)]
                    if isinstance(ref, dict):
                        candidates.append(ref.get("workload"))
                    for c in candidates:
                        if _is_workload(c):
                            return _truth_map(c)
                    nxt.append(ref)
            frontier = nxt
        return None


def _argv_seed(argv: list[str]) -> int | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in ("--seed-start", "--seed"):
            return int(argv[i + 1])
    return None


class ArgvEnvCheat(Cheat):
    """The seed from ``sys.argv``, ``os.environ`` or the parent's ``/proc/<ppid>/cmdline``; then the
    public ``generate_workload`` rebuilds the truth."""

    def learn(self, job):
        seed = _argv_seed(sys.argv)
        for value in os.environ.values():
            if seed is None and (m := re.search(r"--seed-start[= ](\d+)", value)):
                seed = int(m.group(1))
        if seed is None:
            try:
                with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
                    seed = _argv_seed(fh.read().decode().split("\0"))
            except OSError:
                pass
        if seed is None:
            return None
        return _truth_map(generate_workload(load_config(), seed))


class TypesMatchCheat(Cheat):
    """The seed found by matching the first 24 visible job types against public workloads."""

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[int, str] = {}

    def on_arrival(self, job):
        self.types[job.job_id] = job.job_type
        super().on_arrival(job)

    def ready(self):
        return all(i in self.types for i in range(MATCH))

    def learn(self, job):
        cfg = load_config()
        seen = [self.types[i] for i in range(MATCH)]
        for seed in SEEDS:
            wl = generate_workload(cfg, seed)
            if [s.job_type for s in wl.jobs[:MATCH]] == seen:
                return _truth_map(wl)
        return None


def proc_probe(pid: int) -> list[str]:
    """What of process ``pid`` this process can read beyond its command line."""
    found = []
    for name in ("environ", "maps", "mem", "auxv"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                fh.read(1)
            found.append(name)
        except OSError:
            pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            os.readlink(f"/proc/{pid}/fd/{fd}")
            found.append(f"fd/{fd}")
    except OSError:
        pass
    return found


def ancestors(depth: int) -> list[int]:
    """This process's parent, its parent's parent, ... (``depth`` of them, from ``/proc/<pid>/stat``)."""
    out, pid = [], os.getpid()
    for _ in range(depth):
        with open(f"/proc/{pid}/stat") as fh:
            pid = int(fh.read().rpartition(")")[2].split()[1])
        if pid <= 1:
            break
        out.append(pid)
    return out


class ProcCheat(Cheat):
    """Reads the engine's process from outside (``/proc/<ppid>/environ``, ``mem``, ``fd``; with
    ``depth`` 2 its parent's too: the main process of a run with worker processes): if it can read
    anything it stops every job at its first eval (a loud signal)."""

    def __init__(self, depth: int = 1) -> None:
        super().__init__()
        self.depth = depth

    def learn(self, job):
        readable = [x for pid in ancestors(self.depth) for x in proc_probe(pid)]
        return {i: (True, 0.0) for i in range(100_000)} if readable else None


class InheritedState(Overlay):
    """Stops every job at its first eval if its process inherited anything of the run: options on its
    command line, environment variables beyond a PATH and thread limits, files in its working folder,
    or open files beyond its standard streams and the protocol's."""

    name = "inherited"
    ALLOWED_ENV = {"PATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LC_ALL"}

    def attach(self, clock, n_evals):
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")] if os.path.isdir("/proc/self/fd") else []
        self.found = ([a for a in sys.argv if a != "-c"] + sorted(set(os.environ) - self.ALLOWED_ENV)
                      + os.listdir(".") + [f"fd {fd}" for fd in fds if fd > 4])

    def on_eval_id(self, job_id, step, score, loss, proxy):
        return bool(self.found)


# ----------------------------------------------------------------------------- honest and broken overlays
class SnapshotDigest(DetectorOverlay):
    """Honest, but its decisions hang on every visible field of every snapshot and on the clock: a
    sealed run reproduces it only if the child rebuilds each snapshot exactly."""

    def __init__(self, modulus: int = 5) -> None:
        super().__init__("decline", {"k": 2}, "all", name="digest")
        self.modulus = modulus

    def on_arrival(self, job):
        super().on_arrival(job)

    def on_eval(self, job, step, score, loss, proxy):
        text = repr((tuple(job), step, score, loss, proxy, self.coordinator.clock()))
        return step >= 2 and zlib.crc32(text.encode()) % self.modulus == 0


def _protocol_fd() -> int:
    """The worker's protocol output (a malicious overlay finds it on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if "fd_out" in frame.f_locals:
            return frame.f_locals["fd_out"]
        frame = frame.f_back
    raise LookupError("no protocol fd")


class Broken(DetectorOverlay):
    """Misbehaves at its first eval in the way ``how`` says (crash, hang, raise, oversized, shape, noise,
    truthy), or at every eval (slow)."""

    def __init__(self, how: str) -> None:
        super().__init__("decline", {"k": 2}, "all", name="broken")
        self.how = how

    def on_eval_id(self, job_id, step, score, loss, proxy):
        how = self.how
        if how == "crash":
            os._exit(3)
        if how == "hang":
            time.sleep(60)
        if how == "slow":  # each answer in time, all of them together not
            time.sleep(0.2)
            return False
        if how == "raise":
            raise ZeroDivisionError("the overlay's own bug")
        if how == "noise":
            print("debug output from the overlay")  # goes to stderr, not the protocol
            return False
        if how == "truthy":
            return "no"  # not a bool: an error, not a stop
        fd = _protocol_fd()
        if how == "oversized":
            os.write(fd, struct.pack(">I", 1 << 30) + b"[")
        elif how == "shape":
            body = b'[1, "stop"]'
            os.write(fd, struct.pack(">I", len(body)) + body)
        time.sleep(60)
        return False


CHEATS = {c.__name__: c for c in (FrameCheat, TracebackCheat, GcObjectsCheat, GcReferrersCheat, ArgvEnvCheat,
                                  TypesMatchCheat, ProcCheat)}


def _run(cheat: str, sealed: bool, seed: int) -> dict[str, Any]:
    from platform_sim.engine import Simulation
    from platform_sim.schedulers import create_scheduler
    from platform_sim.sealed import SealedOverlay
    from platform_sim.workload import secret_salt

    cfg = load_config()
    salt = secret_salt() if sealed else None
    wl = generate_workload(cfg, seed, salt)
    if sealed:
        with SealedOverlay(f"tests.sim_cheats:{cheat}") as overlay:
            run = Simulation(wl, cfg, create_scheduler("srtf_est"), overlay).run()
    else:
        run = Simulation(wl, cfg, create_scheduler("srtf_est"), CHEATS[cheat]()).run()
    return {"n_evals": wl.n_evals, "salt": None if salt is None else hex(salt),
            "outcomes": [[o.job_id, o.stopped, o.evals_done] for o in run.outcomes],
            "truth": [[s.job_id, s.rlhf, t.hacked, t.peak_progress] for s, t in zip(wl.jobs, wl.truths, strict=True)]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.sim_cheats")
    p.add_argument("cheat", choices=sorted(CHEATS))
    p.add_argument("--mode", choices=("inproc", "sealed"), required=True)
    p.add_argument("--seed-start", type=int, required=True)
    args = p.parse_args(argv)
    print(json.dumps(_run(args.cheat, args.mode == "sealed", args.seed_start)))


if __name__ == "__main__":
    main()
