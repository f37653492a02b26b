"""Stop detectors: pure decision logic over a job's observations.

A detector sees one :class:`Observation` at a time (the information boundary: job type, step,
progress, eval score, train loss, proxy reward; never hidden labels or true durations) and returns
a :class:`Decision` that says what to do and why.

Missing and non-finite values (the documented policy):

* ``eval_score=None`` means "no world-feedback eval at this step" (a training-log only report). It
  neither counts as a decline nor resets the decline counter, and never becomes the best score.
* NaN or infinite numbers are rejected when the :class:`Observation` is built (``ValueError``), so
  they are refused at every API boundary (HTTP 422, CLI exit 2) and never reach a detector.
* Once a detector says STOP, it keeps saying STOP (the same decision) for every later observation.

Safe arithmetic: for every allowed parameter value and any finite scores, no detector raises
(ZeroDivisionError, OverflowError) and all evidence is finite. The noise-robust rules (``drop``,
``trend``, ``cusum``, ``sequential``) saturate their signed scores at ``±SATURATION`` (1e100: no eval
metric comes near, and the squares of their differences stay finite); an absolute ``noise_prior``
and ``prior_evals`` are bounded away from 0, and a relative noise level (the default) is a positive
fraction of the range of the job's evals so far (a job whose evals are all equal is never stopped by
these rules); ``loss_plateau``'s relative improvement saturates the same way.

Units: every rule that reads the eval score (all but ``stop_at``, ``loss_plateau`` and ``never``)
decides the same under any change of the score's units ``a * score + b`` (a > 0) with its default
parameters: ``decline`` and ``patience`` compare scores with each other (``min_delta`` is in score
units, default 0), and the noise-robust rules measure in units of a noise level estimated from the
job's own evals with a prior that is a fraction (``noise_rel``) of the range of those evals. An
absolute ``noise_prior`` (in score units, the pre-issue-18 behaviour) is still accepted and, when
set, replaces the relative prior exactly as before.

Copies: :meth:`Detector.clone` returns an independent copy in a microsecond or two (the state of a
job's detector can be advanced on a copy and swapped in only once the report is stored).

Best checkpoint: the step with the best eval score seen so far (highest for ``direction="max"``,
lowest for ``"min"``); ties keep the earliest step.

Example::

    >>> det = create_detector("decline", k=2)
    >>> for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.55)]:
    ...     decision = det.observe(Observation(job_id="j", step=step, eval_score=score))
    >>> decision.action, decision.best_step
    (<Action.STOP: 'stop'>, 20)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar

from .registry import Registry

__all__ = [
    "Action",
    "CusumDetector",
    "Decision",
    "Detector",
    "DeclineDetector",
    "DropDetector",
    "LossPlateauDetector",
    "NeverDetector",
    "Observation",
    "PatienceDetector",
    "RelativeNoiseLevel",
    "SequentialDetector",
    "StopAtDetector",
    "t_quantile",
    "TrendDetector",
    "DETECTORS",
    "MAX_STEP",
    "SATURATION",
    "create_detector",
    "detector_params",
    "is_decline",
    "is_better",
]


class Action(str, Enum):
    """What a detector asks for."""

    CONTINUE = "continue"
    STOP = "stop"


_CONTINUE = Action.CONTINUE  # bound once: Enum member lookups are slow on the hot path

#: The largest step an Observation takes (the service's bound too: records.MAX_STEP); every step is
#: then exact as a float, and a trend's sums of squared steps stay finite.
MAX_STEP = 2**53


def check_finite(name: str, value: Any) -> None:
    """Raise ValueError unless ``value`` is None or a finite number (bool is not a number)."""
    if value is None or (type(value) is float and value - value == 0.0):  # fast path: finite float
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number or None, but got {value!r}.")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{name} must be finite, but got {value!r}; report None for a missing value.")


def all_finite_floats(*values: Any) -> bool:
    """True if every value is None or a finite float (the hot path's check; ints etc. need a full check)."""
    for v in values:
        if v is not None and (type(v) is not float or v - v != 0.0):
            return False
    return True


_NO_EVIDENCE: Mapping[str, Any] = MappingProxyType({})


class _ObservationFields(NamedTuple):
    job_id: str
    step: int
    eval_score: float | None = None
    train_loss: float | None = None
    proxy_reward: float | None = None
    job_type: str = "rlhf"
    progress: float | None = None


class Observation(_ObservationFields):
    """What a detector may see about one report of one job (immutable; validated on creation).

    ``progress`` is step / planned steps (None when unknown). Building one checks every number
    (ValueError for NaN, infinity, a negative step); the coordinator, which has already checked the
    values at its boundary, builds them with :meth:`trusted` instead (the simulator's hot path).
    """

    __slots__ = ()

    def __new__(cls, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
                proxy_reward: float | None = None, job_type: str = "rlhf", progress: float | None = None
                ) -> Observation:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, but got {step!r}.")
        if step > MAX_STEP:
            raise ValueError(f"step must be at most {MAX_STEP}, but got {step}.")
        if not all_finite_floats(eval_score, train_loss, proxy_reward, progress):
            check_finite("eval_score", eval_score)
            check_finite("train_loss", train_loss)
            check_finite("proxy_reward", proxy_reward)
            check_finite("progress", progress)
        if progress is not None and progress < 0:
            raise ValueError(f"progress must be >= 0, but got {progress!r}.")
        return tuple.__new__(cls, (job_id, step, eval_score, train_loss, proxy_reward, job_type, progress))

    @classmethod
    def trusted(cls, job_id: str, step: int, eval_score: float | None, train_loss: float | None,
                proxy_reward: float | None, job_type: str, progress: float | None) -> Observation:
        """An Observation of values already checked at an API boundary (not checked again)."""
        return tuple.__new__(cls, (job_id, step, eval_score, train_loss, proxy_reward, job_type, progress))


class _DecisionFields(NamedTuple):
    action: Action
    reason: str
    best_step: int | None = None
    best_score: float | None = None
    evidence: Mapping[str, Any] = _NO_EVIDENCE


class Decision(_DecisionFields):
    """A detector's answer: the action, a sentence saying why, the best checkpoint so far, and the
    numbers used (``evidence``, a read-only mapping). Immutable (a NamedTuple: one is made per report)."""

    __slots__ = ()

    def __new__(cls, action: Action, reason: str, best_step: int | None = None, best_score: float | None = None,
                evidence: Mapping[str, Any] | None = None) -> Decision:
        if type(evidence) is not MappingProxyType:
            evidence = _NO_EVIDENCE if not evidence else MappingProxyType(dict(evidence))
        return tuple.__new__(cls, (action, reason, best_step, best_score, evidence))

    @classmethod
    def trusted(cls, action: Action, reason: str, best_step: int | None, best_score: float | None,
                evidence: MappingProxyType) -> Decision:
        """A Decision of a read-only ``evidence`` a detector built (not converted again)."""
        return tuple.__new__(cls, (action, reason, best_step, best_score, evidence))

    @property
    def stop(self) -> bool:
        return self.action is Action.STOP

    def __reduce__(self):  # picklable (the evidence is a read-only view): e.g. broadcast between ranks
        return (Decision, (self.action, self.reason, self.best_step, self.best_score, dict(self.evidence)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "reason": self.reason,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            action=Action(data["action"]),
            reason=data["reason"],
            best_step=data.get("best_step"),
            best_score=data.get("best_score"),
            evidence=dict(data.get("evidence") or {}),
        )


_DIRECTIONS = ("max", "min")


def is_better(new: float, old: float, direction: str, min_delta: float = 0.0) -> bool:
    """True if ``new`` beats ``old`` by more than ``min_delta`` in ``direction``."""
    return new > old + min_delta if direction == "max" else new < old - min_delta


def is_decline(new: float, previous: float, direction: str, min_delta: float = 0.0) -> bool:
    """True if ``new`` is worse than ``previous`` by more than ``min_delta``."""
    return new < previous - min_delta if direction == "max" else new > previous + min_delta


def _fmt(x: float) -> str:
    return f"{x:.4g}"


D = TypeVar("D", bound="Detector")


class Detector(ABC):
    """Base class: one ``observe`` method; a STOP is sticky; :meth:`clone` copies.

    A subclass lists in ``_mutable`` the attributes it sets that hold mutable state (a deque, a dict,
    a :class:`NoiseLevel`: anything whose ``copy()`` returns an independent copy); every other
    attribute must hold an immutable value. A subclass with other state overrides :meth:`clone`.
    """

    #: registry name, set by subclasses
    name: str = ""
    #: attributes holding mutable state, copied by :meth:`clone` (the rest are shared, immutable)
    _mutable: ClassVar[tuple[str, ...]] = ()

    def __init__(self, direction: str = "max") -> None:
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'max' or 'min', but got {direction!r}.")
        self.direction = direction
        self.best_step: int | None = None
        self.best_score: float | None = None
        self._stopped: Decision | None = None

    def observe(self, obs: Observation) -> Decision:
        """Take one observation and return the decision after it."""
        if self._stopped is not None:
            return self._stopped
        score = obs.eval_score
        if score is not None and (
            self.best_score is None
            or (score > self.best_score if self.direction == "max" else score < self.best_score)
        ):
            self.best_step, self.best_score = obs.step, score
        decision = self._observe(obs)
        if decision.action is not _CONTINUE:
            self._stopped = decision
        return decision

    @abstractmethod
    def _observe(self, obs: Observation) -> Decision:
        """The rule itself; the best-so-far is already updated."""

    def resume(self) -> None:
        """Forget a sticky STOP and go on deciding (shadow mode: the job trains on after a would-stop,
        so its best-so-far and later decisions keep following its evals)."""
        self._stopped = None

    def clone(self: D) -> D:
        """An independent copy: observing on either one never changes the other's decisions.

        Copies the instance's attributes and each container in ``_mutable`` (O(window), about a
        microsecond; no ``copy.deepcopy``).
        """
        new = object.__new__(self.__class__)
        state = self.__dict__.copy()
        for attr in self._mutable:
            state[attr] = state[attr].copy()
        new.__dict__ = state
        return new

    def _continue(self, reason: str, **evidence: Any) -> Decision:
        return Decision.trusted(_CONTINUE, reason, self.best_step, self.best_score, MappingProxyType(evidence))

    def _stop(self, reason: str, **evidence: Any) -> Decision:
        return Decision.trusted(Action.STOP, reason, self.best_step, self.best_score, MappingProxyType(evidence))


#: Bounds of every detector parameter: no work or memory may grow with a number a caller sends.
MAX_K = 1000
MAX_WINDOW = 1000
MAX_DELTA = 1e6


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], but got {name}={value!r}.")
    return value


def _check_number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], but got {name}={value!r}.")
    try:
        ok = math.isfinite(value) and low <= value <= high
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number in [{low:g}, {high:g}], but got {name}={value!r}.")
    return float(value)


