"""The vocabulary every rule shares: observations, decisions, the detector base class, its state,
the checks of parameters and values."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol


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
    kl: float | None = None


#: The most examples one eval may be a mean of (a count a caller sends is bounded like every number)
MAX_EXAMPLES = 10**9
_SQRT2 = math.sqrt(2.0)


class Observation(_ObservationFields):
    """What a detector may see about one report of one job (immutable; validated on creation).

    ``progress`` is step / planned steps (None when unknown). ``eval_n`` and ``eval_noise``: the
    eval's number of examples and its paired noise level (the module's "per-example evidence";
    None when the eval is a plain number). ``kl``: the policy's KL to its reference model (a
    KL-clock gate reads it). Building one checks every number (ValueError for NaN,
    infinity, a negative step or noise).
    """

    __slots__ = ()

    def __new__(cls, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
                proxy_reward: float | None = None, job_type: str = "rlhf", progress: float | None = None,
                eval_n: int | None = None, eval_noise: float | None = None, kl: float | None = None) -> Observation:
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
        check_finite("kl", kl)  # an estimate: slightly negative at times (the KL clock fits the positive ones)
        return tuple.__new__(cls, (job_id, step, eval_score, train_loss, proxy_reward, job_type, progress, eval_n,
                                   eval_noise, kl))


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
    @property
    def kl(self) -> float | None: ...


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

        >>> from evalstop_trl.core.detectors import create_detector
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


#: Where the noise-robust rules saturate a score, and ``loss_plateau`` a relative improvement: far
#: beyond any eval metric, and small enough that squares and sums of differences stay finite.
SATURATION = 1e100


class Gate(Detector):
    """A rule whose stops stand only when the run's logged evidence agrees (a policy's ``gate``).

    The rule decides as alone; when it decides STOP, :meth:`_check` reads the gate's own state (what it
    kept of the reports so far, :meth:`_see`): None when the run logs nothing the gate reads (the rule's
    stop stands: evidence is never required), else whether the stop stands, a clause for the reason and
    the evidence. A held stop is a CONTINUE saying why and what the rule would have done; the rule must
    decide a stop again later. Its state: the rule's, then the gate's."""

    #: how a held stop's reason names the gate ("held by the KL gate (...)")
    label: str = "gate"

    def __init__(self, rule: Detector) -> None:
        super().__init__(rule.direction)
        self.rule = rule
        self.name = rule.name

    def _start(self) -> Any:
        return (self.rule._start(), self._start_gate())

    def _start_gate(self) -> Any:
        """The gate's own state before any report."""
        return ()

    @abstractmethod
    def _see(self, own: Any, obs: Observed, best_step: int | None) -> Any:
        """The gate's state after one report (``best_step``: the best-so-far including this report)."""

    @abstractmethod
    def _check(self, own: Any, obs: Observed) -> tuple[bool, str, dict[str, Any]] | None:
        """At the rule's stop: (stands, the clause saying why, the evidence), or None without evidence."""

    def _decide(self, state: Any, obs: Observed, best_step: int | None,
                best_score: float | None) -> tuple[Any, Decision]:
        inner, own = state
        own = self._see(own, obs, best_step)
        inner, decision = self.rule._decide(inner, obs, best_step, best_score)
        if decision.action is not Action.STOP:
            return (inner, own), decision
        verdict = self._check(own, obs)
        if verdict is None:
            return (inner, own), decision  # nothing logged that the gate reads: the rule's own answer
        stands, why, evidence = verdict
        if stands:
            return (inner, own), _stop(f"{decision.reason}; {why}", best_step, best_score,
                                       **decision.evidence, **evidence)
        return (inner, own), Decision(Action.CONTINUE, f"held by the {self.label} ({why}); the rule would stop: "
                                      f"{decision.reason}", best_step, best_score,
                                      MappingProxyType({"held": True, **evidence}))
