"""Delivering a stop to every process of a job: SIGTERM, a grace period, SIGKILL, until none is left.

:class:`Enforcer` owns the child and its :class:`~.procs.ProcessTree`. Its stages are the
:class:`~evalstop_trl.core.records.Escalation` lifecycle (GRACE -> SIGTERM -> SIGKILL -> DONE). It
signals the child's process group while the child is not yet reaped (its pid, so the group's id,
cannot be reused before), and each process outside that group by pid (``setsid``, a new group,
orphans the subreaper adopted), so a process that left the group or outlived the child is reached too.
After SIGKILL it signals again whatever still runs (a process forking while it dies), until none is
left or ``settle_s`` has passed; what survives is reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

from ..core.records import Escalation
from .procs import Proc, ProcessTree

__all__ = ["Enforcer", "describe"]

_SIGNALS = {Escalation.SIGTERM: signal.SIGTERM, Escalation.SIGKILL: signal.SIGKILL}
_LISTED = 8  # processes named in one audit line


def describe(procs: Sequence[Proc], child_pid: int) -> str:
    """``2 processes: pid 12 (sleep), pid 13 (python, own session)`` (the first few named)."""
    named = ", ".join(p.describe(child_pid) for p in procs[:_LISTED])
    more = f" and {len(procs) - _LISTED} more" if len(procs) > _LISTED else ""
    return f"{len(procs)} process{'es' if len(procs) != 1 else ''}: {named}{more}"


class Enforcer:
    """The processes of one job and the escalation against them.

    Args:
        child: the job's command, started in a session of its own.
        tree: the job's processes (read once per :meth:`look`).
    """

    def __init__(self, child: subprocess.Popen, tree: ProcessTree) -> None:
        self.child, self.tree = child, tree
        self.stage = Escalation.GRACE
        self.procs: list[Proc] = []

    @property
    def child_done(self) -> bool:
        return self.child.returncode is not None

    def look(self, scan: bool = True) -> bool:
        """Refresh what runs (``scan=False``: the child only, the last list of the others kept, as a
        walk of ``/proc`` costs milliseconds per hundred processes); True while anything of the job
        runs (the child or a descendant)."""
        self.child.poll()
        if scan or self.child_done:  # once the child is gone, what it left is always looked for
            self.procs = [p for p in self.tree.alive(waited=self.child.pid) if p.pid != self.child.pid]
        return not self.child_done or bool(self.procs)

    def others(self) -> list[Proc]:
        """The job's processes other than the child (left behind once it has exited)."""
        return list(self.procs)

    def escalate(self) -> tuple[Escalation, list[Proc]]:
        """Move to the next stage and send its signal; returns the stage and the processes signalled
        besides the child (those named in the audit)."""
        self.stage = self.stage.to(Escalation.SIGTERM if self.stage is Escalation.GRACE else Escalation.SIGKILL)
        self.look()
        return self.stage, self.send(_SIGNALS[self.stage])

    def send(self, sig: int) -> list[Proc]:
        """``sig`` to the child's process group (while the child is unreaped) and to every process
        outside it; returns the processes reached besides the child."""
        group = False
        if not self.child_done:
            try:
                os.killpg(self.child.pid, sig)  # the child leads its own session: its pgid is its pid
                group = True
            except (ProcessLookupError, PermissionError):
                pass
        alone = [p for p in self.procs if not (group and p.pgid == self.child.pid)]
        reached = self.tree.signal(alone, sig)
        return [p for p in self.procs if group and p.pgid == self.child.pid] + reached

    def forward(self, sig: int) -> None:
        """A signal the launcher received, passed on to the child's process group (safe in a signal
        handler: no ``/proc`` walk)."""
        if self.child.returncode is None:
            try:
                os.killpg(self.child.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
