"""``EvalStopCallback``'s shell: what every mode shares (set-up, logs, decisions, checkpoint state).

``EvalStopCallback(...)`` returns the adapter of its :class:`FeedbackMode` (:mod:`.adapters`), a
subclass made for that one instance: transformers rebuilds a callback from a checkpoint with
``type(callback)(**state["args"])``, so the rebuilt copy reaches the callback it replaces through its
class, that is through the trainer that held it. It takes the callable, the coordinator and the token
from it (JSON carries none of them) and hands it its session, so the user's object sees the copy's
decisions. The deciding itself is :class:`~evalstop_trl.train.session.EvalStopSession`'s.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import re
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, overload

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler, ExportableState

from ..core.detectors import Decision
from .checkpoints import keep_best_copy, load_best_weights, remove_checkpoints_after
from .connect import connect
from .external import snapshot_path
from .hparams import trainer_hparams
from .ranks import share
from .session import DEFAULT_LEASE_S, EvalStopSession, SessionConfig, log

__all__ = ["EvalStopCallback", "FeedbackMode", "calling_trainer", "default_job_id", "infer_job_type"]

_KEEP_BEST = ("copy", "checkpoint")
_NO_DONOR = ("EvalStopCallback: a checkpoint's callback state cannot be restored without the callback itself: "
             "pass callbacks=[EvalStopCallback(world_feedback, ...)] to the trainer again.")
T = TypeVar("T")
#: Job types by the class of the trainer, else of its arguments (the first match in the class's MRO).
_TRAINER_TYPES = {"GRPOTrainer": "grpo", "RLOOTrainer": "rloo", "OnlineDPOTrainer": "online_dpo", "DPOTrainer": "dpo",
                  "PPOTrainer": "ppo", "PPOv2Trainer": "ppo", "SFTTrainer": "sft", "Trainer": "other"}
_ARGS_TYPES = {"GRPOConfig": "grpo", "RLOOConfig": "rloo", "OnlineDPOConfig": "online_dpo", "DPOConfig": "dpo",
               "PPOConfig": "ppo", "SFTConfig": "sft", "TrainingArguments": "other"}


def infer_job_type(trainer: Any = None, args: Any = None) -> str | None:
    """The job type of a trainer (``GRPOTrainer`` -> ``grpo``, ``RLOOTrainer`` -> ``rloo``, ``DPOTrainer`` ->
    ``dpo``, ``OnlineDPOTrainer`` -> ``online_dpo``, ``PPOTrainer`` -> ``ppo``, ``SFTTrainer`` -> ``sft``, a
    plain ``Trainer`` -> ``other``; subclasses count as their base), else of its arguments' class
    (``GRPOConfig``, ...); None when neither says."""
    for obj, table in ((trainer, _TRAINER_TYPES), (args, _ARGS_TYPES)):
        for klass in type(obj).__mro__ if obj is not None else ():
            if klass.__name__ in table:
                return table[klass.__name__]
    return None


def calling_trainer(depth: int = 16) -> tuple[Any, Any]:
    """The ``CallbackHandler`` running the current callback event and the trainer that owns it, found on
    the call stack (callback events are not given either); ``(None, None)`` outside a trainer (a custom
    loop calling the callback itself)."""
    handler = None
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        me = frame.f_locals.get("self")
        if handler is None and isinstance(me, CallbackHandler):
            handler = me
        elif handler is not None and getattr(me, "callback_handler", None) is handler:
            return handler, me
        frame = frame.f_back
    return handler, None


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


def _check_options(keep_best: str) -> None:
    """Raise ValueError for a bad ``keep_best``."""
    if keep_best not in _KEEP_BEST:
        raise ValueError(f"EvalStopCallback: keep_best must be one of {', '.join(_KEEP_BEST)}, but got {keep_best!r}.")


class FeedbackMode(str, Enum):
    """Where the world feedback comes from; each mode has its own adapter class."""

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


class _OnSession(Generic[T]):
    """A callback attribute kept on its session: the user's object and a copy transformers restored
    from a checkpoint share one session, so both read the same values."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _OnSession[T]: ...
    @overload
    def __get__(self, obj: EvalStopCallback, objtype: type | None = None) -> T: ...

    def __get__(self, obj: EvalStopCallback | None, objtype: type | None = None) -> T | _OnSession[T]:
        return self if obj is None else getattr(obj.session, self.name)

    def __set__(self, obj: EvalStopCallback, value: T) -> None:
        setattr(obj.session, self.name, value)


@dataclass(frozen=True)
class _Eval:
    """One world-feedback eval waiting for its decision (the model is kept if it is a new best)."""

    step: int
    score: float | None
    model: Any
    tokenizer: Any


