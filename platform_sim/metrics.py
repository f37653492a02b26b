"""Metrics, exactly as ``simulator-spec.md`` defines them (these definitions are printed in reports).

* **JCT change (completed jobs)** = mean JCT of the jobs that run to completion under the overlay /
  mean JCT of the same jobs under the base scheduler alone - 1 (the paper's reading).
* **JCT change (all jobs)**: the same over all jobs with departure = completion or stop.
* **GPU-hours change**: total GPU-hours held (the paper's "wasted compute" matches this reading).
* **W_post**: GPU-hours of work (training, evals, checkpoints) on hacked RLHF jobs after their
  true gold peak.
* **W_unprod**: GPU-hours of work by any job after the step of the checkpoint it delivers.
* **W_ovh**: eval, checkpoint and restart overhead GPU-hours.
* Restart overhead is in W_ovh only, not in W_post or W_unprod: the engine records how many times
  a job restarted, not at which progress, so the restarts after the peak cannot be told from those
  before it. It is small: 0.3% of all GPU-hours under SRTF-Est alone and 2.4% under LossAware alone
  (``restart_gpu_hours``, seeds 0-9), so even charging every restart to W_post would move it by
  about 1% (SRTF-Est) of its value.
* **Detection** over every *watched* job (the job types the overlay watches; RLHF only when a
  caller does not say), pooled and per job type; flagged = stopped before the planned end.
  Definition A (label): FP = healthy and flagged. Definition B (harmful stop, the headline): FP =
  healthy, flagged, and the delivered checkpoint's gold < gold at p=1 minus ``harmful_margin`` (a job
  with measured curves: minus its corpus run's own harm margin, in that run's gold units).
* **Oracle retention** = GPU-hours saved on hacked jobs (vs the base alone) by the overlay / the
  same saved by Oracle-Stop, summed over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, field, fields
from typing import Any

import numpy as np

from .curves import FAMILIES, CurveKind
from .engine import RunResult
from .jobs import Timing, layout
from .workload import Workload

__all__ = ["Changes", "Detection", "RunSummary", "compare", "detection", "summarize", "DEFINITIONS"]

DEFINITIONS = {
    "jct_change": "mean JCT of the jobs completed under the overlay / mean JCT of the same jobs under the base scheduler alone - 1",
    "jct_change_all": "mean JCT over all jobs (departure = completion or stop) / the same under the base alone - 1",
    "gpu_hours_change": "total GPU-hours held / the same under the base alone - 1 (the paper's 'wasted compute' figure)",
    "w_post": "GPU-hours of work on hacked RLHF jobs after their true gold peak (restart overhead excluded)",
    "w_unprod": "GPU-hours of work by any job after the step of the checkpoint it delivers (restart overhead excluded)",
    "w_ovh": "GPU-hours of eval, checkpoint and restart overhead",
    "watched": "the job types the overlay watches (default EvalStop: RLHF jobs)",
    "flagged": "a watched job stopped before its planned end",
    "fp_A": "definition A (label): healthy and flagged",
    "fp_B": "definition B (harmful stop, headline): healthy, flagged, delivered gold < gold(p=1) - margin",
    "harmful_stops": "FP_B, counted over all seeds",
    "precision": "TP / (TP + FP_B), over watched jobs",
    "recall": "TP / hacked watched jobs",
    "fpr": "FP_B / healthy watched jobs",
    "retention": "GPU-hours saved on hacked jobs by the overlay / by Oracle-Stop (summed over seeds, same base)",
}


@dataclass(frozen=True)
class Detection:
    tp: int
    fp_a: int
    fp_b: int
    hacked: int
    healthy: int
    flagged: int

    def __add__(self, other: Detection) -> Detection:
        return Detection(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp_b) if self.tp + self.fp_b else float("nan")

    @property
    def precision_label(self) -> float:
        return self.tp / (self.tp + self.fp_a) if self.tp + self.fp_a else float("nan")

    @property
    def recall(self) -> float:
        return self.tp / self.hacked if self.hacked else float("nan")

    @property
    def fpr(self) -> float:
        return self.fp_b / self.healthy if self.healthy else float("nan")

    @property
    def fpr_label(self) -> float:
        return self.fp_a / self.healthy if self.healthy else float("nan")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class RunSummary:
    """Per-run numbers (one seed, one scheduler, one overlay), or their means over seeds
    (:meth:`mean`: then ``n_stopped`` and ``events`` are means too, and ``detection`` is pooled)."""

    scheduler: str
    overlay: str
    is_oracle: bool
    mean_jct_h: float
    p50_jct_h: float
    p95_jct_h: float
    p99_jct_h: float
    mean_jct_by_type_h: dict[str, float]
    makespan_h: float
    mean_queueing_h: float
    utilisation: float
    gpu_hours: float
    w_post: float
    w_unprod: float
    w_ovh: float
    restart_gpu_hours: float
    delivered_gold_rlhf: float
    n_stopped: float
    events: float
    detection: Detection
    gpu_hours_by_pool: dict[str, float] = field(default_factory=dict)  # a mixed cluster's GPU-hours per pool
    ref_gpu_hours: float = 0.0  # GPU-hours in reference GPUs (pool speed x hours; gpu_hours on a uniform cluster)

    @classmethod
    def mean(cls, per_seed: Sequence[RunSummary]) -> RunSummary:
        """Field by field means over seeds (per job type for ``mean_jct_by_type_h``, whose types are
        the first seed's); names and the oracle flag from the first seed; detection counts summed."""
        first = per_seed[0]
        values: dict[str, Any] = {}
        for f in fields(cls):
            v = getattr(first, f.name)
            if isinstance(v, Detection):
                total = Detection(0, 0, 0, 0, 0, 0)
                for s in per_seed:
                    total = total + s.detection
                values[f.name] = total
            elif isinstance(v, dict):
                values[f.name] = {k: float(np.mean([getattr(s, f.name)[k] for s in per_seed])) for k in v}
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                values[f.name] = float(np.mean([getattr(s, f.name) for s in per_seed]))
            else:
                values[f.name] = v
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``detection`` (reported on its own)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "detection"}


