"""The wall that holds: sealed overlays (a separate process on the visible stream) and salted truth.

* Sealed runs decide exactly as in-process runs for every built-in overlay but Oracle-Stop (which
  refuses), and for an overlay whose decisions hang on every visible field of every snapshot.
* Each cheat of the audit (``tests/sim_cheats.py``: ``sys._getframe``, traceback frames,
  ``gc.get_objects``, ``gc.get_referrers``, the seed from ``sys.argv`` / ``os.environ`` /
  ``/proc/<ppid>/cmdline`` plus the public ``generate_workload``, the seed matched from the first 24
  job types, reading the engine's ``/proc/<ppid>/environ``, ``mem``, ``fd``) runs as a real overlay
  (a) in-process, the old behaviour: it reproduces the Oracle's decisions on every job (so the test
  can fail), and (b) sealed with a secret salt: it stops no more hacked jobs at their peak than a guess.
* Neither the salt nor any hidden value is ever in what the child is sent, its command line or its
  environment; a child that crashes, hangs, raises or breaks the protocol gives a clear error.
* The child's own wall (round 4): it writes nothing outside its scratch folder (not a module the
  engine imports after the run, not a ``.pth`` in site-packages), reaches no TCP port and signals
  no process outside it (Landlock), and starts no process through any syscall table (a fork through
  the i386 table kills it); the overlays that try report through their stop decisions only.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import platform
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import pytest

from platform_sim import cli, sealed
from platform_sim.config import load_config
from platform_sim.engine import Simulation
from platform_sim.overlays import Overlay, create_overlay
from platform_sim.schedulers import create_scheduler
from platform_sim.sealed import SealedOverlay, SealedOverlayError, child_command, child_env, sealed_spec
from platform_sim.sealed_run import run_salted
from platform_sim.sealed_worker import landlock_abi, seccomp_program
from platform_sim.workload import generate_workload
from tests.sim_cheats import CHEATS, MATCH, InheritedState, SnapshotDigest, oracle_step, proc_probe

ROOT = Path(__file__).resolve().parents[2]
SEED = 41  # in the cheats' candidate seeds (0-63)
#: the child reports itself hardened where every seal holds: capabilities, Landlock, seccomp
HARDENED = sys.platform.startswith("linux") and landlock_abi() >= 1
BUILT_IN = {"evalstop": {"detector": "decline", "k": 2, "job_types": "rlhf"}, "stop_at": {"fraction": 0.65},
            "loss_plateau": {"window": 2, "tolerance": 0.03}, "none": {}}


def _pair(cfg, wl, scheduler, name, block):
    with SealedOverlay(name, block) as ov:
        a = Simulation(wl, cfg, create_scheduler(scheduler), ov).run()
    b = Simulation(wl, cfg, create_scheduler(scheduler), create_overlay(name, wl, **block)).run()
    return a, b, ov


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_sealed_decides_exactly_as_in_process(name):
    cfg = load_config()
    wl = generate_workload(cfg, 5, salt=12345)
    a, b, ov = _pair(cfg, wl, "srtf_est", name, BUILT_IN[name])
    assert a == b  # outcomes, makespan, events, overlay name
    assert ov.hardened == HARDENED
    if name != "none":
        assert sum(o.stopped for o in a.outcomes) > 10


def test_sealed_rebuilds_every_snapshot_exactly():
    """An overlay whose decisions hash every snapshot field and the clock, under a preemptive
    scheduler with rounds (waiting_since, GPU-hours and progress change between evals)."""
    cfg = load_config().replace(**{"workload.n_jobs": 120})
    wl = generate_workload(cfg, 2, salt=7)
    with SealedOverlay("tests.sim_cheats:SnapshotDigest") as ov:
        a = Simulation(wl, cfg, create_scheduler("loss_aware"), ov).run()
    b = Simulation(wl, cfg, create_scheduler("loss_aware"), SnapshotDigest()).run()
    assert a.outcomes == b.outcomes and a.overlay == "digest"
    assert 10 < sum(o.stopped for o in a.outcomes) < 110
    assert sum(o.restarts for o in a.outcomes) > 0  # preemptions happened: snapshots really varied


def test_oracle_refuses_to_run_sealed():
    with pytest.raises(ValueError, match="reads the ground truth by design"):
        sealed_spec("oracle", {})
    with pytest.raises(ValueError, match="module:Class"):
        sealed_spec("not a path:", {})
    with pytest.raises(ValueError, match="Unknown parameter"):
        sealed_spec("evalstop", {"kk": 2})


# ----------------------------------------------------------------------------- the salt
def test_the_salt_hides_the_truth_and_none_is_the_public_workload():
    cfg = load_config().replace(**{"workload.n_jobs": 80})
    public, salted = generate_workload(cfg, 3), generate_workload(cfg, 3, salt=2**100 + 1)
    assert generate_workload(cfg, 3, None) == public and public.salt is None and salted.salt == 2**100 + 1
    assert [(s.job_type, s.gpus) for s in public.jobs] == [(s.job_type, s.gpus) for s in salted.jobs]
    pairs = list(zip(public.truths, salted.truths, strict=True))
    assert all(a.height != b.height and a.scores != b.scores and a.losses != b.losses for a, b in pairs)
    assert not [a for a, b in pairs if a.peak_progress == b.peak_progress < 1.0]  # 1.0: no peak (healthy)
    assert sum(a.duration_s == b.duration_s for a, b in pairs) < 20  # equal only where both are clamped
    assert sum(a.hacked != b.hacked for a, b in pairs) > 10
    assert [s.arrival_s for s in public.jobs][1:] != [s.arrival_s for s in salted.jobs][1:]
    assert generate_workload(cfg, 3, salt=5) == generate_workload(cfg, 3, salt=5)
    assert generate_workload(cfg, 3, salt=5).truths != generate_workload(cfg, 3, salt=6).truths
    for bad in (-1, 1.5, True, "7"):
        with pytest.raises(ValueError, match="salt must be a non-negative integer"):
            generate_workload(cfg, 3, salt=bad)


def test_the_child_inherits_nothing_of_the_run():
    """No option on its command line, no variable beyond PATH and thread limits, an empty working
    folder, no open file but its standard streams and the protocol's (fds 0-3; 4: listdir's own)."""
    cfg = load_config().replace(**{"workload.n_jobs": 8})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("tests.sim_cheats:InheritedState") as ov:
        sealed_run = Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert not any(o.stopped for o in sealed_run.outcomes)
    control = InheritedState()  # in this process: pytest's arguments and environment
    assert all(o.stopped for o in Simulation(wl, cfg, create_scheduler("fifo"), control).run().outcomes)
    assert control.found


def test_neither_the_salt_nor_any_hidden_value_reaches_the_child(monkeypatch):
    salt = 0x5EC12E7_5A17_0DD5_BEEF
    cfg = load_config().replace(**{"workload.n_jobs": 60})
    wl = generate_workload(cfg, SEED, salt=salt)
    sent: list[bytes] = []
    real_send = sealed.send_frame
    monkeypatch.setattr(sealed, "send_frame", lambda fd, data, t: (sent.append(data), real_send(fd, data, t)))
    with SealedOverlay("evalstop", BUILT_IN["evalstop"]) as ov:
        Simulation(wl, cfg, create_scheduler("srtf_est"), ov).run()
    stream = b"".join(sent).decode("latin-1")  # the 4-byte headers are binary
    assert len(sent) > 100
    launch = " ".join(child_command()) + json.dumps(child_env())
    for secret in (str(salt), hex(salt), hex(salt)[2:], f"{salt:X}"):
        assert secret not in stream and secret not in launch
    hidden = [repr(x) for t in wl.truths for x in (t.duration_s, t.peak_progress, t.height, t.shape, t.gold_end)]
    hidden = [h for h in hidden if len(h) >= 10]  # full-precision values (not 1.0: no peak; not a clamp)
    assert len(hidden) > 200 and not [h for h in hidden if h in stream]
    assert set(child_env()) == {"PATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LC_ALL"}
    assert "--" not in " ".join(child_command()[1:])  # python -I -c CODE: no options of this run


# ----------------------------------------------------------------------------- the cheats
def _drive(cheat: str, mode: str) -> dict:
    """Run a cheat with the seed on the driver's own command line (as platform-sim run puts it)."""
    out = subprocess.run([sys.executable, "-m", "tests.sim_cheats", cheat, "--mode", mode, "--seed-start", str(SEED)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _judge(d: dict, truths: dict[int, tuple[bool, float]]) -> tuple[int, int, dict[int, int | None]]:
    """(hacked jobs stopped at their oracle eval, hacked jobs, every judged job's stop eval) over the
    RLHF jobs after the first 24 (a rebuilding cheat needs their types first)."""
    n, rlhf = d["n_evals"], {j for j, r, _, _ in d["truth"] if r}
    stops = {j: (evals if stopped else None) for j, stopped, evals in d["outcomes"] if j >= MATCH and j in rlhf}
    expected = {j: oracle_step(*truths[j], n) for j in stops}
    hacked = [j for j, s in expected.items() if s is not None]
    return sum(stops[j] == expected[j] for j in hacked), len(hacked), stops


@pytest.mark.parametrize("cheat", sorted(set(CHEATS) - {"ProcCheat"}))
def test_each_cheat_reaches_the_truth_in_process_and_nothing_sealed(cheat):
    inproc, sealed_run = _drive(cheat, "inproc"), _drive(cheat, "sealed")
    truth = {j: (h, p) for j, _, h, p in inproc["truth"]}
    hits, hacked, stops = _judge(inproc, truth)
    assert hacked > 30 and hits == hacked  # in-process: the Oracle's decision on every judged job...
    assert stops == {j: oracle_step(*truth[j], inproc["n_evals"]) for j in stops}  # ...and no other stop

    salted_truth = {j: (h, p) for j, _, h, p in sealed_run["truth"]}
    hits, hacked, stops = _judge(sealed_run, salted_truth)
    # a guess from the wrong curves hits a hacked job's peak eval ~12% of the time (47% hacked x
    # ~26% same eval); the Oracle hits all: the bound is 5 standard deviations above the guess
    assert hacked > 30 and hits <= 0.35 * hacked, (hits, hacked, sealed_run["salt"])
    assert stops != {j: oracle_step(*salted_truth[j], sealed_run["n_evals"]) for j in stops}
    if cheat in ("ArgvEnvCheat", "TypesMatchCheat"):
        # it did find the seed (from the parent's command line, or from the public job types) and
        # rebuilt the public workload exactly: the salt is what stops it
        wl = generate_workload(load_config(), SEED)
        public = {s.job_id: (t.hacked, t.peak_progress) for s, t in zip(wl.jobs, wl.truths, strict=True)}
        assert stops == {j: oracle_step(*public[j], sealed_run["n_evals"]) for j in stops}


def test_the_engine_process_cannot_be_read_from_the_sealed_child():
    if not sys.platform.startswith("linux"):
        pytest.skip("/proc, capabilities and dumpability are Linux's")
    # positive control: an ordinary child of this process reads its parent's /proc entries
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                            "import os; from tests.sim_cheats import proc_probe; print(proc_probe(os.getppid()))"],
                           capture_output=True, text=True, timeout=60)
    assert "environ" in probe.stdout, probe.stderr
    assert proc_probe(os.getpid())  # and this process reads its own
    inproc, sealed_run = _drive("ProcCheat", "inproc"), _drive("ProcCheat", "sealed")
    assert sum(s for _, s, _ in inproc["outcomes"]) > 50  # in the driver's process the probe reads /proc
    assert sum(s for _, s, _ in sealed_run["outcomes"]) == 0  # sealed: nothing readable, no stop


