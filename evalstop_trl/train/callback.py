"""``EvalStopCallback``: EvalStop for any transformers ``Trainer`` or TRL trainer.

Usage::

    from evalstop_trl import EvalStopCallback

    cb = EvalStopCallback(world_feedback=my_eval, eval_every=20)   # my_eval(model, tokenizer) -> float
    trainer = GRPOTrainer(..., callbacks=[cb])
    trainer.train()
    cb.decision.reason, cb.best_step, cb.best_checkpoint

or, with the trainer's own evaluation: ``EvalStopCallback("eval_reward")`` (a key of the metrics
passed to ``on_evaluate``; a missing key raises, listing the keys that are there). Loss-like names
(``loss``, ``perplexity``, ``error``) are minimised (``direction="min"``, logged); pass
``direction=`` to say otherwise.

What it does:

* every ``eval_every`` optimizer steps (or at each ``on_evaluate``) the main process computes the
  world-feedback score and reports it, with the train loss and the trainer's reward (the proxy) of
  the same step's log, to the coordinator: an embedded one (SQLite under ``args.output_dir``) by
  default, ``$EVALSTOP_URL`` (set by ``evalstop run``), an ``evalstop serve`` URL, or a client /
  Coordinator object;
* the evaluation restores the Python, NumPy and torch RNG states and the model's train/eval mode,
  so training with the callback is bit-identical to training without it up to the stop;
* one log line per eval (step, score, best, declines, decision), and ``evalstop/score``,
  ``evalstop/best_score``, ``evalstop/declines``, ``evalstop/stop`` in the trainer's logs
  (``log_history``, ``trainer_state.json``, and the ``report_to`` integrations that come after the
  callback in the trainer's list: ``EvalStopCallback.first_in(trainer)`` puts it first);
* a failing eval (an exception, NaN or None: an LLM judge timing out) is a missing eval, logged once
  with its traceback; ``max_eval_failures`` failures in a row end as ``on_eval_error`` says
  (``"skip"``: go on, ``"stop"``: stop the job, ``"raise"``: raise);
* on a new best score the model (or the PEFT adapter) and tokenizer are saved atomically to
  ``<output_dir>/evalstop-best`` with ``evalstop.json`` (job, step, score, time); a resume never
  replaces it with a worse model. ``keep_best="checkpoint"`` keeps the trainer's own
  ``checkpoint-N`` instead of a copy;
* on STOP it sets ``control.should_training_stop``, acknowledges the stop and logs the reason; in
  multi-process training rank 0's decision, best step and score are broadcast, so every rank stops at
  the same step and knows the same best;
* **a job is its ``job_id``** (default: ``$EVALSTOP_JOB_ID``, else ``run_name``, else the output
  folder's name and a short hash of its path). A new process attaches to it as a new attempt, and
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
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..core.detectors import DETECTORS, Action, Decision, Observation
from ..core.errors import Conflict, EvalStopError
from .checkpoints import BEST_DIR, read_best, save_atomically
from .connect import connect
from .distributed import broadcast_object
from .evaluation import evaluate_preserving_state, finite, to_number

__all__ = ["EvalStopCallback", "default_job_id", "infer_direction"]

log = logging.getLogger("evalstop.callback")

REWARD_KEYS = ("reward", "rewards/mean", "objective/scores", "objective/rlhf_reward", "rewards/margins",
               "rewards/chosen")
LOSS_KEYS = ("loss", "train_loss")
_LOSS_LIKE = re.compile(r"(loss|perplexity|ppl|error|err|wer|cer)(\b|_|$)", re.IGNORECASE)
_EVAL_ERRORS = ("skip", "stop", "raise")
_FAIL_MODES = ("local", "open")
_KEEP_BEST = ("copy", "checkpoint")

# Callbacks created by users (weakly held), so that one rebuilt by transformers from a checkpoint's
# JSON state can take back the world-feedback callable, which JSON cannot carry, and keep the user's
# object up to date (the user holds that one, not transformers' copy).
_LIVE: list[weakref.ref[EvalStopCallback]] = []


def infer_direction(metric: str) -> str:
    """``"min"`` for loss-like metric names (loss, perplexity, error, ...), else ``"max"``."""
    return "min" if _LOSS_LIKE.search(metric) else "max"


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


class EvalStopCallback(TrainerCallback, ExportableState):
    """Stop training when world feedback declines ``k`` evals in a row (see the module docstring).

    Args:
        world_feedback: ``(model, tokenizer) -> float`` run every ``eval_every`` steps, or the name
            of a metric of the trainer's own evaluation (e.g. ``"eval_reward"``).
        eval_every: optimizer steps between world-feedback evals (required with a callable).
        coordinator: None (``$EVALSTOP_URL`` if set, else embedded SQLite under ``output_dir``), an
            ``http(s)://`` URL of ``evalstop serve``, an ``EvalStopClient``/``EmbeddedClient`` or a ``Coordinator``.
        token: the tenant token for a URL (default: ``$EVALSTOP_TOKEN``).
        job_id: the job's id (default: see :func:`default_job_id`).
        job_type: ``rlhf``, ``grpo``, ``rloo``, ``dpo``, ``online_dpo``, ``sft``, ...
        detector, k, min_delta, **detector_params: the stop rule (see ``create_detector``).
        direction: ``"max"`` (higher is better) or ``"min"``; None: ``"min"`` for a loss-like metric
            name, else ``"max"``.
        save_best: keep the best checkpoint; keep_best: ``"copy"`` (to ``<output_dir>/evalstop-best``)
            or ``"checkpoint"`` (the trainer saves ``checkpoint-N`` at each new best; its path is kept).
        max_eval_failures, on_eval_error: after this many failed evals in a row, ``"skip"`` (go on),
            ``"stop"`` (stop the job) or ``"raise"``.
        fail_mode: ``"local"`` (a local detector decides while the coordinator is unreachable) or
            ``"open"`` (never stop then).
        external_eval: publish a snapshot every ``eval_every`` steps for ``evalstop evaluate`` workers
            instead of evaluating in the loop; keep_snapshots: keep scored snapshots (default: only the best).
        eval_on_all_ranks: run ``world_feedback`` on every rank (a collective forward of a sharded
            model); rank 0's score is used.
    """

    def __init__(
        self,
        world_feedback: Callable[[Any, Any], float] | str | None = None,
        *,
        eval_every: int | None = None,
        coordinator: Any = None,
        token: str | None = None,
        job_id: str | None = None,
        job_type: str = "rlhf",
        detector: str = "decline",
        k: int = 2,
        min_delta: float = 0.0,
        direction: str | None = None,
        save_best: bool = True,
        keep_best: str = "copy",
        max_eval_failures: int = 3,
        on_eval_error: str = "skip",
        fail_mode: str = "local",
        external_eval: bool = False,
        keep_snapshots: bool = False,
        eval_on_all_ranks: bool = False,
        _restored: bool = False,
        **detector_params: Any,
    ) -> None:
        donor = None
        if _restored:
            alive = [c for c in (r() for r in _LIVE) if c is not None]
            donor = alive[-1] if alive else None
            if world_feedback is None:
                if donor is None:
                    raise ValueError("EvalStopCallback: a checkpoint's callback state cannot be restored without "
                                     "the callback itself: pass callbacks=[EvalStopCallback(world_feedback, ...)] "
                                     "to the trainer again.")
                world_feedback, coordinator = donor.world_feedback, coordinator or donor._coordinator_arg
                token = token or donor.token
        if external_eval:
            if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
                raise ValueError(f"EvalStopCallback: eval_every must be an integer >= 1 with external_eval=True, "
                                 f"but got eval_every={eval_every!r}.")
            if world_feedback is not None and not _restored:
                raise ValueError("EvalStopCallback: with external_eval=True the world feedback runs in "
                                 "'evalstop evaluate' workers; pass world_feedback=None.")
            world_feedback = None
        elif world_feedback is None:
            raise ValueError("EvalStopCallback needs world_feedback: a callable (model, tokenizer) -> float "
                             "or the name of an evaluation metric such as 'eval_reward'.")
        if external_eval:
            pass  # checked above
        elif callable(world_feedback):
            if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
                raise ValueError(f"EvalStopCallback: eval_every must be an integer >= 1 with a world_feedback "
                                 f"callable, but got eval_every={eval_every!r}.")
        elif not isinstance(world_feedback, str) or not world_feedback:
            raise ValueError(f"EvalStopCallback: world_feedback must be a callable or a metric name, "
                             f"but got {world_feedback!r}.")
        for name, value, allowed in (("keep_best", keep_best, _KEEP_BEST), ("on_eval_error", on_eval_error, _EVAL_ERRORS),
                                     ("fail_mode", fail_mode, _FAIL_MODES)):
            if value not in allowed:
                raise ValueError(f"EvalStopCallback: {name} must be one of {', '.join(allowed)}, but got {value!r}.")
        if isinstance(max_eval_failures, bool) or not isinstance(max_eval_failures, int) or max_eval_failures < 1:
            raise ValueError(f"EvalStopCallback: max_eval_failures must be an integer >= 1, got {max_eval_failures!r}.")
        for gone in ("enforce", "grace_s"):
            if gone in detector_params:
                if _restored:  # a checkpoint written by evalstop 0.1
                    detector_params.pop(gone)
                    continue
                raise ValueError(f"EvalStopCallback: {gone} was removed (the service never signals a process); run "
                                 "the training under 'evalstop run --grace-s S -- CMD' to stop a loop that ignores "
                                 "the stop flag.")
        accepted = DETECTORS.params(detector)  # ValueError listing the valid names
        if direction is None and "direction" not in detector_params and not external_eval:
            direction = infer_direction(world_feedback) if isinstance(world_feedback, str) else "max"
            if direction == "min" and not _restored:
                log.info("EvalStop: %r looks like a loss: lower is better (direction='min'); pass direction= "
                         "to say otherwise", world_feedback)
        # k, min_delta and direction are this signature's conveniences: passed on to detectors that take them
        params = {n: v for n, v in (("k", k), ("min_delta", min_delta), ("direction", direction))
                  if n in accepted and v is not None}
        params.update(detector_params)
        DETECTORS.create(detector, **params)  # validate now (unknown parameters, bad values)
        self.world_feedback = world_feedback
        self.eval_every = eval_every
        self._coordinator_arg = coordinator
        self.token = token
        self.job_id = job_id
        self.job_type = job_type
        self.detector, self.params = detector, params
        self.direction = params.get("direction", direction or "max")
        self.save_best, self.keep_best = save_best, keep_best
        self.max_eval_failures, self.on_eval_error, self.fail_mode = max_eval_failures, on_eval_error, fail_mode
        self.external_eval, self.keep_snapshots = external_eval, keep_snapshots
        self.eval_on_all_ranks = bool(eval_on_all_ranks)
        self.stop_lag: int | None = None  # external_eval: steps trained after the eval that decided the stop
        self._snapshots: list[int] = []  # external_eval: steps whose snapshots this process published
        self._remote: Any = None  # external_eval: the stopped job view the watcher saw
        self._watcher: Any = None
        self.client: Any = None
        self.decision: Decision | None = None
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_checkpoint: str | None = None
        self.history: list[dict[str, Any]] = []
        self.stopped_at: int | None = None
        self.attempt = 0
        self._mirror = donor  # the user's own object, kept up to date after a restore
        self._local = None  # the local detector (fail_mode="local")
        self._pending: tuple[int, float | None, Any, Any] | None = None  # an eval waiting for its step's log
        self._failures = 0
        self._ended = False
        self._last_loss: float | None = None
        self._last_reward: float | None = None
        self._is_main = True
        if not _restored:
            _LIVE[:] = [r for r in _LIVE if r() is not None] + [weakref.ref(self)]

    @staticmethod
    def first_in(trainer: Any) -> None:
        """Move this trainer's EvalStopCallback to the front of its callbacks, so that the
        ``report_to`` integrations also see the ``evalstop/*`` metrics of each eval."""
        handler = trainer.callback_handler
        mine = [c for c in handler.callbacks if isinstance(c, EvalStopCallback)]
        handler.callbacks[:] = mine + [c for c in handler.callbacks if not isinstance(c, EvalStopCallback)]

    # ------------------------------------------------------------------ ExportableState
    def state(self) -> dict[str, Any]:
        return {
            "args": {"job_id": self.job_id, "eval_every": self.eval_every, "job_type": self.job_type,
                     "detector": self.detector, "save_best": self.save_best, "keep_best": self.keep_best,
                     "max_eval_failures": self.max_eval_failures, "on_eval_error": self.on_eval_error,
                     "fail_mode": self.fail_mode, "external_eval": self.external_eval,
                     "keep_snapshots": self.keep_snapshots, "eval_on_all_ranks": self.eval_on_all_ranks,
                     "_restored": True, **self.params},
            "attributes": {"history": self.history, "best_step": self.best_step, "best_score": self.best_score,
                           "best_checkpoint": self.best_checkpoint},
        }

    def _publish(self) -> None:
        """Keep the user's own object (after transformers swapped in a restored copy) up to date."""
        mirror = self._mirror
        if mirror is not None and mirror is not self:
            for name in ("decision", "best_step", "best_score", "best_checkpoint", "stopped_at", "job_id", "attempt",
                         "client", "stop_lag"):
                setattr(mirror, name, getattr(self, name))
            mirror.history = self.history

    # ------------------------------------------------------------------ setup
    def on_train_begin(self, args, state, control, **kwargs):
        self._is_main = state.is_world_process_zero
        self._output_dir = args.output_dir
        if self.job_id is None:
            self.job_id = default_job_id(args)
        if self._is_main and self.client is None:
            self.client = connect(self._coordinator_arg, self.token, args.output_dir)
            self._attach(args, state)
            atexit.register(_mark_failed_at_exit, weakref.ref(self))
            if self.external_eval:
                self._start_watcher()
        shared = broadcast_object({"job_id": self.job_id, "best_step": self.best_step, "best_score": self.best_score,
                                   "best_checkpoint": self.best_checkpoint} if self._is_main else None)
        self.job_id, self.best_step, self.best_score, self.best_checkpoint = (
            shared["job_id"], shared["best_step"], shared["best_score"], shared["best_checkpoint"])
        self._publish()

    def _register(self, state) -> Any:
        policy = {"detector": self.detector, **self.params}
        try:
            return self.client.register_job(self.job_id, self.job_type, planned_steps=state.max_steps or None,
                                            policy=policy)
        except Conflict as exc:
            raise ValueError(f"EvalStopCallback: job {self.job_id!r} exists with another registration ({exc}); "
                             "use the same job_type, max_steps and policy to resume it, or another job_id") from None

    def _attach(self, args, state) -> None:
        """Register, or attach to the job as a new attempt; take the stored history as the truth."""
        view = self._register(state)
        if view is not None and view.n_reports and state.global_step == 0 and not self.history:
            base, n = self.job_id, 2  # a fresh run on a job that already has reports: a new run, a new id
            while view is not None and view.n_reports:
                self.job_id = f"{base}-{n}"
                n += 1
                view = self._register(state)
            log.warning("EvalStop: job %r already has reports and this run starts at step 0: it is a new run, "
                        "reported as %r", base, self.job_id)
        self.attempt = 1 if view is None or not view.n_reports else 2
        for h in self.history:  # a restored callback's own history: make sure the coordinator has it
            self._send(h)
        reports = []
        if view is not None:
            try:
                view = self.client.status(self.job_id)
                reports = self.client.reports(self.job_id)
            except EvalStopError as exc:
                log.warning("EvalStop: could not read job %r's history (%s); going on with what this process has",
                            self.job_id, exc)
        if view is not None and view.best_step is not None:
            self.best_step, self.best_score = view.best_step, view.best_score
            self.best_checkpoint = view.best_checkpoint
            self.decision = view.decision
        self._local = DETECTORS.create(self.detector, **self.params)
        for r in reports or [_Stored(h) for h in self.history]:
            self._local.observe(Observation(self.job_id, r.step, r.eval_score, r.train_loss, r.proxy_reward))
        if view is not None and view.n_reports and state.global_step:
            log.info("EvalStop: job %r resumed at step %d (attempt with %d stored reports, best step %s)",
                     self.job_id, state.global_step, view.n_reports, self.best_step)

    # ------------------------------------------------------------------ signals from the trainer
    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs if logs is not None else {}
        for key in LOSS_KEYS:
            if finite(logs.get(key)):
                self._last_loss = float(logs[key])
                break
        for key in REWARD_KEYS:
            if finite(logs.get(key)):
                self._last_reward = float(logs[key])
                break
        if self._pending is not None and self._pending[0] == state.global_step:
            self._decide(args, state, control, logs)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.external_eval:
            self._external_step(args, state, control)
            return
        if self._pending is not None:  # the trainer did not log the last eval's step: decide without it
            self._decide(args, state, control, None)
            if control.should_training_stop:
                return
        if not callable(self.world_feedback) or state.global_step % self.eval_every != 0:
            return
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        # sharded models (FSDP, ZeRO-3) need every rank in the forward pass: eval_on_all_ranks; rank 0's score counts
        score = self._evaluate(model, tokenizer, state.global_step) if self._is_main or self.eval_on_all_ranks else None
        self._pending = (state.global_step, score, model, tokenizer)
        control.should_log = True  # the report carries this step's loss and reward, from this step's log

    def on_save(self, args, state, control, **kwargs):
        if not (self.external_eval and self._is_main) or state.global_step % self.eval_every != 0:
            return
        step = state.global_step
        path = str(Path(args.output_dir) / f"checkpoint-{step}")
        if step in self._snapshots or not Path(path).is_dir():
            return
        self._snapshots.append(step)
        self.client.publish_snapshot(self.job_id, step, path, self._last_loss, self._last_reward)
        self._prune()

    def on_evaluate(self, args, state, control, metrics=None, model=None, processing_class=None, **kwargs):
        if callable(self.world_feedback) or self.external_eval:
            return
        metrics = metrics or {}
        name = self.world_feedback
        if name not in metrics:
            raise ValueError(f"EvalStopCallback: metric {name!r} is not in the evaluation metrics; "
                             f"available: {', '.join(sorted(metrics)) or '(none)'}.")
        value = to_number(metrics[name])
        score = float(value) if finite(value) else self._failed(state.global_step, f"metric {name!r} is {value!r}")
        self._pending = (state.global_step, score, model, processing_class or kwargs.get("tokenizer"))
        self._decide(args, state, control, metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:
            self._decide(args, state, control, None)
        self._ended = True
        if self._is_main and self.client is not None and self.stopped_at is None:
            try:
                self.client.finish(self.job_id)
            except EvalStopError as exc:
                log.warning("EvalStop: could not mark %s finished: %s", self.job_id, exc)

    # ------------------------------------------------------------------ external evals
    def _start_watcher(self) -> None:
        """A daemon thread long-polling the job's decision: the step loop learns a STOP at its next step."""
        import threading

        client, job_id, me = self.client, self.job_id, weakref.ref(self)

        def watch() -> None:
            while True:
                cb = me()
                if cb is None or cb._ended or cb._remote is not None:
                    return
                del cb
                try:
                    view = client.wait_decision(job_id, 10.0, stopped=True)
                except Exception:  # noqa: BLE001 - unreachable: keep training, try again
                    time.sleep(1.0)
                    continue
                cb = me()
                if cb is not None and view.status == "stopped":
                    cb._remote = view
                    return

        self._watcher = threading.Thread(target=watch, name="evalstop-watcher", daemon=True)
        self._watcher.start()

    def _external_step(self, args, state, control) -> None:
        if state.global_step % self.eval_every == 0:
            control.should_save = True  # the trainer's own save path writes checkpoint-<step> (FSDP/ZeRO-3 too)
            control.should_log = True
        remote = self._remote if self._is_main else None
        shared = broadcast_object(None if remote is None else {
            "decision": remote.decision, "best_step": remote.best_step, "best_score": remote.best_score,
            "best_checkpoint": remote.best_checkpoint} if self._is_main else None)
        if shared is None:
            return
        self.decision, self.best_step = shared["decision"], shared["best_step"]
        self.best_score, self.best_checkpoint = shared["best_score"], shared["best_checkpoint"]
        control.should_training_stop = True
        self.stopped_at = state.global_step
        if self._is_main:
            decided = (self.decision.evidence.get("steps") or [None])[-1] if self.decision else None
            self.stop_lag = None if decided is None else state.global_step - decided
            try:
                self.client.ack(self.job_id, self.best_checkpoint, state.global_step)
            except EvalStopError as exc:
                log.warning("EvalStop: could not acknowledge the stop: %s", exc)
            log.warning("EvalStop: stopping at step %d (stop lag %s steps after the deciding eval): %s; best step "
                        "%s (score %s), snapshot %s", state.global_step, self.stop_lag,
                        self.decision.reason if self.decision else "", self.best_step, self.best_score,
                        self.best_checkpoint)
            self._prune(final=True)
        self._publish()

    def _prune(self, final: bool = False) -> None:
        """Delete published snapshots already scored and not the best (unless keep_snapshots).

        ``final`` (the job is stopped): every snapshot but the best goes, scored or not. A stopped
        job's decision and best no longer change, so a score that arrives later (an evaluator that was
        behind) would only leave its snapshot on disk; an evaluator still holding one reports it missing."""
        if self.keep_snapshots or not self._snapshots:
            return
        try:
            view = self.client.status(self.job_id)
        except EvalStopError:
            return
        scored_to = view.last_step if view.last_step is not None else -1
        for step in list(self._snapshots):
            if (final or step <= scored_to) and step != view.best_step:
                path = Path(self._output_dir) / f"checkpoint-{step}"
                import shutil

                shutil.rmtree(path, ignore_errors=True)
                self._snapshots.remove(step)

    # ------------------------------------------------------------------ the work
    def _evaluate(self, model, tokenizer, step: int) -> float | None:
        """World feedback, or None for a failed eval (an exception, NaN or None), logged once."""
        try:
            score = evaluate_preserving_state(self.world_feedback, model, tokenizer)
        except Exception as exc:  # noqa: BLE001 - a failing judge must not kill the run
            return self._failed(step, f"{type(exc).__name__}: {exc}", exc)
        self._failures = 0
        return score

    def _failed(self, step: int, what: str, exc: BaseException | None = None) -> None:
        self._failures += 1
        if self._failures == 1:
            log.warning("EvalStop: the eval at step %d failed (%s); counted as a missing eval", step, what,
                        exc_info=exc)
        if self._failures >= self.max_eval_failures and self.on_eval_error == "raise":
            raise RuntimeError(f"EvalStopCallback: {self._failures} evals in a row failed (last: {what})") from exc
        return None

    def _send(self, entry: dict[str, Any]) -> Decision:
        try:
            return self.client.report(self.job_id, entry["step"], eval_score=entry["eval_score"],
                                      train_loss=entry.get("train_loss"), proxy_reward=entry.get("proxy_reward"),
                                      checkpoint=entry.get("checkpoint"))
        except Conflict as exc:  # a resumed run re-evaluating a step the coordinator already has
            log.warning("EvalStop: keeping the stored report for step %s (%s)", entry["step"], exc)
            try:
                return self.client.status(self.job_id).decision or Decision(Action.CONTINUE, "stored report kept")
            except EvalStopError:
                return Decision(Action.CONTINUE, "stored report kept")

    def _improves(self, score: float | None) -> bool:
        if score is None:
            return False
        if self.best_score is None:
            return True
        return score > self.best_score if self.direction == "max" else score < self.best_score

    def _decide(self, args, state, control, logs: dict | None) -> None:
        step, score, model, tokenizer = self._pending
        self._pending = None
        stop, give_up = False, False
        if self._is_main:
            entry = {"step": step, "eval_score": score, "train_loss": self._last_loss,
                     "proxy_reward": self._last_reward}
            improves = self._improves(score)
            if improves and self.save_best and model is not None:
                entry["checkpoint"] = self._keep(args, control, model, tokenizer, step, score)
            decision = self._send(entry)
            local = self._local.observe(Observation(self.job_id, step, score, entry["train_loss"],
                                                    entry["proxy_reward"]))
            if getattr(self.client, "unreachable", False):  # the coordinator cannot answer now
                decision = local if self.fail_mode == "local" else decision
            self.history.append(entry)
            self.decision = decision
            if decision.best_step is not None:
                self.best_step, self.best_score = decision.best_step, decision.best_score
            elif improves:
                self.best_step, self.best_score = step, score
            if improves and entry.get("checkpoint"):
                self.best_checkpoint = entry["checkpoint"]
            stop = decision.action is Action.STOP
            give_up = score is None and self._failures >= self.max_eval_failures and self.on_eval_error == "stop"
            if give_up and not stop:
                self._give_up(step)
                stop = True
        shared = broadcast_object({"stop": stop, "decision": self.decision, "best_step": self.best_step,
                                   "best_score": self.best_score, "best_checkpoint": self.best_checkpoint}
                                  if self._is_main else None)
        self.decision, self.best_step, self.best_score, self.best_checkpoint = (
            shared["decision"], shared["best_step"], shared["best_score"], shared["best_checkpoint"])
        self._record(state, logs, step, score, shared["stop"])
        if shared["stop"]:
            control.should_training_stop = True
            self.stopped_at = step
            if self._is_main and not give_up:
                try:
                    self.client.ack(self.job_id, self.best_checkpoint)
                except EvalStopError as exc:
                    log.warning("EvalStop: could not acknowledge the stop: %s", exc)
            if self._is_main:
                best = "none" if self.best_score is None else f"{self.best_score:.4g}"
                log.warning("EvalStop: stopping at step %d: %s; best step %s (score %s), checkpoint %s", step,
                            self.decision.reason if self.decision else "", self.best_step, best, self.best_checkpoint)
        self._publish()

    def _give_up(self, step: int) -> None:
        reason = f"{self._failures} evals in a row failed (on_eval_error='stop')"
        self.decision = Decision(Action.STOP, reason, self.best_step, self.best_score)
        try:
            self.client.stop(self.job_id, reason)
        except EvalStopError as exc:
            log.warning("EvalStop: could not record the stop: %s", exc)

    def _record(self, state, logs: dict | None, step: int, score: float | None, stop: bool) -> None:
        """One log line, and the evalstop/* metrics in the trainer's logs."""
        declines = None
        if self.decision is not None:
            ev = self.decision.evidence
            declines = ev.get("declines", ev.get("stale"))
        metrics = {"evalstop/score": score, "evalstop/best_score": self.best_score,
                   "evalstop/declines": declines, "evalstop/stop": int(stop)}
        metrics = {k: v for k, v in metrics.items() if v is not None}
        if logs is not None:
            logs.update(metrics)  # seen by the callbacks after this one (report_to integrations)
        state.log_history.append({**metrics, "step": step})
        if self._is_main:
            log.info("EvalStop step %d: score %s, best %s (step %s), declines %s, %s", step,
                     "failed" if score is None else f"{score:.4g}",
                     "none" if self.best_score is None else f"{self.best_score:.4g}", self.best_step,
                     declines, self.decision.reason if self.decision else "")

    def _keep(self, args, control, model, tokenizer, step: int, score: float) -> str | None:
        """Keep the new best: a copy with evalstop.json (never over a better one), or the trainer's checkpoint."""
        if self.keep_best == "checkpoint":
            control.should_save = True  # the trainer writes checkpoint-<step> at the end of this step
            return str(Path(args.output_dir) / f"checkpoint-{step}")
        kept = read_best(args.output_dir)
        if kept is not None and kept.get("job_id") == self.job_id and finite(kept.get("score")) and \
                not (score > kept["score"] if self.direction == "max" else score < kept["score"]):
            log.info("EvalStop: %s already holds a model at least as good (step %s, score %.4g): not replaced",
                     BEST_DIR, kept.get("step"), kept["score"])
            return str(Path(args.output_dir) / BEST_DIR)
        return save_atomically(args.output_dir, model, tokenizer,
                               {"job_id": self.job_id, "step": step, "score": score, "saved_at": time.time()})


class _Stored:
    """A history entry seen as a stored report (for the local detector)."""

    def __init__(self, h: dict[str, Any]) -> None:
        self.step, self.eval_score = h["step"], h.get("eval_score")
        self.train_loss, self.proxy_reward = h.get("train_loss"), h.get("proxy_reward")


def _mark_failed_at_exit(ref: weakref.ref) -> None:
    """At interpreter exit: a job whose training neither ended nor stopped failed (e.g. it crashed)."""
    cb = ref()
    if cb is None or cb._ended or cb.stopped_at is not None or cb.client is None:
        return
    exc = getattr(sys, "last_value", None)
    reason = f"the training process exited before the end of training ({type(exc).__name__ if exc else 'no exception'})"
    try:
        cb.client.fail(cb.job_id, reason)
    except Exception:  # noqa: BLE001 - at exit, say nothing more
        pass
