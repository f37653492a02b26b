"""``EvalStopSession``: EvalStop's deciding side for one job, without a trainer (no torch, no transformers).

A session talks to the coordinator through a client: it registers the job (or attaches to it as a new
attempt), reports each world-feedback eval with the train loss and proxy reward of the same step,
acknowledges a stop and marks the job finished or failed. It keeps the best (step, score, checkpoint),
counts failed evals and builds the ``evalstop/*`` metrics of each eval. It fails open: a coordinator
that errors or cannot be reached never crashes training (``fail_mode="local"``: a local detector with
the same policy decides meanwhile; ``"open"``: no stop).

The ``EvalStopCallback`` adapters call it from a trainer's events; a custom training loop can call it
directly::

    >>> from evalstop_trl.clients.embedded import EmbeddedClient
    >>> from evalstop_trl.core.coordinator import Coordinator
    >>> session = EvalStopSession(SessionConfig.build("decline", k=2))
    >>> session.attach(EmbeddedClient(Coordinator()), "my-run")
    >>> [session.report(step, score) for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.4)]]
    [False, False, False, True]
    >>> session.best_step, session.best_score
    (20, 0.7)
    >>> session.stop_here(40)  # acknowledges the stop, logs why

A failed eval is a missing one: ``session.evals.accept(step, value)`` gives the float score, or None
after counting the failure (``session.evals.failed(step, what, exc)`` for an exception).

The job stays alive between evals: ``session.beat()`` (the callback calls it at every step) sends a
heartbeat at most every ``heartbeat_s`` seconds (5), so a long gap between evals never makes a healthy
run ``lost``; a heartbeat that fails is logged once and never raised. The answer carries the job's
status: a stop decided between evals (a manual stop from the dashboard or ``POST /v1/jobs/ID/stop``)
reaches the trainer within one heartbeat (``beat()`` returns True).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..core.detectors import DETECTORS, Action, Decision, Detector, Observation, is_better
from ..core.errors import Conflict, EvalStopError, InvalidInput, NotFound
from ..core.examples import evidence_keys
from ..core.job import SHADOW_REASON, shadowed
from ..core.klclock import KL_KEYS
from ..core.labels import check_hparams, check_tags
from ..core.logged import LENGTH_KEYS, LOSS_KEYS, REWARD_KEYS, read_logged
from ..core.records import Report
from .ranks import RankMessage
from .scores import finite, to_number

#: where a per-example eval's evidence is logged beside evalstop/score (the readers look there)
_N_KEY, _NOISE_KEY = evidence_keys("evalstop/score") or ()

__all__ = ["DEFAULT_HEARTBEAT_S", "EvalFailures", "EvalStopSession", "Heartbeat", "SessionConfig", "infer_direction",
           "KL_KEYS", "LENGTH_KEYS", "LOSS_KEYS", "REWARD_KEYS"]

log = logging.getLogger("evalstop.callback")

_LOSS_LIKE = re.compile(r"(loss|perplexity|ppl|error|err|wer|cer)(\b|_|$)", re.IGNORECASE)
_EVAL_ERRORS = ("skip", "stop", "raise")
_FAIL_MODES = ("local", "open")
_DIRECTIONS = ("max", "min")
#: Seconds between heartbeats while training: a stop decided between evals (a manual stop, a stop an
#: external evaluator's score caused) reaches the trainer within this; the coordinator writes a
#: heartbeat at most once per eighth of its lease, so frequent ones stay cheap.
DEFAULT_HEARTBEAT_S = 5.0


def infer_direction(metric: str) -> str:
    """``"min"`` for loss-like metric names (loss, perplexity, error, ...), else ``"max"``.

    >>> infer_direction("eval_loss"), infer_direction("eval_reward")
    ('min', 'max')
    """
    return "min" if _LOSS_LIKE.search(metric) else "max"


@dataclass(frozen=True)
class SessionConfig:
    """The stop rule, and what to do when evals fail or the coordinator is away. Validated on creation.

    Attributes:
        detector, params: the stop rule, ``create_detector(detector, **params)``.
        direction: ``"max"`` (higher scores are better) or ``"min"``.
        job_type: ``rlhf``, ``grpo``, ``rloo``, ``dpo``, ``online_dpo``, ``sft``, ...; None: unspecified (the
            job keeps the type it has; a new job is ``rlhf`` unless :meth:`EvalStopSession.attach` is told one).
        max_eval_failures, on_eval_error: after this many failed evals in a row, ``"skip"`` (go on),
            ``"stop"`` (stop the job) or ``"raise"``.
        fail_mode: ``"local"`` (a local detector decides while the coordinator is unreachable) or
            ``"open"`` (never stop then).

    Raises:
        ValueError: an unknown detector or parameter (the message lists the valid ones), a value out
            of range, or an option not among its allowed values.
    """

    detector: str = "decline"
    params: Mapping[str, Any] = field(default_factory=dict)
    direction: str = "max"
    job_type: str | None = None
    max_eval_failures: int = 3
    on_eval_error: str = "skip"
    fail_mode: str = "local"
    shadow: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)  # user tags, stored with the job (core.labels)
    hparams: Mapping[str, Any] = field(default_factory=dict)  # the trainer's hyperparameters (train.hparams)
    stop_on: tuple[str, ...] = ("hacked",)  # add "converged" to also stop plateaus (core.records.StopKind)
    gate: str | None = None  # a name in core.detectors.GATES: a stop stands only when the run's evidence agrees

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        object.__setattr__(self, "stop_on", tuple(self.stop_on) if isinstance(self.stop_on, (list, tuple))
                           else self.stop_on)
        try:
            object.__setattr__(self, "tags", check_tags(self.tags))
            object.__setattr__(self, "hparams", check_hparams(self.hparams))
        except InvalidInput as exc:
            raise ValueError(f"EvalStopCallback: {exc}") from None
        for name, value, allowed in (("on_eval_error", self.on_eval_error, _EVAL_ERRORS),
                                     ("fail_mode", self.fail_mode, _FAIL_MODES),
                                     ("direction", self.direction, _DIRECTIONS)):
            if value not in allowed:
                raise ValueError(f"EvalStopCallback: {name} must be one of {', '.join(allowed)}, but got {value!r}.")
        n = self.max_eval_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"EvalStopCallback: max_eval_failures must be an integer >= 1, got {n!r}.")
        self.new_detector()  # unknown parameters, bad values: ValueError now, not at the first eval

    def __reduce__(self) -> tuple[Any, ...]:  # picklable: the read-only params view is not
        return SessionConfig, (self.detector, dict(self.params), self.direction, self.job_type,
                               self.max_eval_failures, self.on_eval_error, self.fail_mode, self.shadow,
                               dict(self.tags), dict(self.hparams), self.stop_on, self.gate)

    @classmethod
    def build(cls, detector: str = "decline", *, k: int = 2, min_delta: float = 0.0, direction: str | None = None,
              job_type: str | None = None, max_eval_failures: int = 3, on_eval_error: str = "skip",
              fail_mode: str = "local", shadow: bool = False, tags: Mapping[str, Any] | None = None,
              **detector_params: Any) -> SessionConfig:
        """A config from ``EvalStopCallback``'s conveniences: ``k``, ``min_delta`` and ``direction`` go to
        the detectors that take them; ``detector_params`` to the detector as they are."""
        accepted = DETECTORS.params(detector)  # ValueError listing the valid names
        params = {n: v for n, v in (("k", k), ("min_delta", min_delta), ("direction", direction))
                  if n in accepted and v is not None}
        stop_on = detector_params.pop("stop_on", ("hacked",))  # the policy's, not the detector's
        gate = detector_params.pop("gate", None)
        params.update(detector_params)
        return cls(detector, params, params.get("direction", direction or "max"), job_type, max_eval_failures,
                   on_eval_error, fail_mode, bool(shadow), tags or {}, stop_on=stop_on, gate=gate)

    @property
    def policy(self) -> dict[str, Any]:
        """The policy registered with the job (``mode`` only for shadow: else the tenant's default)."""
        return {"detector": self.detector, **self.params, **({"mode": "shadow"} if self.shadow else {}),
                **({"stop_on": list(self.stop_on)} if tuple(self.stop_on) != ("hacked",) else {}),
                **({"gate": self.gate} if self.gate is not None else {})}

    def new_detector(self) -> Detector:
        """A fresh detector with this stop rule (the local one of ``fail_mode="local"``), and the
        policy's ``stop_on``."""
        from ..core.records import Policy

        try:
            return Policy.from_dict({k: v for k, v in self.policy.items() if k != "mode"}).build()
        except InvalidInput as exc:
            raise ValueError(f"EvalStopCallback: {exc}") from None


class EvalFailures:
    """Failed evals (an exception, NaN, None: a missing eval for the detector), each logged at WARNING
    (the traceback with the first of a run of failures). After ``limit`` in a row, ``on_error`` says
    what happens: ``"skip"`` (nothing), ``"stop"`` (:attr:`exhausted` turns True) or ``"raise"``
    (:meth:`failed` raises).

    Attributes:
        count: failed evals in a row; total: failed evals in this process (``evalstop/eval_failures``).

    >>> evals = EvalFailures(limit=2, on_error="stop")
    >>> evals.accept(10, float("nan")), evals.accept(20, None), evals.exhausted
    (None, None, True)
    >>> evals.accept(30, 0.5), evals.count, evals.total
    (0.5, 0, 2)
    """

    def __init__(self, limit: int = 3, on_error: str = "skip") -> None:
        self.limit, self.on_error = limit, on_error
        self.count = 0
        self.total = 0

    @property
    def exhausted(self) -> bool:
        """``limit`` failures in a row with ``on_error="stop"``: the job should stop."""
        return self.count >= self.limit and self.on_error == "stop"

    def accept(self, step: int, value: Any, what: str = "the score") -> float | None:
        """``value`` (a number, numpy or torch scalar) as a float score, or None for a failed eval."""
        value = to_number(value)
        if not finite(value):
            return self.failed(step, f"{what} is {value!r}")
        self.count = 0
        return float(value)

    def failed(self, step: int, what: str, exc: BaseException | None = None) -> None:
        """Count a failed eval; returns None (the missing score).

        Raises:
            RuntimeError: ``limit`` failures in a row with ``on_error="raise"``.
        """
        self.count += 1
        self.total += 1
        log.warning("EvalStop: the eval at step %d failed (%s); counted as a missing eval (%d in a row, "
                    "on_eval_error=%r after %d)", step, what, self.count, self.on_error, self.limit,
                    exc_info=exc if self.count == 1 else None)
        if self.count >= self.limit and self.on_error == "raise":
            raise RuntimeError(f"EvalStopCallback: {self.count} evals in a row failed (last: {what})") from exc


class Heartbeat:
    """Renews a job's lease at most every ``every_s`` seconds (a report renews it too: :meth:`seen`).
    Fail-open: an error (a coordinator that is away, an older one without heartbeats) is logged once
    at WARNING, then at DEBUG, and never raised; while the HTTP client is in an outage nothing is sent.

    Args:
        every_s: seconds between heartbeats; None or 0: none.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, every_s: float | None = DEFAULT_HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if every_s is not None and (isinstance(every_s, bool) or not isinstance(every_s, (int, float))
                                    or every_s < 0):
            raise ValueError(f"EvalStopCallback: heartbeat_s must be None or a number of seconds >= 0, "
                             f"but got {every_s!r}.")
        self.every_s, self.clock = every_s or None, clock
        self.last: float | None = None
        self.sent = 0
        self._warned = False

    def seen(self) -> None:
        """The coordinator just heard from the job (a registration, a report): the lease is fresh."""
        self.last = self.clock()

    def beat(self, client: Any, job_id: str) -> Any:
        """Send a heartbeat if one is due; returns the job's view when one was sent and answered (None:
        not due, or not answered)."""
        now = self.clock()
        if self.every_s is None or (self.last is not None and now - self.last < self.every_s):
            return None
        self.last = now
        if getattr(client, "unreachable", False):
            return None
        try:
            view = client.heartbeat(job_id)
        except Exception as exc:  # noqa: BLE001 - liveness must never cost the run
            if not self._warned:
                self._warned = True
                log.warning("EvalStop: could not send a heartbeat for job %s (%s: %s); training goes on "
                            "(said once)", job_id, type(exc).__name__, exc)
            else:
                log.debug("EvalStop: heartbeat for job %s failed: %s", job_id, exc)
            return None
        self.sent += 1
        return view


class ShadowMode:
    """A session's shadow mode (``SessionConfig.shadow``, or the job's policy when its tenant's default
    is shadow): a stop, the local detector's too, is only recorded; the first one is logged once, and
    every later decision's reason names it (a later decline does not hide why the run would have stopped).

    Attributes:
        on: shadow mode applies; step, reason: the first would-stop eval's step and its reason.
    """

    __slots__ = ("on", "reason", "step")

    def __init__(self, on: bool) -> None:
        self.on = on
        self.step: int | None = None  # the step of the first would-stop eval
        self.reason: str | None = None

    def adopt(self, view: Any) -> None:
        """Take the job's mode and first would-stop from its view (None: not read)."""
        if view is not None:
            self.on = self.on or view.policy.get("mode") == "shadow"
            self.step = view.would_stop_step
            first = getattr(view, "would_stop", None)
            self.reason = None if first is None else SHADOW_REASON + first.reason

    def apply(self, step: int, decision: Decision) -> Decision:
        """The decision to act on: CONTINUE instead of a stop in shadow mode, naming the first would-stop."""
        if self.on and decision.action is Action.STOP:
            decision = shadowed(decision, self.step or step)
        would = decision.evidence.get("would_stop")
        if would is not None and self.step is None:
            self.step = would
            log.warning("EvalStop (shadow mode, not stopping): would stop at step %s: %s", would,
                        decision.reason.removeprefix(SHADOW_REASON))
        if self.step is None or decision.action is Action.STOP:
            return decision
        if self.reason is None:
            self.reason = decision.reason if decision.reason.startswith(SHADOW_REASON) else None
        if self.reason is None or decision.reason == self.reason:
            return decision
        return Decision(Action.CONTINUE, self.reason, decision.best_step, decision.best_score,
                        {**decision.evidence, "would_stop": self.step})


