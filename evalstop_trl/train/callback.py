"""``EvalStopCallback``: EvalStop for any transformers ``Trainer`` or TRL trainer.

Usage::

    from evalstop_trl import EvalStopCallback

    cb = EvalStopCallback(world_feedback=my_eval, eval_every=20)   # my_eval(model, tokenizer) -> float
    trainer = GRPOTrainer(..., callbacks=[cb])
    trainer.train()
    cb.decision.reason, cb.best_step, cb.best_checkpoint

or, as TRL's own callbacks take their trainer, so that the ``report_to`` integrations get EvalStop's
metrics too::

    trainer = GRPOTrainer(...)
    cb = EvalStopCallback(world_feedback=my_eval, eval_every=20, trainer=trainer)
    trainer.add_callback(cb)

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
  trainer's logs (external mode: ``evalstop/stop``, ``evalstop/best_score`` and ``evalstop/stop_lag`` at
  the stop). With ``trainer=`` they go out through ``trainer.log`` at the eval's step, in a log of
  their own, so ``log_history``, ``trainer_state.json``, the printer and the ``report_to``
  integrations all get them. Without it, ``log_history`` (and ``trainer_state.json``) gets them at the
  eval's step, and the next log the trainer sends carries them to the callbacks listed after this one
  (the printer): the eval step's own log in callable mode, the next log in metric mode. The
  ``report_to`` integrations, which the trainer runs before your callbacks, then never see them;
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
(a callable, a metric name, or ``external_eval=True``) and passes each trainer event on to it; the
strategy uses the callback's public surface only (:class:`~evalstop_trl.train.feedback.Host`). Every
rank applies rank 0's :class:`~evalstop_trl.train.ranks.RankMessage` at each decision point. The
callback uses only what its events and ``trainer=`` hand it: it never looks for the trainer on the
call stack nor changes the trainer's list of callbacks. It keeps no state in a checkpoint: a resumed
run (``restore_callback_states_from_checkpoint`` or not) re-attaches to its job, whose stored history
the coordinator holds.
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

from ..core.detectors import Decision
from .checkpoints import keep_best_copy, keep_final_copy, load_best_weights, remove_checkpoints_after
from .connect import connect
from .external import snapshot_path
from .feedback import FEEDBACKS, Eval, FeedbackMode
from .hparams import trainer_hparams
from .ranks import share
from .session import DEFAULT_HEARTBEAT_S, LOSS_KEYS, REWARD_KEYS, EvalStopSession, SessionConfig, infer_direction, log

__all__ = ["LOSS_KEYS", "REWARD_KEYS", "EvalStopCallback", "EvalStopSession", "FeedbackMode", "default_job_id",
           "infer_direction", "infer_job_type"]

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
            ``stop_on=["hacked", "converged"]`` among them also stops plateaus, ``gate="kl_past_peak"``
            holds a stop until the run's KL (the trainer's ``objective/kl`` or ``kl``) is past the KL
            clock's forecast peak, ``gate="proxy_diverges"`` while the proxy reward (the trainer's
            ``reward``) is not above its value at the best eval (docs/training.md).
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
        trainer: the trainer this callback is added to (``trainer.add_callback(cb)``), as TRL's own
            callbacks take it: EvalStop's metrics then go out through ``trainer.log`` at the eval's
            step, which the ``report_to`` integrations see. None (the callback in ``callbacks=[...]``):
            the same stops, the metrics in ``log_history`` at the eval's step and in the trainer's next
            log for the callbacks after this one, never in the integrations (see the module docstring).

    Attributes:
        mode: the :class:`FeedbackMode`; feedback: its strategy; session: the :class:`EvalStopSession`
            that decides (``decision``, ``best_step``, ``best_score``, ``best_checkpoint``, ``history``, ...
            read through to it); trainer: the ``trainer=`` given, or None.

    Raises:
        ValueError: a missing or invalid option (the message names it and what it must be).
        TypeError: a ``trainer`` without a ``log`` method.
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
        trainer: Any = None,
        **detector_params: Any,
    ) -> None:
        self.mode = FeedbackMode.of(world_feedback, external_eval)
        if trainer is not None and not callable(getattr(trainer, "log", None)):
            raise TypeError(f"EvalStopCallback: trainer must be the trainer the callback is added to (with a log "
                            f"method, as transformers' Trainer has), but got {type(trainer).__name__}.")
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
        self.trainer = trainer
        self.feedback = strategy(self)
        self._is_main = True
        self._output_dir: str | None = None
        self._args_job_type: str | None = None
        self._outbox: dict[str, float] = {}  # evalstop/* metrics not logged yet (see log_metrics)
        self._flushing = False  # trainer.log(...) of the outbox is running

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

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0, the one that reports, keeps the best and talks to the coordinator."""
        return self._is_main

    @property
    def output_dir(self) -> str | None:
        """The trainer's ``output_dir`` (None before training)."""
        return self._output_dir

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(self, args, state, control, **kwargs):
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

    def on_step_begin(self, args, state, control, **kwargs):
        self._flush(control)

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
        self.log_metrics(state, control, state.global_step, {k: v for k, v in metrics.items() if v is not None})
        return True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._flushing:  # EvalStop's own metrics (_flush): nothing in them to read
            return
        logs = logs if logs is not None else {}
        self.session.observe_logs(logs)
        self.feedback.on_log(args, state, control, logs)
        if self.trainer is None and self._outbox:  # for the callbacks after this one (the printer, ...)
            logs.update(self._outbox)
            self._outbox.clear()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.feedback.on_evaluate(args, state, control, metrics if metrics is not None else {}, **kwargs)
        self._flush(control)

    def on_save(self, args, state, control, **kwargs):
        self.feedback.on_save(args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._flush(control)  # the last chance before the end of training (a stop, the last step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.feedback.on_train_end(args, state, control)
        if self.trainer is not None and self._outbox:
            # decided now (an eval whose step the trainer never logged): the integrations, which ran their
            # on_train_end before this callback, may have closed their runs; log_history still takes them
            state.log_history.append({**self._outbox, "step": state.global_step})
        self._outbox.clear()
        s = self.session
        s.finish()
        if s.stopped_at is not None and self._is_main and not self.keep_checkpoints:
            remove_checkpoints_after(args.output_dir, s.best_step)
        if self.load_best_at_end and model is not None and s.best_checkpoint and s.best_step != state.global_step \
                and load_best_weights(model, s.best_checkpoint):
            log.warning("EvalStop: loaded the best weights (step %s, score %s) from %s into the model "
                        "(load_best_at_end=True)", s.best_step, s.best_score, s.best_checkpoint)

    # ------------------------------------------------------------------ logs
    def log_metrics(self, state: Any, control: Any, step: int, metrics: Mapping[str, float]) -> None:
        """Log EvalStop's ``metrics`` of ``step`` (an eval's, a stop's); the strategies call it.

        The trainer is asked to log this step (its loss and reward go out first). With ``trainer=`` the
        metrics wait for the next event outside the trainer's own logging, still at this step (the next
        ``on_step_begin``, ``on_evaluate`` or ``on_epoch_end``), and go out through ``trainer.log`` there:
        called from inside the trainer's log, a TRL trainer would add its own pending metrics to them
        a second time. Without it they go into ``state.log_history`` now and into the next log the
        trainer sends (``on_log``), for the callbacks after this one.
        """
        control.should_log = True
        self._outbox.update(metrics)
        if self.trainer is None:
            state.log_history.append({**metrics, "step": step})

    def _flush(self, control: Any) -> None:
        """Send the metrics waiting for the trainer (``trainer=``) through ``trainer.log``."""
        if self.trainer is None or not self._outbox:
            return
        metrics, self._outbox = self._outbox, {}
        asked, self._flushing = control.should_log, True
        try:
            self.trainer.log(metrics)
        finally:
            self._flushing = False
            control.should_log = asked  # the log event clears it: a log the trainer still owes (the epoch's) stays

    # ------------------------------------------------------------------ an eval, decided
    def decide(self, state: Any, control: Any, ev: Eval) -> dict[str, float]:
        """Decide the eval ``ev``; the strategies call it. Rank 0 reports it (keeping a new best's model);
        every rank applies rank 0's message, logs the ``evalstop/*`` metrics (:meth:`log_metrics`) and
        stops if told to. Returns the metrics."""
        s = self.session
        stop = False
        if self._is_main:
            kept = None
            if self.save_best and ev.model is not None and ev.score is not None and s.improves(ev.score):
                kept = self._keep(control, ev, ev.score)
            stop = s.report(ev.step, ev.score, kept, eval_n=ev.n, eval_noise=ev.noise, proxy_reward=ev.proxy)
        message = share(s.message(stop) if self._is_main else None)
        if message is not None:
            s.adopt(message)
            stop = message.stop
        metrics = s.eval_metrics(ev.score, stop, ev.n, ev.noise)
        self.log_metrics(state, control, ev.step, metrics)
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