def _check_k(k: Any) -> int:
    return _check_int("k", k, 1, MAX_K)


def _check_delta(min_delta: Any) -> float:
    return _check_number("min_delta", min_delta, 0.0, MAX_DELTA)


class DeclineDetector(Detector):
    """The paper's rule: STOP after ``k`` consecutive evals, each worse than the one before by more
    than ``min_delta``. Reports without an eval score are skipped (no count, no reset)."""

    name = "decline"
    _mutable = ("_run", "_said")

    def __init__(self, k: int = 2, min_delta: float = 0.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)
        self.count = 0
        # the last k+1 evals of the current run of declines (memory bounded by k, not by the run)
        self._run: deque[tuple[int, float]] = deque(maxlen=self.k + 1)
        self._said: dict[int, tuple[str, Mapping[str, Any]]] = {}  # count -> (reason, evidence), built once

    def _observe(self, obs: Observation) -> Decision:
        score = obs.eval_score
        if score is None:
            return self._continue("no eval score in this report", declines=self.count)
        run = self._run
        # is_decline(score, previous), inlined: this rule runs once per simulated eval
        if run and (score < run[-1][1] - self.min_delta if self.direction == "max"
                    else score > run[-1][1] + self.min_delta):
            self.count += 1
        elif self.count or run:
            self.count = 0
            run.clear()
        run.append((obs.step, score))
        if self.count >= self.k:
            path = " → ".join(_fmt(s) for _, s in self._run)
            return self._stop(
                f"{self.k} consecutive {'declines' if self.direction == 'max' else 'rises'}: {path} at step {obs.step}",
                declines=self.count,
                scores=[s for _, s in self._run],
                steps=[st for st, _ in self._run],
                k=self.k,
                min_delta=self.min_delta,
            )
        said = self._said.get(self.count)
        if said is None:
            said = self._said[self.count] = (f"{self.count} consecutive "
                                             f"{'decline' if self.direction == 'max' else 'rise'}(s) of {self.k}",
                                             MappingProxyType({"declines": self.count}))
        return Decision.trusted(_CONTINUE, said[0], self.best_step, self.best_score, said[1])