def test_a_run_with_worker_processes_keeps_them_and_its_main_process_unreadable():
    """platform-sim run --sealed --workers 2: the children's parents are forked workers, whose
    parent (this process) holds the salt: neither can be read from a sealed child."""
    cfg = load_config().replace(**{"workload.n_jobs": 40})
    res = run_salted(cfg, seeds=2, workers=2, overlay_class="tests.sim_cheats:ProcCheat", overlay_params={"depth": 2})
    assert res.sealed and res.result.changes.gpu_hours_change.mean == 0.0  # no job was stopped
    assert proc_probe(os.getpid())  # and this process is readable (to itself) again after the run


# ----------------------------------------------------------------------------- a misbehaving child
@pytest.mark.parametrize(("how", "message"), [
    ("crash", "closed its output"),
    ("hang", "did not answer within 1 s"),
    ("raise", "ZeroDivisionError: the overlay's own bug"),
    ("oversized", "announced a frame of 1073741824 bytes"),
    ("shape", "expected 0 cut"),
    ("truthy", "Broken.on_eval must return True .stop the job. or False, but returned 'no' of type str"),
])
def test_a_misbehaving_child_gives_a_clear_error(how, message):
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    wl = generate_workload(cfg, 0, salt=1)
    ov = SealedOverlay("tests.sim_cheats:Broken", {"how": how}, reply_timeout_s=1.0 if how == "hang" else 20.0)
    with pytest.raises(SealedOverlayError, match=message):
        Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert ov._proc is None  # killed and reaped