def delivered_gold(run: RunResult, workload: Workload) -> np.ndarray:
    """True gold of each job's delivered checkpoint (0 for a job that delivered none)."""
    out = np.zeros(len(run.outcomes))
    gao, plateau = FAMILIES.index("gao"), tuple(CurveKind).index(CurveKind.PLATEAU)
    family, kind = workload.family_index.tolist(), workload.kind_index.tolist()
    shape, height = workload.shape.tolist(), workload.height.tolist()
    for i, o in enumerate(run.outcomes):
        p = o.delivered_progress
        if p > 0:
            if family[i] != gao or workload.measured.get(i, ("", ()))[1]:  # a family's or a measured run's curve
                out[i] = workload.gold_at(i, p)
                continue
            x = p / shape[i]
            out[i] = height[i] * (1.0 - math.exp(-x)) if kind[i] == plateau else height[i] * x * (1.0 - math.log(x))
    return out


def detection_by_type(run: RunResult, workload: Workload, margin: float,
                      watched: frozenset[str] | None = None) -> dict[str, Detection]:
    """Detection counts per job type, over the ``watched`` job types (None: the RLHF types)."""
    gold = delivered_gold(run, workload)
    counts: dict[str, list[int]] = {}
    columns = (workload.job_types(), workload.rlhf.tolist(), workload.hacked.tolist(), workload.gold_end.tolist(), gold)
    for j, (o, job_type, rlhf, hacked, gold_end, g) in enumerate(zip(run.outcomes, *columns, strict=True)):
        if (job_type not in watched) if watched is not None else not rlhf:
            continue
        c = counts.setdefault(job_type, [0, 0, 0, 0, 0, 0])  # tp, fp_a, fp_b, hacked, healthy, flagged
        c[3] += hacked
        c[4] += not hacked
        c[5] += o.stopped
        if o.stopped and hacked:
            c[0] += 1
        elif o.stopped:
            c[1] += 1
            own = workload.harm_margin(j)  # a measured run's own margin, in its units (None: the configured one)
            c[2] += bool(g < gold_end - (margin if own is None else own))
    return {t: Detection(*c) for t, c in sorted(counts.items())}


def detection(run: RunResult, workload: Workload, margin: float, watched: frozenset[str] | None = None) -> Detection:
    """Detection counts pooled over the ``watched`` job types (None: the RLHF types)."""
    total = Detection(0, 0, 0, 0, 0, 0)
    for d in detection_by_type(run, workload, margin, watched).values():
        total = total + d
    return total


def wasted(run: RunResult, workload: Workload, cfg) -> tuple[float, float, float]:
    """(W_post, W_unprod, W_ovh) in GPU-hours."""
    w_post = w_unprod = w_ovh = 0.0
    n = workload.n_evals
    columns = (*(c.tolist() for c in layout(workload.duration_s, workload.whole_run, cfg, n)), workload.rlhf.tolist(),
               workload.hacked.tolist(), workload.gpus.tolist(), workload.peak_progress.tolist())
    for o, d, seg_train, seg_eval, seg_len, total, rlhf, hacked, gpus, peak in zip(run.outcomes, *columns, strict=True):
        timing = Timing(d, n, seg_train, seg_eval, seg_len, total)
        if rlhf and hacked:
            w_post += gpus * max(0.0, o.work_done - timing.work_at(peak))
        w_unprod += gpus * max(0.0, o.work_done - timing.work_at(o.delivered_progress))
        w_ovh += o.overhead_gpu_seconds
    return w_post / 3600, w_unprod / 3600, w_ovh / 3600