class PatienceDetector(Detector):
    """transformers' EarlyStoppingCallback semantics: STOP after ``k`` evals in a row that do not
    improve on the best score so far by more than ``min_delta``. Unlike ``decline``, a flat or
    slowly rising-then-noisy curve also stops it."""

    name = "patience"

    def __init__(self, k: int = 2, min_delta: float = 0.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)
        self.count = 0
        self._reference: float | None = None

    def _observe(self, obs: Observation) -> Decision:
        score = obs.eval_score
        if score is None:
            return self._continue("no eval score in this report", stale=self.count)
        if self._reference is None or is_better(score, self._reference, self.direction, self.min_delta):
            self.count = 0
        else:
            self.count += 1
        if self._reference is None or is_better(score, self._reference, self.direction):
            self._reference = score
        if self.count >= self.k:
            return self._stop(
                f"{self.count} evals without improving on the best {_fmt(self.best_score)} "
                f"(step {self.best_step}) by more than {self.min_delta:g}, at step {obs.step}",
                stale=self.count,
                k=self.k,
                min_delta=self.min_delta,
            )
        return self._continue(f"{self.count} eval(s) without improvement of {self.k}", stale=self.count)


class StopAtDetector(Detector):
    """Baseline StopAt: STOP once ``progress >= fraction``. Jobs without known progress never stop."""

    name = "stop_at"

    def __init__(self, fraction: float = 0.65, direction: str = "max") -> None:
        super().__init__(direction)
        self.fraction = _check_number("fraction", fraction, 0.0, 1.0)
        if self.fraction == 0:
            raise ValueError("fraction must be in (0, 1], but got fraction=0.")

    def _observe(self, obs: Observation) -> Decision:
        if obs.progress is None:
            return self._continue("progress unknown (no planned_steps): stop_at never stops this job")
        if obs.progress >= self.fraction:
            return self._stop(
                f"progress {obs.progress:.2f} reached {self.fraction:.2f} at step {obs.step}",
                progress=obs.progress,
                fraction=self.fraction,
            )
        return self._continue(f"progress {obs.progress:.2f} < {self.fraction:.2f}", progress=obs.progress)


