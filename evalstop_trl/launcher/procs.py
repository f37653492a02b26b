"""Every process a job starts: the launcher as a child subreaper, and the tree it owns.

A job's command may start processes that leave its process group (``setsid``, a daemon's double
fork) or outlive it (``cmd &`` in a script that then exits 0). On Linux the launcher marks itself a
*child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan anywhere below it is re-parented to
the launcher instead of init, so the tree under the launcher, read from ``/proc``, holds every
descendant the job ever started, in whatever session or group. :class:`ProcessTree` lists it, signals
it and reaps the orphans that end up as the launcher's own children.

Elsewhere (no ``/proc``, no ``prctl``) the tree is empty and the launcher signals the child's process
group only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Proc", "ProcessTree", "set_child_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_PROC = "/proc"


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def set_child_subreaper(on: bool = True) -> bool | None:
    """Make this process a child subreaper (or stop being one). Returns the previous setting, or None
    where the kernel cannot do it (not Linux, or ``prctl`` refused)."""
    prctl = _prctl()
    if prctl is None:
        return None
    previous = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return None
    return bool(previous.value)


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as ``/proc/PID/stat`` shows it (``start`` tells a reused pid apart)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    name: str
    start: int

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X")  # a zombie waits to be reaped; it runs nothing

    def describe(self, child_pid: int) -> str:
        """``pid 123 (sleep)``, plus where it went: its own session, or outside the child's group."""
        where = ""
        if self.sid != child_pid and self.pid != child_pid:
            where = ", own session"
        elif self.pgid != child_pid:
            where = ", own process group"
        return f"pid {self.pid} ({self.name}{where})"


def _read(pid: int) -> Proc | None:
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    left, right = raw.find("("), raw.rfind(")")  # the name may hold spaces and parentheses
    fields = raw[right + 2:].split()
    try:
        return Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], raw[left + 1:right],
                    int(fields[19]))
    except (IndexError, ValueError):
        return None


def _all() -> dict[int, Proc]:
    try:
        names = os.listdir(_PROC)
    except OSError:
        return {}
    procs = {}
    for name in names:
        if name.isdigit() and (p := _read(int(name))) is not None:
            procs[p.pid] = p
    return procs


class ProcessTree:
    """The processes below this one that belong to a job.

    Args:
        root: this process (default ``os.getpid()``).
        exclude: children of ``root`` that are not the job's (by default, those it had already), with
            their own descendants.
    """

    def __init__(self, root: int | None = None, exclude: Iterable[int] | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.available = os.path.isdir(f"{_PROC}/self")
        procs = _all() if self.available else {}
        self.exclude = set(exclude) if exclude is not None else {p.pid for p in procs.values() if p.ppid == self.root}
        self._seen: dict[int, Proc] = {}

    def scan(self) -> list[Proc]:
        """The job's processes now, zombies included, parents before children. Also keeps every
        process once seen: one that left the tree (where no subreaper holds it) is still listed while
        its pid names the same process."""
        if not self.available:
            return []
        procs = _all()
        kids: dict[int, list[Proc]] = {}
        for p in procs.values():
            kids.setdefault(p.ppid, []).append(p)
        found: list[Proc] = []
        todo = [p for p in kids.get(self.root, []) if p.pid not in self.exclude]
        while todo:
            p = todo.pop()
            found.append(p)
            todo.extend(kids.get(p.pid, []))
        pids = {p.pid for p in found}
        for pid, old in list(self._seen.items()):
            now = procs.get(pid)
            if now is None or now.start != old.start:
                del self._seen[pid]
            elif pid not in pids:
                found.append(now)
        self._seen.update((p.pid, p) for p in found)
        return found

    def alive(self, waited: int | None = None) -> list[Proc]:
        """The job's processes that still run (not zombies). Reaps the zombies that are this process's
        own children (orphans re-parented to it), except ``waited`` (the child a ``Popen`` waits for)."""
        out = []
        for p in self.scan():
            if not p.dead:
                out.append(p)
            elif p.ppid == self.root and p.pid != waited:
                self._reap(p.pid)
        return out

    @staticmethod
    def _reap(pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def signal(self, procs: Iterable[Proc], sig: int) -> list[Proc]:
        """Send ``sig`` to each of ``procs`` that is still the same process; returns those signalled."""
        sent = []
        for p in procs:
            now = _read(p.pid)
            if now is None or now.start != p.start or now.dead:
                continue
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
            sent.append(p)
        return sent
