"""``EvalStopCallback``: EvalStop for any transformers ``Trainer`` or TRL trainer.

Usage::

    from evalstop_trl import EvalStopCallback

    cb = EvalStopCallback(world_feedback=my_eval, eval_every=20)   # my_eval(model, tokenizer) -> float
    trainer = GRPOTrainer(..., callbacks=[cb])
    trainer.train()
    cb.decision.reason, cb.best_step, cb.best_checkpoint

or, with the trainer's own evaluation: ``EvalStopCallback("eval_reward")`` (a key of the metrics
passed to ``on_evaluate``; a missing key raises at the first eval, listing the keys that are there; a
trainer that never evaluates, ``eval_strategy="no"``, raises when training begins). Loss-like names
(``loss``, ``perplexity``, ``error``) are minimised (``direction="min"``, said at WARNING); pass
``direction=`` to say otherwise.

What it does:

* every ``eval_every`` optimizer steps (or at each ``on_evaluate``) the main process computes the
  world-feedback score and reports it, with the train loss and the trainer's reward (the proxy) of
  the same step's log, to the coordinator: an embedded one (SQLite under ``args.output_dir``) by
  default, ``$EVALSTOP_URL`` (set by ``evalstop run``), an ``evalstop serve`` URL, or a client /
  Coordinator object;
* the evaluation restores the Python, NumPy and torch RNG states and the model's train/eval mode,
  so training with the callback is bit-identical to training without it up to the stop;
* one log line per eval (step, score, best, declines, decision; INFO on the ``evalstop`` logger, shown
  on stderr when the program configured no logging), and ``evalstop/score``,
  ``evalstop/best_score``, ``evalstop/declines``, ``evalstop/stop``, ``evalstop/eval_failures`` in the
  trainer's logs (``log_history``, ``trainer_state.json``, the printer, and the ``report_to``
  integrations: the callback stays where you put it and places a small forwarder ahead of the
  integrations, which adds its metrics to each log; metric mode logs them in a log event of its own at
  the eval's step; external mode logs ``evalstop/stop``, ``evalstop/best_score`` and
  ``evalstop/stop_lag`` at the stop);
* a failing eval (an exception, NaN or None: an LLM judge timing out) is a missing eval, each one
  logged at WARNING (the traceback with the first of a run) and counted; ``max_eval_failures``
  failures in a row end as ``on_eval_error`` says (``"skip"``: go on, ``"stop"``: stop the job,
  ``"raise"``: raise);
* on a new best score the model (or the PEFT adapter) and tokenizer are saved atomically to
  ``<output_dir>/evalstop-best`` with ``evalstop.json`` (job, step, score, direction, time); a resume
  never replaces it with a worse model, and another job (a rerun, ``NAME-2``) never replaces it at all:
  it keeps its own ``evalstop-best-NAME-2`` and says so at WARNING. ``keep_best="checkpoint"`` keeps
  the trainer's own ``checkpoint-N`` instead of a copy. After a stop the trainer's checkpoints newer
  than the best are removed (``keep_checkpoints=True`` keeps them); ``load_best_at_end=True`` loads
  the best weights into the model at the end of training, as ``load_best_model_at_end`` does. A stop
  before any eval scored a model (a manual stop before the first eval) keeps the model of the stop's
  step in ``<output_dir>/evalstop-final`` (or the trainer's ``checkpoint-N``) and says so at WARNING;
* the job type comes from the class of the trainer's arguments (``GRPOConfig`` -> ``grpo``, ``DPOConfig``
  -> ``dpo``, ``TrainingArguments`` -> ``other``, ...) unless ``job_type=`` says; a heartbeat every ``heartbeat_s``
  seconds (5) keeps the job from turning ``lost`` between evals, and its answer brings a stop
  decided between evals (a manual stop) to the next step;
* on STOP it sets ``control.should_training_stop``, acknowledges the stop and logs the reason; in
  multi-process training rank 0's decision, best step and score are broadcast, so every rank stops at
  the same step and knows the same best;
* **a job is its ``job_id``** (default: ``$EVALSTOP_JOB_ID``, else ``run_name``, else the output
  folder's name and a short hash of its path). Whoever registered it first (``evalstop run`` does,
  without planned steps), the callback adopts it and fills in ``max_steps``; a resume with another
  ``max_steps`` extends the plan (audited). A new process attaches to it as a new attempt, and
  the coordinator's stored history is the source of truth for the decline count and the best step,
  so a resumed run (any process, any restore setting) stops where an uninterrupted one would. A run
  that starts at step 0 on a job that already has reports is a new run: it gets the next free id
  (``NAME-2``, ...), with a log line saying so;
* if the coordinator cannot be reached, a local detector with the same policy keeps deciding
  (``fail_mode="local"``; ``"open"`` never stops); the client keeps the reports in its outbox and
  replays them when the service returns, whose decision then wins;
* a training process that exits without finishing marks its job ``failed``.

Trainers that ignore ``should_training_stop`` (e.g. the old experimental PPO loop, custom loops)
run under ``evalstop run -- CMD``: the launcher owns the process group and escalates SIGTERM, then
SIGKILL, when a stop is not acknowledged in time.

How it is built: one plain class. :class:`~evalstop_trl.train.session.EvalStopSession` decides (no
trainer, no torch); the callback keeps a strategy of its :class:`~evalstop_trl.train.feedback.FeedbackMode`
(a callable, a metric name, or ``external_eval=True``) and passes each trainer event on to it, and
every rank applies rank 0's :class:`~evalstop_trl.train.ranks.RankMessage` at each decision point. The
callback keeps no state in a checkpoint: a resumed run (``restore_callback_states_from_checkpoint``
or not) re-attaches to its job, whose stored history the coordinator holds.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import os
import re
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from ..core.detectors import Decision
from .checkpoints import keep_best_copy, keep_final_copy, load_best_weights, remove_checkpoints_after
from .connect import connect
from .external import snapshot_path
from .feedback import FEEDBACKS, Eval, FeedbackMode
from .hparams import trainer_hparams
from .ranks import share
from .session import DEFAULT_HEARTBEAT_S, LOSS_KEYS, REWARD_KEYS, EvalStopSession, SessionConfig, infer_direction, log

__all__ = ["LOSS_KEYS", "REWARD_KEYS", "EvalStopCallback", "EvalStopSession", "FeedbackMode", "calling_handler",
           "default_job_id", "infer_direction", "infer_job_type"]

_KEEP_BEST = ("copy", "checkpoint")
#: Job types by the class of the trainer's arguments (the first match in the class's MRO).
_ARGS_TYPES = {"GRPOConfig": "grpo", "RLOOConfig": "rloo", "OnlineDPOConfig": "online_dpo", "DPOConfig": "dpo",
               "PPOConfig": "ppo", "SFTConfig": "sft", "TrainingArguments": "other"}


def infer_job_type(args: Any) -> str | None:
    """The job type of a trainer's arguments (``GRPOConfig`` -> ``grpo``, ``RLOOConfig`` -> ``rloo``,
    ``DPOConfig`` -> ``dpo``, ``OnlineDPOConfig`` -> ``online_dpo``, ``SFTConfig`` -> ``sft``, plain
    ``TrainingArguments`` -> ``other``; subclasses count as their base); None for anything else.
    Every TRL trainer takes its own config class, so the arguments name the trainer."""
    for klass in type(args).__mro__ if args is not None else ():
        if klass.__name__ in _ARGS_TYPES:
            return _ARGS_TYPES[klass.__name__]
    return None


def calling_handler(depth: int = 8) -> CallbackHandler | None:
    """The trainer's ``CallbackHandler`` running the current callback event, found on the call stack;
    None outside a trainer (a custom loop calling the callback itself).

    The one place EvalStop reaches past a callback event's arguments. transformers gives events the
    model, the tokenizer, the optimizer and the dataloaders, never the trainer or its handler, yet two
    things need the handler: placing the log forwarder ahead of the ``report_to`` integrations, and
    metric mode's log event at the eval's own step (the trainer has logged the eval already).
    """
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        if isinstance(frame.f_locals.get("self"), CallbackHandler):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


def default_job_id(args: Any) -> str:
    """``$EVALSTOP_JOB_ID``, else the run name, else the output folder's name and a hash of its path."""
    if os.environ.get("EVALSTOP_JOB_ID"):
        return os.environ["EVALSTOP_JOB_ID"]
    out = Path(args.output_dir).resolve()
    run_name = getattr(args, "run_name", None)
    if run_name and run_name != args.output_dir and Path(run_name).resolve() != out:
        name = run_name
    else:
        name = f"{out.name or 'job'}-{hashlib.sha1(str(out).encode()).hexdigest()[:6]}"
    return re.sub(r"[^A-Za-z0-9_.:@-]", "-", name).lstrip("-_.:@")[:120] or "job"