#: Where the noise-robust rules saturate a score, and ``loss_plateau`` a relative improvement: far
#: beyond any eval metric, and small enough that squares and sums of differences stay finite.
SATURATION = 1e100


def relative_improvement(old: float, new: float) -> float:
    """Relative loss improvement ``(old - new) / |old|`` (0 when ``old`` is 0), saturated at
    ``±SATURATION`` (it overflows for huge or tiny losses, e.g. ``old=1e-300, new=1``)."""
    if old == 0:
        return 0.0
    rel = (old - new) / abs(old)
    if -SATURATION <= rel <= SATURATION:
        return rel
    # ``old - new`` or the quotient overflowed (inputs are finite, so never NaN): the same ratio
    # without the difference, finite or ±inf
    rel = 1.0 - new / old if old > 0 else new / old - 1.0
    return rel if -SATURATION <= rel <= SATURATION else math.copysign(SATURATION, rel)


class LossPlateauDetector(Detector):
    """Baseline: STOP when the train loss improved by less than ``tolerance`` (relative) over the
    last ``window`` loss observations. Reports without a train loss are skipped."""

    name = "loss_plateau"
    _mutable = ("_losses",)

    def __init__(self, window: int = 2, tolerance: float = 0.03, direction: str = "max") -> None:
        super().__init__(direction)
        self.window = _check_int("window", window, 1, MAX_WINDOW)
        self.tolerance = _check_number("tolerance", tolerance, -MAX_DELTA, MAX_DELTA)
        self._losses: deque[float] = deque(maxlen=self.window + 1)

    def _observe(self, obs: Observation) -> Decision:
        if obs.train_loss is None:
            return self._continue("no train loss in this report")
        self._losses.append(obs.train_loss)
        if len(self._losses) <= self.window:
            return self._continue(f"{len(self._losses)} loss point(s), need {self.window + 1}")
        old = self._losses[-self.window - 1]
        rel = relative_improvement(old, obs.train_loss)
        if rel < self.tolerance:
            return self._stop(
                f"train loss improved {rel:.1%} over the last {self.window} evals "
                f"(< {self.tolerance:.1%}) at step {obs.step}",
                relative_improvement=rel,
                window=self.window,
                tolerance=self.tolerance,
            )
        return self._continue(f"train loss improving {rel:.1%} over {self.window} evals", relative_improvement=rel)


# ----------------------------------------------------------------------------- noise-robust detectors
# History of the defaults: drop, trend and cusum's windows, z, drift and threshold were chosen in the
# simulator (platform_sim, seeds 0-249) before issue 18; no script or log of that choice survives, and
# their absolute ``noise_prior`` 0.09 was a guess in the simulator's gold units. Since issue 18 the
# prior is relative (``noise_rel``), and ``noise_rel`` and ``sequential``'s parameters come from
# ``scripts/tune_detectors.py`` (seeds < 1000 only, log in ``configs/sweep/tuning-log.jsonl``).
#: Bounds of the noise-robust detectors' statistical parameters. The noise level is at least
#: ``noise_prior * sqrt(prior_evals / (prior_evals + n))`` after n evals: the lower bounds keep it a
#: normal positive float (no division by 0) for any number of evals a job can make.
MAX_Z = 100.0
MIN_NOISE_PRIOR = 1e-12
MAX_NOISE_PRIOR = MAX_DELTA
MIN_PRIOR_EVALS = 1e-3
MAX_PRIOR_EVALS = 1000.0
#: Bounds of the relative noise prior (a fraction of the range of the job's evals so far)
MIN_NOISE_REL = 1e-6
MAX_NOISE_REL = 100.0
#: The relative noise priors of drop, trend and cusum, as fractions of the range of the job's evals so
#: far (``scripts/tune_detectors.py``, tuning seed 7; the former absolute prior was 0.09 on curves that
#: rise by about 1)
DROP_NOISE_REL = TREND_NOISE_REL = 0.05
CUSUM_NOISE_REL = 0.2


def third_difference(y0: float, y1: float, y2: float, y3: float) -> float:
    """``y3 - 3 y2 + 3 y1 - y0``: for independent noise of level sigma its variance is 20 sigma^2,
    and a smooth curve contributes only its (small) third derivative."""
    return y3 - 3.0 * y2 + 3.0 * y1 - y0


def t_threshold(z: float, dof: float) -> float:
    """A normal threshold ``z`` widened for a noise level estimated with ``dof`` degrees of freedom
    (the first Cornish-Fisher term of Student's t quantile: ``z + (z^3 + z) / (4 dof)``)."""
    return z + (z**3 + z) / (4.0 * dof)


def pooled_sigma(prior: float, prior_evals: float, sum_sq: float, n: int) -> float:
    """Noise level from a prior guess worth ``prior_evals`` terms and ``n`` observed terms whose
    squares (each an unbiased estimate of sigma^2) sum to ``sum_sq``."""
    dof = prior_evals + n
    return math.sqrt((prior_evals * prior * prior + sum_sq) / dof) if dof > 0 else 0.0


