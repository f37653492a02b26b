"""Where the score of an eval comes from, and when it is decided: one strategy per :class:`FeedbackMode`.

``EvalStopCallback`` is one class; it keeps a strategy (``callback.feedback``) chosen by its
``world_feedback`` and passes each trainer event on to it after the work every mode shares:

* :class:`CallableFeedback`: ``world_feedback(model, tokenizer)`` every ``eval_every`` steps;
* :class:`MetricFeedback`: a metric of the trainer's own evaluation, at each ``on_evaluate``;
* :class:`ExternalFeedback`: ``evalstop evaluate`` workers score the snapshots the run publishes.

A strategy holds its callback (``self.cb``) and uses only its public surface, :class:`Host`: the
options, the session, and ``decide`` / ``log_metrics`` for what every mode shares.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ..core.examples import ExampleEval, WorldFeedback, is_per_example, summarize
from .checkpoints import keep_best_snapshot
from .evaluation import evaluate_preserving_state
from .external import DecisionWatcher, keep_earlier_bests, prune_snapshots, snapshot_path
from .ranks import RankMessage, share
from .session import EvalStopSession, infer_direction

__all__ = ["FEEDBACKS", "CallableFeedback", "ExternalFeedback", "Eval", "Feedback", "FeedbackMode", "Host",
           "MetricFeedback"]


class FeedbackMode(str, Enum):
    """Where the world feedback comes from; each mode has its strategy in :data:`FEEDBACKS`."""

    CALLABLE = "callable"  # world_feedback(model, tokenizer) every eval_every steps
    METRIC = "metric"  # a metric of the trainer's own evaluation (on_evaluate)
    EXTERNAL = "external"  # `evalstop evaluate` workers score published snapshots

    @classmethod
    def of(cls, world_feedback: Any, external_eval: bool) -> FeedbackMode:
        """The mode of ``EvalStopCallback(world_feedback, external_eval=...)``.

        Raises:
            ValueError: no world feedback, or one that is neither a callable nor a metric name.
        """
        if external_eval:
            return cls.EXTERNAL
        if world_feedback is None:
            raise ValueError("EvalStopCallback needs world_feedback: a callable (model, tokenizer) -> float "
                             "or the name of an evaluation metric such as 'eval_reward'.")
        if callable(world_feedback):
            return cls.CALLABLE
        if isinstance(world_feedback, str) and world_feedback:
            return cls.METRIC
        raise ValueError(f"EvalStopCallback: world_feedback must be a callable or a metric name, "
                         f"but got {world_feedback!r}.")


@dataclass(frozen=True)
class Eval:
    """One world-feedback eval waiting for its decision (the model is kept if it is a new best);
    ``n`` and ``noise``: its per-example evidence (None for a plain score); ``proxy``: the proxy's
    score of the eval's completions (:class:`~evalstop_trl.core.examples.WorldFeedback`; None: the
    report carries the trainer's logged reward)."""

    step: int
    score: float | None
    model: Any
    tokenizer: Any
    n: int | None = None
    noise: float | None = None
    proxy: float | None = None


class Host(Protocol):
    """What a strategy uses of the ``EvalStopCallback`` that keeps it: its options, its session (the
    job, the best, the failed evals, the coordinator's client) and two methods for what every mode
    shares. All public; the callback documents each."""

    session: EvalStopSession
    world_feedback: Any
    eval_every: int | None
    eval_on_all_ranks: bool
    keep_snapshots: bool

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0."""

    @property
    def output_dir(self) -> str | None:
        """The trainer's ``output_dir`` (None before training)."""

    def decide(self, state: Any, control: Any, ev: Eval) -> dict[str, float]:
        """Report ``ev``, keep a new best, log the ``evalstop/*`` metrics, stop if told to; returns the metrics."""

    def log_metrics(self, state: Any, control: Any, step: int, metrics: Mapping[str, float]) -> None:
        """Log ``evalstop/*`` metrics of ``step`` where the trainer's logs go."""


def _check_every(eval_every: Any, what: str) -> None:
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"EvalStopCallback: eval_every must be an integer >= 1 with {what}, "
                         f"but got eval_every={eval_every!r}.")


