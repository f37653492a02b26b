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
* one log line per eval (step, score, best, declines, decision), and ``evalstop/score``,
  ``evalstop/best_score``, ``evalstop/declines``, ``evalstop/stop``, ``evalstop/eval_failures`` in the
  trainer's logs (``log_history``, ``trainer_state.json``, the printer, and the ``report_to``
  integrations: the callback moves itself to the front of the trainer's callbacks when the trainer is
  built and when training begins; metric mode logs them in a log event of its own at the eval's step;
  external mode logs ``evalstop/stop``, ``evalstop/best_score`` and ``evalstop/stop_lag`` at the stop);
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
  the best weights into the model at the end of training, as ``load_best_model_at_end`` does;
* the job type comes from the trainer's class (``GRPOTrainer`` -> ``grpo``, ``DPOTrainer`` -> ``dpo``,
  a plain ``Trainer`` -> ``other``, ...) unless ``job_type=`` says; a heartbeat every ``heartbeat_s``
  seconds (75: a quarter of the default lease) keeps the job from turning ``lost`` between evals;
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

How it is built: :class:`~evalstop_trl.train.session.EvalStopSession` decides (no trainer, no torch);
``EvalStopCallback(...)`` returns the thin adapter of its mode over a session (a callable, a metric
name, or ``external_eval=True``), and every rank applies rank 0's
:class:`~evalstop_trl.train.ranks.RankMessage` at each decision point. A callback that transformers
rebuilds from a checkpoint (``restore_callback_states_from_checkpoint=True``) takes the world-feedback
callable and the coordinator from the callback it replaces in that trainer, and the user's object
sees the rebuilt one's session.
"""

from __future__ import annotations

from . import adapters  # noqa: F401 - registers the adapter of each mode
from .base import EvalStopCallback, FeedbackMode, default_job_id, infer_job_type
from .session import LOSS_KEYS, REWARD_KEYS, EvalStopSession, infer_direction

__all__ = ["LOSS_KEYS", "REWARD_KEYS", "EvalStopCallback", "EvalStopSession", "FeedbackMode", "default_job_id",
           "infer_direction", "infer_job_type"]