class _Configured:
    """``EvalStopCallback``'s configuration, read-only (it lives in its session's config)."""

    session: EvalStopSession
    mode: ClassVar[FeedbackMode]
    _trainer_job_type: str | None = None
    job_id: Any
    eval_every: int | None
    save_best: bool
    keep_best: str
    keep_snapshots: bool
    eval_on_all_ranks: bool
    load_best_at_end: bool
    keep_checkpoints: bool
    history: Any
    best_step: Any
    best_score: Any
    best_checkpoint: Any

    @property
    def external_eval(self) -> bool:
        """Whether snapshots go to ``evalstop evaluate`` workers (the external mode)."""
        return self.mode is FeedbackMode.EXTERNAL

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
        """The job type given, else the one inferred from the trainer (None before training)."""
        return self.config.job_type or self._trainer_job_type

    @property
    def would_stop_step(self) -> int | None:
        """Shadow mode: the step of the eval where the detector first decided to stop (None: not yet)."""
        return self.session.shadow.step

    # ------------------------------------------------------------------ ExportableState
    def state(self) -> dict[str, Any]:
        """The callback's arguments and history, for a checkpoint (``TrainerState.stateful_callbacks``)."""
        c = self.config
        return {
            "args": {"job_id": self.job_id, "eval_every": self.eval_every, "job_type": c.job_type,
                     "detector": c.detector, "save_best": self.save_best, "keep_best": self.keep_best,
                     "max_eval_failures": c.max_eval_failures, "on_eval_error": c.on_eval_error,
                     "fail_mode": c.fail_mode, "shadow": c.shadow, "tags": dict(c.tags),
                     "external_eval": self.external_eval,
                     "keep_snapshots": self.keep_snapshots, "eval_on_all_ranks": self.eval_on_all_ranks,
                     "load_best_at_end": self.load_best_at_end, "keep_checkpoints": self.keep_checkpoints,
                     "heartbeat_s": self.session.heartbeat.every_s, "_restored": True, **c.params},
            "attributes": {"history": self.history, "best_step": self.best_step, "best_score": self.best_score,
                           "best_checkpoint": self.best_checkpoint},
        }

    @staticmethod
    def first_in(trainer: Any) -> None:
        """Move this trainer's EvalStopCallback to the front of its callbacks (it does so itself when the
        trainer is built and when training begins; kept for scripts that call it)."""
        handler = trainer.callback_handler
        mine = [c for c in handler.callbacks if isinstance(c, EvalStopCallback)]
        handler.callbacks[:] = mine + [c for c in handler.callbacks if not isinstance(c, EvalStopCallback)]


