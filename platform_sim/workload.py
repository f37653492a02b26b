"""Seeded synthetic workloads: visible job specs plus hidden ground truth (curves, labels, durations).

Random draws come from separate streams (types, durations, estimates, arrivals, curves, noise) of
one ``numpy.random.SeedSequence(seed)``, so a sweep that changes, say, the noise level keeps the same
jobs, arrivals and curves (a paired design). Observed eval scores, losses and proxy rewards at the
eval points are drawn here once, so every policy sees exactly the same stream for a job.

**Secret salt.** ``generate_workload(cfg, seed)`` is public: anyone who knows (or guesses) the seed
can rebuild every job's truth. With ``salt`` (a secret integer, :func:`secret_salt`: 128 random
bits) every stream but the job types and GPU counts is drawn from ``SeedSequence([seed, salt])``
instead: durations, estimates, arrivals, curves (hack onset, peak, labels) and noise. The types stay
seed-determined, so a cheat can still find the seed by matching them, and learns nothing from it.
``salt=None`` (the default) is the unsalted workload, bit for bit (the paper's reproduction)::

    >>> from platform_sim.config import load_config
    >>> cfg = load_config().replace(**{"workload.n_jobs": 50})
    >>> public, salted = generate_workload(cfg, 7), generate_workload(cfg, 7, salt=12345)
    >>> [s.job_type for s in public.jobs] == [s.job_type for s in salted.jobs]
    True
    >>> [t.peak_progress for t in public.truths] == [t.peak_progress for t in salted.truths]
    False
    >>> salted == generate_workload(cfg, 7, salt=12345), salted.salt
    (True, 12345)
"""

from __future__ import annotations

import csv
import math
import operator
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

import numpy as np

from .config import SimConfig
from .curves import FAMILIES, CurveKind, Family, family_gold, gao, gold, peak_of

__all__ = ["COLUMNS", "SALT_BITS", "JobSpec", "JobTruth", "Records", "TraceWindow", "Workload", "generate_workload",
           "per_example_scores", "read_trace", "secret_salt", "write_trace"]

#: bits of a :func:`secret_salt`: far beyond any search over candidate salts
SALT_BITS = 128