def summarize(run: RunResult, workload: Workload, cfg, watched: frozenset[str] | None = None) -> RunSummary:
    """Per-run numbers; detection over the ``watched`` job types (None: the RLHF types)."""
    jct = np.array([o.jct_s for o in run.outcomes]) / 3600
    types = np.array(workload.job_types())
    rlhf = workload.rlhf
    gold = delivered_gold(run, workload)
    w_post, w_unprod, w_ovh = wasted(run, workload, cfg)
    gpu_h = sum(o.gpu_seconds for o in run.outcomes) / 3600
    return RunSummary(
        scheduler=run.scheduler, overlay=run.overlay, is_oracle=run.is_oracle,
        mean_jct_h=float(jct.mean()), p50_jct_h=float(np.percentile(jct, 50)),
        p95_jct_h=float(np.percentile(jct, 95)), p99_jct_h=float(np.percentile(jct, 99)),
        mean_jct_by_type_h={t: float(jct[types == t].mean()) for t in sorted(set(types))},
        makespan_h=run.makespan_s / 3600,
        mean_queueing_h=float(np.mean([o.first_start_s - o.arrival_s for o in run.outcomes]) / 3600),
        utilisation=gpu_h / (run.total_gpus * run.makespan_s / 3600) if run.makespan_s else 0.0,
        gpu_hours=gpu_h, w_post=w_post, w_unprod=w_unprod, w_ovh=w_ovh,
        restart_gpu_hours=sum(o.restarts * g for o, g in zip(run.outcomes, workload.gpus.tolist(), strict=True))
        * cfg.workload.restart_overhead_s / 3600,
        delivered_gold_rlhf=float(gold[rlhf].mean()) if rlhf.any() else float("nan"),
        n_stopped=sum(o.stopped for o in run.outcomes), events=run.events,
        detection=detection(run, workload, cfg.metrics.harmful_margin, watched),
        gpu_hours_by_pool={name: sec / 3600 for name, sec in run.pool_gpu_seconds},
        ref_gpu_hours=sum(o.ref_gpu_seconds for o in run.outcomes) / 3600,
    )


def _change(new: float, old: float) -> float:
    return new / old - 1 if old else float("nan")


@dataclass(frozen=True)
class Changes:
    """Paired changes of a run (base + overlay) against the base alone, one seed (see DEFINITIONS)."""

    jct_change: float
    jct_change_all: float
    mean_jct_completed_base_h: float
    mean_jct_completed_h: float
    gpu_hours_change: float
    w_post_change: float
    w_unprod_change: float
    w_ovh_change: float
    p95_jct_change: float
    makespan_change: float
    gpu_hours_saved: float
    gpu_hours_saved_hacked: float
    delivered_gold_change: float


def compare(base: RunResult, run: RunResult, workload: Workload, cfg,
            summaries: tuple[RunSummary, RunSummary] | None = None) -> Changes:
    """Paired changes of ``run`` (base + overlay) against ``base`` (the base alone), same workload.

    ``summaries`` may pass ``(summarize(base), summarize(run))`` already computed."""
    if base.seed != run.seed or len(base.outcomes) != len(run.outcomes):
        raise ValueError("compare() needs two runs of the same workload")
    completed = [o.job_id for o in run.outcomes if o.completed]
    jct_base = np.array([o.jct_s for o in base.outcomes])
    jct_run = np.array([o.jct_s for o in run.outcomes])
    b, r = summaries or (summarize(base, workload, cfg), summarize(run, workload, cfg))
    return Changes(
        jct_change=_change(jct_run[completed].mean(), jct_base[completed].mean()) if completed else float("nan"),
        jct_change_all=_change(jct_run.mean(), jct_base.mean()),
        mean_jct_completed_base_h=float(jct_base[completed].mean() / 3600) if completed else float("nan"),
        mean_jct_completed_h=float(jct_run[completed].mean() / 3600) if completed else float("nan"),
        gpu_hours_change=_change(r.gpu_hours, b.gpu_hours),
        w_post_change=_change(r.w_post, b.w_post),
        w_unprod_change=_change(r.w_unprod, b.w_unprod),
        w_ovh_change=_change(r.w_ovh, b.w_ovh),
        p95_jct_change=_change(r.p95_jct_h, b.p95_jct_h),
        makespan_change=_change(r.makespan_h, b.makespan_h),
        gpu_hours_saved=b.gpu_hours - r.gpu_hours,
        gpu_hours_saved_hacked=sum(ob.gpu_seconds - orun.gpu_seconds for ob, orun, hacked in
                                   zip(base.outcomes, run.outcomes, workload.hacked.tolist(), strict=True) if hacked) / 3600,
        delivered_gold_change=r.delivered_gold_rlhf - b.delivered_gold_rlhf,
    )
