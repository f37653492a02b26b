"""The sealed overlay's process: runs one overlay on the visible stream and answers with decisions.

Started by :class:`platform_sim.sealed.SealedOverlay` with a clean command line (``python -I -c``,
no seed, no salt, no paths of the run), a scrubbed environment and an empty working folder. It
reads frames (:mod:`platform_sim.sealed_protocol`) on its standard input and answers on a private
copy of its standard output (the overlay's own prints go to standard error).

Before it builds the overlay (and imports a user's overlay class) it gives up what could reach
the engine's process (Linux, best effort, :func:`drop_privileges`): no new privileges, every
capability (a root process without ``CAP_SYS_PTRACE`` and with fewer capabilities than its parent
cannot read the parent's memory or its ``/proc/<pid>/environ``, ``mem``, ``fd``), and the bounding
set (an ``exec`` of a root binary gets none back). Then it installs a seccomp filter
(:func:`no_new_processes`): ``clone`` without ``CLONE_THREAD`` (``fork``, ``vfork``,
``posix_spawn``) fails with EAGAIN, so the overlay cannot start a process that would outlive the
run, not even one that leaves the child's session; threads still start (``clone3`` answers ENOSYS,
and the C library falls back to ``clone``).

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
import traceback
from typing import Any

from .overlays import Overlay, create_overlay, eval_hook_name
from .sealed_protocol import ARRIVAL, ASK, EVAL, encode, read_frame_blocking
from .views import VISIBLE_FIELDS, JobSnapshot, VirtualClock

__all__ = ["drop_privileges", "main", "no_new_processes"]

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


#: per machine: (seccomp's audit arch, clone, clone3, fork or None, vfork or None)
_SYSCALLS = {"x86_64": (0xC000003E, 56, 435, 57, 58), "aarch64": (0xC00000B7, 220, 435, None, None)}
_CLONE_THREAD = 0x00010000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def no_new_processes() -> bool:
    """A seccomp filter (Linux, x86_64 and aarch64; needs no-new-privileges): no new process for
    good, threads allowed (see the module docstring). Whether it is in place."""
    known = _SYSCALLS.get(platform.machine())
    if not sys.platform.startswith("linux") or known is None:
        return False
    arch, clone, clone3, fork, vfork = known
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, refuse, nosys = 0x7FFF0000, 0x00050000 | errno.EAGAIN, 0x00050000 | errno.ENOSYS
    program = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, allow), (ld, 0, 0, 0)]  # arch, then the number
    for nr in (n for n in (fork, vfork) if n is not None):
        program += [(jeq, 0, 1, nr), (ret, 0, 0, refuse)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, nosys),
                (jeq, 0, 3, clone), (ld, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD), (ret, 0, 0, refuse),
                (ret, 0, 0, allow)]
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
    hardened = drop_privileges()
    hardened = no_new_processes() and hardened

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
