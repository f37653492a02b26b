"""``EvalStopCallback``: EvalStop for any transformers ``Trainer`` or TRL trainer.

Usage::

    from evalstop_trl import EvalStopCallback

    cb = EvalStopCallback(world_feedback=my_eval, eval_every=20)   # my_eval(model, tokenizer) -> float
    trainer = GRPOTrainer(..., callbacks=[cb])
    trainer.train()
    cb.decision.reason, cb.best_step, cb.best_checkpoint

or, with the trainer's own evaluation: ``EvalStopCallback("eval_reward")`` (a key of the metrics
passed to ``on_evaluate``; a missing key raises, listing the keys that are there).

What it does:

* every ``eval_every`` optimizer steps (or at each ``on_evaluate``) the main process computes the
  world-feedback score, with the train loss and the trainer's reward (the proxy) seen in the logs,
  and reports it to the coordinator: an embedded one (SQLite under ``args.output_dir``) by default,
  an ``evalstop serve`` URL, or a client / Coordinator object;
* the evaluation restores the Python, NumPy and torch RNG states and the model's train/eval mode,
  so training with the callback is bit-identical to training without it up to the stop;
* on a new best score it saves the model (or the PEFT adapter) and tokenizer atomically to
  ``<output_dir>/evalstop-best`` and reports that path;
* on STOP it sets ``control.should_training_stop``, acknowledges the stop and logs the reason;
  in multi-process training the decision is broadcast from rank 0 so every rank stops at the same
  step;
* it is an ``ExportableState``: resuming from a checkpoint keeps its history (and so the decline
  count, which is replayed into a coordinator that lacks it).

Trainers that ignore ``should_training_stop`` (e.g. the old experimental PPO loop, custom loops)
run under ``evalstop run -- CMD``: the launcher owns the process group and escalates SIGTERM, then
SIGKILL, when a stop is not acknowledged in time. Under the launcher the callback reports to the
launcher's coordinator and job (``EVALSTOP_URL``, ``EVALSTOP_TOKEN``, ``EVALSTOP_JOB_ID``).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..core.detectors import DETECTORS, Action, Decision
from ..core.errors import Conflict, EvalStopError
from .checkpoints import save_atomically
from .connect import connect
from .distributed import broadcast_stop
from .evaluation import evaluate_preserving_state, finite, to_number

__all__ = ["EvalStopCallback"]

log = logging.getLogger("evalstop.callback")

REWARD_KEYS = ("reward", "rewards/mean", "objective/scores", "objective/rlhf_reward", "rewards/margins",
               "rewards/chosen")
LOSS_KEYS = ("loss", "train_loss")

# Callbacks created by users (weakly held), so that one rebuilt by transformers from a checkpoint's
# JSON state can take back the world-feedback callable, which JSON cannot carry.
_LIVE: list[weakref.ref[EvalStopCallback]] = []


class EvalStopCallback(TrainerCallback, ExportableState):
    """Stop training when world feedback declines ``k`` evals in a row (see the module docstring).

    Args:
        world_feedback: ``(model, tokenizer) -> float`` run every ``eval_every`` steps, or the name
            of a metric of the trainer's own evaluation (e.g. ``"eval_reward"``).
        eval_every: optimizer steps between world-feedback evals (required with a callable).
        coordinator: None (``$EVALSTOP_URL`` if set, else embedded SQLite under ``output_dir``), an ``http(s)://`` URL of
            ``evalstop serve``, an ``EvalStopClient``/``EmbeddedClient`` or a ``Coordinator``.
        token: the tenant token for a URL (default: ``$EVALSTOP_TOKEN``).
        job_id: the job's id (default: ``$EVALSTOP_JOB_ID``, else the name of ``output_dir``).
        job_type: ``rlhf``, ``grpo``, ``rloo``, ``dpo``, ``online_dpo``, ``sft``, ...
        detector, k, min_delta, **detector_params: the stop rule (see ``create_detector``).
        save_best: save the best checkpoint to ``<output_dir>/evalstop-best``.
        direction: ``"max"`` (default) or ``"min"`` for a loss-like metric.
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
        save_best: bool = True,
        _restored: bool = False,
        **detector_params: Any,
    ) -> None:
        if world_feedback is None and _restored:
            alive = [c for c in (r() for r in _LIVE) if c is not None]
            donor = next((c for c in reversed(alive) if c.job_id in (None, job_id)), None)
            if donor is None:
                raise ValueError("EvalStopCallback: cannot restore from a checkpoint without a live callback; "
                                 "pass callbacks=[EvalStopCallback(world_feedback, ...)] to the trainer again.")
            world_feedback, coordinator = donor.world_feedback, coordinator or donor._coordinator_arg
        if world_feedback is None:
            raise ValueError("EvalStopCallback needs world_feedback: a callable (model, tokenizer) -> float "
                             "or the name of an evaluation metric such as 'eval_reward'.")
        if callable(world_feedback):
            if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
                raise ValueError(f"EvalStopCallback: eval_every must be an integer >= 1 with a world_feedback "
                                 f"callable, but got eval_every={eval_every!r}.")
        elif not isinstance(world_feedback, str) or not world_feedback:
            raise ValueError(f"EvalStopCallback: world_feedback must be a callable or a metric name, "
                             f"but got {world_feedback!r}.")
        for gone in ("enforce", "grace_s"):
            if gone in detector_params:
                if _restored:  # a checkpoint written by evalstop 0.1
                    detector_params.pop(gone)
                    continue
                raise ValueError(f"EvalStopCallback: {gone} was removed (the service never signals a process); run "
                                 "the training under 'evalstop run --grace-s S -- CMD' to stop a loop that ignores "
                                 "the stop flag.")
        accepted = DETECTORS.params(detector)  # ValueError listing the valid names
        # k and min_delta are this signature's conveniences: passed on to detectors that take them
        params = {name: v for name, v in (("k", k), ("min_delta", min_delta)) if name in accepted}
        params.update(detector_params)
        DETECTORS.create(detector, **params)  # validate now (unknown parameters, bad values)
        self.world_feedback = world_feedback
        self.eval_every = eval_every
        self._coordinator_arg = coordinator
        self.token = token
        self.job_id = job_id
        self.job_type = job_type
        self.detector, self.params = detector, params
        self.save_best = save_best
        self.client: Any = None
        self.decision: Decision | None = None
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_checkpoint: str | None = None
        self.history: list[dict[str, Any]] = []
        self.stopped_at: int | None = None
        self._last_loss: float | None = None
        self._last_reward: float | None = None
        self._is_main = True
        if not _restored:
            _LIVE[:] = [r for r in _LIVE if r() is not None] + [weakref.ref(self)]

    # ------------------------------------------------------------------ ExportableState
    def state(self) -> dict[str, Any]:
        return {
            "args": {"job_id": self.job_id, "eval_every": self.eval_every, "job_type": self.job_type,
                     "detector": self.detector, "save_best": self.save_best, "_restored": True, **self.params},
            "attributes": {"history": self.history, "best_step": self.best_step, "best_score": self.best_score,
                           "best_checkpoint": self.best_checkpoint},
        }

    # ------------------------------------------------------------------ setup
    def on_train_begin(self, args, state, control, **kwargs):
        self._is_main = state.is_world_process_zero
        if self.job_id is None:
            self.job_id = os.environ.get("EVALSTOP_JOB_ID") or Path(args.output_dir).resolve().name or "job"
        if not self._is_main or self.client is not None:
            return
        self.client = connect(self._coordinator_arg, self.token, args.output_dir)
        policy = {"detector": self.detector, **self.params}
        self.client.register_job(self.job_id, self.job_type, planned_steps=state.max_steps or None, policy=policy)
        for h in self.history:  # after a resume: make sure the coordinator has the whole history
            self._send(h)

    # ------------------------------------------------------------------ signals from the trainer
    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        for key in LOSS_KEYS:
            if finite(logs.get(key)):
                self._last_loss = float(logs[key])
                break
        for key in REWARD_KEYS:
            if finite(logs.get(key)):
                self._last_reward = float(logs[key])
                break

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not callable(self.world_feedback) or state.global_step % self.eval_every != 0:
            return
        score = None
        if self._is_main:
            tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
            score = evaluate_preserving_state(self.world_feedback, model, tokenizer)
        self._observe(args, state, control, score, model, processing_class or kwargs.get("tokenizer"))

    def on_evaluate(self, args, state, control, metrics=None, model=None, processing_class=None, **kwargs):
        if callable(self.world_feedback):
            return
        metrics = metrics or {}
        name = self.world_feedback
        if name not in metrics:
            raise ValueError(f"EvalStopCallback: metric {name!r} is not in the evaluation metrics; "
                             f"available: {', '.join(sorted(metrics)) or '(none)'}.")
        value = metrics[name]
        value = to_number(value)
        if not finite(value):
            raise ValueError(f"EvalStopCallback: metric {name!r} is {value!r} at step {state.global_step}; "
                             "world feedback must be a finite number.")
        self._observe(args, state, control, float(value), model, processing_class or kwargs.get("tokenizer"))

    def on_train_end(self, args, state, control, **kwargs):
        if self._is_main and self.client is not None and self.stopped_at is None:
            try:
                self.client.finish(self.job_id)
            except EvalStopError as exc:
                log.warning("EvalStop: could not mark %s finished: %s", self.job_id, exc)

    # ------------------------------------------------------------------ the work
    def _send(self, entry: dict[str, Any]) -> Decision:
        try:
            return self.client.report(self.job_id, entry["step"], eval_score=entry["eval_score"],
                                      train_loss=entry.get("train_loss"), proxy_reward=entry.get("proxy_reward"),
                                      checkpoint=entry.get("checkpoint"))
        except Conflict as exc:  # a resumed run re-evaluating a step the coordinator already has
            log.warning("EvalStop: keeping the stored report for step %s (%s)", entry["step"], exc)
            return self.client.status(self.job_id).decision or Decision(Action.CONTINUE, "stored report kept")

    def _observe(self, args, state, control, score, model, tokenizer) -> None:
        step = state.global_step
        stop = False
        if self._is_main:
            entry = {"step": step, "eval_score": score, "train_loss": self._last_loss,
                     "proxy_reward": self._last_reward}
            if self.best_score is None:
                improves = True
            elif self.params.get("direction", "max") == "max":
                improves = score > self.best_score
            else:
                improves = score < self.best_score
            if improves and self.save_best and model is not None:
                entry["checkpoint"] = save_atomically(args.output_dir, model, tokenizer)
            decision = self._send(entry)
            self.history.append(entry)
            self.decision = decision
            if decision.best_step is not None:
                self.best_step, self.best_score = decision.best_step, decision.best_score
            elif improves:
                self.best_step, self.best_score = step, score
            if improves and entry.get("checkpoint"):
                self.best_checkpoint = entry["checkpoint"]
            stop = decision.action is Action.STOP
        stop = broadcast_stop(stop)
        if stop:
            control.should_training_stop = True
            self.stopped_at = step
            if self._is_main:
                try:
                    self.client.ack(self.job_id, self.best_checkpoint)
                except EvalStopError as exc:
                    log.warning("EvalStop: could not acknowledge the stop: %s", exc)
                msg = (f"EvalStop: stopping at step {step}: {self.decision.reason}; best step {self.best_step} "
                       f"(score {self.best_score:.4g}), checkpoint {self.best_checkpoint}")
                log.warning(msg)
