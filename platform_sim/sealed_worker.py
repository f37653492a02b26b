"""The sealed overlay's process: runs one overlay on the visible stream and answers with decisions.

Started by :class:`platform_sim.sealed.SealedOverlay` with a clean command line (``python -I -c``,
no seed, no salt, no paths of the run), a scrubbed environment and an empty working folder. It
reads frames (:mod:`platform_sim.sealed_protocol`) on its standard input and answers on a private
copy of its standard output (the overlay's own prints go to standard error).

Before it builds the overlay (and imports a user's overlay class) it gives up what could reach
the engine's process or outlive the run (Linux, best effort; the ready message says whether every
step held):

* :func:`drop_privileges`: no new privileges, every capability (a root process without
  ``CAP_SYS_PTRACE`` and with fewer capabilities than its parent cannot read the parent's memory or
  its ``/proc/<pid>/environ``, ``mem``, ``fd``), and the bounding set (an ``exec`` of a root binary
  gets none back);
* :func:`confine_writes` (Landlock, kernel 5.13+): nothing is written, created, removed, renamed,
  linked or truncated outside the child's private scratch folder (its working folder) and
  ``/dev/null``; no process outside the child is traced (its memory read or written); no TCP socket
  is bound or connected (kernel 6.7+); no signal reaches, and no abstract socket connects to, a
  process outside the child (kernel 6.12+). A ``.pth`` in site-packages or a line added to one of
  this package's modules, which the engine would run after the run, cannot be written;
* :func:`no_new_processes`, a seccomp filter: ``clone`` without ``CLONE_THREAD`` (``fork``,
  ``vfork``, ``posix_spawn``) fails with EAGAIN, so the overlay cannot start a process that would
  outlive the run, not even one that leaves the child's session; threads still start (``clone3``
  answers ENOSYS, and the C library falls back to ``clone``). A system call of another syscall
  table (an i386 ``int 0x80`` on x86_64, x32, arm32 on aarch64) kills the child at once, and the
  calls that change a file's mode, owner, times or extended attributes, or make SysV IPC objects,
  POSIX message queues or keys (state that outlives the child outside any folder), fail with EPERM.

The overlay sees what an in-process overlay sees, rebuilt from the stream: a
:class:`~platform_sim.views.JobSnapshot` at each arrival and eval (the job's static fields kept from
its arrival, its eval scores and loss records appended eval by eval), the eval's score, loss and
proxy reward, and a :class:`~platform_sim.views.VirtualClock` set to each event's time.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import platform
import sys
import tempfile
import traceback
from typing import Any

from .overlays import Overlay, create_overlay, eval_hook_name
from .sealed_protocol import ARRIVAL, ASK, EVAL, encode, read_frame_blocking
from .views import VISIBLE_FIELDS, JobSnapshot, VirtualClock

__all__ = ["confine_writes", "drop_privileges", "landlock_abi", "main", "no_new_processes", "seccomp_program"]

_AT = {name: i for i, name in enumerate(VISIBLE_FIELDS)}  # a snapshot field's place in the arrival's list
_SCORES, _LOSSES = _AT["eval_scores"], _AT["loss_history"]

_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 4, 24, 38, 22, 2
_CAP_VERSION_3 = 0x20080522


def drop_privileges() -> bool:
    """No new privileges, an empty capability bounding set and no capabilities (Linux).

    Returns True when every step succeeded (False elsewhere or where the kernel refused one)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    ok = libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    for cap in range(64):  # past the kernel's last capability prctl answers EINVAL: nothing to drop
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2): all empty
    ok &= libc.capset(header, data) == 0
    return bool(ok)


#: Landlock (``linux/landlock.h``): the system calls (one table on every architecture), the
#: filesystem rights that write (by the ABI version that introduced them), the scopes (ABI 6)
_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446
_LL_WRITE_FILE, _LL_TRUNCATE = 1 << 1, 1 << 14
_LL_WRITES = {1: sum(1 << b for b in (1, *range(4, 13))), 2: 1 << 13, 3: _LL_TRUNCATE, 5: 1 << 15}
_LL_TCP, _LL_TCP_ABI = 0b11, 4  # bind, connect
_LL_SCOPES, _LL_SCOPES_ABI = 0b11, 6  # abstract unix sockets, signals
_LL_PATH_BENEATH, _LL_VERSION = 1, 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return 0
    return max(0, libc.syscall(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_VERSION)))


