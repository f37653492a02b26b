"""Stop detectors: pure decision logic over a job's observations.

A detector sees one observation at a time (:class:`Observed`, the information boundary: step,
progress, eval score, train loss, proxy reward and the eval's evidence; never hidden labels or true
durations) and returns a :class:`Decision` that says what to do and why. Callers build an
:class:`Observation`; the coordinator hands over the report it stores (checked once on arrival).

Missing and non-finite values (the documented policy):

* ``eval_score=None`` means "no world-feedback eval at this step" (a training-log only report). It
  neither counts as a decline nor resets the decline counter, and never becomes the best score.
* NaN or infinite numbers are rejected when an :class:`Observation` is built (``ValueError``) and
  when a report arrives (``records.check_report``), so they are refused at every API boundary (HTTP
  422, CLI exit 2) and never reach a detector.
* Once a detector says STOP, it keeps saying STOP (the same decision) for every later observation.

Per-example evidence (optional): ``eval_n`` is the number of examples the eval score is a mean of,
and ``eval_noise`` its noise level in score units, estimated from the per-example differences
with the previous eval on the same examples (:func:`evalstop_trl.core.examples.paired_noise`).
With ``eval_noise`` a ``decline`` counts only a fall larger than the noise of a difference of two
evals (``noise_z`` times ``sqrt(2) * eval_noise``), and the noise-robust rules use it as their noise
level instead of their estimate; without it every rule decides exactly as before.

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

State: a detector is its parameters; what it remembers of a job is a :class:`DetectorState`, an
immutable value, and ``decide(state, obs) -> (state', decision)`` is pure, so a job's state can be
advanced and swapped in only once the report is stored, without copying anything.

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
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from .registry import Registry

__all__ = [
    "Action",
    "CusumDetector",
    "Decision",
    "Detector",
    "DetectorState",
    "DeclineDetector",
    "DropDetector",
    "LossPlateauDetector",
    "NeverDetector",
    "Observation",
    "Observed",
    "PatienceDetector",
    "RelativeNoiseLevel",
    "SequentialDetector",
    "StopAtDetector",
    "t_quantile",
    "TrendDetector",
    "DETECTORS",
    "DEFAULT_DETECTOR",
    "MAX_EXAMPLES",
    "MAX_STEP",
    "RECOMMENDED_DETECTOR",
    "SATURATION",
    "create_detector",
    "detector_params",
    "check_evidence",
    "is_decline",
    "is_better",
]


class Action(str, Enum):
    """What a detector asks for."""

    CONTINUE = "continue"
    STOP = "stop"


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
    eval_n: int | None = None
    eval_noise: float | None = None


#: The most examples one eval may be a mean of (a count a caller sends is bounded like every number)
MAX_EXAMPLES = 10**9
_SQRT2 = math.sqrt(2.0)


class Observation(_ObservationFields):
    """What a detector may see about one report of one job (immutable; validated on creation).

    ``progress`` is step / planned steps (None when unknown). ``eval_n`` and ``eval_noise``: the
    eval's number of examples and its paired noise level (the module's "per-example evidence";
    None when the eval is a plain number). Building one checks every number (ValueError for NaN,
    infinity, a negative step or noise).
    """

    __slots__ = ()

    def __new__(cls, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
                proxy_reward: float | None = None, job_type: str = "rlhf", progress: float | None = None,
                eval_n: int | None = None, eval_noise: float | None = None) -> Observation:
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
        if eval_n is not None or eval_noise is not None:
            check_evidence(eval_score, eval_n, eval_noise)
        return tuple.__new__(cls, (job_id, step, eval_score, train_loss, proxy_reward, job_type, progress, eval_n,
                                   eval_noise))


class Observed(Protocol):
    """What a detector reads of one report: an :class:`Observation`, or the coordinator's stored
    :class:`~evalstop_trl.core.records.Report` (checked once on arrival; its ``progress`` comes
    from the job's plan). The job's id and type are not part of it: a job's policy, and so its
    detector, is chosen per job at registration."""

    @property
    def step(self) -> int: ...
    @property
    def eval_score(self) -> float | None: ...
    @property
    def train_loss(self) -> float | None: ...
    @property
    def proxy_reward(self) -> float | None: ...
    @property
    def progress(self) -> float | None: ...
    @property
    def eval_n(self) -> int | None: ...
    @property
    def eval_noise(self) -> float | None: ...


def check_evidence(eval_score: Any, eval_n: Any, eval_noise: Any) -> None:
    """Raise ValueError unless ``eval_n`` (None or an integer in [1, MAX_EXAMPLES]) and
    ``eval_noise`` (None or a finite number >= 0) describe an eval score that is there."""
    if eval_n is not None and (isinstance(eval_n, bool) or not isinstance(eval_n, int)
                               or not 1 <= eval_n <= MAX_EXAMPLES):
        raise ValueError(f"eval_n must be an integer in [1, {MAX_EXAMPLES}] (the eval's number of examples), "
                         f"but got {eval_n!r}.")
    check_finite("eval_noise", eval_noise)
    if eval_noise is not None and eval_noise < 0:
        raise ValueError(f"eval_noise must be >= 0 (a noise level in score units), but got {eval_noise!r}.")
    if eval_score is None:
        raise ValueError("eval_n and eval_noise describe an eval score: send them with eval_score, or not at all.")


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

    @property
    def stop(self) -> bool:
        return self.action is Action.STOP

    def __reduce__(self):  # picklable (the evidence is a read-only view): e.g. broadcast between ranks
        return (Decision, (self.action, self.reason, self.best_step, self.best_score, dict(self.evidence)))

    # as JSON: evalstop_trl.core.codec (to_wire / from_wire, codec.DECISION), the one codec of records


_DIRECTIONS = ("max", "min")


def is_better(new: float, old: float, direction: str, min_delta: float = 0.0) -> bool:
    """True if ``new`` beats ``old`` by more than ``min_delta`` in ``direction``."""
    return new > old + min_delta if direction == "max" else new < old - min_delta


def is_decline(new: float, previous: float, direction: str, min_delta: float = 0.0) -> bool:
    """True if ``new`` is worse than ``previous`` by more than ``min_delta``."""
    return new < previous - min_delta if direction == "max" else new > previous + min_delta


def _fmt(x: float) -> str:
    return f"{x:.4g}"


class DetectorState(NamedTuple):
    """A job's detector state: an immutable value (the best so far, a sticky stop, the rule's own).

    ``rule`` is the rule's state, a tuple of numbers and tuples (never a container that changes),
    so a state can be kept, shared and compared; :meth:`Detector.decide` returns a new one."""

    best_step: int | None = None
    best_score: float | None = None
    stopped: Decision | None = None
    rule: Any = ()


def _push(window: tuple, value: Any, size: int) -> tuple:
    """``window`` with ``value`` appended, keeping the last ``size`` items."""
    return (*window, value) if len(window) < size else (*window[1 - size:], value) if size > 1 else (value,)


class Detector(ABC):
    """Base class: a rule's parameters (fixed once built) and one pure function of a state.

    :meth:`start` gives a job's first :class:`DetectorState` and :meth:`decide` the next state and the
    decision after one observation: ``decide(state, obs) -> (state', decision)``, pure, so the
    coordinator keeps each job's state as a value and never copies a detector. A STOP is sticky
    (:meth:`resume` forgets it). A subclass implements ``_start`` and ``_decide`` on its own part
    of the state (``state.rule``); the best-so-far is the base's.

    For a caller that follows one series, :meth:`observe` keeps a state in the detector itself::

        >>> det = create_detector("decline", k=1)
        >>> det.observe(Observation("j", 10, 0.5)).action, det.observe(Observation("j", 20, 0.4)).action
        (<Action.CONTINUE: 'continue'>, <Action.STOP: 'stop'>)
    """

    #: registry name, set by subclasses
    name: str = ""
    #: the values ``evalstop calibrate`` tries for the main threshold (and ``k`` of the count rules),
    #: each grid including the default: cross-validated by run, never a constant in score units
    tuning: Mapping[str, tuple[Any, ...]] = MappingProxyType({})

    def __init__(self, direction: str = "max") -> None:
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'max' or 'min', but got {direction!r}.")
        self.direction = direction
        self._max = direction == "max"
        self._state: DetectorState | None = None  # observe()'s series only; decide() never reads it

    def start(self) -> DetectorState:
        """The state of a job with no observation yet."""
        return DetectorState(rule=self._start())

    def decide(self, state: DetectorState, obs: Observed) -> tuple[DetectorState, Decision]:
        """The state after ``obs`` and the decision: a pure function of ``state`` and ``obs``."""
        if state.stopped is not None:
            return state, state.stopped
        best_step, best_score = state.best_step, state.best_score
        score = obs.eval_score
        if score is not None and (best_score is None or (score > best_score if self._max else score < best_score)):
            best_step, best_score = obs.step, score
        rule, decision = self._decide(state.rule, obs, best_step, best_score)
        return DetectorState(best_step, best_score, decision if decision.action is Action.STOP else None,
                             rule), decision

    def resume(self, state: DetectorState) -> DetectorState:
        """``state`` without its sticky STOP: deciding goes on (shadow mode: the job trains on after a
        would-stop, so its best-so-far and later decisions keep following its evals)."""
        return state._replace(stopped=None)

    def _start(self) -> Any:
        """The rule's own state before any observation (default: none)."""
        return ()

    @abstractmethod
    def _decide(self, rule: Any, obs: Observed, best_step: int | None,
                best_score: float | None) -> tuple[Any, Decision]:
        """The rule itself: its next state and the decision; the best-so-far is already updated."""

    # ------------------------------------------------------------------ one series kept in the detector
    @property
    def state(self) -> DetectorState:
        """The state of the series :meth:`observe` follows."""
        if self._state is None:
            self._state = self.start()
        return self._state

    def observe(self, obs: Observed) -> Decision:
        """Take the next observation of the series this detector follows; the decision after it."""
        self._state, decision = self.decide(self.state, obs)
        return decision

    def resume_series(self) -> None:
        """:meth:`resume` on the series :meth:`observe` follows."""
        self._state = self.resume(self.state)

    @property
    def best_step(self) -> int | None:
        return self.state.best_step

    @property
    def best_score(self) -> float | None:
        return self.state.best_score


def _continue(reason: str, best_step: int | None, best_score: float | None, **evidence: Any) -> Decision:
    return Decision(Action.CONTINUE, reason, best_step, best_score, MappingProxyType(evidence))


def _stop(reason: str, best_step: int | None, best_score: float | None, **evidence: Any) -> Decision:
    return Decision(Action.STOP, reason, best_step, best_score, MappingProxyType(evidence))


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
    than ``min_delta``. Reports without an eval score are skipped (no count, no reset). An eval that
    carries its paired noise level (``eval_noise``) counts as a decline only when it is also worse by
    more than ``noise_z`` standard errors of the difference of two evals (``noise_z * sqrt(2) *
    eval_noise``): a fall within the noise resets the count like a rise; a plain score decides as
    the paper's rule.

    State: the count of declines and the last ``k + 1`` evals of the current run of declines (memory
    bounded by ``k``, not by the run)."""

    name = "decline"
    tuning = MappingProxyType({"k": (1, 2, 3, 4)})

    def __init__(self, k: int = 2, min_delta: float = 0.0, noise_z: float = 1.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)
        self.noise_z = _check_number("noise_z", noise_z, 0.0, MAX_Z)
        # a CONTINUE's reason and evidence depend on the count only: built once per count (a memo)
        self._said: dict[int, tuple[str, Mapping[str, Any]]] = {}

    def _start(self) -> tuple[int, tuple[tuple[int, float], ...]]:
        return 0, ()

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        count, run = rule
        score = obs.eval_score
        if score is None:
            return rule, _continue("no eval score in this report", best_step, best_score, declines=count)
        delta = self.min_delta
        if obs.eval_noise is not None:
            delta = max(delta, self.noise_z * _SQRT2 * obs.eval_noise)
        if run and is_decline(score, run[-1][1], self.direction, self.min_delta) and self._beyond_noise(
                score, run[-1][1], obs.eval_noise):
            count, run = count + 1, _push(run, (obs.step, score), self.k + 1)
        else:
            count, run = 0, ((obs.step, score),)
        threshold = "" if obs.eval_noise is None else self._threshold(delta, obs.eval_noise)
        if count >= self.k:
            path = " → ".join(_fmt(s) for _, s in run)
            return (count, run), _stop(
                f"{self.k} consecutive {'declines' if self._max else 'rises'}: {path} at step {obs.step}{threshold}",
                best_step, best_score, declines=count, scores=[s for _, s in run], steps=[st for st, _ in run],
                k=self.k, min_delta=self.min_delta,
                **({} if obs.eval_noise is None else {"noise": obs.eval_noise, "needed": delta}))
        said = self._said.get(count)
        if said is None:
            said = self._said[count] = (f"{count} consecutive {'decline' if self._max else 'rise'}(s) of {self.k}",
                                        MappingProxyType({"declines": count}))
        return (count, run), Decision(Action.CONTINUE, said[0] + threshold, best_step, best_score, said[1])

    def _threshold(self, delta: float, noise: float) -> str:
        """What a per-example eval's change had to exceed to count, for its reason (the log line shows
        it beside the count): the noise threshold ``noise_z * sqrt(2) * eval_noise``, or ``min_delta``
        when that is larger."""
        what = "decline" if self._max else "rise"
        if delta > self.noise_z * _SQRT2 * noise:
            return f" (a {what} must exceed min_delta {_fmt(delta)})"
        return (f" (a {what} must exceed the noise threshold {_fmt(delta)} = noise_z {_fmt(self.noise_z)} × √2 × "
                f"eval noise {_fmt(noise)})")

    def _beyond_noise(self, score: float, previous: float, noise: float | None) -> bool:
        """A fall larger than ``noise_z`` standard errors of a difference; a tie (up to rounding: win
        rates on a k/n grid land exactly on it) is within the noise, in every unit (:func:`exceeds`)."""
        if not noise:
            return True
        fall = previous - score if self._max else score - previous
        return exceeds(fall / (_SQRT2 * noise), self.noise_z)


class PatienceDetector(Detector):
    """transformers' EarlyStoppingCallback semantics: STOP after ``k`` evals in a row that do not
    improve on the best score so far by more than ``min_delta``. Unlike ``decline``, a flat or
    slowly rising-then-noisy curve also stops it. State: the count and the reference score."""

    name = "patience"
    tuning = MappingProxyType({"k": (1, 2, 3, 4, 6)})

    def __init__(self, k: int = 2, min_delta: float = 0.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)

    def _start(self) -> tuple[int, float | None]:
        return 0, None

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        count, reference = rule
        score = obs.eval_score
        if score is None:
            return rule, _continue("no eval score in this report", best_step, best_score, stale=count)
        if reference is None or is_better(score, reference, self.direction, self.min_delta):
            count = 0
        else:
            count += 1
        if reference is None or is_better(score, reference, self.direction):
            reference = score
        if count >= self.k:
            return (count, reference), _stop(
                f"{count} evals without improving on the best {_fmt(best_score)} "
                f"(step {best_step}) by more than {self.min_delta:g}, at step {obs.step}",
                best_step, best_score, stale=count, k=self.k, min_delta=self.min_delta)
        return (count, reference), _continue(f"{count} eval(s) without improvement of {self.k}", best_step,
                                             best_score, stale=count)


class StopAtDetector(Detector):
    """Baseline StopAt: STOP once ``progress >= fraction``. Jobs without known progress never stop."""

    name = "stop_at"
    tuning = MappingProxyType({"fraction": (0.5, 0.65, 0.8)})

    def __init__(self, fraction: float = 0.65, direction: str = "max") -> None:
        super().__init__(direction)
        self.fraction = _check_number("fraction", fraction, 0.0, 1.0)
        if self.fraction == 0:
            raise ValueError("fraction must be in (0, 1], but got fraction=0.")

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        progress = obs.progress  # read once: a stored report computes it from its plan
        if progress is None:
            return rule, _continue("progress unknown (no planned_steps): stop_at never stops this job", best_step,
                                   best_score)
        if progress >= self.fraction:
            return rule, _stop(f"progress {progress:.2f} reached {self.fraction:.2f} at step {obs.step}",
                               best_step, best_score, progress=progress, fraction=self.fraction)
        return rule, _continue(f"progress {progress:.2f} < {self.fraction:.2f}", best_step, best_score,
                               progress=progress)


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
    last ``window`` loss observations. Reports without a train loss are skipped. State: the last
    ``window + 1`` losses."""

    name = "loss_plateau"
    tuning = MappingProxyType({"window": (2, 3, 5)})

    def __init__(self, window: int = 2, tolerance: float = 0.03, direction: str = "max") -> None:
        super().__init__(direction)
        self.window = _check_int("window", window, 1, MAX_WINDOW)
        self.tolerance = _check_number("tolerance", tolerance, -MAX_DELTA, MAX_DELTA)

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.train_loss is None:
            return rule, _continue("no train loss in this report", best_step, best_score)
        losses = _push(rule, obs.train_loss, self.window + 1)
        if len(losses) <= self.window:
            return losses, _continue(f"{len(losses)} loss point(s), need {self.window + 1}", best_step, best_score)
        rel = relative_improvement(losses[-self.window - 1], obs.train_loss)
        if rel < self.tolerance:
            return losses, _stop(f"train loss improved {rel:.1%} over the last {self.window} evals "
                                 f"(< {self.tolerance:.1%}) at step {obs.step}", best_step, best_score,
                                 relative_improvement=rel, window=self.window, tolerance=self.tolerance)
        return losses, _continue(f"train loss improving {rel:.1%} over {self.window} evals", best_step, best_score,
                                 relative_improvement=rel)


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