class EvalStopCallback(_Configured, TrainerCallback, ExportableState):
    """Stop training when world feedback declines ``k`` evals in a row (see the module docstring).

    ``EvalStopCallback(...)`` returns the adapter of its :class:`FeedbackMode` (a subclass); every one
    is an ``EvalStopCallback``.

    Args:
        world_feedback: ``(model, tokenizer) -> float`` run every ``eval_every`` steps, or the name
            of a metric of the trainer's own evaluation (e.g. ``"eval_reward"``).
        eval_every: optimizer steps between world-feedback evals (required with a callable).
        coordinator: None (``$EVALSTOP_URL`` if set, else embedded SQLite under ``output_dir``), an
            ``http(s)://`` URL of ``evalstop serve``, an ``EvalStopClient``/``EmbeddedClient`` or a ``Coordinator``.
        token: the tenant token for a URL (default: ``$EVALSTOP_TOKEN``).
        job_id: the job's id (default: see :func:`default_job_id`).
        job_type: ``grpo``, ``rloo``, ``dpo``, ``online_dpo``, ``ppo``, ``sft``, ``rlhf``, ``other``; None: from
            the trainer's class (:func:`infer_job_type`).
        detector, k, min_delta, **detector_params: the stop rule (see ``create_detector``).
        direction: ``"max"`` (higher is better) or ``"min"``; None: ``"min"`` for a loss-like metric
            name, else ``"max"``.
        save_best: keep the best checkpoint; keep_best: ``"copy"`` (to ``<output_dir>/evalstop-best``, or
            ``evalstop-best-<job_id>`` when it holds another job's) or ``"checkpoint"`` (the trainer saves
            ``checkpoint-N`` at each new best; its path is kept).
        load_best_at_end: at the end of training (a stop included) load the best weights into the model.
        keep_checkpoints: after a stop, keep the trainer's checkpoints newer than the best (default: removed).
        heartbeat_s: seconds between heartbeats that keep the job's lease (None or 0: none).
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

    Raises:
        ValueError: a missing or invalid option (the message names it and what it must be).
    """

    mode: ClassVar[FeedbackMode]
    _adapters: ClassVar[dict[FeedbackMode, type[EvalStopCallback]]] = {}
    #: Set on each instance's own class: the instance. transformers restores a callback from a checkpoint
    #: with ``type(callback)(**state["args"])``, so the copy finds the callback it replaces through the
    #: trainer that held it, not through a process-wide list.
    _owner: ClassVar[weakref.ref[EvalStopCallback] | None] = None
    _face: ClassVar[type[EvalStopCallback]]

    decision: _OnSession[Decision | None] = _OnSession()
    best_step: _OnSession[int | None] = _OnSession()
    best_score: _OnSession[float | None] = _OnSession()
    best_checkpoint: _OnSession[str | None] = _OnSession()
    job_id: _OnSession[str | None] = _OnSession()
    client: _OnSession[Any] = _OnSession()
    history: _OnSession[list[dict[str, Any]]] = _OnSession()
    stopped_at: _OnSession[int | None] = _OnSession()
    attempt: _OnSession[int] = _OnSession()
    stop_lag: _OnSession[int | None] = _OnSession()

    def __init_subclass__(cls, mode: FeedbackMode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if mode is not None:
            cls.mode = mode
            EvalStopCallback._adapters[mode] = cls

    def __new__(cls, world_feedback: Any = None, *args: Any, **kwargs: Any) -> EvalStopCallback:
        if cls._owner is not None:  # transformers rebuilding this class's callback from a checkpoint
            return super().__new__(cls)
        if kwargs.get("_restored"):
            raise ValueError(_NO_DONOR)
        mode = FeedbackMode.of(world_feedback, bool(kwargs.get("external_eval")))
        adapter = cls._adapters.get(mode)
        if adapter is None:
            raise LookupError(f"EvalStopCallback: no adapter for {mode.value!r} world feedback is registered; "
                              "import EvalStopCallback from evalstop_trl.train.callback")
        # the mode's adapter; a user's subclass of EvalStopCallback comes first, before the adapter
        bases = (cls,) if issubclass(cls, adapter) else (adapter,) if cls is EvalStopCallback else (cls, adapter)
        return _new_owned(cls, bases)

    def __reduce__(self) -> tuple[Any, ...]:
        # its own class cannot be pickled by name: rebuild one over the same bases
        return _new_owned, (type(self)._face, type(self).__bases__), self.__dict__

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
        heartbeat_s: float | None = DEFAULT_LEASE_S / 4,
        _restored: bool = False,
        **detector_params: Any,
    ) -> None:
        owner = self._owner() if self._owner is not None else None
        donor = owner if owner is not None and owner is not self else None
        if donor is not None:  # JSON state carries no callable, no client, no token: the replaced callback has them
            world_feedback, token = donor.world_feedback, token or donor.token
            coordinator, _restored = coordinator or donor._coordinator_arg, True
        if _restored and world_feedback is None and self.mode is not FeedbackMode.EXTERNAL:
            raise ValueError(_NO_DONOR)
        self._check(world_feedback, eval_every, _restored)
        _check_options(keep_best)
        self._direction_note = None
        if direction is None and "direction" not in detector_params:
            direction = self._default_direction(world_feedback, quiet=_restored)
            self._direction_note = None if _restored or self.mode is not FeedbackMode.METRIC else direction
        config = SessionConfig.build(detector, k=k, min_delta=min_delta, direction=direction, job_type=job_type,
                                     max_eval_failures=max_eval_failures, on_eval_error=on_eval_error,
                                     fail_mode=fail_mode, shadow=shadow, tags=tags, **detector_params)
        self.world_feedback = None if self.mode is FeedbackMode.EXTERNAL else world_feedback
        self.eval_every, self._coordinator_arg, self.token = eval_every, coordinator, token
        self.save_best, self.keep_best, self.keep_snapshots = save_best, keep_best, keep_snapshots
        self.eval_on_all_ranks = bool(eval_on_all_ranks)
        self.load_best_at_end, self.keep_checkpoints = bool(load_best_at_end), bool(keep_checkpoints)
        self.session = EvalStopSession(config, job_id, heartbeat_s=heartbeat_s)
        self._is_main = True
        self._output_dir: str | None = None
        self._trainer_job_type: str | None = None
        self._pending_logs: dict[str, float] = {}
        if donor is not None:
            donor.session = self.session  # the user's own object follows this copy

    # ------------------------------------------------------------------ per mode
    @classmethod
    def _check(cls, world_feedback: Any, eval_every: Any, restored: bool) -> None:
        """Raise ValueError for options this mode cannot work with."""

    @classmethod
    def _default_direction(cls, world_feedback: Any, quiet: bool) -> str | None:
        """The direction when none is given (None: the detector's default)."""
        return "max"

    # ------------------------------------------------------------------ events every mode handles
    def on_init_end(self, args, state, control, **kwargs):
        self._join(*calling_trainer())

    def on_train_begin(self, args, state, control, **kwargs):
        self._join(*calling_trainer())
        self._is_main = state.is_world_process_zero
        self._output_dir = args.output_dir
        s = self.session
        if s.job_id is None:
            s.job_id = default_job_id(args)
        if self._is_main and s.client is None:
            s.config = dataclasses.replace(s.config, hparams=trainer_hparams(args, kwargs.get("model")))
            s.attach(connect(self._coordinator_arg, self.token, args.output_dir), step=state.global_step,
                     planned_steps=state.max_steps or None, job_type=self._trainer_job_type or infer_job_type(args=args))
            atexit.register(_fail_at_exit, weakref.ref(s))
            if self._direction_note is not None:
                log.warning("EvalStop: metric %r: %s is better (direction=%r, from its name); pass direction= to say "
                            "otherwise", self.world_feedback, "lower" if self.direction == "min" else "higher",
                            self.direction)
        message = share(s.message() if self._is_main else None)
        if message is not None:
            s.adopt(message)

    def on_step_end(self, args, state, control, **kwargs):
        self.session.beat()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending_logs and logs is not None:  # metrics of a decision made between logs
            logs.update(self._pending_logs)
            self._pending_logs = {}
        self.session.observe_logs(logs or {})

    def on_train_end(self, args, state, control, model=None, **kwargs):
        s = self.session
        s.finish()
        if s.stopped_at is not None and self._is_main and not self.keep_checkpoints:
            remove_checkpoints_after(args.output_dir, s.best_step)
        if self.load_best_at_end and model is not None and s.best_checkpoint and s.best_step != state.global_step \
                and load_best_weights(model, s.best_checkpoint):
            log.warning("EvalStop: loaded the best weights (step %s, score %s) from %s into the model "
                        "(load_best_at_end=True)", s.best_step, s.best_score, s.best_checkpoint)

    def _join(self, handler: Any, trainer: Any) -> None:
        """Take the front of the trainer's callbacks, so that every ``report_to`` integration (they come
        first in a trainer's list) sees the ``evalstop/*`` metrics; learn the job type from the trainer."""
        if handler is not None and handler.callbacks and handler.callbacks[0] is not self and self in handler.callbacks:
            # safe inside the handler's loop: only the callbacks before this one move, one place on
            handler.callbacks.remove(self)
            handler.callbacks.insert(0, self)
        if trainer is not None:
            self._trainer_job_type = infer_job_type(trainer)

    def _log_later(self, state: Any, control: Any, step: int, metrics: dict[str, float]) -> None:
        """``metrics`` in ``log_history`` now and in the trainer's next log (``report_to`` integrations)."""
        state.log_history.append({**metrics, "step": step})
        self._pending_logs.update(metrics)
        control.should_log = True

    # ------------------------------------------------------------------ an eval, decided
    def _decide(self, state: Any, control: Any, ev: _Eval, logs: dict[str, Any] | None) -> dict[str, float]:
        """Rank 0 reports the eval (keeping a new best's model); every rank applies its message, logs the
        ``evalstop/*`` metrics (in ``logs`` too: the integrations after this callback see them) and stops
        if told to. Returns the metrics."""
        s = self.session
        stop = False
        if self._is_main:
            kept = None
            if self.save_best and ev.model is not None and ev.score is not None and s.improves(ev.score):
                kept = self._keep(control, ev, ev.score)
            stop = s.report(ev.step, ev.score, kept)
        message = share(s.message(stop) if self._is_main else None)
        if message is not None:
            s.adopt(message)
            stop = message.stop
        metrics = s.eval_metrics(ev.score, stop)
        if logs is not None:
            logs.update(metrics)
        state.log_history.append({**metrics, "step": ev.step})
        if self._is_main:
            s.log_eval(ev.step, ev.score)
        if stop:
            control.should_training_stop = True
            s.stop_here(ev.step)
        return metrics

    def _keep(self, control: Any, ev: _Eval, score: float) -> str:
        """Keep the new best: a copy with evalstop.json (never over a better one), or the trainer's checkpoint."""
        out = self._output_dir or "."
        if self.keep_best == "checkpoint":
            control.should_save = True  # the trainer writes checkpoint-<step> at the end of this step
            return str(snapshot_path(out, ev.step))
        return keep_best_copy(out, ev.model, ev.tokenizer, job_id=self.job_id, step=ev.step, score=score,
                              direction=self.direction)


def _new_owned(face: type[EvalStopCallback], bases: tuple[type[EvalStopCallback], ...]) -> EvalStopCallback:
    """An instance of a class made for it alone, over ``bases``, named as ``face``, the class the user
    called (its name is the key of the callback's state in a checkpoint; see ``EvalStopCallback._owner``)."""
    own = type(face.__name__, bases, {"__module__": face.__module__, "__qualname__": face.__qualname__,
                                      "__doc__": face.__doc__, "_face": face})
    self = object.__new__(own)
    own._owner = weakref.ref(self)
    return self


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