def confine_writes(scratch: str) -> bool:
    """Landlock (Linux 5.13+; needs no-new-privileges): from now on this process and anything it
    could start write, create, remove, rename, link and truncate only beneath ``scratch`` (and write
    ``/dev/null``), and trace no process outside it (``/proc/<pid>/mem``, ``process_vm_writev``);
    from ABI 4 (Linux 6.7) they bind and connect no TCP socket, from ABI 6 (Linux 6.12) they signal
    no process and connect to no abstract unix socket outside it. Reading files is not restricted.
    Whether it is in place."""
    abi = landlock_abi()
    if abi < 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    writes = sum(bits for since, bits in _LL_WRITES.items() if abi >= since)
    attr = _RulesetAttr(writes, _LL_TCP if abi >= _LL_TCP_ABI else 0, _LL_SCOPES if abi >= _LL_SCOPES_ABI else 0)
    size = 24 if abi >= _LL_SCOPES_ABI else 16 if abi >= _LL_TCP_ABI else 8  # the fields this ABI knows
    ruleset = libc.syscall(_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        for path, access in ((scratch, writes), ("/dev/null", _LL_WRITE_FILE | (writes & _LL_TRUNCATE))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(access, fd)
                if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _LL_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return False
            finally:
                os.close(fd)
        return libc.syscall(_LANDLOCK_RESTRICT, ruleset, 0) == 0
    finally:
        os.close(ruleset)


#: per machine: seccomp's audit arch, clone, clone3, fork or None, vfork or None, the first number
#: of a second table on the same arch (x32's) or None, and the calls refused with EPERM: a file's
#: mode, owner, times and extended attributes (Landlock covers none of them), io_uring (it can set
#: extended attributes without a system call of its own), and what would outlive the child outside
#: any folder: SysV shared memory, semaphores and message queues, POSIX message queues, keyrings
_SYSCALLS = {
    "x86_64": (0xC000003E, 56, 435, 57, 58, 0x40000000,
               (90, 91, 92, 93, 94, 132, 235, 261, 260, 268, 280, 188, 189, 190, 197, 198, 199, 425, 452, 463, 466,
                29, 64, 68, 240, 248, 249, 250)),
    "aarch64": (0xC00000B7, 220, 435, None, None, None,
                (5, 6, 7, 14, 15, 16, 52, 53, 54, 55, 88, 425, 452, 463, 466, 194, 190, 186, 180, 217, 218, 219)),
}
_CLONE_THREAD = 0x00010000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter of :func:`no_new_processes` for ``machine`` (``platform.machine()``), as classic BPF
    ``(code, jt, jf, k)``.

    Raises:
        KeyError: a machine without a table here."""
    arch, clone, clone3, fork, vfork, foreign, refused = _SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|JGE|JSET|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eagain, enosys, eperm = (0x00050000 | e for e in (errno.EAGAIN, errno.ENOSYS, errno.EPERM))
    program = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]  # another table: killed
    if foreign is not None:
        program += [(jge, 0, 1, foreign), (ret, 0, 0, kill)]
    for nr in refused:
        program += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    for nr in (n for n in (fork, vfork) if n is not None):
        program += [(jeq, 0, 1, nr), (ret, 0, 0, eagain)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys),
                (jeq, 0, 3, clone), (ld, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD), (ret, 0, 0, eagain),
                (ret, 0, 0, allow)]
    return program


def no_new_processes() -> bool:
    """A seccomp filter (Linux, x86_64 and aarch64; needs no-new-privileges): no new process for
    good, threads allowed, a foreign syscall table kills, no change of a file's mode, owner, times
    or extended attributes (see the module docstring). Whether it is in place."""
    if not sys.platform.startswith("linux") or platform.machine() not in _SYSCALLS:
        return False
    program = seccomp_program(platform.machine())
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    prog = _SockFprog(len(program), filters)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def _load_overlay(spec: str, params: dict[str, Any], n_evals: int) -> Overlay:
    """A registered overlay by name (its factory gets no workload: the parent refused Oracle-Stop,
    the only one that reads it), or a user's ``module:Class`` (an :class:`Overlay` subclass)."""
    if ":" not in spec:
        return create_overlay(spec, None, **params)
    module, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Overlay)):
        raise TypeError(f"{spec} is not a subclass of platform_sim.overlays.Overlay")
    return obj(**params)


