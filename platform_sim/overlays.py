"""Stop overlays wrapped around a base scheduler.

Detector overlays (``evalstop``, ``loss_plateau``) are one class, :class:`DetectorOverlay`, that
calls the real ``evalstop_trl`` Coordinator (MemoryStore, the simulator's virtual clock): the same
decision code as the HTTP service and the TRL callback, no second copy of any rule. They differ only
in their detector. ``stop_at`` (:class:`StopAtOverlay`) stops each watched job at an exact progress
(a planned cut, not the first eval past it). Oracle-Stop is the only code here that reads ground
truth, and it is marked ``is_oracle`` in every output.

Overlays are registered in :data:`OVERLAYS`; every factory receives the run's workload as registry
*context* (only the oracle reads it). :func:`create_overlay` takes an overlay's flat config block:
the overlay's own parameters (``job_types``, and ``detector`` for ``evalstop``) plus its
detector's parameters, each checked against the signature that declares it::

    >>> from platform_sim.workload import Workload
    >>> empty = Workload((), (), n_evals=10, seed=0)
    >>> ov = create_overlay("evalstop", empty, k=3, job_types="rlhf")
    >>> ov.name, ov.policy.detector, ov.policy.params["k"], ov.rlhf_only
    ('evalstop', 'decline', 3, True)
    >>> create_overlay("stop_at", empty, k=3)
    Traceback (most recent call last):
    ...
    ValueError: Unknown parameter(s) k for overlay 'stop_at'; valid parameters are: fraction, job_types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.detectors import DETECTORS, Action
from evalstop_trl.core.records import JobType, Policy, Quotas
from evalstop_trl.core.registry import Registry
from evalstop_trl.core.requests import JobRequest, ReportRequest
from evalstop_trl.stores.memory import MemoryStore

from .views import JobSnapshot

if TYPE_CHECKING:  # a type only: a sealed overlay's process never imports the workload (nor numpy)
    from .workload import Workload

__all__ = ["OVERLAYS", "DetectorOverlay", "Overlay", "OracleOverlay", "StopAtOverlay", "create_overlay",
           "eval_hook_name", "overlay_block_keys"]

TENANT = "platform"

_JOB_TYPES = {"lora_sft": JobType.LORA_SFT, "dpo": JobType.DPO, "rlhf_ppo": JobType.PPO, "rlhf_grpo": JobType.GRPO}


# The simulated platform is one tenant holding every job of the workload: a service's per-tenant
# quotas (100,000 jobs, 10 million reports) would refuse the 100,001st job of a large run, so the
# platform's are the largest Quotas allows: 10^8 jobs, 10^7 at once, 10^11 reports (the workload
# itself bounds what the coordinator stores).
_PLATFORM_QUOTAS = Quotas(max_jobs=10**8, max_active_jobs=10**7, max_reports_per_job=10**9,
                          max_reports_per_tenant=10**11)

class Overlay:
    """Watches jobs' evals and may stop them. The default does nothing (the base scheduler alone)."""

    name = "none"
    is_oracle = False
    #: Whether the eval hook takes the eval's per-example evidence: with per-example evals
    #: (``noise.per_example``) the engine then also passes ``eval_n`` and ``eval_noise`` (None: no level).
    wants_evidence = False

    def attach(self, clock: Callable[[], float], n_evals: int) -> None:
        """Called once by the engine before the run. ``clock()`` is the simulated time (a
        :class:`~platform_sim.views.VirtualClock`: one float the engine sets, nothing else)."""

    def on_arrival(self, job: JobSnapshot) -> None:
        """A job arrived."""

    def on_eval(self, job: JobSnapshot, step: int, score: float, loss: float, proxy: float) -> bool:
        """An eval finished (``step`` = eval index, 1-based). Return True to stop the job now.

        By default it hands the eval to :meth:`on_eval_id`."""
        return self.on_eval_id(job.job_id, step, score, loss, proxy)

    def on_eval_id(self, job_id: int, step: int, score: float, loss: float, proxy: float) -> bool:
        """:meth:`on_eval` for an overlay that needs only the job's id (it keeps its own state per
        job): the engine then builds no snapshot per eval.

        The engine calls the eval hook defined lowest in the overlay's class hierarchy (``on_eval``
        where one class defines both), so a subclass of an ``on_eval_id`` overlay may still override
        ``on_eval`` and call ``super().on_eval(...)``."""
        return False

    def cut_progress(self, job_id: int) -> float | None:
        """Oracle only: progress at which the job is stopped, or None."""
        return None