class NoiseLevel:
    """Online eval-noise level of one job: third differences of consecutive eval scores, pooled
    with a prior guess (``noise_prior``, worth ``prior_evals`` terms). O(1) memory."""

    __slots__ = ("prior", "prior_evals", "_last", "_sum_sq", "n")

    def __init__(self, prior: float, prior_evals: float) -> None:
        self.prior, self.prior_evals = prior, prior_evals
        self._last: deque[float] = deque(maxlen=3)
        self._sum_sq = 0.0
        self.n = 0

    def add(self, y: float) -> None:
        if len(self._last) == 3:
            d = third_difference(self._last[0], self._last[1], self._last[2], y)
            self._sum_sq += d * d / 20.0
            self.n += 1
        self._last.append(y)

    def copy(self) -> NoiseLevel:
        """An independent copy (for :meth:`Detector.clone`)."""
        new = _new_noise_level(NoiseLevel)
        new.prior, new.prior_evals, new._last, new._sum_sq, new.n = (
            self.prior, self.prior_evals, self._last.copy(), self._sum_sq, self.n)
        return new

    @property
    def sigma(self) -> float:
        return pooled_sigma(self.prior, self.prior_evals, self._sum_sq, self.n)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


_new_noise_level = object.__new__


class RelativeNoiseLevel:
    """Online eval-noise level of one job in the job's own units: third differences of consecutive
    evals (as :class:`NoiseLevel`) pooled with a prior of ``rel`` times the range of the evals so far
    (max - min), worth ``prior_evals`` terms. Under ``a * score + b`` (a > 0) the level scales by
    ``a``: rules that measure in its units are invariant. O(1) memory.

    The sum of squared differences is kept in units of the current range (rescaled when the range
    grows; a third difference is at most 8 ranges), so nothing overflows or underflows to a zero
    level while the range is positive. ``sigma`` is 0 only while every eval so far is equal.
    """

    __slots__ = ("rel", "prior_evals", "_last", "_sum_sq", "n", "low", "high")

    def __init__(self, rel: float, prior_evals: float) -> None:
        self.rel, self.prior_evals = rel, prior_evals
        self._last: deque[float] = deque(maxlen=3)
        self._sum_sq = 0.0  # sum of (third difference / range)^2 / 20
        self.n = 0
        self.low = self.high = 0.0

    def add(self, y: float) -> None:
        if not self._last and not self.n:
            self.low = self.high = y
        elif y < self.low or y > self.high:
            old = self.high - self.low
            self.low, self.high = min(self.low, y), max(self.high, y)
            if self._sum_sq:
                self._sum_sq *= (old / (self.high - self.low)) ** 2
        if len(self._last) == 3:
            rng = self.high - self.low
            if rng > 0:
                d = third_difference(self._last[0], self._last[1], self._last[2], y) / rng  # |d| <= 8
                self._sum_sq += d * d / 20.0
            self.n += 1
        self._last.append(y)

    def copy(self) -> RelativeNoiseLevel:
        """An independent copy (for :meth:`Detector.clone`)."""
        new = _new_noise_level(RelativeNoiseLevel)
        new.rel, new.prior_evals, new._last, new._sum_sq, new.n, new.low, new.high = (
            self.rel, self.prior_evals, self._last.copy(), self._sum_sq, self.n, self.low, self.high)
        return new

    @property
    def range(self) -> float:
        return self.high - self.low

    @property
    def relative_sigma(self) -> float:
        """The noise level in units of the range (at least ``rel * sqrt(prior_evals / dof)`` > 0)."""
        return pooled_sigma(self.rel, self.prior_evals, self._sum_sq, self.n)

    @property
    def sigma(self) -> float:
        return self.relative_sigma * (self.high - self.low)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


def _check_noise(noise_prior: Any, noise_rel: Any, prior_evals: Any) -> NoiseLevel | RelativeNoiseLevel:
    """The noise level of a rule: absolute (``noise_prior`` in score units) when ``noise_prior`` is
    set, otherwise relative (``noise_rel`` of the range of the job's evals)."""
    evals = _check_number("prior_evals", prior_evals, MIN_PRIOR_EVALS, MAX_PRIOR_EVALS)
    rel = _check_number("noise_rel", noise_rel, MIN_NOISE_REL, MAX_NOISE_REL)
    if noise_prior is None:
        return RelativeNoiseLevel(rel, evals)
    return NoiseLevel(_check_number("noise_prior", noise_prior, MIN_NOISE_PRIOR, MAX_NOISE_PRIOR), evals)


_NO_SCALE = "every eval so far is equal: no noise scale yet"


class _NoisyDetector(Detector):
    """Base of the noise-robust rules: a ``window`` of recent evals (at least ``min_window``), the
    eval noise estimated online (:class:`NoiseLevel`), scores signed so that higher is better."""

    def __init__(self, window: int, min_window: int, noise_prior: float | None, noise_rel: float,
                 prior_evals: float, direction: str) -> None:
        super().__init__(direction)
        self.window = _check_int("window", window, min_window, MAX_WINDOW)
        self.noise = _check_noise(noise_prior, noise_rel, prior_evals)
        self._sign = 1.0 if direction == "max" else -1.0

    def _signed(self, score: float) -> float:
        """The score signed so that higher is better, saturated at ``±SATURATION``."""
        y = self._sign * score
        return y if -SATURATION <= y <= SATURATION else math.copysign(SATURATION, y)


class DropDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the mean of the last ``window`` evals lies significantly below
    the best earlier ``window``-eval mean: ``(best - now) / (sigma * sqrt(2 / window))`` above
    ``z`` (widened for an estimated sigma, :func:`t_threshold`). Sigma, the eval noise level, is
    estimated online from the job's own evals with a prior of ``noise_rel`` times their range
    (:class:`RelativeNoiseLevel`), worth ``prior_evals`` evals; an absolute ``noise_prior`` in score
    units (:class:`NoiseLevel`, the behaviour before issue 18) replaces it when set. Memory:
    ``2 * window`` scores. Reports without an eval are skipped.
    """

    name = "drop"
    _mutable = ("noise", "_now", "_before")

    def __init__(self, window: int = 2, z: float = 1.4, noise_prior: float | None = None,
                 noise_rel: float = DROP_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)
        self._now: deque[float] = deque(maxlen=self.window)  # the last ``window`` evals
        self._before: deque[float] = deque(maxlen=self.window)  # the ``window`` evals before those
        self._ref: float | None = None  # best mean of a window that ended before the current one

    def _observe(self, obs: Observation) -> Decision:
        if obs.eval_score is None:
            return self._continue("no eval score in this report")
        y = self._signed(obs.eval_score)
        self.noise.add(y)
        w = self.window
        if len(self._now) == w:
            self._before.append(self._now.popleft())
        self._now.append(y)
        if len(self._before) < w:
            return self._continue(f"{len(self._before) + len(self._now)} eval(s), need {2 * w}")
        earlier = sum(self._before) / w
        self._ref = earlier if self._ref is None else max(self._ref, earlier)
        now = sum(self._now) / w
        sigma = self.noise.sigma
        if sigma <= 0:
            return self._continue(_NO_SCALE)
        stat = (self._ref - now) / (sigma * math.sqrt(2.0 / w))
        threshold = t_threshold(self.z, self.noise.dof)
        evidence = {"z": stat, "threshold": threshold, "sigma": sigma, "drop": self._sign * (self._ref - now)}
        if stat > threshold:
            return self._stop(
                f"mean of the last {w} evals is {_fmt(abs(self._ref - now))} below the best {w}-eval mean "
                f"({_fmt(stat)} noise units > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}",
                **evidence)
        return self._continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)}", **evidence)


class TrendDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the least-squares slope of the last ``window`` evals (against
    their steps) is significantly negative: ``-slope / se`` above ``z`` (widened for an estimated
    sigma), with ``se = sigma / sqrt(Sxx)`` and sigma estimated online as in :class:`DropDetector`
    (``noise_rel`` / ``noise_prior``). Memory: ``window`` evals.
    """

    name = "trend"
    _mutable = ("noise", "_recent")

    def __init__(self, window: int = 5, z: float = 1.1, noise_prior: float | None = None,
                 noise_rel: float = TREND_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 2, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)
        self._recent: deque[tuple[int, float]] = deque(maxlen=self.window)

    def _observe(self, obs: Observation) -> Decision:
        if obs.eval_score is None:
            return self._continue("no eval score in this report")
        y = self._signed(obs.eval_score)
        self.noise.add(y)
        self._recent.append((obs.step, y))
        if len(self._recent) < self.window:
            return self._continue(f"{len(self._recent)} eval(s), need {self.window}")
        slope, sxx = least_squares_slope(self._recent)
        if sxx <= 0:
            return self._continue("all evals in the window share one step")
        sigma = self.noise.sigma
        if sigma <= 0:
            return self._continue(_NO_SCALE)
        stat = -slope * math.sqrt(sxx) / sigma
        threshold = t_threshold(self.z, self.noise.dof)
        evidence = {"t": stat, "threshold": threshold, "sigma": sigma, "slope": self._sign * slope}
        if stat > threshold:
            return self._stop(
                f"the last {self.window} evals fall (slope {_fmt(self._sign * slope)} per step, "
                f"t = {_fmt(stat)} > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}", **evidence)
        return self._continue(f"trend t = {_fmt(-stat)} (stop below {_fmt(-threshold)})", **evidence)


def least_squares_slope(points: Any) -> tuple[float, float]:
    """(slope, Sxx) of the least-squares line through ``(x, y)`` points (slope 0 when Sxx is 0)."""
    pts = list(points)
    n = len(pts)
    xm = sum(x for x, _ in pts) / n
    ym = sum(y for _, y in pts) / n
    sxx = sum((x - xm) ** 2 for x, _ in pts)
    if sxx <= 0:
        return 0.0, 0.0
    return sum((x - xm) * (y - ym) for x, y in pts) / sxx, sxx