class _Session:
    """One overlay and what it has been told: each job's static fields and histories."""

    def __init__(self, overlay: Overlay, n_evals: int) -> None:
        self.overlay, self.clock = overlay, VirtualClock()
        kind = type(overlay)
        hook = eval_hook_name(kind)
        self.eval_hook = getattr(overlay, hook) if hook else None
        self.eval_snapshot = hook == "on_eval"
        self.cuts = kind.cut_progress is not Overlay.cut_progress
        self.jobs: dict[int, list] = {}  # job id -> its snapshot's fields (updated at each eval)
        overlay.attach(self.clock, n_evals)

    def handle(self, events: list) -> list:
        out: list = []
        for ev in events:
            if ev == ASK:
                continue
            self.clock.now = ev[1]
            if ev[0] == ARRIVAL:
                fields = ev[2:]
                fields[_SCORES] = tuple(fields[_SCORES])
                fields[_LOSSES] = tuple(tuple(x) for x in fields[_LOSSES])
                self.jobs[fields[0]] = fields
                self.overlay.on_arrival(JobSnapshot(*fields))
                if self.cuts:
                    out.append(self.overlay.cut_progress(fields[0]))
            elif ev[0] == EVAL:
                out.append(self._decision(self._eval(*ev[2:])))
        return out

    def _decision(self, stop) -> bool:
        """An eval hook's answer: exactly True or False (numpy's bool too); anything else is an error,
        not a silent "stop" for every truthy value."""
        if stop is True or stop is False:
            return stop
        if type(stop).__name__ == "bool_":
            return bool(stop)
        raise TypeError(f"{type(self.overlay).__name__}.on_eval must return True (stop the job) or False, "
                        f"but returned {stop!r:.60} of type {type(stop).__name__}")

    def _eval(self, job_id, step, score, loss, proxy, progress, waiting_since, gpu_hours, loss_gpu_hours, pool, speed):
        f = self.jobs[job_id]
        for name, value in (("progress", progress), ("running", True), ("waiting_since", waiting_since),
                            ("evals_done", step), ("gpu_hours", gpu_hours), ("pool", pool), ("speed", speed)):
            f[_AT[name]] = value
        f[_SCORES] += (score,)
        f[_LOSSES] += ((loss_gpu_hours, loss),)
        if self.eval_hook is None:
            return False
        return self.eval_hook(JobSnapshot(*f) if self.eval_snapshot else job_id, step, score, loss, proxy)


def main() -> None:
    """Serve one overlay on standard input/output until the input ends."""
    fd_in = sys.stdin.fileno()
    fd_out = os.dup(sys.stdout.fileno())  # the protocol's; the overlay's prints go to stderr
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    scratch = os.getcwd()  # the parent's private, empty folder for this child
    hardened = drop_privileges()
    hardened = confine_writes(scratch) and hardened
    hardened = no_new_processes() and hardened
    tempfile.tempdir, sys.dont_write_bytecode = scratch, True  # nothing else is writable

    def reply(obj: Any) -> None:
        data = encode(obj)
        while data:
            data = data[os.write(fd_out, data):]

    hello = read_frame_blocking(fd_in)
    if hello is None:
        return
    try:
        sys.path[:0] = [p for p in hello.get("path", ()) if p not in sys.path]
        session = _Session(_load_overlay(hello["overlay"], hello.get("params", {}), hello["n_evals"]),
                           hello["n_evals"])
    except Exception:  # noqa: BLE001 - the parent shows it to the user
        reply({"error": traceback.format_exc(limit=8)})
        return
    reply({"name": str(session.overlay.name), "eval": session.eval_hook is not None, "cut": session.cuts,
           "hardened": hardened})
    while (events := read_frame_blocking(fd_in)) is not None:
        try:
            out = session.handle(events)
        except Exception:  # noqa: BLE001
            reply({"error": traceback.format_exc(limit=8)})
            return
        if events and events[-1] == ASK:
            reply(out)


if __name__ == "__main__":
    main()