def eval_hook_name(kind: type[Overlay]) -> str | None:
    """The eval hook the engine calls: the one defined lowest in the class hierarchy (``on_eval``
    where a class defines both), or None when neither is overridden (no call, no snapshot)."""
    for cls in kind.__mro__:
        if cls is Overlay:
            return None
        if "on_eval" in cls.__dict__:
            return "on_eval"
        if "on_eval_id" in cls.__dict__:
            return "on_eval_id"
    return "on_eval" if hasattr(kind, "on_eval") else None  # not an Overlay subclass: its on_eval, if any


class DetectorOverlay(Overlay):
    """Register jobs with a Coordinator under a detector policy and stop a job when it says STOP.

    Args:
        detector: a registered detector name (``evalstop_trl.core.detectors.DETECTORS``).
        params: the detector's parameters (checked by its signature).
        job_types: ``"all"`` watches every job, ``"rlhf"`` only RLHF jobs.
        name: the overlay's name in results.

    Raises:
        ValueError: unknown detector, unknown or bad detector parameter, or bad ``job_types``.
    """

    def __init__(self, detector: str, params: Mapping[str, Any] | None = None, job_types: str = "all",
                 name: str = "detector") -> None:
        if job_types not in ("all", "rlhf"):
            raise ValueError(f"job_types must be 'all' or 'rlhf', but got job_types={job_types!r}.")
        self.name = name
        self.policy = Policy(detector, dict(params or {}))  # ValueError naming a bad detector parameter
        self.rlhf_only = job_types == "rlhf"
        self.coordinator: Coordinator | None = None
        self._watched: dict[int, str] = {}  # job id -> the coordinator's job id

    wants_evidence = True  # the coordinator's detectors use a per-example eval's paired noise

    def attach(self, clock, n_evals):
        self.coordinator = Coordinator(MemoryStore(), clock=clock, default_policy=self.policy, quotas=_PLATFORM_QUOTAS)
        self._report = self.coordinator.report
        self.n_evals = n_evals

    def on_arrival(self, job):
        if self.rlhf_only and not job.rlhf:
            return
        name = str(job.job_id)
        self.coordinator.add_job(TENANT, JobRequest(name, _JOB_TYPES.get(job.job_type, JobType.OTHER),
                                                    planned_steps=self.n_evals))
        self._watched[job.job_id] = name

    def on_eval_id(self, job_id, step, score, loss, proxy, eval_n=None, eval_noise=None):
        name = self._watched.get(job_id)
        if name is None:
            return False
        request = ReportRequest(step, score, loss, proxy, None, eval_n, eval_noise)
        return self._report(TENANT, name, request).action is Action.STOP


class StopAtOverlay(Overlay):
    """Baseline StopAt: stop every watched job when its progress reaches ``fraction`` exactly (a
    cut planned at arrival from visible facts only: the job type and the planned work). The job
    delivers its state at the cut. ``fraction`` 1 never stops a job."""

    name = "stop_at"

    def __init__(self, fraction: float = 0.65, job_types: str = "rlhf") -> None:
        if job_types not in ("all", "rlhf"):
            raise ValueError(f"job_types must be 'all' or 'rlhf', but got job_types={job_types!r}.")
        self.fraction = DETECTORS.create("stop_at", fraction=fraction).fraction  # the detector's checks
        self.rlhf_only = job_types == "rlhf"
        self._cut: set[int] = set()

    def on_arrival(self, job):
        if job.rlhf or not self.rlhf_only:
            self._cut.add(job.job_id)

    def cut_progress(self, job_id):
        return self.fraction if job_id in self._cut else None