_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the platform knows about a job (schedulers see these through a read-only view)."""

    job_id: int
    job_type: str
    rlhf: bool
    gpus: int
    arrival_s: float
    est_duration_s: float


@dataclass(frozen=True, slots=True)
class JobTruth:
    """Hidden ground truth: only the workload, the metrics and the oracle may read it.

    A job on measured curves (``kind`` MEASURED, :mod:`platform_sim.measured`) carries its corpus run's name
    and gold (``curve_progress``, ``curve_gold``; ``height`` is the gold's peak and ``shape`` its progress)."""

    duration_s: float
    kind: CurveKind
    height: float
    shape: float
    hacked: bool
    peak_progress: float  # where gold peaks within [0, 1]
    gold_end: float
    scores: tuple[float, ...]  # observed eval score at each eval point
    losses: tuple[float, ...]
    proxies: tuple[float, ...]
    family: str = "gao"  # the hacked-curve family (curves.Family); "gao" for every healthy curve
    extra: tuple[float, ...] = ()  # the family's other parameters (see curves.family_gold)
    eval_n: int = 0  # examples per eval (noise.per_example.n; 0: each score is one noisy number)
    eval_noise: tuple[float, ...] = ()  # each eval's paired noise level (NaN: none, e.g. the first eval)
    whole_run: bool = False  # duration_s is the whole run, evals and checkpoints inside it (a cluster trace's)
    run: str = ""  # measured curves: the corpus run the job's curves come from ("": fitted curves)
    curve_progress: tuple[float, ...] = ()  # measured curves: the run's evals' progress (step / max_steps)
    curve_gold: tuple[float, ...] = ()  # measured curves: the run's gold at those evals (its own units)
    harm_margin: float | None = None  # measured curves: the run's own harm margin (None: metrics.harmful_margin)

    def gold_at(self, p: float) -> float:
        return _gold_at(self.kind, self.height, self.shape, self.family, self.extra, self.curve_progress,
                        self.curve_gold, p)


def _gold_at(kind: CurveKind, height: float, shape: float, family: str, extra: tuple, curve_progress: tuple,
             curve_gold: tuple, p: float) -> float:
    """A job's true gold at progress ``p`` (:meth:`JobTruth.gold_at`, :meth:`Workload.gold_at`)."""
    if curve_progress:  # measured: the run's gold, linear between its evals
        return float(np.interp(p, curve_progress, curve_gold))
    return float(gold(kind, height, shape, p, family, extra))


_KINDS = tuple(CurveKind)  # a truth's kind is stored as its index here
_MAX_EXTRA = 3  # the most parameters a hacked-curve family has (oscillating's)
_CHUNK = 65_536  # records built per block when iterating: memory bounded by the block, not the workload
_NO_MEASURED = ("", (), (), None)  # a fitted truth's run, curve_progress, curve_gold, harm_margin

#: the per-job columns (arrays indexed by job id), in the order they are compared
COLUMNS = ("type_index", "rlhf", "gpus", "arrival_s", "est_duration_s", "duration_s", "whole_run", "kind_index",
           "height", "shape", "hacked", "peak_progress", "gold_end", "family_index", "extra", "n_extra", "scores",
           "losses", "proxies", "eval_n", "noisy", "eval_noise")


class Workload:
    """One seed's jobs: what the platform knows of each (:class:`JobSpec`) and its hidden truth
    (:class:`JobTruth`), held as columns, one read-only numpy array per field indexed by job id (a
    job's id is its index). The eval series are ``(jobs, n_evals)`` float arrays (``scores``,
    ``losses``, ``proxies``; ``eval_noise`` where per-example evals give one, else ``(jobs, 0)``): a
    million jobs take about 0.3 GiB, where a record per job took about 3 GiB.

    ``jobs`` and ``truths`` give the same jobs as records, built when read (nothing is cached); the
    engine and the metrics read the columns. A job's type is ``type_names[type_index[j]]``, its curve
    kind ``tuple(CurveKind)[kind_index[j]]``, its family ``FAMILIES[family_index[j]]`` with the first
    ``n_extra[j]`` of ``extra[j]`` as its parameters; a measured run's name and gold (sparse) are in
    ``measured``: ``{job id: (run, curve_progress, curve_gold, harm_margin)}``.

    Args:
        jobs, truths: the jobs as records, job ``i`` with ``job_id == i``.
        n_evals: evals per job: every truth's scores, losses and proxies (and its ``eval_noise``, if
            any) have this many values.
        seed, salt, source: as :func:`generate_workload` drew them.

    Raises:
        ValueError: a job id that is not its index, a series of another length, or a truth with more
            than three family parameters.
    """

    __slots__ = ("n_evals", "seed", "salt", "source", "type_names", "measured", *COLUMNS)

    def __init__(self, jobs: Sequence[JobSpec], truths: Sequence[JobTruth], n_evals: int, seed: int,
                 salt: int | None = None, source: TraceWindow | None = None) -> None:
        if len(jobs) != len(truths):
            raise ValueError(f"a workload needs one truth per job, but got {len(jobs)} jobs and {len(truths)} truths")
        for j, (spec, t) in enumerate(zip(jobs, truths, strict=True)):
            if spec.job_id != j:
                raise ValueError(f"job {j}'s job_id is {spec.job_id}: a workload's job ids are their indices 0..n-1")
            if not len(t.scores) == len(t.losses) == len(t.proxies) == n_evals or len(t.eval_noise) not in (0, n_evals):
                raise ValueError(f"job {j}'s truth has {len(t.scores)} scores, {len(t.losses)} losses, "
                                 f"{len(t.proxies)} proxies and {len(t.eval_noise)} noise levels; n_evals={n_evals}")
            if len(t.extra) > _MAX_EXTRA:
                raise ValueError(f"job {j}'s truth has {len(t.extra)} family parameters; at most {_MAX_EXTRA}")
        n = len(jobs)
        names = tuple(dict.fromkeys(s.job_type for s in jobs))

        def column(field: str, records: Sequence, dtype: type = float) -> np.ndarray:
            return np.array([getattr(r, field) for r in records], dtype=dtype)

        def series(field: str) -> np.ndarray:
            return np.array([getattr(t, field) or (math.nan,) * n_evals for t in truths], dtype=float).reshape(n, n_evals)

        noisy = np.array([bool(t.eval_noise) for t in truths], dtype=bool)
        extra = np.zeros((n, _MAX_EXTRA))
        for j, t in enumerate(truths):
            extra[j, :len(t.extra)] = t.extra
        measured = {j: m for j, t in enumerate(truths)
                    if (m := (t.run, t.curve_progress, t.curve_gold, t.harm_margin)) != _NO_MEASURED}
        self._set(n_evals, seed, salt, source, names, measured, {
            "type_index": np.array([names.index(s.job_type) for s in jobs], dtype=np.int16),
            "rlhf": column("rlhf", jobs, bool), "gpus": column("gpus", jobs, np.int64),
            "arrival_s": column("arrival_s", jobs), "est_duration_s": column("est_duration_s", jobs),
            "duration_s": column("duration_s", truths), "whole_run": column("whole_run", truths, bool),
            "kind_index": np.array([_KINDS.index(CurveKind(t.kind)) for t in truths], dtype=np.int8),
            "height": column("height", truths), "shape": column("shape", truths), "hacked": column("hacked", truths, bool),
            "peak_progress": column("peak_progress", truths), "gold_end": column("gold_end", truths),
            "family_index": np.array([FAMILIES.index(t.family) for t in truths], dtype=np.int8), "extra": extra,
            "n_extra": np.array([len(t.extra) for t in truths], dtype=np.int8), "scores": series("scores"),
            "losses": series("losses"), "proxies": series("proxies"), "eval_n": column("eval_n", truths, np.int64),
            "noisy": noisy, "eval_noise": series("eval_noise") if noisy.any() else np.zeros((n, 0)),
        })

    @classmethod
    def of_columns(cls, n_evals: int, seed: int, salt: int | None, source: TraceWindow | None,
                   type_names: tuple[str, ...], measured: dict[int, tuple], **columns: np.ndarray) -> Workload:
        """A workload from its columns (every name of :data:`COLUMNS`, see the class docstring)."""
        wl = cls.__new__(cls)
        wl._set(n_evals, seed, salt, source, type_names, measured, columns)
        return wl

    def _set(self, n_evals, seed, salt, source, type_names, measured, columns) -> None:
        if set(columns) != set(COLUMNS):
            raise ValueError(f"a workload's columns are {', '.join(COLUMNS)}; got {', '.join(columns)}")
        self.n_evals, self.seed, self.salt, self.source = n_evals, seed, salt, source
        self.type_names, self.measured = tuple(type_names), dict(measured)
        for name in COLUMNS:
            a = np.ascontiguousarray(columns[name])
            a.flags.writeable = False
            setattr(self, name, a)

    # ------------------------------------------------------------------ records
    @property
    def jobs(self) -> Records[JobSpec]:
        """Every job's :class:`JobSpec`, built when read."""
        return Records(self, self._specs)

    @property
    def truths(self) -> Records[JobTruth]:
        """Every job's :class:`JobTruth`, built when read."""
        return Records(self, self._truths)

    def _specs(self, lo: int, hi: int) -> list[JobSpec]:
        names = self.type_names
        return [JobSpec(j, names[t], r, g, a, e) for j, t, r, g, a, e in zip(
            range(lo, hi), *(getattr(self, c)[lo:hi].tolist() for c in (
                "type_index", "rlhf", "gpus", "arrival_s", "est_duration_s")), strict=True)]

    def _truths(self, lo: int, hi: int) -> list[JobTruth]:
        cols = [getattr(self, c)[lo:hi].tolist() for c in (
            "duration_s", "kind_index", "height", "shape", "hacked", "peak_progress", "gold_end", "scores", "losses",
            "proxies", "family_index", "extra", "n_extra", "eval_n", "noisy", "whole_run")]
        noise = self.eval_noise[lo:hi].tolist() if self.eval_noise.shape[1] else None
        out = []
        for j, (d, k, h, s, hk, pk, e, sc, lo_, px, f, ex, ne, en, nz, w) in enumerate(zip(*cols, strict=True), lo):
            run, curve_progress, curve_gold, harm_margin = self.measured.get(j, _NO_MEASURED)
            out.append(JobTruth(
                duration_s=d, kind=_KINDS[k], height=h, shape=s, hacked=hk, peak_progress=pk, gold_end=e,
                scores=tuple(sc), losses=tuple(lo_), proxies=tuple(px), family=FAMILIES[f], extra=tuple(ex[:ne]),
                eval_n=en, eval_noise=tuple(noise[j - lo]) if nz else (), whole_run=w, run=run,
                curve_progress=curve_progress, curve_gold=curve_gold, harm_margin=harm_margin))
        return out

    # ------------------------------------------------------------------ values
    def __len__(self) -> int:
        return len(self.gpus)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return ((self.n_evals, self.seed, self.salt, self.source, self.type_names, self.measured)
                == (other.n_evals, other.seed, other.salt, other.source, other.type_names, other.measured)
                and all(np.array_equal(getattr(self, c), getattr(other, c), equal_nan=getattr(self, c).dtype.kind == "f")
                        for c in COLUMNS))

    __hash__ = None  # type: ignore[assignment]  # arrays: compared by value, not hashed

    def __reduce__(self):
        return (_rebuild, (self.n_evals, self.seed, self.salt, self.source, self.type_names, self.measured,
                           {c: getattr(self, c) for c in COLUMNS}))

    def __repr__(self) -> str:
        return (f"Workload({len(self)} jobs, n_evals={self.n_evals}, seed={self.seed}, "
                f"salt={'set' if self.salt is not None else None}, source={self.source!r})")

    def eval_progress(self, i: int) -> float:
        """Progress of eval ``i`` (1-based)."""
        return i / self.n_evals

    def job_types(self) -> list[str]:
        """Each job's type name."""
        names = self.type_names
        return [names[i] for i in self.type_index.tolist()]

    def gold_at(self, j: int, p: float) -> float:
        """Job ``j``'s true gold at progress ``p`` (:meth:`JobTruth.gold_at`)."""
        _, curve_progress, curve_gold, _ = self.measured.get(j, _NO_MEASURED)
        return _gold_at(_KINDS[self.kind_index[j]], float(self.height[j]), float(self.shape[j]),
                        FAMILIES[self.family_index[j]], tuple(self.extra[j, :self.n_extra[j]].tolist()), curve_progress,
                        curve_gold, p)

    def harm_margin(self, j: int) -> float | None:
        """A measured run's own harm margin (None: the configured one applies)."""
        return self.measured.get(j, _NO_MEASURED)[3]


def _rebuild(n_evals, seed, salt, source, type_names, measured, columns) -> Workload:
    """Unpickle a :class:`Workload` (worker processes receive them)."""
    return Workload.of_columns(n_evals, seed, salt, source, type_names, measured, **columns)


class Records(Sequence[_R]):
    """A workload's jobs as records (:class:`JobSpec` or :class:`JobTruth`), built from its columns when
    read: an index or a slice, or a pass over all of them (a block at a time). Compares equal to any
    sequence of the same records."""

    __slots__ = ("_workload", "_make")

    def __init__(self, workload: Workload, make: Callable[[int, int], list[_R]]) -> None:
        self._workload, self._make = workload, make

    def __len__(self) -> int:
        return len(self._workload)

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            lo, hi, step = i.indices(n)
            if step != 1:
                return tuple(self[lo:hi])[::step]
            return tuple(self._make(lo, hi)) if lo < hi else ()
        i = operator.index(i)
        if not -n <= i < n:
            raise IndexError(f"job {i} is not in a workload of {n} jobs")
        i %= n
        return self._make(i, i + 1)[0]

    def __iter__(self) -> Iterator[_R]:
        for lo in range(0, len(self), _CHUNK):
            yield from self._make(lo, min(lo + _CHUNK, len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} records of {self._workload!r}>"


def _label(kind: CurveKind, height: float, shape: float, min_drop: float) -> tuple[bool, float, float]:
    """(hacked, peak progress in [0, 1], gold at p=1) from the noiseless curve."""
    if kind is CurveKind.PLATEAU:
        return False, 1.0, height * (1.0 - math.exp(-1.0 / shape))
    x = 1.0 / shape
    end = height * x * (1.0 - math.log(x))
    if shape >= 1.0:
        return False, 1.0, end
    return height - end >= min_drop, shape, end  # the Gao form peaks at x=1 with gold = height


def _noise(cfg: SimConfig, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    n = cfg.noise
    if n.kind == "student_t":
        z = rng.standard_t(n.t_df, size=shape) * np.sqrt((n.t_df - 2) / n.t_df)
        return n.sigma * z
    z = rng.standard_normal(shape)
    if n.kind == "ar1":
        e = np.empty(shape)
        e[:, 0] = z[:, 0]
        scale = np.sqrt(1 - n.ar_rho**2)
        for i in range(1, shape[1]):
            e[:, i] = n.ar_rho * e[:, i - 1] + scale * z[:, i]
        z = e
    return n.sigma * z


def secret_salt() -> int:
    """A fresh secret salt (:data:`SALT_BITS` bits from :mod:`secrets`)."""
    return secrets.randbits(SALT_BITS)


def _streams(seed: int, salt: int | None) -> list[np.random.Generator]:
    """The seven generators (types, durations, estimates, arrivals, curves, noise, examples); with a
    salt, every one but the types' is drawn from ``SeedSequence([seed, salt])``. (A seed sequence's
    first six children do not depend on how many it spawns: adding the examples' stream left the
    others as they were.)"""
    public = np.random.SeedSequence(seed).spawn(7)
    if salt is None:
        return [np.random.default_rng(s) for s in public]
    if isinstance(salt, bool) or not isinstance(salt, int) or salt < 0:
        raise ValueError(f"salt must be a non-negative integer or None, but got salt={salt!r}.")
    hidden = np.random.SeedSequence([seed, salt]).spawn(7)
    return [np.random.default_rng(public[0])] + [np.random.default_rng(s) for s in hidden[1:]]


def generate_workload(cfg: SimConfig, seed: int, salt: int | None = None) -> Workload:
    """Draw ``cfg.workload.n_jobs`` jobs for ``seed``; the hidden streams with a secret ``salt``
    (see the module docstring; None: the public, unsalted workload).

    Raises:
        ValueError: ``salt`` is not a non-negative integer or None.
    """
    w, cv = cfg.workload, cfg.curves
    m = w.evals_per_job
    s_types, s_dur, s_est, s_arr, s_curve, s_noise, s_examples = _streams(seed, salt)
    if w.source.kind == "trace":
        types, gpus, durations, arrivals, source = _trace_jobs(cfg, s_types, s_arr)
    else:
        types, gpus, durations, arrivals = _synthetic_jobs(cfg, s_types, s_dur, s_arr)
        source = None
    n = len(types)
    estimates = durations * np.exp(w.sigma_est * s_est.standard_normal(n))

    u = s_curve.random((n, 6))  # fixed draws per job: hack?, rising?, two shape uniforms, kappa, tau_L
    v = s_curve.random((n, 4))  # hacked family and its parameters (drawn after u: u is unchanged)
    noise = _noise(cfg, s_noise, (n, m))
    proxy_noise = s_noise.standard_normal((n, m)) * cfg.proxy.sigma
    loss_noise = s_noise.standard_normal((n, m)) * cfg.loss.sigma
    p = np.arange(1, m + 1) / m

    def lerp(r: tuple[float, float], x: np.ndarray) -> np.ndarray:
        return r[0] + (r[1] - r[0]) * x

    rlhf = np.array([w.types[t].rlhf for t in types], dtype=bool)
    hacked_form = rlhf & (u[:, 0] < cv.hack_fraction)
    rising_form = rlhf & ~hacked_form & (u[:, 1] < cv.rising_share)
    plateau_form = ~hacked_form & ~rising_form
    shape = np.where(hacked_form, lerp(cv.hacked_p_peak, u[:, 2]),
                     np.where(rising_form, lerp(cv.rising_p_peak, u[:, 2]), lerp(cv.plateau_tau, u[:, 2])))
    height = np.where(hacked_form, lerp(cv.hacked_height, u[:, 3]), lerp(cv.plateau_height, u[:, 3]))
    height = np.where(rising_form, lerp(cv.rising_final_gain, u[:, 3]) / gao(1.0 / shape), height)
    family, extra = _families(cfg, hacked_form, u, v, lerp)
    shape = np.where(family == _LATE, lerp(cv.hacked_families.late_p_peak, u[:, 2]), shape)
    shape = np.where(family == _KL, lerp(cv.hacked_families.kl_p_peak, u[:, 2]), shape)
    shape = np.where(family == _DROP, lerp(cv.plateau_tau, u[:, 2]), shape)
    x = p[None, :] / shape[:, None]
    g = np.where(plateau_form[:, None], height[:, None] * (1.0 - np.exp(-x)), height[:, None] * gao(x))
    for fi in np.unique(family[family != _GAO]):
        sel = family == fi
        g[sel] = family_gold(FAMILIES[fi], height[sel, None], shape[sel, None],
                             tuple(e[sel, None] for e in extra), p[None, :])
    kappa = lerp(cfg.proxy.kappa, u[:, 4])
    tau_l = lerp(cfg.loss.tau, u[:, 5])
    pe = cfg.noise.per_example
    if pe.n:
        scores, eval_noise = per_example_scores(pe, cfg.noise.sigma, g, s_examples)
    else:
        scores, eval_noise = g + noise, np.zeros((n, 0))
    losses = 0.3 + 0.7 * np.exp(-p[None, :] / tau_l[:, None]) + loss_noise
    proxies = kappa[:, None] * p[None, :] + proxy_noise
    kind_index = np.where(hacked_form, 0, np.where(rising_form, 1, 2)).astype(np.int8)  # HACKED, RISING, PLATEAU
    extra = np.stack(extra, axis=1)
    n_extra = np.array([_N_EXTRA[f] for f in FAMILIES], dtype=np.int8)[family]
    hacked, peak, end = np.zeros(n, dtype=bool), np.empty(n), np.empty(n)
    measured = _measured_runs(cfg, rlhf, hacked_form, s_curve) if cfg.measured_path is not None else None
    runs: dict[int, tuple] = {}

    # the labels from each noiseless curve (scalar math, as the recorded results were computed)
    kind_l, family_l, shape_l, height_l, extra_l = (x.tolist() for x in (kind_index, family, shape, height, extra))
    for j in range(n):
        if measured is not None and measured[j] is not None:  # an RLHF job on a corpus run's curves
            t = _measured_truth(measured[j], p, durations[j], source is not None)
            kind_index[j], family[j], n_extra[j] = _KINDS.index(CurveKind.MEASURED), _GAO, 0
            height[j], shape[j], hacked[j], peak[j], end[j] = t.height, t.shape, t.hacked, t.peak_progress, t.gold_end
            scores[j], losses[j], proxies[j] = t.scores, t.losses, t.proxies
            runs[j] = (t.run, t.curve_progress, t.curve_gold, t.harm_margin)
            continue
        fam = FAMILIES[family_l[j]]
        if fam == "gao":
            hacked[j], peak[j], end[j] = _label(_KINDS[kind_l[j]], height_l[j], shape_l[j], cv.label_min_drop)
        else:
            top_peak, top, end[j] = peak_of(fam, height_l[j], shape_l[j], tuple(extra_l[j][:_N_EXTRA[fam]]))
            peak[j], hacked[j] = top_peak, top_peak < 1.0 and top - end[j] >= cv.label_min_drop
    type_names = tuple(dict.fromkeys(types))
    index = {name: i for i, name in enumerate(type_names)}
    return Workload.of_columns(
        m, seed, salt, source, type_names, runs,
        type_index=np.array([index[t] for t in types], dtype=np.int16), rlhf=rlhf, gpus=gpus.astype(np.int64),
        arrival_s=arrivals.astype(float), est_duration_s=estimates, duration_s=durations.astype(float),
        whole_run=np.full(n, source is not None), kind_index=kind_index, height=height, shape=shape, hacked=hacked,
        peak_progress=peak, gold_end=end, family_index=family.astype(np.int8), extra=extra, n_extra=n_extra,
        scores=scores, losses=losses, proxies=proxies, eval_n=np.full(n, pe.n if pe.n else 0, dtype=np.int64),
        noisy=np.full(n, bool(pe.n)), eval_noise=eval_noise)


def _measured_runs(cfg: SimConfig, rlhf: np.ndarray, hacked_form: np.ndarray, s_curve: np.random.Generator) -> list:
    """Each job's corpus run (:class:`~platform_sim.measured.MeasuredRun`; None for a job that is not RLHF):
    of the gold label its drawn status asks for, uniformly. The draws come after the fitted ones from the
    curves stream, so those (and every LoRA and DPO job's curves) stay as with fitted curves."""
    from .measured import load_measured

    corpus = load_measured(cfg.measured_path)
    u = s_curve.random(len(rlhf)).tolist()
    hf = cfg.curves.hack_fraction
    return [corpus.pick(bool(h), x, hf) if r else None for r, h, x in zip(rlhf.tolist(), hacked_form.tolist(), u, strict=True)]


def _measured_truth(run, p: np.ndarray, duration_s: float, whole_run: bool) -> JobTruth:
    """The ground truth of a job on corpus run ``run``, its series resampled at the eval points ``p``
    (progress, linear between the run's evals): the world feedback is the observed score as measured (no
    noise added), the gold the hidden curve; its label, peak and harm margin are the run's own."""
    peak = run.peak_progress
    return JobTruth(
        duration_s=duration_s, kind=CurveKind.MEASURED, height=float(run.gold.max()), shape=peak, hacked=run.hacked,
        peak_progress=peak, gold_end=float(run.gold[-1]), scores=tuple(run.at(run.world_feedback, p).tolist()),
        losses=tuple(run.at(run.loss, p).tolist()), proxies=tuple(run.at(run.proxy, p).tolist()), whole_run=whole_run,
        run=run.name, curve_progress=tuple(run.progress.tolist()), curve_gold=tuple(run.gold.tolist()),
        harm_margin=run.harm_margin)


def _synthetic_jobs(cfg: SimConfig, s_types, s_dur, s_arr) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(types, GPUs, exclusive durations in s, arrivals in s) drawn from the type table."""
    w = cfg.workload
    n = w.n_jobs
    names = list(w.types)
    shares = np.array([w.types[t].share for t in names])
    type_idx = s_types.choice(len(names), size=n, p=shares / shares.sum())
    gpu_u = s_types.random(n)
    dur_z = s_dur.standard_normal(n)
    types = [names[i] for i in type_idx]
    gpus = np.empty(n, dtype=int)
    durations = np.empty(n)
    for ti, name in enumerate(names):
        tc, sel = w.types[name], type_idx == ti
        options = sorted(tc.gpus)
        cum = np.cumsum([tc.gpus[g] for g in options])
        pick = np.minimum(np.searchsorted(cum, gpu_u[sel] * cum[-1], side="right"), len(options) - 1)
        gpus[sel] = np.asarray(options)[pick]
        durations[sel] = np.clip(tc.median_h * np.exp(tc.sigma_ln * dur_z[sel]), *tc.clamp_h) * 3600.0
    if w.arrivals == "all_at_zero":
        arrivals = np.zeros(n)
    else:
        capacity = cfg.cluster.reference_gpus({t: tc.share for t, tc in w.types.items()})
        rate = w.load * capacity / float(np.mean(gpus * durations))  # jobs per second
        arrivals = np.cumsum(s_arr.exponential(1.0 / rate, size=n))
        arrivals -= arrivals[0]
    return types, gpus, durations, arrivals


@dataclass(frozen=True)
class TraceWindow:
    """Where a trace workload's jobs came from (``workload.source.kind: trace``).

    Attributes:
        rows: usable jobs in the whole file; skipped: its rows the reader could not use, by reason.
        dropped: jobs of the window's span left out, by reason (too short, too many GPU-hours,
            larger than the cluster, thinned).
        recorded_load: the window's offered load as recorded (GPU-hours / (GPUs x span));
            time_scale: the factor arrival times were multiplied by (``load_fit: scale``).
    """

    format: str
    path: str
    rows: int
    skipped: tuple[tuple[str, int], ...]
    dropped: tuple[tuple[str, int], ...]
    start_s: float
    span_s: float
    recorded_load: float
    time_scale: float

    def to_dict(self) -> dict:
        """Plain data (``skipped`` and ``dropped`` as ``{reason: count}``), as ``run --json`` writes it."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "skipped": dict(self.skipped), "dropped": dict(self.dropped)}


def _offered(gpus: np.ndarray, durations: np.ndarray, arrivals: np.ndarray, total_gpus: float) -> float:
    """Exclusive GPU-seconds over (GPUs x the arrivals' span): the load the synthetic workload's rate sets
    (``total_gpus``: the capacity in reference GPUs)."""
    span = float(arrivals[-1] - arrivals[0])
    if len(arrivals) < 2 or span <= 0:
        return math.inf
    # n jobs over a span of n - 1 gaps: the mean gap times n, as a Poisson rate over n jobs gives
    return float(np.sum(gpus * durations)) / (total_gpus * span * len(arrivals) / (len(arrivals) - 1))


def _trace_jobs(cfg: SimConfig, s_types, s_arr) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, TraceWindow]:
    """(types, GPUs, durations, arrivals, the window) from a cluster trace (:class:`SourceConfig`)."""
    from .cluster_traces import read_cluster_trace

    w, src = cfg.workload, cfg.workload.source
    trace = read_cluster_trace(src.format, src.path)
    n, total = w.n_jobs, cfg.cluster.reference_gpus({t: tc.share for t, tc in w.types.items()})
    start = src.start_h * 3600.0
    after = trace.submit_s >= start
    short = trace.duration_s < src.min_duration_s
    long_ = trace.gpus * trace.duration_s > src.max_gpu_hours * 3600.0
    large = trace.gpus > cfg.cluster.largest_pool  # a gang runs in one pool
    too_large = (f"larger than the largest pool ({cfg.cluster.largest_pool} GPUs)" if cfg.cluster.pools
                 else "larger than the cluster")
    ok = np.flatnonzero(after & ~short & ~long_ & ~large)
    if w.source.load_fit == "thin":
        first = ok[:n]
        load = _offered(trace.gpus[first], trace.duration_s[first], trace.submit_s[first], total)
        if load <= w.load:
            raise ValueError(
                f"workload.source.load_fit: thin can only lower the load, but the window's first {len(first)} jobs "
                f"offer {load:.3g} <= workload.load {w.load:g}; use load_fit: scale (or none)")
        keep = s_arr.random(len(ok)) < w.load / load
        thinned_ok, ok = ok, ok[keep]
    if len(ok) < n:
        raise ValueError(
            f"{trace.path}: the window from start_h={src.start_h:g} holds {len(ok)} usable jobs, fewer than "
            f"workload.n_jobs={n}; lower n_jobs or start_h (the file has {len(trace)} jobs)")
    pick = ok[:n]
    end = trace.submit_s[pick[-1]]
    span_sel = after & (trace.submit_s <= end)
    dropped = {"shorter than min_duration_s": int(np.sum(span_sel & short)),
               "more than max_gpu_hours": int(np.sum(span_sel & ~short & long_)),
               too_large: int(np.sum(span_sel & ~short & ~long_ & large))}
    if w.source.load_fit == "thin":
        dropped["thinned"] = int(np.sum(thinned_ok <= pick[-1])) - n
    gpus, durations = trace.gpus[pick].astype(int), trace.duration_s[pick].astype(float)
    arrivals = trace.submit_s[pick] - trace.submit_s[pick[0]]
    recorded = _offered(gpus, durations, arrivals, total)
    scale = 1.0
    if w.source.load_fit == "scale":
        if not math.isfinite(recorded):
            raise ValueError(f"{trace.path}: every job of the window arrives at once; load_fit: scale needs a span "
                             "(use load_fit: none)")
        scale = recorded / w.load
        arrivals = arrivals * scale
    types = _trace_types(cfg, trace.types, pick, gpus, durations, s_types)
    window = TraceWindow(trace.format, trace.path, len(trace), tuple(sorted(trace.skipped.items())),
                         tuple((k, v) for k, v in dropped.items() if v), float(trace.submit_s[pick[0]]),
                         float(trace.submit_s[pick[-1]] - trace.submit_s[pick[0]]), recorded, scale)
    return types, gpus, durations, arrivals, window


def _trace_types(cfg: SimConfig, trace_types, pick: np.ndarray, gpus: np.ndarray, durations: np.ndarray,
                 rng: np.random.Generator) -> list[str]:
    """Each trace job's simulator type: its trace type through ``type_map``, else a draw from the first
    rule of ``type_rules`` it fits (the last rule if none). One uniform per job, drawn for every job."""
    src = cfg.workload.source
    rules = list(src.type_rules.values())
    u = rng.random(len(pick))
    hours = durations / 3600.0
    which = np.full(len(pick), len(rules) - 1)
    for r in reversed(range(len(rules))):  # the first fitting rule wins: assign in reverse
        fits = (gpus <= rules[r].max_gpus) & (hours <= rules[r].max_h)
        which[fits] = r
    out = []
    for j, idx in enumerate(pick.tolist()):
        own = trace_types[idx] if trace_types is not None else None
        if own is not None and own in src.type_map:
            out.append(src.type_map[own])
            continue
        odds = rules[which[j]].types
        names = list(odds)
        cum = np.cumsum([odds[t] for t in names])
        out.append(names[min(int(np.searchsorted(cum, u[j] * cum[-1], side="right")), len(names) - 1)])
    return out


def per_example_scores(pe, sigma: float, g: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(scores, paired noise levels) of evals that are means over ``pe.n`` examples, for the gold
    ``g`` (jobs x evals) at the eval points (:class:`~platform_sim.config.PerExampleConfig`). Each
    level is sd(d) / sqrt(2 n) over the per-example differences from the eval before (as
    :func:`evalstop_trl.core.examples.paired_noise`); NaN for the first eval and for fresh examples.
    Drawn a block of jobs at a time: memory stays bounded by the block, not by the workload."""
    jobs, m = g.shape
    k = pe.n
    scores, noise = np.empty((jobs, m)), np.full((jobs, m), np.nan)
    block = max(1, 1_000_000 // k)
    for lo in range(0, jobs, block):
        gb = g[lo:lo + block]
        size = (len(gb), k)
        effects = rng.standard_normal(size) * pe.example_sd
        before = None
        for i in range(m):
            if pe.examples == "fresh" and i:
                effects = rng.standard_normal(size) * pe.example_sd
            if pe.scores == "gaussian":
                x = gb[:, i:i + 1] + effects + rng.standard_normal(size) * (sigma * math.sqrt(k))
            else:
                p = 1.0 / (1.0 + np.exp(-(pe.link_scale * (gb[:, i:i + 1] - pe.link_mid) + effects)))
                x = (rng.random(size) < p).astype(float)
            scores[lo:lo + len(gb), i] = x.mean(axis=1)
            if before is not None and pe.examples == "fixed" and k >= 2:
                noise[lo:lo + len(gb), i] = (x - before).std(axis=1, ddof=1) / math.sqrt(2.0 * k)
            before = x
    return scores, noise


_GAO, _LATE, _SHALLOW, _DROP, _OSC, _KL = (FAMILIES.index(f.value) for f in Family)
_N_EXTRA = {"gao": 0, "late_onset": 1, "shallow": 1, "plateau_then_drop": 2, "oscillating": 3, "gao_kl": 1}


def _families(cfg: SimConfig, hacked_form: np.ndarray, u: np.ndarray, v: np.ndarray, lerp
              ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each job's hacked-curve family index (``_GAO`` for every job not of the hacked form) and
    up to three family parameters (see :func:`platform_sim.curves.family_gold`)."""
    fc = cfg.curves.hacked_families
    shares = np.array([fc.shares.get(f, 0.0) for f in FAMILIES])
    pick = np.minimum(np.searchsorted(np.cumsum(shares), v[:, 0] * shares.sum(), side="right"), len(FAMILIES) - 1)
    family = np.where(hacked_form, pick, _GAO)
    zero = np.zeros(len(family))
    e0 = np.select([family == _LATE, family == _SHALLOW, family == _DROP, family == _OSC, family == _KL],
                   [lerp(fc.late_sharpness, v[:, 1]), lerp(fc.shallow_depth, v[:, 1]), lerp(fc.drop_at, v[:, 1]),
                    lerp(fc.osc_amplitude, v[:, 1]), lerp(fc.kl_exponent, v[:, 1])], zero)
    e1 = np.select([family == _DROP, family == _OSC], [lerp(fc.drop_depth, v[:, 2]), lerp(fc.osc_cycles, v[:, 2])],
                   zero)
    e2 = np.where(family == _OSC, 2.0 * math.pi * v[:, 3], zero)
    return family, (e0, e1, e2)


_SPEC_FIELDS = [f.name for f in fields(JobSpec)]
_TRUTH_FIELDS = [f.name for f in fields(JobTruth)]


def write_trace(workload: Workload, path: str | Path) -> None:
    """Write a workload (specs and ground truth) to a CSV trace; lists are ';'-joined."""
    with open(path, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["n_evals", "seed"] + _SPEC_FIELDS + _TRUTH_FIELDS)
        for spec, truth in zip(workload.jobs, workload.truths, strict=True):
            row = [workload.n_evals, workload.seed] + [getattr(spec, f) for f in _SPEC_FIELDS]
            for f in _TRUTH_FIELDS:
                v = getattr(truth, f)
                row.append(";".join(repr(x) for x in v) if isinstance(v, tuple) else (v.value if isinstance(v, CurveKind) else v))
            wr.writerow(row)


def read_trace(path: str | Path) -> Workload:
    """Read a trace written by :func:`write_trace`."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    jobs, truths, n_evals, seed = [], [], None, 0
    with open(path, newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), 2):
            try:
                n_evals, seed = int(row["n_evals"]), int(row["seed"])
                jobs.append(JobSpec(int(row["job_id"]), row["job_type"], row["rlhf"] == "True", int(row["gpus"]),
                                    float(row["arrival_s"]), float(row["est_duration_s"])))
                family = row.get("family") or "gao"  # traces written before the families have none
                if family not in FAMILIES:
                    raise ValueError(f"unknown curve family {family!r}")
                extra = tuple(float(x) for x in (row.get("extra") or "").split(";") if x)
                truths.append(JobTruth(
                    float(row["duration_s"]), CurveKind(row["kind"]), float(row["height"]), float(row["shape"]),
                    row["hacked"] == "True", float(row["peak_progress"]), float(row["gold_end"]),
                    *(tuple(float(x) for x in row[k].split(";")) for k in ("scores", "losses", "proxies")),
                    family=family, extra=extra, eval_n=int(row.get("eval_n") or 0),
                    eval_noise=tuple(float(x) for x in (row.get("eval_noise") or "").split(";") if x),
                    whole_run=row.get("whole_run") == "True", run=row.get("run") or "",
                    curve_progress=tuple(float(x) for x in (row.get("curve_progress") or "").split(";") if x),
                    curve_gold=tuple(float(x) for x in (row.get("curve_gold") or "").split(";") if x),
                    harm_margin=None if row.get("harm_margin") in (None, "", "None") else float(row["harm_margin"]),
                ))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a platform-sim trace row ({exc})") from None
            if len(truths[-1].scores) != n_evals:
                raise ValueError(f"{path}:{lineno}: {len(truths[-1].scores)} scores but n_evals={n_evals}")
    if not jobs:
        raise ValueError(f"{path}: empty trace")
    return Workload(tuple(jobs), tuple(truths), n_evals, seed)