class CusumDetector(_NoisyDetector):
    """Noise-robust rule, a one-sided CUSUM of shortfalls: each eval's shortfall below the best
    ``window``-eval mean so far, in noise units, minus ``drift``, accumulates (never below 0);
    STOP when the sum exceeds ``threshold``. Sigma is estimated online as in :class:`DropDetector`
    (``noise_rel`` / ``noise_prior``). Memory: ``window`` scores.
    """

    name = "cusum"
    _mutable = ("noise", "_recent")

    def __init__(self, window: int = 2, drift: float = 0.25, threshold: float = 3.5, noise_prior: float | None = None,
                 noise_rel: float = CUSUM_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.drift = _check_number("drift", drift, 0.0, MAX_Z)
        self.threshold = _check_number("threshold", threshold, 0.0, MAX_Z)
        self._recent: deque[float] = deque(maxlen=self.window)
        self._ref: float | None = None
        self.total = 0.0

    def _observe(self, obs: Observation) -> Decision:
        if obs.eval_score is None:
            return self._continue("no eval score in this report")
        y = self._signed(obs.eval_score)
        self.noise.add(y)
        sigma = self.noise.sigma
        if self._ref is not None:
            self.total = max(0.0, self.total + ((self._ref - y) / sigma if sigma > 0 else 0.0) - self.drift)
        self._recent.append(y)
        if len(self._recent) == self.window:
            mean = sum(self._recent) / self.window
            self._ref = mean if self._ref is None else max(self._ref, mean)
        evidence = {"cusum": self.total, "threshold": self.threshold, "sigma": sigma}
        if self.total > self.threshold:
            return self._stop(f"accumulated shortfall below the best {self.window}-eval mean "
                              f"{_fmt(self.total)} noise units > {_fmt(self.threshold)} (noise {_fmt(sigma)}) "
                              f"at step {obs.step}", **evidence)
        return self._continue(f"cusum {_fmt(self.total)} <= {_fmt(self.threshold)}", **evidence)


class SequentialDetector(Detector):
    """The recommended rule for new users: a scale-free, cadence-aware sequential drop test.

    Scores are signed so that higher is better. With ``w`` evals per ``span`` of training (``w =
    round(span * n / progress)``, between 1 and ``window``; 1 when the report has no progress), it
    compares the mean of the last ``w`` evals with the best earlier ``w``-eval mean (one that ended
    before the last ``w`` began)::

        stat = (best earlier w-mean - mean of the last w) / (sigma * sqrt(2 / w))

    and STOPs when ``stat`` exceeds a threshold that grows with the number of looks::

        threshold = t_quantile(z, k) + sqrt(2 ln(n / w))

    ``n / w`` is the number of ``w``-eval blocks seen: the best of that many block means of a flat
    run sits about ``sqrt(2 ln(n / w))`` noise units above its level, so a fixed threshold would stop
    more flat runs the more often they are evaluated; this one does not. Averaging over a fixed
    share of training (not a fixed number of evals) makes 5, 10, 20 or 40 evals per job see about
    the same evidence; the cost is that a job whose reports carry no progress (no planned steps) is
    judged eval by eval (``w = 1``).

    ``sigma`` is the job's own noise level: the root mean square of the last ``2 * window`` third
    differences of its evals over sqrt(20) (exact for independent noise, blind to any quadratic
    trend), never below ``noise_rel`` times the range of the job's evals so far (a relative floor,
    which keeps a lucky small estimate from the first few evals from stopping a run on noise).
    ``t_quantile`` widens ``z`` for the ``k`` differences the level rests on (Student's t).

    Every quantity is a difference of scores over a difference of scores, so the decisions are the
    same in any units (``a * score + b``, a > 0). No stop before ``min_evals`` evals (nor before
    ``2 w``). Memory: ``4 * window`` numbers; work per report O(window). Reports without an eval are
    skipped. Defaults: ``scripts/tune_detectors.py`` (tuning seeds < 1000;
    ``configs/sweep/tuning-log.jsonl``).

    Example::

        >>> det = create_detector("sequential")
        >>> scores = [0.30, 0.62, 0.80, 0.90, 0.93, 0.88, 0.74, 0.55]
        >>> [det.observe(Observation("j", 10 * (i + 1), s, progress=(i + 1) / 10)).action.value
        ...  for i, s in enumerate(scores)][-3:]
        ['continue', 'stop', 'stop']
    """

    name = "sequential"
    _mutable = ("_recent", "_diffs")

    def __init__(self, z: float = 0.75, span: float = 0.15, window: int = 8, noise_rel: float = 0.02,
                 min_evals: int = 4, direction: str = "max") -> None:
        super().__init__(direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)
        self.span = _check_number("span", span, 0.0, 1.0)
        if self.span == 0:
            raise ValueError("span must be in (0, 1], but got span=0.")
        self.window = _check_int("window", window, 1, MAX_WINDOW)
        self.noise_rel = _check_number("noise_rel", noise_rel, MIN_NOISE_REL, MAX_NOISE_REL)
        self.min_evals = _check_int("min_evals", min_evals, 2, MAX_WINDOW)
        self._sign = 1.0 if direction == "max" else -1.0
        self._recent: deque[float] = deque(maxlen=2 * self.window)  # the last 2 * window evals
        self._diffs: deque[float] = deque(maxlen=2 * self.window)  # their third differences
        self._low = self._high = 0.0
        self._best: float | None = None  # best w-mean that ended before the last w evals
        self._w = 0
        self.looks = 0

    def _run_length(self, progress: float | None) -> int:
        """Evals per ``span`` of training, from the evals so far and the progress (1 without)."""
        if progress is None or progress <= 0:
            return 1
        if self.span * self.looks >= self.window * progress:
            return self.window
        # half up, with a tolerance for the rounding of looks / progress: with evenly spaced evals
        # 0.15 * 7 / 0.7 is 1.5000000000000002 and 0.15 * 4 / 0.4 is 1.4999999999999998, and w must
        # not flip between 1 and 2 from one eval to the next
        return max(1, int(self.span * self.looks / progress + 0.5 + 1e-9))

    def _update_reference(self, w: int) -> None:
        recent = self._recent
        if w != self._w:  # the cadence changed (or the first eval): rebuild from the evals in memory
            self._w, self._best = w, None
            prefix = [0.0]
            for v in recent:  # running sums: O(window) even if the cadence changes at every report
                prefix.append(prefix[-1] + v)
            for end in range(w, len(prefix) - w):
                m = (prefix[end] - prefix[end - w]) / w
                self._best = m if self._best is None or m > self._best else self._best
        elif len(recent) >= 2 * w:  # the w-mean that ended w evals ago becomes eligible
            vals = list(recent)[-2 * w:-w]
            m = sum(vals) / w
            self._best = m if self._best is None or m > self._best else self._best

    def _observe(self, obs: Observation) -> Decision:
        if obs.eval_score is None:
            return self._continue("no eval score in this report")
        y = self._sign * obs.eval_score
        if not -SATURATION <= y <= SATURATION:
            y = math.copysign(SATURATION, y)
        recent = self._recent
        if len(recent) >= 3:
            self._diffs.append(third_difference(recent[-3], recent[-2], recent[-1], y))
        if not self.looks:
            self._low = self._high = y
        elif y < self._low:
            self._low = y
        elif y > self._high:
            self._high = y
        recent.append(y)
        self.looks += 1
        n = self.looks
        w = self._run_length(obs.progress)
        self._update_reference(w)
        if n < self.min_evals or n < 2 * w or self._best is None or not self._diffs:
            return self._continue(f"{n} eval(s), need {max(self.min_evals, 2 * w, 4)}")
        rng = self._high - self._low
        k = len(self._diffs)
        sigma = max(self.noise_rel * rng, math.sqrt(sum(d * d for d in self._diffs) / (20.0 * k)))
        if sigma <= 0:
            return self._continue(_NO_SCALE)
        now = sum(list(recent)[-w:]) / w
        stat = (self._best - now) / (sigma * math.sqrt(2.0 / w))
        threshold = t_quantile(self.z, k) + math.sqrt(2.0 * math.log(n / w))
        evidence = {"stat": stat, "threshold": threshold, "sigma": sigma, "run": w, "looks": n}
        if stat > threshold:
            return self._stop(
                f"mean of the last {w} eval(s) is {_fmt(stat)} noise units below the best earlier {w}-eval mean "
                f"(> {_fmt(threshold)} after {n} looks; noise {_fmt(sigma)}) at step {obs.step}", **evidence)
        return self._continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)} after {n} looks", **evidence)