def show_eval_lines() -> bool:
    """Let the per-eval line (INFO, logger ``evalstop``) reach stderr when the application configured
    no logging at all, as transformers does for its own logger; returns whether it did. A program that
    configured the root logger or the ``evalstop`` logger keeps what it chose."""
    lib = logging.getLogger("evalstop")
    if lib.handlers or logging.getLogger().handlers or lib.level != logging.NOTSET:
        return False
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    lib.addHandler(handler)
    lib.setLevel(logging.INFO)
    return True


class _LogsFirst(TrainerCallback):
    """Placed first in the trainer's callbacks by an :class:`EvalStopCallback`, which itself stays where
    the user put it: each log gets EvalStop's metrics before the ``report_to`` integrations (which come
    before any user callback) see it. It does nothing else."""

    def __init__(self, cb: EvalStopCallback) -> None:
        self.cb = cb

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.cb._log(args, state, control, logs if logs is not None else {})


class EvalStopCallback(TrainerCallback):
    """Stop training when world feedback declines ``k`` evals in a row (see the module docstring).

    Args:
        world_feedback: ``(model, tokenizer) -> float`` run every ``eval_every`` steps, or the name
            of a metric of the trainer's own evaluation (e.g. ``"eval_reward"``). The callable may
            return per-example scores instead (a list, an array, or a dict example id -> score, the
            same examples at every eval): the detectors then also see the eval's paired noise level.
        eval_every: optimizer steps between world-feedback evals (required with a callable).
        coordinator: None (``$EVALSTOP_URL`` if set, else embedded SQLite under ``output_dir``), an
            ``http(s)://`` URL of ``evalstop serve``, an ``EvalStopClient``/``EmbeddedClient`` or a ``Coordinator``.
        token: the tenant token for a URL (default: ``$EVALSTOP_TOKEN``).
        job_id: the job's id (default: see :func:`default_job_id`).
        job_type: ``grpo``, ``rloo``, ``dpo``, ``online_dpo``, ``ppo``, ``sft``, ``rlhf``, ``other``; None: from
            the class of the trainer's arguments (:func:`infer_job_type`).
        detector, k, min_delta, **detector_params: the stop rule (see ``create_detector``);
            ``stop_on=["hacked", "converged"]`` among them also stops plateaus (docs/training.md).
        direction: ``"max"`` (higher is better) or ``"min"``; None: ``"min"`` for a loss-like metric
            name, else ``"max"``.
        save_best: keep the best checkpoint; keep_best: ``"copy"`` (to ``<output_dir>/evalstop-best``, or
            ``evalstop-best-<job_id>`` when it holds another job's) or ``"checkpoint"`` (the trainer saves
            ``checkpoint-N`` at each new best; its path is kept).
        load_best_at_end: at the end of training (a stop included) load the best weights into the model.
        keep_checkpoints: after a stop, keep the trainer's checkpoints newer than the best (default: removed).
        heartbeat_s: seconds between heartbeats that keep the job's lease and bring a manual stop to the
            next step (None or 0: none; default 5).
        max_eval_failures, on_eval_error: after this many failed evals in a row, ``"skip"`` (go on),
            ``"stop"`` (stop the job) or ``"raise"``.
        fail_mode: ``"local"`` (a local detector decides while the coordinator is unreachable) or
            ``"open"`` (never stop then).
        shadow: decide and record "would stop" (the job's ``would_stop``, a WARNING, the metric
            ``evalstop/would_stop``) but never stop training (also when the tenant's default mode is shadow).
        external_eval: publish a snapshot every ``eval_every`` steps for ``evalstop evaluate`` workers
            instead of evaluating in the loop; keep_snapshots: keep scored snapshots (default: only the best).
        eval_on_all_ranks: run ``world_feedback`` on every rank (a collective forward of a sharded
            model); rank 0's score is used.

    Attributes:
        mode: the :class:`FeedbackMode`; feedback: its strategy; session: the :class:`EvalStopSession`
            that decides (``decision``, ``best_step``, ``best_score``, ``best_checkpoint``, ``history``, ...
            read through to it).

    Raises:
        ValueError: a missing or invalid option (the message names it and what it must be).
    """

    def __init__(
        self,
        world_feedback: Callable[[Any, Any], float] | str | None = None,
        *,
        eval_every: int | None = None,
        coordinator: Any = None,
        token: str | None = None,
        job_id: str | None = None,
        job_type: str | None = None,
        detector: str = "decline",
        k: int = 2,
        min_delta: float = 0.0,
        direction: str | None = None,
        save_best: bool = True,
        keep_best: str = "copy",
        max_eval_failures: int = 3,
        on_eval_error: str = "skip",
        fail_mode: str = "local",
        shadow: bool = False,
        tags: Mapping[str, Any] | None = None,
        external_eval: bool = False,
        keep_snapshots: bool = False,
        eval_on_all_ranks: bool = False,
        load_best_at_end: bool = False,
        keep_checkpoints: bool = False,
        heartbeat_s: float | None = DEFAULT_HEARTBEAT_S,
        **detector_params: Any,
    ) -> None:
        self.mode = FeedbackMode.of(world_feedback, external_eval)
        strategy = FEEDBACKS[self.mode]
        strategy.check(world_feedback, eval_every)
        if keep_best not in _KEEP_BEST:
            raise ValueError(f"EvalStopCallback: keep_best must be one of {', '.join(_KEEP_BEST)}, "
                             f"but got {keep_best!r}.")
        self._direction_note = None  # a metric's direction read from its name: said when training begins
        if direction is None and "direction" not in detector_params:
            direction = strategy.default_direction(world_feedback)
            self._direction_note = direction if self.mode is FeedbackMode.METRIC else None
        config = SessionConfig.build(detector, k=k, min_delta=min_delta, direction=direction, job_type=job_type,
                                     max_eval_failures=max_eval_failures, on_eval_error=on_eval_error,
                                     fail_mode=fail_mode, shadow=shadow, tags=tags, **detector_params)
        self.world_feedback = world_feedback
        self.eval_every, self._coordinator_arg, self.token = eval_every, coordinator, token
        self.save_best, self.keep_best, self.keep_snapshots = save_best, keep_best, keep_snapshots
        self.eval_on_all_ranks = bool(eval_on_all_ranks)
        self.load_best_at_end, self.keep_checkpoints = bool(load_best_at_end), bool(keep_checkpoints)
        self.session = EvalStopSession(config, job_id, heartbeat_s=heartbeat_s)
        self.feedback = strategy(self)
        self._is_main = True
        self._output_dir: str | None = None
        self._args_job_type: str | None = None
        self._pending_logs: dict[str, float] = {}
        self._forwarder: _LogsFirst | None = None
        self._handler: weakref.ref[CallbackHandler] | None = None

    # ------------------------------------------------------------------ what the session knows
    @property
    def config(self) -> SessionConfig:
        """The stop rule and failure handling (``detector``, ``params``, ``direction``, ...)."""
        return self.session.config

    @property
    def detector(self) -> str:
        """The stop rule's detector name."""
        return self.config.detector

    @property
    def params(self) -> Mapping[str, Any]:
        """The detector's parameters (read-only)."""
        return self.config.params

    @property
    def direction(self) -> str:
        """``"max"`` (higher scores are better) or ``"min"``."""
        return self.config.direction

    @property
    def job_type(self) -> str | None:
        """The job type given, else the one of the trainer's arguments (None before training)."""
        return self.config.job_type or self._args_job_type

    @property
    def external_eval(self) -> bool:
        """Whether snapshots go to ``evalstop evaluate`` workers (the external mode)."""
        return self.mode is FeedbackMode.EXTERNAL

    @property
    def job_id(self) -> str | None:
        """The job's id (``NAME-2`` for a rerun; None before training unless given)."""
        return self.session.job_id

    @property
    def client(self) -> Any:
        """The coordinator client (None before training and on ranks other than 0)."""
        return self.session.client

    @property
    def decision(self) -> Decision | None:
        """The latest decision (None before the first eval)."""
        return self.session.decision

    @property
    def best_step(self) -> int | None:
        """The step of the best eval so far."""
        return self.session.best_step

    @property
    def best_score(self) -> float | None:
        """The best score so far."""
        return self.session.best_score

    @property
    def best_checkpoint(self) -> str | None:
        """Where the best eval's model is kept."""
        return self.session.best_checkpoint

    @property
    def history(self) -> list[dict[str, Any]]:
        """This process's reports, oldest first (the coordinator holds the job's whole history)."""
        return self.session.history

    @property
    def stopped_at(self) -> int | None:
        """The step training stopped at, if it did."""
        return self.session.stopped_at

    @property
    def attempt(self) -> int:
        """1 for a new job, 2 when this process attached to a job with stored reports."""
        return self.session.attempt

    @property
    def stop_lag(self) -> int | None:
        """External evals: the steps trained after the eval that decided the stop."""
        return self.session.stop_lag

    @property
    def would_stop_step(self) -> int | None:
        """Shadow mode: the step of the eval where the detector first decided to stop (None: not yet)."""
        return self.session.shadow.step

    # ------------------------------------------------------------------ trainer events
    def on_init_end(self, args, state, control, **kwargs):
        self._join()

    def on_train_begin(self, args, state, control, **kwargs):
        self._join()
        self.feedback.check_args(args)
        self._is_main = state.is_world_process_zero
        self._output_dir = args.output_dir
        self._args_job_type = infer_job_type(args)
        s = self.session
        if s.job_id is None:
            s.job_id = default_job_id(args)
        requested = s.job_id
        if self._is_main and s.client is None:
            s.config = dataclasses.replace(s.config, hparams=trainer_hparams(args, kwargs.get("model")))
            s.attach(connect(self._coordinator_arg, self.token, args.output_dir), step=state.global_step,
                     planned_steps=state.max_steps or None, job_type=self._args_job_type)
            atexit.register(_fail_at_exit, weakref.ref(s))
            show_eval_lines()
            if self._direction_note is not None:
                log.warning("EvalStop: metric %r: %s is better (direction=%r, from its name); pass direction= to say "
                            "otherwise", self.world_feedback, "lower" if self.direction == "min" else "higher",
                            self.direction)
        message = share(s.message() if self._is_main else None)
        if message is not None:
            s.adopt(message)
        self.feedback.on_train_begin(args, requested)

    def on_step_end(self, args, state, control, **kwargs):
        if self.feedback.stops_between_evals and self._stopped_between_evals(state, control, kwargs):
            return
        if not self.feedback.stops_between_evals:
            self.session.beat()
        self.feedback.on_step_end(args, state, control, **kwargs)

    def _stopped_between_evals(self, state: Any, control: Any, event: Mapping[str, Any]) -> bool:
        """Rank 0's heartbeat says the job was stopped since the last eval (by hand, or by a stop only
        the coordinator saw): every rank stops at this step, the best kept (the model at the stop when
        no eval scored one), the stop acknowledged."""
        s = self.session
        stopped = self._is_main and s.beat()
        message = share(s.message(stop=True) if stopped else None)
        if message is None:
            return False
        s.adopt(message)
        control.should_training_stop = True
        tokenizer = event.get("processing_class")
        self._keep_at_stop(control, state.global_step, event.get("model"),
                           tokenizer if tokenizer is not None else event.get("tokenizer"))
        s.stop_here(state.global_step)
        metrics = {"evalstop/stop": 1, "evalstop/best_score": s.best_score}
        self._log_later(state, control, state.global_step, {k: v for k, v in metrics.items() if v is not None})
        return True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._forwarder is None:  # no trainer's handler found (a custom loop): the logs come here first
            self._log(args, state, control, logs if logs is not None else {})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.feedback.on_evaluate(args, state, control, metrics if metrics is not None else {}, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        self.feedback.on_save(args, state, control)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.feedback.on_train_end(args, state, control)
        s = self.session
        s.finish()
        if s.stopped_at is not None and self._is_main and not self.keep_checkpoints:
            remove_checkpoints_after(args.output_dir, s.best_step)
        if self.load_best_at_end and model is not None and s.best_checkpoint and s.best_step != state.global_step \
                and load_best_weights(model, s.best_checkpoint):
            log.warning("EvalStop: loaded the best weights (step %s, score %s) from %s into the model "
                        "(load_best_at_end=True)", s.best_step, s.best_score, s.best_checkpoint)

    # ------------------------------------------------------------------ logs
    def _join(self) -> None:
        """Place the log forwarder first in the trainer's callbacks (once per trainer)."""
        handler = calling_handler()
        if handler is None or (self._forwarder is not None and self._forwarder in handler.callbacks):
            return
        self._forwarder = self._forwarder or _LogsFirst(self)
        self._handler = weakref.ref(handler)
        # a new list, not an insert: the event running now goes on over the old one, each callback once
        handler.callbacks = [self._forwarder, *handler.callbacks]

    def _log(self, args: Any, state: Any, control: Any, logs: dict[str, Any]) -> None:
        """A trainer's log, before the integrations see it: add the metrics of a decision made between
        logs, take the loss and reward, and let the mode decide an eval waiting for this log."""
        if self._pending_logs:
            logs.update(self._pending_logs)
            self._pending_logs = {}
        self.session.observe_logs(logs)
        self.feedback.on_log(args, state, control, logs)

    def _log_later(self, state: Any, control: Any, step: int, metrics: dict[str, float]) -> None:
        """``metrics`` in ``log_history`` now and in the trainer's next log (``report_to`` integrations)."""
        state.log_history.append({**metrics, "step": step})
        self._pending_logs.update(metrics)
        control.should_log = True

    def _log_now(self, args: Any, state: Any, control: Any, metrics: dict[str, float]) -> None:
        """``metrics`` in a log event of their own at this step (the ``report_to`` integrations and the
        printer see them; ``log_history`` has them already)."""
        handler = self._handler() if self._handler is not None else None
        if handler is not None:
            handler.on_log(args, state, control, logs=dict(metrics))

    # ------------------------------------------------------------------ an eval, decided
    def _decide(self, state: Any, control: Any, ev: Eval, logs: dict[str, Any] | None) -> dict[str, float]:
        """Rank 0 reports the eval (keeping a new best's model); every rank applies its message, logs the
        ``evalstop/*`` metrics (in ``logs`` too: the integrations see them) and stops if told to.
        Returns the metrics."""
        s = self.session
        stop = False
        if self._is_main:
            kept = None
            if self.save_best and ev.model is not None and ev.score is not None and s.improves(ev.score):
                kept = self._keep(control, ev, ev.score)
            stop = s.report(ev.step, ev.score, kept, eval_n=ev.n, eval_noise=ev.noise)
        message = share(s.message(stop) if self._is_main else None)
        if message is not None:
            s.adopt(message)
            stop = message.stop
        metrics = s.eval_metrics(ev.score, stop, ev.n, ev.noise)
        if logs is not None:
            logs.update(metrics)
        state.log_history.append({**metrics, "step": ev.step})
        if self._is_main:
            s.log_eval(ev.step, ev.score)
        if stop:
            control.should_training_stop = True
            if s.stopped_at is None:  # not already stopped between evals (an eval decided after that stop)
                self._keep_at_stop(control, ev.step, ev.model, ev.tokenizer)
                s.stop_here(ev.step)
        return metrics

    def _keep_at_stop(self, control: Any, step: int, model: Any, tokenizer: Any) -> None:
        """A stop before any scored eval (a manual stop before the first eval, evals that all failed):
        rank 0 keeps the model as it is now (``evalstop-final``, or the trainer's ``checkpoint-N`` with
        ``keep_best="checkpoint"``), or notes why it keeps nothing; :meth:`EvalStopSession.stop_here`
        says which at WARNING and acknowledges the stop with it."""
        s = self.session
        if not self._is_main or s.best_step is not None or s.best_checkpoint is not None:
            return
        if not self.save_best:
            s.nothing_kept = "no eval scored a model and save_best=False"
        elif model is None:
            s.nothing_kept = "no eval scored a model and the trainer's event gave no model to save"
        elif self.keep_best == "checkpoint":
            control.should_save = True  # the trainer writes checkpoint-<step> at the end of this step
            s.final_checkpoint = str(snapshot_path(self._output_dir or ".", step))
        else:
            s.final_checkpoint = keep_final_copy(self._output_dir or ".", model, tokenizer, job_id=self.job_id,
                                                 step=step, reason="stopped before any eval scored a model")

    def _keep(self, control: Any, ev: Eval, score: float) -> str:
        """Keep the new best: a copy with evalstop.json (never over a better one), or the trainer's checkpoint."""
        out = self._output_dir or "."
        if self.keep_best == "checkpoint":
            control.should_save = True  # the trainer writes checkpoint-<step> at the end of this step
            return str(snapshot_path(out, ev.step))
        return keep_best_copy(out, ev.model, ev.tokenizer, job_id=self.job_id, step=ev.step, score=score,
                              direction=self.direction)


def _fail_at_exit(ref: weakref.ref[EvalStopSession]) -> None:
    """At interpreter exit: a job whose training neither ended nor stopped failed (e.g. it crashed)."""
    session = ref()
    if session is None:
        return
    exc = getattr(sys, "last_value", None)
    try:
        session.fail_unfinished(f"the training process exited before the end of training "
                                f"({type(exc).__name__ if exc else 'no exception'})")
    except Exception:  # noqa: BLE001 - at exit, say nothing more
        pass