class NoiseLevel(NamedTuple):
    """Online eval-noise level of one job: third differences of consecutive eval scores, pooled
    with a prior guess (``prior``, worth ``prior_evals`` terms). An immutable value (``add`` returns
    the next one); O(1) memory."""

    prior: float
    prior_evals: float
    last: tuple[float, ...] = ()  # the last three evals
    sum_sq: float = 0.0
    n: int = 0

    def add(self, y: float) -> NoiseLevel:
        last, sum_sq, n = self.last, self.sum_sq, self.n
        if len(last) == 3:
            d = third_difference(last[0], last[1], last[2], y)
            sum_sq, n = sum_sq + d * d / 20.0, n + 1
        return NoiseLevel(self.prior, self.prior_evals, _push(last, y, 3), sum_sq, n)

    @property
    def sigma(self) -> float:
        return pooled_sigma(self.prior, self.prior_evals, self.sum_sq, self.n)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


class RelativeNoiseLevel(NamedTuple):
    """Online eval-noise level of one job in the job's own units: third differences of consecutive
    evals (as :class:`NoiseLevel`) pooled with a prior of ``rel`` times the range of the evals so far
    (max - min), worth ``prior_evals`` terms. Under ``a * score + b`` (a > 0) the level scales by
    ``a``: rules that measure in its units are invariant. An immutable value; O(1) memory.

    The sum of squared differences is kept in units of the current range (rescaled when the range
    grows; a third difference is at most 8 ranges), so nothing overflows or underflows to a zero
    level while the range is positive. ``sigma`` is 0 only while every eval so far is equal.
    """

    rel: float
    prior_evals: float
    last: tuple[float, ...] = ()  # the last three evals
    sum_sq: float = 0.0  # sum of (third difference / range)^2 / 20
    n: int = 0
    low: float = 0.0
    high: float = 0.0

    def add(self, y: float) -> RelativeNoiseLevel:
        last, sum_sq, n, low, high = self.last, self.sum_sq, self.n, self.low, self.high
        if not last and not n:
            low = high = y
        elif y < low or y > high:
            old = high - low
            low, high = min(low, y), max(high, y)
            if sum_sq:
                sum_sq *= (old / (high - low)) ** 2
        if len(last) == 3:
            rng = high - low
            if rng > 0:
                d = third_difference(last[0], last[1], last[2], y) / rng  # |d| <= 8
                sum_sq += d * d / 20.0
            n += 1
        return RelativeNoiseLevel(self.rel, self.prior_evals, _push(last, y, 3), sum_sq, n, low, high)

    @property
    def range(self) -> float:
        return self.high - self.low

    @property
    def relative_sigma(self) -> float:
        """The noise level in units of the range (at least ``rel * sqrt(prior_evals / dof)`` > 0)."""
        return pooled_sigma(self.rel, self.prior_evals, self.sum_sq, self.n)

    @property
    def sigma(self) -> float:
        return self.relative_sigma * (self.high - self.low)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