def test_an_overlay_that_prints_does_not_break_the_protocol():
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("tests.sim_cheats:Broken", {"how": "noise"}) as ov:
        res = Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert all(o.completed for o in res.outcomes)


# ----------------------------------------------------------------------------- the child's own wall
# These overlays run in the sealed child (imported from here by name) and report through their stop
# decisions only: the child can write nothing the test could read.
def _named(tag: str) -> list[int]:
    """The live processes named ``tag`` (a grandchild renames itself so that it can be found)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == tag:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _outlive(tag: str) -> None:
    """In a grandchild: leave the child's session (out of reach of its group's kill), take a name
    the test looks for, and stay."""
    os.setsid()
    ctypes.CDLL(None).prctl(15, tag.encode(), 0, 0, 0)  # PR_SET_NAME
    time.sleep(60)
    os._exit(0)


class Forker(Overlay):
    """At its first eval forks a grandchild that would outlive the run; stops every job iff the
    fork was refused (EAGAIN) and a thread still ran."""

    name = "forker"

    def __init__(self, tag: str) -> None:
        self.tag, self.verdict = tag, None

    def on_eval_id(self, job_id, step, score, loss, proxy):
        if self.verdict is None:
            self.verdict = False
            try:
                pid = os.fork()
            except BlockingIOError:
                ran = []
                worker = threading.Thread(target=lambda: ran.append(1))
                worker.start()
                worker.join()
                self.verdict = ran == [1]
            else:
                if pid == 0:
                    _outlive(self.tag)
        return self.verdict


I386_FORK = b"\xb8\x02\x00\x00\x00\xcd\x80\xc3"  # mov eax, 2 (i386 __NR_fork); int 0x80; ret
I386_GETPID = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"  # mov eax, 20 (i386 __NR_getpid); int 0x80; ret


def _run_code(code: bytes) -> int:
    """Run machine code from an executable page of this process; its eax."""
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    return ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()


def _i386_table() -> bool:
    """Whether this kernel answers i386 system calls (a child process tries: it may be killed)."""
    if platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                            "from tests.sim.test_sim_sealed import I386_GETPID, _run_code; import os; "
                            "print(_run_code(I386_GETPID) == os.getpid())"], capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() == "True"


class ForeignForker(Overlay):
    """At its first eval forks through the i386 table (``int 0x80`` from x86_64 code), where the
    x86_64 filter's numbers mean nothing; the grandchild leaves the session and stays."""

    name = "foreign_forker"

    def __init__(self, tag: str) -> None:
        self.tag, self.tried = tag, False

    def on_eval_id(self, job_id, step, score, loss, proxy):
        if not self.tried:
            self.tried = True
            if _run_code(I386_FORK) == 0:
                _outlive(self.tag)
        return False


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