def t_quantile(z: float, dof: float) -> float:
    """Student's t quantile with ``dof`` degrees of freedom at the normal quantile ``z`` (the
    Cornish-Fisher expansion to 1/dof^4: within 4% of the exact value for z <= 1.5 at any dof >= 1
    and for z <= 2.5 at dof >= 2; below it at dof 1 and larger z; exact as dof grows)."""
    z2 = z * z
    g1 = (z2 + 1.0) * z / 4.0
    g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0
    g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0
    g4 = ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) * z / 92160.0
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4


class NeverDetector(Detector):
    """Baseline: always CONTINUE (still tracks the best checkpoint)."""

    name = "never"

    def _observe(self, obs: Observation) -> Decision:
        return self._continue("never stops")


DETECTORS: Registry[Detector] = Registry("detector")
for _cls in (DeclineDetector, PatienceDetector, StopAtDetector, LossPlateauDetector, DropDetector, TrendDetector,
             CusumDetector, SequentialDetector, NeverDetector):
    DETECTORS.add(_cls.name, _cls)


def detector_params(name: str) -> dict[str, Any]:
    """The parameters a registered detector takes, with their defaults."""
    return DETECTORS.params(name)


def create_detector(name: str, **params: Any) -> Detector:
    """Build a registered detector.

    Args:
        name: one of ``decline``, ``patience``, ``stop_at``, ``loss_plateau``, ``drop``, ``trend``,
            ``cusum``, ``sequential`` (recommended for new users), ``never``.
        **params: the detector's parameters (see :func:`detector_params`).

    Raises:
        ValueError: unknown name, unknown parameter (the message lists the valid ones) or an
            invalid value.
    """
    return DETECTORS.create(name, **params)
