"""The information boundary: what schedulers and overlays may know about a job, copied out.

Schedulers and overlays receive :class:`JobSnapshot` records: plain, immutable values copied out of
the engine's state at one instant (the fields in :data:`VISIBLE_FIELDS`: what a real platform knows —
type, GPUs, arrival, the duration *estimate*, progress, eval scores and loss history). A snapshot
holds no reference to the job, the simulation, the workload or the ground truth, so nothing reachable
from it (attributes, ``__slots__``, ``gc.get_referents``) leads there; asking for a hidden field such
as the true duration or the hacking label raises :class:`InformationBoundaryError`. Overlays read
the simulated time from a :class:`VirtualClock`, an object holding one float that the engine sets at
each instant (not a closure over the simulation).

In-process, this is a wall of references, not a sandbox: code in the same interpreter can still
walk the call stack (``sys._getframe``, a traceback's frames), scan every live object
(``gc.get_objects``), ask who holds it (``gc.get_referrers``), or rebuild the public workload
(``generate_workload(cfg, seed)``, the seed read from ``sys.argv`` or matched from the visible job
types). ``tests/sim/test_sim_wall.py`` lists what the references defend.

**The wall that holds** is the sealed mode (``platform-sim run --sealed``, ``--overlay-class
module:Class``; :mod:`platform_sim.sealed`): the overlay runs in a fresh process with a clean command
line and environment, after it has dropped its capabilities, and receives these snapshots' fields
as JSON, nothing else: the engine's objects are in another address space. Its workloads' hidden
streams are drawn with a secret salt (:func:`platform_sim.workload.generate_workload`), so the
public generator cannot rebuild the truth either. ``tests/sim/test_sim_sealed.py`` runs every cheat
above both ways: in-process each reproduces the Oracle; sealed none does better than a guess.

Example::

    >>> s = JobSnapshot(3, "rlhf_grpo", True, 8, 0.0, 7200.0, 0.25, True, 0.0, 2, (0.1, 0.3),
    ...                 ((1.0, 0.9), (2.0, 0.8)), 2.5)
    >>> s.est_duration_s * (1 - s.progress), s.eval_scores[-1]
    (5400.0, 0.3)
    >>> s.duration_s
    Traceback (most recent call last):
    ...
    platform_sim.views.InformationBoundaryError: 'duration_s' is not visible to scheduling policies; visible fields: job_id, job_type, rlhf, gpus, arrival_s, est_duration_s, progress, running, waiting_since, evals_done, eval_scores, loss_history, gpu_hours, pool, speed
    >>> clock = VirtualClock(60.0)
    >>> clock()
    60.0
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["InformationBoundaryError", "JobSnapshot", "VirtualClock", "VISIBLE_FIELDS"]


class InformationBoundaryError(AttributeError):
    """A policy tried to read a field it may not see, or to change a snapshot."""


class _Visible(NamedTuple):
    job_id: int
    job_type: str
    rlhf: bool
    gpus: int
    arrival_s: float
    est_duration_s: float
    progress: float  # training steps done / planned steps, in [0, 1]
    running: bool
    waiting_since: float
    evals_done: int
    eval_scores: tuple[float, ...]
    loss_history: tuple[tuple[float, float], ...]  # (GPU-hours used so far, train loss) at each eval
    gpu_hours: float
    pool: str = ""  # the pool (GPU model) it runs or last ran on in a mixed cluster ("" before it starts, or uniform)
    speed: float = 1.0  # that pool's speed for its type, in reference GPUs (1.0 on a uniform cluster)


VISIBLE_FIELDS: tuple[str, ...] = _Visible._fields


class JobSnapshot(_Visible):
    """One job as a policy may see it at one instant: frozen values, no references into the engine."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise InformationBoundaryError(
            f"{name!r} is not visible to scheduling policies; visible fields: {', '.join(VISIBLE_FIELDS)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise InformationBoundaryError(f"job snapshots are read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"JobSnapshot(job_id={self.job_id}, job_type={self.job_type!r}, gpus={self.gpus}, progress={self.progress:.3f})"


class VirtualClock:
    """The simulated time in seconds, as an overlay's Coordinator reads it (``clock()``).

    It holds one float, set by the engine at every instant; it knows nothing else about the run."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now!r})"