class WriteOutside(Overlay):
    """At attach, tries to open each of ``appends`` to append (writing nothing: the real modules are
    not harmed when the wall fails), to change each path of ``targets`` (hard-link it into its own
    folder and append there, append, truncate, chmod, utime, rename, link and symlink beside it,
    remove it) and to create ``creates``, to connect to
    the test's TCP ``port`` and to signal its parent (signal 0: a permission check); then writes a
    file in its working folder. Stops every job iff every attempt outside was refused with a
    permission error and the write inside worked."""

    name = "write_outside"

    def __init__(self, appends: list[str], targets: list[str], creates: list[str], port: int | None,
                 signal: bool) -> None:
        self.appends, self.targets, self.creates, self.verdict = appends, targets, creates, False
        self.port, self.signal = port, signal

    def attach(self, clock, n_evals):
        attempts = [lambda p=path: open(p, "ab").close() for path in self.appends]
        if self.port is not None:
            attempts.append(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=5).close())
        if self.signal:
            attempts.append(lambda: os.kill(os.getppid(), 0))
        for k, path in enumerate(self.targets):  # a hard link into its own folder too (Landlock: EXDEV)
            attempts += [lambda p=path, k=k: (os.link(p, f"inside-{k}"), _append(f"inside-{k}", "# through a link\n")),
                         lambda p=path: _append(p, "import os  # the overlay's line\n"), lambda p=path: os.truncate(p, 0),
                         lambda p=path: os.chmod(p, 0o777), lambda p=path: os.utime(p, (0, 0)),
                         lambda p=path: os.rename(p, p + ".moved"), lambda p=path: os.link(p, p + ".link"),
                         lambda p=path: os.symlink(p, p + ".sym"), lambda p=path: os.unlink(p)]
        for path in self.creates:
            attempts += [lambda p=path: Path(p).write_text("# written by a sealed overlay\n"),
                         lambda p=path: os.mkdir(p + ".d")]
        refused = 0
        for attempt in attempts:
            try:
                attempt()
            except PermissionError:
                refused += 1
            except OSError as exc:
                refused += exc.errno == errno.EXDEV  # a link across Landlock's rule
        Path("scratch.txt").write_text("mine")
        self.verdict = refused == len(attempts) and Path("scratch.txt").read_text() == "mine"

    def on_eval_id(self, job_id, step, score, loss, proxy):
        return self.verdict