def _check_noise(noise_prior: Any, noise_rel: Any, prior_evals: Any) -> NoiseLevel | RelativeNoiseLevel:
    """The noise level of a rule before any eval: absolute (``noise_prior`` in score units) when
    ``noise_prior`` is set, otherwise relative (``noise_rel`` of the range of the job's evals)."""
    evals = _check_number("prior_evals", prior_evals, MIN_PRIOR_EVALS, MAX_PRIOR_EVALS)
    rel = _check_number("noise_rel", noise_rel, MIN_NOISE_REL, MAX_NOISE_REL)
    if noise_prior is None:
        return RelativeNoiseLevel(rel, evals)
    return NoiseLevel(_check_number("noise_prior", noise_prior, MIN_NOISE_PRIOR, MAX_NOISE_PRIOR), evals)


_NO_SCALE = "every eval so far is equal: no noise scale yet"


class _NoisyDetector(Detector):
    """Base of the noise-robust rules: a ``window`` of recent evals (at least ``min_window``), the
    eval noise estimated online (:class:`NoiseLevel`; ``noise`` is its value before any eval),
    scores signed so that higher is better."""

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

    @staticmethod
    def _level(noise: NoiseLevel | RelativeNoiseLevel, obs: Observed) -> tuple[float, float]:
        """(sigma, dof): the eval's own paired noise level when it carries one (with ``eval_n - 1``
        degrees of freedom), else the job's estimate. A supplied level is floored at a millionth of
        the estimate, which keeps every statistic finite."""
        supplied = obs.eval_noise
        if not supplied:
            return noise.sigma, noise.dof
        n = obs.eval_n
        return max(supplied, 1e-6 * noise.sigma), (n - 1.0 if n and n > 1 else noise.dof)


class DropDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the mean of the last ``window`` evals lies significantly below
    the best earlier ``window``-eval mean: ``(best - now) / (sigma * sqrt(2 / window))`` above
    ``z`` (widened for an estimated sigma, :func:`t_threshold`). Sigma, the eval noise level, is
    estimated online from the job's own evals with a prior of ``noise_rel`` times their range
    (:class:`RelativeNoiseLevel`), worth ``prior_evals`` evals; an absolute ``noise_prior`` in score
    units (:class:`NoiseLevel`, the behaviour before issue 18) replaces it when set. State: the noise
    level, the last ``window`` evals, the ``window`` before those and the best earlier mean.
    Reports without an eval are skipped.
    """

    name = "drop"
    tuning = MappingProxyType({"z": (0.8, 1.1, 1.4, 2.0, 2.8)})

    def __init__(self, window: int = 2, z: float = 1.4, noise_prior: float | None = None,
                 noise_rel: float = DROP_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, (), (), None

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, now, before, ref = rule
        y = self._signed(obs.eval_score)
        noise = noise.add(y)
        w = self.window
        if len(now) == w:
            before, now = _push(before, now[0], w), now[1:]
        now = (*now, y)
        if len(before) < w:
            return (noise, now, before, ref), _continue(f"{len(before) + len(now)} eval(s), need {2 * w}",
                                                        best_step, best_score)
        earlier = sum(before) / w
        ref = earlier if ref is None else max(ref, earlier)
        rule = noise, now, before, ref
        mean = sum(now) / w
        sigma, dof = self._level(noise, obs)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        stat = (ref - mean) / (sigma * math.sqrt(2.0 / w))
        threshold = t_threshold(self.z, dof)
        evidence = {"z": stat, "threshold": threshold, "sigma": sigma, "drop": self._sign * (ref - mean)}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"mean of the last {w} evals is {_fmt(abs(ref - mean))} below the best {w}-eval mean "
                f"({_fmt(stat)} noise units > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)}", best_step, best_score,
                               **evidence)


class TrendDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the least-squares slope of the last ``window`` evals (against
    their steps) is significantly negative: ``-slope / se`` above ``z`` (widened for an estimated
    sigma), with ``se = sigma / sqrt(Sxx)`` and sigma estimated online as in :class:`DropDetector`
    (``noise_rel`` / ``noise_prior``). State: the noise level and the last ``window`` evals.
    """

    name = "trend"
    tuning = MappingProxyType({"z": (0.8, 1.1, 1.5, 2.0, 2.8)})

    def __init__(self, window: int = 5, z: float = 1.1, noise_prior: float | None = None,
                 noise_rel: float = TREND_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 2, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, ()

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, recent = rule
        y = self._signed(obs.eval_score)
        rule = noise, recent = noise.add(y), _push(recent, (obs.step, y), self.window)
        if len(recent) < self.window:
            return rule, _continue(f"{len(recent)} eval(s), need {self.window}", best_step, best_score)
        slope, sxx = least_squares_slope(recent)
        if sxx <= 0:
            return rule, _continue("all evals in the window share one step", best_step, best_score)
        sigma, dof = self._level(noise, obs)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        stat = -slope * math.sqrt(sxx) / sigma
        threshold = t_threshold(self.z, dof)
        evidence = {"t": stat, "threshold": threshold, "sigma": sigma, "slope": self._sign * slope}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"the last {self.window} evals fall (slope {_fmt(self._sign * slope)} per step, "
                f"t = {_fmt(stat)} > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"trend t = {_fmt(-stat)} (stop below {_fmt(-threshold)})", best_step, best_score,
                               **evidence)