class EvalStopSession:
    """One job's decisions: what to report, whether to stop, which eval was the best.

    Only the main process attaches a client; the others keep the state rank 0 broadcasts
    (:meth:`message` / :meth:`adopt`).

    Args:
        config: the stop rule and failure handling.
        job_id: the job's id (or give it to :meth:`attach`).
        heartbeat_s: seconds between heartbeats sent by :meth:`beat` (None or 0: none; default: lease / 4).
        clock: monotonic seconds for the heartbeats (injected by tests).

    Attributes:
        decision: the latest decision (None before the first report).
        best_step, best_score, best_checkpoint: the best eval so far and where its model is kept.
        final_checkpoint, nothing_kept: at a stop before any scored eval, where the model of the stop's
            step is kept (set by the callback), or why nothing is; said by :meth:`stop_here`.
        history: this process's reports (``step``, ``eval_score``, ``train_loss``, ``proxy_reward``,
            ``checkpoint`` on a new best, ``eval_n`` and ``eval_noise`` for a per-example eval), oldest first.
        stopped_at: the step training stopped at, if it did.
        attempt: 1 for a new job, 2 when attaching to a job with stored reports.
        stop_lag: with external evals, the steps trained after the eval that decided the stop.
        evals: failed evals in a row (:class:`EvalFailures`; ``evals.accept(step, value)`` counts one).
        train_loss, proxy_reward: the latest of each seen in the trainer's logs (:meth:`observe_logs`).
    """

    def __init__(self, config: SessionConfig, job_id: str | None = None, *,
                 heartbeat_s: float | None = DEFAULT_HEARTBEAT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.job_id = job_id
        self.client: Any = None
        self.decision: Decision | None = None
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_checkpoint: str | None = None
        self.final_checkpoint: str | None = None
        self.nothing_kept: str | None = None
        self.history: list[dict[str, Any]] = []
        self.stopped_at: int | None = None
        self.attempt = 0
        self.stop_lag: int | None = None
        self.evals = EvalFailures(config.max_eval_failures, config.on_eval_error)
        self.ended = False
        self.train_loss: float | None = None
        self.proxy_reward: float | None = None
        self.kl: float | None = None
        self.length: float | None = None  # the latest mean completion length logged (LENGTH_KEYS)
        self.heartbeat = Heartbeat(heartbeat_s, clock)
        self._local = config.new_detector()
        self._gave_up = False
        self.shadow = ShadowMode(config.shadow)

    # ------------------------------------------------------------------ the job
    def attach(self, client: Any, job_id: str | None = None, *, step: int = 0, planned_steps: int | None = None,
               job_type: str | None = None) -> None:
        """Register the job, or attach to it; the coordinator's history is the truth.

        Whoever registered the job first (``evalstop run``, an evaluator), the session adopts it and fills
        in what it knows: ``planned_steps`` (a changed one is an extended plan, audited ``amended``), the
        job type (``job_type``: inferred from the trainer, used when the config names none; it yields to
        the job's own specific type), the policy while no report was decided. A run at step 0 on a job
        with reports is a new run: the next free id (``NAME-2``, ...; see :func:`free_job_id`). A resumed
        run (``step`` > 0, or a restored history) attaches as a new attempt and reports its history again.

        Raises:
            ValueError: another job has this id (another specific job type, or another policy once its
                reports were decided; see :func:`register`).
        """
        self.client = client
        self.job_id = job_id or self.job_id
        if not self.job_id:
            raise ValueError("EvalStopSession.attach needs a job_id.")
        if step == 0 and not self.history:
            self.job_id = free_job_id(client, self.job_id)
        view = register(client, self.job_id, self.config, planned_steps, job_type)
        self.heartbeat.seen()
        self.attempt = 1 if view is None or not view.n_reports else 2
        for entry in self.history:
            self._send(entry)
        stored: list[Any] = []
        if view is not None:
            try:
                view = client.status(self.job_id)
                stored = client.reports(self.job_id)
            except EvalStopError as exc:
                log.warning("EvalStop: could not read job %r's history (%s); going on with what this process has",
                            self.job_id, exc)
        self.shadow.adopt(view)
        if view is not None and view.best_step is not None:
            self.best_step, self.best_score, self.best_checkpoint = view.best_step, view.best_score, view.best_checkpoint
            self.decision = view.decision
        self._local = self.config.new_detector()
        for r in stored or [_as_report(h) for h in self.history]:
            self._local.observe(Observation(self.job_id, r.step, r.eval_score, r.train_loss, r.proxy_reward,
                                            eval_n=r.eval_n, eval_noise=r.eval_noise, kl=r.kl))
        if view is not None and view.n_reports and step:
            log.info("EvalStop: job %r resumed at step %d (attempt with %d stored reports, best step %s)",
                     self.job_id, step, view.n_reports, self.best_step)

    def finish(self) -> None:
        """Training ended: mark the job finished (unless it was stopped)."""
        self.ended = True
        if self.client is not None and self.stopped_at is None:
            self._safely("mark the job finished", self.client.finish, self.job_id)

    def beat(self) -> bool:
        """Renew the job's lease if a heartbeat is due (see :class:`Heartbeat`); nothing once training
        ended or stopped, or without a client (the other ranks). Returns whether the answer says the
        job was stopped meanwhile (a manual stop, a stop between evals): its decision and best are
        then this session's, and the trainer should stop now (:meth:`stop_here`)."""
        if self.client is None or not self.job_id or self.ended or self.stopped_at is not None:
            return False
        view = self.heartbeat.beat(self.client, self.job_id)
        if view is None or view.status != "stopped":  # a shadow job's detector never stops it: a stop is by hand
            return False
        self.decision = view.decision
        if view.best_step is not None:
            self.best_step, self.best_score = view.best_step, view.best_score
            self.best_checkpoint = view.best_checkpoint or self.best_checkpoint
        return True

    def fail_unfinished(self, reason: str) -> None:
        """Mark the job failed if training neither ended nor stopped (the process is exiting)."""
        if not self.ended and self.stopped_at is None and self.client is not None:
            self._safely("mark the job failed", self.client.fail, self.job_id, reason)

    # ------------------------------------------------------------------ signals and evals
    def observe_logs(self, logs: Mapping[str, Any]) -> None:
        """Remember the train loss, the proxy reward, the KL and the mean completion length of a trainer's
        log (reported with the next eval)."""
        for name, value in read_logged(logs).items():  # each of core.logged.LOGGED, an attribute of the same name
            setattr(self, name, value)

    def improves(self, score: float | None) -> bool:
        """Whether ``score`` beats the best so far (a new best model is worth keeping)."""
        if score is None:
            return False
        return self.best_score is None or is_better(score, self.best_score, self.config.direction)

    def report(self, step: int, score: float | None, checkpoint: str | None = None, eval_n: int | None = None,
               eval_noise: float | None = None, proxy_reward: float | None = None) -> bool:
        """Report the eval of ``step`` (None: failed) with the latest train loss and proxy reward;
        ``checkpoint``: where this eval's model is kept (on a new best); ``eval_n``, ``eval_noise``:
        the eval's per-example evidence (:mod:`evalstop_trl.core.examples`); ``proxy_reward``: the
        proxy's score of this eval's completions (``WorldFeedback.proxy``), reported instead of the
        trainer's logged reward. Returns whether to stop."""
        proxy = proxy_reward if proxy_reward is not None else self.proxy_reward
        entry: dict[str, Any] = {"step": step, "eval_score": score, "train_loss": self.train_loss,
                                 "proxy_reward": proxy}
        for key, value in (("checkpoint", checkpoint), ("eval_n", eval_n), ("eval_noise", eval_noise), ("kl", self.kl),
                           ("length", self.length)):
            if value is not None:
                entry[key] = value
        improves = self.improves(score)
        decision, reached = self._send(entry)
        if reached:
            self.heartbeat.seen()
        local = self._local.observe(Observation(self.job_id or "job", step, score, self.train_loss, proxy,
                                                eval_n=eval_n, eval_noise=eval_noise, kl=self.kl))
        if (not reached or getattr(self.client, "unreachable", False)) and self.config.fail_mode == "local":
            decision = local
        if self.shadow.on and local.action is Action.STOP:
            self._local.resume_series()
        decision = self.shadow.apply(step, decision)
        self.history.append(entry)
        self.decision = decision
        if decision.best_step is not None:
            self.best_step, self.best_score = decision.best_step, decision.best_score
        elif improves:
            self.best_step, self.best_score = step, score
        if improves and checkpoint:
            self.best_checkpoint = checkpoint
        if decision.action is Action.STOP:
            return True
        if score is None and self.evals.exhausted:
            self._give_up()
            return True
        return False

    def _send(self, entry: Mapping[str, Any]) -> tuple[Decision, bool]:
        """The coordinator's decision on ``entry``, and whether it answered (fail-open: never raises)."""
        if self.client is None:
            return Decision(Action.CONTINUE, "no coordinator attached"), False
        try:
            evidence = {k: entry[k] for k in ("eval_n", "eval_noise", "kl", "length") if k in entry}  # else as before
            return self.client.report(self.job_id, entry["step"], eval_score=entry["eval_score"],
                                      train_loss=entry.get("train_loss"), proxy_reward=entry.get("proxy_reward"),
                                      checkpoint=entry.get("checkpoint"), **evidence), True
        except Conflict as exc:  # a resumed run re-evaluating a step the coordinator already has
            log.warning("EvalStop: keeping the stored report for step %s (%s)", entry["step"], exc)
            try:
                return self.client.status(self.job_id).decision or Decision(Action.CONTINUE, "stored report kept"), True
            except EvalStopError:
                return Decision(Action.CONTINUE, "stored report kept"), True
        except EvalStopError as exc:
            log.warning("EvalStop: the coordinator refused the report of step %s (%s); deciding locally",
                        entry["step"], exc)
            return Decision(Action.CONTINUE, f"coordinator error: {exc} (fail-open)"), False

    def _give_up(self) -> None:
        reason = f"{self.evals.count} evals in a row failed (on_eval_error='stop')"
        self.decision = Decision(Action.STOP, reason, self.best_step, self.best_score)
        self._gave_up = True
        if self.client is not None:
            self._safely("record the stop", self.client.stop, self.job_id, reason)

    def publish_snapshot(self, step: int, path: str) -> None:
        """Publish the snapshot of ``step`` at ``path`` for external evaluators (with the latest train loss
        and proxy reward)."""
        if self.client is not None:
            self._safely("publish a snapshot", self.client.publish_snapshot, self.job_id, step, path, self.train_loss,
                         self.proxy_reward)

    # ------------------------------------------------------------------ between ranks
    def message(self, stop: bool = False) -> RankMessage:
        """What rank 0 tells the other ranks now."""
        return RankMessage(stop, self.decision, self.best_step, self.best_score, self.best_checkpoint, self.job_id)

    def adopt(self, message: RankMessage) -> None:
        """Take rank 0's decision, best and job id."""
        self.decision, self.best_step, self.best_score = message.decision, message.best_step, message.best_score
        self.best_checkpoint = message.best_checkpoint
        self.job_id = message.job_id or self.job_id

    # ------------------------------------------------------------------ stopping
    def stop_here(self, step: int) -> None:
        """Training stops at ``step``, the step of the deciding eval: acknowledge the stop and say why
        (on the main process)."""
        self.stopped_at = step
        if self.client is None:
            return
        if not self._gave_up:  # with the step trained to: the dashboard's last step of a job that ended
            self._safely("acknowledge the stop", self.client.ack, self.job_id,
                         self.best_checkpoint or self.final_checkpoint, step)
        log.warning("EvalStop: stopping at step %d: %s; best step %s (score %s), checkpoint %s", step,
                    self.decision.reason if self.decision else "", _shown(self.best_step),
                    _shown(self.best_score), self._kept(step))

    def _kept(self, step: int) -> str:
        """The stop line's checkpoint: the best's, else the model kept at the stop, else none and why."""
        if self.best_checkpoint is not None:
            return self.best_checkpoint
        if self.final_checkpoint is not None:
            return f"{self.final_checkpoint} (the model at step {step}: no eval scored one)"
        return f"none ({self.nothing_kept})" if self.nothing_kept else "none"

    def stop_after_external_eval(self, step: int, decided_at: int | None) -> None:
        """Training stops at ``step`` on a decision external evaluators made about ``decided_at``: record
        the stop lag, acknowledge with the step (the audit records the lag too) and say why."""
        self.stopped_at = step
        self.stop_lag = None if decided_at is None else max(0, step - decided_at)
        if self.client is None:
            return
        self._safely("acknowledge the stop", self.client.ack, self.job_id, self.best_checkpoint, step)
        log.warning("EvalStop: stopping at step %d (stop lag %s steps after the deciding eval): %s; best step "
                    "%s (score %s), snapshot %s", step, _shown(self.stop_lag),
                    self.decision.reason if self.decision else "", _shown(self.best_step), _shown(self.best_score),
                    _shown(self.best_checkpoint))

    # ------------------------------------------------------------------ what the trainer logs
    def eval_metrics(self, score: float | None, stop: bool, eval_n: int | None = None,
                     eval_noise: float | None = None) -> dict[str, float]:
        """The ``evalstop/*`` metrics of an eval (absent values left out); ``evalstop/eval_failures`` counts
        the failed evals of this process so far. A per-example eval adds its ``evalstop/eval_n`` and
        ``evalstop/eval_noise``: ``evalstop calibrate`` and ``evalstop replay`` read them from the
        trainer's logs and replay the rules with the same evidence."""
        evidence = self.decision.evidence if self.decision is not None else {}
        metrics = {"evalstop/score": score, "evalstop/best_score": self.best_score,
                   "evalstop/declines": evidence.get("declines", evidence.get("stale")), "evalstop/stop": int(stop),
                   "evalstop/eval_failures": self.evals.total,
                   "evalstop/would_stop": None if self.shadow.step is None else 1,
                   _N_KEY: eval_n if score is not None else None, _NOISE_KEY: eval_noise if score is not None else None}
        return {k: v for k, v in metrics.items() if v is not None}

    def log_eval(self, step: int, score: float | None) -> None:
        """One log line per eval: step, score, best, declines and the decision's reason."""
        declines = self.eval_metrics(score, False).get("evalstop/declines")
        log.info("EvalStop step %d: score %s, best %s (step %s), declines %s, %s", step,
                 "failed" if score is None else f"{score:.4g}", _shown(self.best_score), _shown(self.best_step),
                 _shown(declines), self.decision.reason if self.decision else "")

    def _safely(self, what: str, fn: Any, *args: Any) -> Any:
        """Call the client; a coordinator error is logged, never raised (fail-open)."""
        try:
            return fn(*args)
        except EvalStopError as exc:
            log.warning("EvalStop: could not %s for job %s: %s", what, self.job_id, exc)
            return None


def _shown(value: Any) -> str:
    """A value of a log line: ``none`` when missing (one spelling), a score to 4 significant digits."""
    if value is None:
        return "none"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def free_job_id(client: Any, job_id: str) -> str:
    """``job_id``, or the first of ``job_id-2``, ``job_id-3``, ... without reports when it has some (a
    fresh run on a used id is a new run). Existing jobs are only read, never amended; a coordinator that
    cannot be read leaves the id as it is (the registration decides)."""
    candidate, n = job_id, 2
    while True:
        try:
            view = client.status(candidate)
        except NotFound:
            break
        except EvalStopError:
            return job_id
        if not view.n_reports:
            break
        candidate, n = f"{job_id}-{n}", n + 1
    if candidate != job_id:
        log.warning("EvalStop: job %r already has reports and this run starts at step 0: it is a new run, "
                    "reported as %r", job_id, candidate)
    return candidate


def register(client: Any, job_id: str, config: SessionConfig, planned_steps: int | None,
             job_type: str | None) -> Any:
    """Register ``job_id`` or attach to it (the coordinator fills in or amends what differs); a job type
    only inferred from the trainer (``config.job_type`` None) yields to the job's own specific type.

    Raises:
        ValueError: the coordinator says it is another job (see :meth:`EvalStopSession.attach`).
    """
    policy, planned = config.policy, planned_steps or None
    types = [config.job_type] if config.job_type is not None else [job_type, None] if job_type else [None]
    labels = {k: dict(v) for k, v in (("tags", config.tags), ("hparams", config.hparams)) if v}  # said only if any
    for kind in types:
        try:
            return client.register_job(job_id, kind, planned_steps=planned, policy=policy, **labels)
        except Conflict as exc:
            conflict = exc
    raise ValueError(f"EvalStopCallback: job {job_id!r} is another job ({conflict}); pass another job_id "
                     "(or the job's own job_type and policy to resume it)") from None


def _as_report(entry: Mapping[str, Any]) -> Report:
    """A history entry seen as a stored report (to replay into the local detector)."""
    return Report(entry["step"], entry.get("eval_score"), entry.get("train_loss"), entry.get("proxy_reward"),
                  eval_n=entry.get("eval_n"), eval_noise=entry.get("eval_noise"), kl=entry.get("kl"),
                  length=entry.get("length"))