def _tag() -> str:
    return f"sealgc{os.getpid() % 100000}{int(time.monotonic() * 1000) % 1000}"[:15]


def test_a_sealed_overlay_cannot_leave_a_process_behind():
    """A grandchild that calls setsid() escapes the child's process group; the child may start no
    process at all (the seccomp filter refuses clone without CLONE_THREAD), so none outlives the run."""
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    tag = _tag()
    try:
        with SealedOverlay(f"{__name__}:Forker", {"tag": tag}) as ov:
            res = Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
    finally:
        time.sleep(0.2)
        left = _named(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert ov.hardened == HARDENED and left == []
    assert all(o.stopped for o in res.outcomes)  # the fork was refused and a thread ran


def test_a_fork_through_another_syscall_table_kills_the_child():
    """``int 0x80`` reaches the i386 table, whose fork (2) the x86_64 numbers never match: the
    filter kills the child on any system call of another table, and no grandchild survives."""
    if not _i386_table():
        pytest.skip("no i386 system calls here (x86_64 Linux with IA32 emulation)")
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    tag = _tag()
    ov = SealedOverlay(f"{__name__}:ForeignForker", {"tag": tag})
    try:
        with pytest.raises(SealedOverlayError, match=r"killed by SIGSYS \(a forbidden system call\)"):
            Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
    finally:
        ov.close(kill=True)
        time.sleep(0.2)
        left = _named(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == []


def test_a_sealed_overlay_writes_nothing_outside_its_scratch_folder(tmp_path):
    """What the engine would run after the run (a line in one of its modules, as ``--plot`` imports
    ``platform_sim.plots``; a ``.pth`` in site-packages, run by every later Python) and any other
    path: the child can neither change a file nor create one; it writes in its own folder. It
    connects to no TCP port (a local database's; Linux 6.7+) and signals no process outside it
    (Linux 6.12+)."""
    abi = landlock_abi()
    if abi < 3:
        pytest.skip("Landlock with truncation (Linux 6.2+) is what confines the child's writes")
    listener = socket.create_server(("127.0.0.1", 0))
    site = Path(sysconfig.get_paths()["purelib"])
    probe = f"_sealed_probe_{os.getpid()}"
    appends = [ROOT / "platform_sim" / "plots.py", ROOT / "platform_sim" / "__init__.py"]
    targets = [ROOT / "platform_sim" / f"{probe}.py", site / f"{probe}.pth", tmp_path / "victim.txt"]
    creates = [ROOT / "platform_sim" / f"{probe}_new.py", site / f"{probe}_new.pth", tmp_path / "new.txt",
               Path(tempfile.gettempdir()) / f"{probe}_new.txt"]
    for path in targets:
        path.write_text("# the test's own file\n")
    before = {p: (p.read_bytes(), os.stat(p)) for p in appends + targets}
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    try:
        with SealedOverlay(f"{__name__}:WriteOutside", {"appends": [str(p) for p in appends],
                                                         "targets": [str(p) for p in targets],
                                                         "creates": [str(p) for p in creates],
                                                         "port": listener.getsockname()[1] if abi >= 4 else None,
                                                         "signal": abi >= 6}) as ov:
            res = Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
        after = {p: (p.read_bytes(), os.stat(p)) for p in before if p.exists()}
        made = [p for p in creates for q in (p, Path(f"{p}.d")) if q.exists()]
        made += [q for p in targets for q in (Path(f"{p}.moved"), Path(f"{p}.link")) if q.exists()]
        made += [Path(f"{p}.sym") for p in targets if os.path.lexists(f"{p}.sym")]
    finally:
        listener.close()
        for path in [*targets, *creates]:
            for q in (path, Path(f"{path}.moved"), Path(f"{path}.link"), Path(f"{path}.sym")):
                if os.path.lexists(q):
                    q.unlink()
            if Path(f"{path}.d").is_dir():
                Path(f"{path}.d").rmdir()
    assert ov.hardened and made == []
    for path, (data, st) in before.items():
        assert path in after and after[path][0] == data, path
        assert (after[path][1].st_mode, after[path][1].st_mtime_ns) == (st.st_mode, st.st_mtime_ns), path
    assert all(o.stopped for o in res.outcomes)  # every attempt was refused; its own folder took the write


def test_the_seccomp_filter_kills_every_foreign_table():
    """The filter's first instructions, for each machine: another audit arch is killed, not allowed."""
    kill = 0x80000000
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine)
        assert program[1][:3] == (0x15, 1, 0) and program[2] == (0x06, 0, 0, kill)
        assert program[-1] == (0x06, 0, 0, 0x7FFF0000)  # the only allow, at the end
    assert (0x35, 0, 1, 0x40000000) in seccomp_program("x86_64")  # x32's numbers, same audit arch


def test_a_sealed_run_has_an_overall_time_bound():
    """Every answer within its 30 s, the run as a whole not: the child's time in all is bounded."""
    cfg = load_config().replace(**{"workload.n_jobs": 40})
    ov = SealedOverlay("tests.sim_cheats:Broken", {"how": "slow"}, total_timeout_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(SealedOverlayError, match=r"took more than 3 s in all over this run \(total_timeout_s\)"):
        Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
    assert time.monotonic() - t0 < 15


def test_one_sealed_overlay_serves_one_run():
    cfg = load_config().replace(**{"workload.n_jobs": 5})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("none") as ov:
        Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
        with pytest.raises(ValueError, match="serves one run"):
            Simulation(wl, cfg, create_scheduler("fifo"), ov).run()


def test_a_class_that_is_not_an_overlay_or_does_not_exist():
    ov = SealedOverlay("tests.sim_cheats:oracle_step")
    with pytest.raises(SealedOverlayError, match="is not a subclass of platform_sim.overlays.Overlay"):
        ov.attach(lambda: 0.0, 10)
    ov = SealedOverlay("no_such_module_here:X")
    with pytest.raises(SealedOverlayError, match="No module named 'no_such_module_here'"):
        ov.attach(lambda: 0.0, 10)


# ----------------------------------------------------------------------------- the command line
def test_cli_sealed_run_records_its_salt_and_reproduces(tmp_path, capsys):
    common = ["run", "--seeds", "2", "--workers", "1", "--quiet", "--set", "workload.n_jobs=40"]
    assert cli.main([*common, "--sealed", "--json", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    salt = a["sealed"]["salt"]
    assert a["sealed"]["sealed"] is True and int(salt, 16) > 2**64 and salt in capsys.readouterr().out
    assert cli.main([*common, "--salt", salt, "--json", str(tmp_path / "b.json")]) == 0  # in-process, same salt
    b = json.loads((tmp_path / "b.json").read_text())
    assert b.pop("sealed")["sealed"] is False and (a.pop("sealed"), a)[1] == b
    assert cli.main([*common, "--overlay-class", "tests.sim_cheats:SnapshotDigest", "--overlay-params",
                     '{"modulus": 3}', "--salt", "9", "--json", str(tmp_path / "c.json")]) == 0
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["overlay"] == "digest" and c["sealed"]["overlay"] == "tests.sim_cheats:SnapshotDigest"


@pytest.mark.parametrize(("args", "message"), [
    (["--sealed", "--set", "overlay.name=oracle"], "reads the ground truth by design"),
    (["--overlay-params", "{}"], "--overlay-params needs --overlay-class"),
    (["--sealed", "--trace", "x.csv"], "--trace cannot be salted or sealed"),
    (["--salt", "-3"], "--salt must be a non-negative integer"),
    (["--overlay-class", "m:C", "--overlay-params", "[1]"], "must be a JSON object"),
    (["--overlay-class", "my_pkg.stops"], "--overlay-class takes MODULE:CLASS"),
])
def test_cli_refuses(args, message, capsys):
    assert cli.main(["run", "--seeds", "1", "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_sealed_rebuilds_snapshots_on_a_mixed_cluster_under_gavel():
    """The pool and speed fields cross the wall too: jobs move between pools at Gavel's rounds."""
    cfg = load_config(ROOT / "configs" / "sim" / "sia_3type.yaml").replace(**{"workload.n_jobs": 60})
    wl = generate_workload(cfg, 3, salt=7)
    with SealedOverlay("tests.sim_cheats:SnapshotDigest") as ov:
        a = Simulation(wl, cfg, create_scheduler("gavel"), ov).run()
    b = Simulation(wl, cfg, create_scheduler("gavel"), SnapshotDigest()).run()
    assert a.outcomes == b.outcomes and a.pool_gpu_seconds == b.pool_gpu_seconds
    assert len({name for name, s in a.pool_gpu_seconds if s > 0}) == 3