class Feedback:
    """A mode's strategy; every hook does nothing unless the mode needs it. The callback calls
    :meth:`check` and :meth:`default_direction` before it builds one, and the ``on_*`` hooks from its
    trainer events (after what every mode does)."""

    #: Whether the callback stops at the next step when its heartbeat's answer says the job was stopped
    #: (the external mode's watcher learns every stop itself).
    stops_between_evals = True

    def __init__(self, cb: Host) -> None:
        self.cb = cb  # the EvalStopCallback this strategy decides for

    @staticmethod
    def check(world_feedback: Any, eval_every: Any) -> None:
        """Raise ValueError for options this mode cannot work with."""

    @staticmethod
    def default_direction(world_feedback: Any) -> str | None:
        """The direction when none is given (None: the detector's default)."""
        return "max"

    def check_args(self, args: Any) -> None:
        """Raise ValueError, before the job is registered, for training arguments this mode cannot work with."""

    def on_train_begin(self, args: Any, requested_job_id: str) -> None:
        """Training began and the job is attached (under ``requested_job_id`` or, for a rerun, ``NAME-2``)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step ended."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any]) -> None:
        """The trainer logged ``logs`` (the callback has read their loss and reward)."""

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any], **kwargs: Any) -> None:
        """The trainer's own evaluation produced ``metrics``."""

    def on_save(self, args: Any, state: Any, control: Any) -> None:
        """The trainer saved a checkpoint."""

    def on_train_end(self, args: Any, state: Any, control: Any) -> None:
        """Training ends (before the job is marked finished)."""


class CallableFeedback(Feedback):
    """``world_feedback(model, tokenizer)`` every ``eval_every`` steps, at the end of the step; the
    decision waits for that step's log (the report carries its loss and reward), or for the next step
    when the trainer logs nothing.

    ``world_feedback`` may return per-example scores (a sequence, an array, or a mapping example id
    -> score) instead of their mean: the report then carries the mean, the number of examples and
    the paired noise level against the previous eval on the examples both scored
    (:mod:`evalstop_trl.core.examples`); only the last eval's scores are kept."""

    def __init__(self, cb: Host) -> None:
        super().__init__(cb)
        self.pending: Eval | None = None
        self.examples: ExampleEval | None = None  # the last per-example eval (paired with the next)

    @staticmethod
    def check(world_feedback: Any, eval_every: Any) -> None:
        _check_every(eval_every, "a world_feedback callable")

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        cb = self.cb
        if self.pending is not None:  # the trainer did not log the last eval's step: decide without it
            self._decide_pending(state, control)
            if control.should_training_stop:
                return
        if state.global_step % cb.eval_every != 0:
            return
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        # sharded models (FSDP, ZeRO-3) need every rank in the forward pass: eval_on_all_ranks; rank 0's score counts
        evaluate = cb.is_main or cb.eval_on_all_ranks
        ev = self._evaluate(model, tokenizer, state.global_step) if evaluate else None
        score, n, noise, proxy = (None, None, None, None) if ev is None else ev
        self.pending = Eval(state.global_step, score, model, tokenizer, n, noise, proxy)
        control.should_log = True  # the report carries this step's loss and reward, from this step's log

    def on_log(self, args, state, control, logs):
        if self.pending is not None and self.pending.step == state.global_step:
            self._decide_pending(state, control)

    def on_train_end(self, args, state, control):
        self._decide_pending(state, control)

    def _decide_pending(self, state: Any, control: Any) -> None:
        ev, self.pending = self.pending, None
        if ev is not None:
            self.cb.decide(state, control, ev)

    def _evaluate(self, model: Any, tokenizer: Any,
                  step: int) -> tuple[float | None, int | None, float | None, float | None]:
        """(score, n, noise, proxy) of world feedback; the score None for a failed eval (an exception,
        NaN, None, a bad per-example score or proxy), logged once."""
        evals = self.cb.session.evals
        proxy = None
        try:
            value = evaluate_preserving_state(self.cb.world_feedback, model, tokenizer, check=False)
            if isinstance(value, WorldFeedback):
                value, proxy = value.score, value.proxy
            if is_per_example(value):
                ev = summarize(value, self.examples)
                self.examples = ev
                score = evals.accept(step, ev.mean, "world_feedback's mean score")
                return score, ev.n, ev.noise, proxy if score is not None else None
        except Exception as exc:  # noqa: BLE001 - a failing judge must not kill the run
            return evals.failed(step, f"{type(exc).__name__}: {exc}", exc), None, None, None
        score = evals.accept(step, value, "world_feedback's score")
        return score, None, None, proxy if score is not None else None


