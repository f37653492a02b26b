"""Incremental planning for priority schedulers: the waiting line and the greedy cut.

The engine's policy step used to sort every active job at every planning point and re-derive each
job's key; at 20,000 jobs that was most of the run. Here waiting jobs are kept in order by their
scheduler priority (:class:`WaitingLine`, one sorted bucket per GPU count), inserted once when they
start waiting and removed when they start, and the preemptive plan (:func:`greedy_cut`) looks only at
the jobs that can change it.

The plan it reproduces is the one a full sort gives: go down all active jobs in priority order and
keep each one whose GPUs still fit in the cluster (by count); running jobs not kept are preempted,
waiting jobs kept are started in that order. Running jobs whose priority is below every waiting job's
("early") come first and all fit together (they run now), so only the waiting line and the "late"
running jobs (priority at or above the first waiting one) need ordering.

Example::

    >>> line = WaitingLine()
    >>> for priority, job_id, gpus in [(5.0, 0, 8), (1.0, 1, 2), (3.0, 2, 2), (2.0, 3, 4)]:
    ...     line.add(priority, job_id, gpus)
    >>> line.first(), line.gpus, [e[1] for e in line.in_order()]
    ((1.0, 1, 2), 16, [1, 3, 2, 0])
    >>> line.first_fitting(3, ()), line.first_fitting(3, (2,))  # the first job that fits in 3 GPUs
    ((1.0, 1, 2), None)

Eight GPUs and two late running jobs (10: priority 2.5, 4 GPUs; 11: priority 6.0, 4 GPUs). Down the
merged order, jobs 1 and 3 take 6 GPUs; job 10 needs 4 of the 2 left and loses its GPUs; job 2 takes
the last 2; nothing is left for job 0 or job 11::

    >>> greedy_cut(8, 0, [(2.5, 10, 4), (6.0, 11, 4)], line)
    ([1, 3, 2], [10, 11])
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection

__all__ = ["Entry", "WaitingLine", "greedy_cut"]

Entry = tuple[float, int, int]  # (priority, job id, GPUs)


class WaitingLine:
    """Waiting jobs in (priority, job id) order, one sorted list per GPU count."""

    __slots__ = ("_buckets", "_sizes", "gpus", "n")

    def __init__(self) -> None:
        self._buckets: dict[int, list[tuple[float, int]]] = {}
        self._sizes: list[int] = []  # GPU counts that have (or had) a bucket, ascending
        self.gpus = 0  # GPUs all waiting jobs ask for together
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, priority: float, job_id: int, gpus: int) -> None:
        bucket = self._buckets.get(gpus)
        if bucket is None:
            bucket = self._buckets[gpus] = []
            insort(self._sizes, gpus)
        insort(bucket, (priority, job_id))
        self.gpus += gpus
        self.n += 1

    def remove(self, priority: float, job_id: int, gpus: int) -> None:
        bucket = self._buckets[gpus]
        i = bisect_left(bucket, (priority, job_id))
        if i == len(bucket) or bucket[i][1] != job_id:
            raise KeyError(f"job {job_id} is not waiting with priority {priority!r}")
        del bucket[i]
        self.gpus -= gpus
        self.n -= 1

    def first(self) -> Entry | None:
        """The first waiting job, whatever its size."""
        return self.first_fitting(self.gpus, ())

    def first_fitting(self, free: int, blocked: Collection[int]) -> Entry | None:
        """The first waiting job of at most ``free`` GPUs whose size is not in ``blocked``."""
        best, size = None, 0
        buckets = self._buckets
        for g in self._sizes:
            if g > free:
                break
            bucket = buckets[g]
            if bucket and g not in blocked and (best is None or bucket[0] < best):
                best, size = bucket[0], g
        return None if best is None else (best[0], best[1], size)

    def in_order(self) -> list[Entry]:
        """Every waiting job, in order."""
        out = [(p, jid, g) for g, bucket in self._buckets.items() for p, jid in bucket]
        out.sort()
        return out

    def cursors(self) -> dict[int, int]:
        return dict.fromkeys(self._sizes, 0)

    def head(self, cursors: dict[int, int], free: int) -> Entry | None:
        """The first job of at most ``free`` GPUs at or after each bucket's cursor (nothing is removed)."""
        best, size = None, 0
        buckets = self._buckets
        for g in self._sizes:
            if g > free:
                break
            bucket, i = buckets[g], cursors[g]
            if i < len(bucket) and (best is None or bucket[i] < best):
                best, size = bucket[i], g
        return None if best is None else (best[0], best[1], size)


def greedy_cut(total_gpus: int, early_gpus: int, late: list[Entry], line: WaitingLine) -> tuple[list[int], list[int]]:
    """The preemptive plan: which waiting jobs start (in order) and which late running jobs stop.

    Args:
        total_gpus: the cluster's GPUs.
        early_gpus: GPUs of the running jobs that come before every waiting job (all kept).
        late: the other running jobs, sorted by (priority, job id).
        line: the waiting jobs.

    Returns:
        ``(start, preempt)``: job ids of the waiting jobs kept, in order, and of the late running jobs
        not kept. Walking the merged order, a job is kept if its GPUs fit in what is left; a waiting job
        that does not fit now never will in this plan (what is left only shrinks), so each bucket of the
        line is read from its cursor and skipped once its size no longer fits.
    """
    free = total_gpus - early_gpus
    start: list[int] = []
    preempt: list[int] = []
    cursors = line.cursors()
    i, n_late = 0, len(late)
    while free > 0:
        cand = line.head(cursors, free)
        if i < n_late and (cand is None or late[i] < cand):
            _, jid, g = late[i]
            i += 1
            if g <= free:
                free -= g
            else:
                preempt.append(jid)
        elif cand is not None:
            start.append(cand[1])
            free -= cand[2]
            cursors[cand[2]] += 1
        else:
            break
    preempt.extend(jid for _, jid, _ in late[i:])  # nothing left for them
    return start, preempt