#: Relative margin of :func:`exceeds`: far below any real difference, far above rounding.
_TIE_REL = 1e-9


def exceeds(stat: float, threshold: float) -> bool:
    """Whether a statistic in noise units is above its threshold, a tie (equal up to rounding) not.

    Scores on a grid (k/n win rates, judge scores in eighths) can put a statistic exactly on its
    threshold; the rounding then differs per unit (3.5 vs 3.5000000000000018), and so would the
    decision. A relative margin of 1e-9 makes a tie the same decision in every unit.

    >>> exceeds(3.5000000000000018, 3.5), exceeds(3.51, 3.5)
    (False, True)
    """
    return stat > threshold + _TIE_REL * max(1.0, abs(threshold))


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
    (``noise_rel`` / ``noise_prior``). State: the noise level, the last ``window`` scores, the best
    mean and the sum.
    """

    name = "cusum"
    tuning = MappingProxyType({"threshold": (2.0, 2.75, 3.5, 4.5, 6.0)})

    def __init__(self, window: int = 2, drift: float = 0.25, threshold: float = 3.5, noise_prior: float | None = None,
                 noise_rel: float = CUSUM_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.drift = _check_number("drift", drift, 0.0, MAX_Z)
        self.threshold = _check_number("threshold", threshold, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, (), None, 0.0

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, recent, ref, total = rule
        y = self._signed(obs.eval_score)
        noise = noise.add(y)
        sigma = self._level(noise, obs)[0]
        if ref is not None:
            total = max(0.0, total + ((ref - y) / sigma if sigma > 0 else 0.0) - self.drift)
        recent = _push(recent, y, self.window)
        if len(recent) == self.window:
            mean = sum(recent) / self.window
            ref = mean if ref is None else max(ref, mean)
        rule = noise, recent, ref, total
        evidence = {"cusum": total, "threshold": self.threshold, "sigma": sigma}
        if exceeds(total, self.threshold):
            return rule, _stop(f"accumulated shortfall below the best {self.window}-eval mean "
                               f"{_fmt(total)} noise units > {_fmt(self.threshold)} (noise {_fmt(sigma)}) "
                               f"at step {obs.step}", best_step, best_score, **evidence)
        return rule, _continue(f"cusum {_fmt(total)} <= {_fmt(self.threshold)}", best_step, best_score, **evidence)


class _Sequential(NamedTuple):
    """:class:`SequentialDetector`'s state."""

    recent: tuple[float, ...] = ()  # the last 2 * window evals (signed)
    diffs: tuple[float, ...] = ()  # their third differences
    low: float = 0.0
    high: float = 0.0
    best: float | None = None  # best w-mean that ended before the last w evals
    w: int = 0  # the run length ``best`` was built for
    looks: int = 0


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
    ``2 w``). State: ``4 * window`` numbers; work per report O(window). Reports without an eval are
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
    tuning = MappingProxyType({"z": (0.5, 0.75, 1.0, 1.5, 2.0)})

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

    def _start(self) -> _Sequential:
        return _Sequential()

    def run_length(self, looks: int, progress: float | None) -> int:
        """Evals per ``span`` of training, from the evals so far and the progress (1 without)."""
        if progress is None or progress <= 0:
            return 1
        if self.span * looks >= self.window * progress:
            return self.window
        # half up, with a tolerance for the rounding of looks / progress: with evenly spaced evals
        # 0.15 * 7 / 0.7 is 1.5000000000000002 and 0.15 * 4 / 0.4 is 1.4999999999999998, and w must
        # not flip between 1 and 2 from one eval to the next
        return max(1, int(self.span * looks / progress + 0.5 + 1e-9))

    @staticmethod
    def _reference(recent: tuple[float, ...], w: int, kept: int, best: float | None) -> float | None:
        """The best earlier ``w``-mean: rebuilt from the evals in memory when the cadence changed
        (or at the first eval), else updated with the ``w``-mean that ended ``w`` evals ago."""
        if w != kept:
            best = None
            prefix = [0.0]
            for v in recent:  # running sums: O(window) even if the cadence changes at every report
                prefix.append(prefix[-1] + v)
            for end in range(w, len(prefix) - w):
                m = (prefix[end] - prefix[end - w]) / w
                best = m if best is None or m > best else best
        elif len(recent) >= 2 * w:
            m = sum(recent[-2 * w:-w]) / w
            best = m if best is None or m > best else best
        return best

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        recent, diffs, low, high, best, kept, looks = rule
        y = self._sign * obs.eval_score
        if not -SATURATION <= y <= SATURATION:
            y = math.copysign(SATURATION, y)
        size = 2 * self.window
        if len(recent) >= 3:
            diffs = _push(diffs, third_difference(recent[-3], recent[-2], recent[-1], y), size)
        if not looks:
            low = high = y
        elif y < low:
            low = y
        elif y > high:
            high = y
        recent = _push(recent, y, size)
        n = looks = looks + 1
        w = self.run_length(looks, obs.progress)
        best = self._reference(recent, w, kept, best)
        rule = _Sequential(recent, diffs, low, high, best, w, looks)
        if n < self.min_evals or n < 2 * w or best is None or not diffs:
            return rule, _continue(f"{n} eval(s), need {max(self.min_evals, 2 * w, 4)}", best_step, best_score)
        rng = high - low
        k = len(diffs)
        if obs.eval_noise is None:
            sigma = max(self.noise_rel * rng, math.sqrt(sum(d * d for d in diffs) / (20.0 * k)))
        else:  # the eval's own paired noise level, on eval_n - 1 degrees of freedom
            sigma = max(self.noise_rel * rng, obs.eval_noise)
            k = max(k, obs.eval_n - 1 if obs.eval_n else 0)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        now = sum(recent[-w:]) / w
        stat = (best - now) / (sigma * math.sqrt(2.0 / w))
        threshold = t_quantile(self.z, k) + math.sqrt(2.0 * math.log(n / w))
        evidence = {"stat": stat, "threshold": threshold, "sigma": sigma, "run": w, "looks": n}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"mean of the last {w} eval(s) is {_fmt(stat)} noise units below the best earlier {w}-eval mean "
                f"(> {_fmt(threshold)} after {n} looks; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)} after {n} looks", best_step,
                               best_score, **evidence)


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
    tuning = MappingProxyType({})

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        return rule, _continue("never stops", best_step, best_score)


#: the detector of a policy that names none: the paper's rule
DEFAULT_DETECTOR = "decline"
#: the detector recommended to new users (the README and ``evalstop replay --help`` say so; tests/test_readme.py)
RECOMMENDED_DETECTOR = "sequential"

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