class MetricFeedback(Feedback):
    """A metric of the trainer's own evaluation, decided at each ``on_evaluate``. The trainer must
    evaluate (``eval_strategy`` not ``"no"``: checked when training begins) and report the metric
    (checked at the first eval, listing the names there are). The trainer has logged the eval before
    ``on_evaluate``: the ``evalstop/*`` metrics go out after it (``Host.log_metrics``)."""

    @staticmethod
    def default_direction(world_feedback: Any) -> str | None:
        return infer_direction(world_feedback)  # said at WARNING when training begins

    def check_args(self, args: Any) -> None:
        strategy = getattr(args, "eval_strategy", None)
        if strategy is not None and getattr(strategy, "value", strategy) == "no":
            raise ValueError(f"EvalStopCallback({self.cb.world_feedback!r}) reads a metric of the trainer's "
                             "evaluation, but the trainer never evaluates (eval_strategy='no'); set "
                             "eval_strategy='steps' with eval_steps (or 'epoch') and an eval_dataset, or pass a "
                             "world_feedback callable with eval_every.")

    def on_evaluate(self, args, state, control, metrics, model=None, processing_class=None, **kwargs):
        cb, name = self.cb, self.cb.world_feedback
        if name not in metrics:
            close = difflib.get_close_matches(name, [str(m) for m in metrics], n=1)
            raise ValueError(f"EvalStopCallback: metric {name!r} is not in the evaluation metrics; "
                             f"available: {', '.join(sorted(metrics)) or '(none)'}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}.")
        score = cb.session.evals.accept(state.global_step, metrics[name], f"metric {name!r}")
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        cb.decide(state, control, Eval(state.global_step, score, model, tokenizer))


class ExternalFeedback(Feedback):
    """``evalstop evaluate`` workers score the snapshots the run publishes every ``eval_every`` steps (the
    trainer's own ``checkpoint-<step>``); a watcher thread learns of a stop, which every rank applies at
    the next step."""

    stops_between_evals = False

    def __init__(self, cb: Host) -> None:
        super().__init__(cb)
        self.snapshots: list[int] = []  # steps whose snapshots this process published and has not pruned
        self.watcher: DecisionWatcher | None = None

    @staticmethod
    def check(world_feedback: Any, eval_every: Any) -> None:
        _check_every(eval_every, "external_eval=True")
        if world_feedback is not None:
            raise ValueError("EvalStopCallback: with external_eval=True the world feedback runs in "
                             "'evalstop evaluate' workers; pass world_feedback=None.")

    @staticmethod
    def default_direction(world_feedback: Any) -> str | None:
        return None

    def on_train_begin(self, args, requested_job_id):
        cb, s = self.cb, self.cb.session
        current = s.job_id
        if cb.is_main and current and current != requested_job_id:  # a rerun: NAME-2, ...
            keep_earlier_bests(s.client, requested_job_id, current, args.output_dir)
        if cb.is_main and self.watcher is None:
            self.watcher = DecisionWatcher(s.client, current or "")

    def on_step_end(self, args, state, control, **kwargs):
        cb = self.cb
        if state.global_step % cb.eval_every == 0:
            control.should_save = True  # the trainer's own save path writes checkpoint-<step> (FSDP/ZeRO-3 too)
            control.should_log = True
        seen = self.watcher.stopped if cb.is_main and self.watcher is not None else None
        message = share(None if seen is None else RankMessage.from_view(seen, stop=True))
        if message is None:
            return
        s = cb.session
        s.adopt(message)
        if cb.is_main:  # the best snapshot becomes evalstop-best, as the in-loop modes keep theirs
            s.best_checkpoint = keep_best_snapshot(args.output_dir, s.best_checkpoint, job_id=s.job_id,
                                                   step=s.best_step, score=s.best_score, direction=s.config.direction)
        control.should_training_stop = True
        s.stop_after_external_eval(state.global_step, None if seen is None else _decided_at(seen))
        stopped = {"evalstop/stop": 1, "evalstop/best_score": s.best_score, "evalstop/stop_lag": s.stop_lag}
        cb.log_metrics(state, control, state.global_step, {k: v for k, v in stopped.items() if v is not None})
        if cb.is_main:
            self._prune(final=True)

    def on_save(self, args, state, control):
        cb, step = self.cb, state.global_step
        path = snapshot_path(args.output_dir, step)
        if not cb.is_main or step % cb.eval_every != 0 or step in self.snapshots or not path.is_dir():
            return
        self.snapshots.append(step)
        cb.session.publish_snapshot(step, str(path))
        self._prune()

    def on_train_end(self, args, state, control):
        if self.watcher is not None:
            self.watcher.close()

    def _prune(self, final: bool = False) -> None:
        """Delete published snapshots already scored and not the best (``final``: all but the best)."""
        cb = self.cb
        if not cb.keep_snapshots:
            prune_snapshots(cb.session.client, cb.session.job_id or "", cb.output_dir or ".", self.snapshots,
                            final=final)


def _decided_at(view: Any) -> int | None:
    """The step of the eval that stopped the job: the decision's last step, else the last step fed."""
    steps = view.decision.evidence.get("steps") if view.decision is not None else None
    return steps[-1] if steps else view.last_step


#: The strategy of each mode.
FEEDBACKS: dict[FeedbackMode, type[Feedback]] = {FeedbackMode.CALLABLE: CallableFeedback,
                                                 FeedbackMode.METRIC: MetricFeedback,
                                                 FeedbackMode.EXTERNAL: ExternalFeedback}