class OracleOverlay(Overlay):
    """ORACLE (reads ground truth): stops each hacked job exactly at its true gold peak."""

    name = "oracle"
    is_oracle = True

    def __init__(self, workload: Workload) -> None:
        self._cut = {j: peak for j, (hacked, peak) in enumerate(zip(workload.hacked.tolist(),
                                                                     workload.peak_progress.tolist(), strict=True))
                     if hacked}

    def cut_progress(self, job_id):
        return self._cut.get(job_id)


# ----------------------------------------------------------------------------- registry
OVERLAYS: Registry[Overlay] = Registry("overlay", context=("workload",))


@OVERLAYS.register("none")
def no_overlay(workload: Workload) -> Overlay:
    """The base scheduler alone."""
    return Overlay()


@OVERLAYS.register("evalstop")
def evalstop(workload: Workload, detector: str = "decline", params: Mapping[str, Any] | None = None,
             job_types: str = "all") -> DetectorOverlay:
    """EvalStop: the paper's decline rule (or any registered ``detector``) on world-feedback evals."""
    return DetectorOverlay(detector, params, job_types, name="evalstop")


def _fixed_detector(name: str, detector: str, workload: Workload, params: Mapping[str, Any] | None = None,
                    job_types: str = "all") -> DetectorOverlay:
    return DetectorOverlay(detector, params, job_types, name=name)


@OVERLAYS.register("stop_at")
def stop_at(workload: Workload, fraction: float = 0.65, job_types: str = "rlhf") -> StopAtOverlay:
    """StopAt: stop every watched job at exactly ``fraction`` of its planned work."""
    return StopAtOverlay(fraction, job_types)


#: detector overlays whose detector is fixed: entry name -> (detector, default job_types)
FIXED_DETECTORS = {"loss_plateau": ("loss_plateau", "all")}
for _name, (_detector, _job_types) in FIXED_DETECTORS.items():
    OVERLAYS.add(_name, partial(_fixed_detector, _name, _detector, job_types=_job_types))
del _name, _detector, _job_types


@OVERLAYS.register("oracle")
def oracle(workload: Workload) -> Overlay:
    """ORACLE: stops each hacked job at its true gold peak (the limit EvalStop is measured against)."""
    return OracleOverlay(workload)


def _detector_of(name: str, block: Mapping[str, Any]) -> str | None:
    """The detector overlay ``name`` runs with this config block (None: not a detector overlay)."""
    if name in FIXED_DETECTORS:
        return FIXED_DETECTORS[name][0]
    own = OVERLAYS.params(name)
    if "detector" in own:
        return block.get("detector", own["detector"])
    return None


def overlay_block_keys(name: str, block: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Valid keys of overlay ``name``'s flat config block: its own parameters, then its detector's.

    Raises:
        ValueError: unknown overlay or (for ``evalstop``) unknown ``detector`` in ``block``.
    """
    own = tuple(k for k in OVERLAYS.params(name) if k != "params")
    detector = _detector_of(name, block or {})
    return own + (tuple(DETECTORS.params(detector)) if detector is not None else ())


def create_overlay(name: str, workload: Workload, /, **block: Any) -> Overlay:
    """Build a registered overlay from its flat config block.

    Args:
        name: one of ``none``, ``evalstop``, ``stop_at``, ``loss_plateau``, ``oracle``.
        workload: the run's workload (registry context; only the oracle reads it).
        **block: the overlay's parameters and, for a detector overlay, its detector's parameters,
            e.g. ``create_overlay("evalstop", wl, detector="decline", k=2, job_types="all")``.

    Raises:
        ValueError: unknown name or key (the message lists the valid ones), or a bad value.
    """
    valid = overlay_block_keys(name, block)
    unknown = sorted(set(block) - set(valid))
    if unknown:
        raise ValueError(f"Unknown parameter(s) {', '.join(unknown)} for overlay {name!r}; "
                         f"valid parameters are: {', '.join(valid) or '(none)'}.")
    if _detector_of(name, block) is None:
        return OVERLAYS.create(name, workload, **block)
    own = OVERLAYS.params(name)
    kwargs = {k: v for k, v in block.items() if k in own}
    return OVERLAYS.create(name, workload, params={k: v for k, v in block.items() if k not in own}, **kwargs)
