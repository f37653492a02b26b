"""The three ``EvalStopCallback`` adapters, one per :class:`~.base.FeedbackMode`: where the score of an
eval comes from and when it is decided. Each is a thin shell over the callback's session."""

from __future__ import annotations

import difflib
from typing import Any

from .base import EvalStopCallback, FeedbackMode, _Eval, calling_trainer, default_job_id
from .evaluation import evaluate_preserving_state
from .external import DecisionWatcher, keep_earlier_bests, prune_snapshots, snapshot_path
from .ranks import RankMessage, share
from .session import infer_direction

__all__: list[str] = []  # reached through EvalStopCallback(...), never by name


def _check_every(eval_every: Any, what: str) -> None:
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"EvalStopCallback: eval_every must be an integer >= 1 with {what}, "
                         f"but got eval_every={eval_every!r}.")


class _CallableFeedback(EvalStopCallback, mode=FeedbackMode.CALLABLE):
    """``world_feedback(model, tokenizer)`` every ``eval_every`` steps, at the end of the step; the
    decision waits for that step's log (the report carries its loss and reward), or for the next step
    when the trainer logs nothing."""

    _pending: _Eval | None = None

    @classmethod
    def _check(cls, world_feedback: Any, eval_every: Any, restored: bool) -> None:
        _check_every(eval_every, "a world_feedback callable")

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.session.beat()
        if self._pending is not None:  # the trainer did not log the last eval's step: decide without it
            self._decide_pending(state, control, None)
            if control.should_training_stop:
                return
        if state.global_step % self.eval_every != 0:
            return
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        # sharded models (FSDP, ZeRO-3) need every rank in the forward pass: eval_on_all_ranks; rank 0's score counts
        score = self._evaluate(model, tokenizer, state.global_step) if self._is_main or self.eval_on_all_ranks else None
        self._pending = _Eval(state.global_step, score, model, tokenizer)
        control.should_log = True  # the report carries this step's loss and reward, from this step's log

    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=logs, **kwargs)
        if self._pending is not None and self._pending.step == state.global_step:
            self._decide_pending(state, control, logs if logs is not None else {})

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:
            self._decide_pending(state, control, None)
        super().on_train_end(args, state, control, **kwargs)

    def _decide_pending(self, state: Any, control: Any, logs: dict[str, Any] | None) -> None:
        ev, self._pending = self._pending, None
        if ev is not None:
            self._decide(state, control, ev, logs)

    def _evaluate(self, model: Any, tokenizer: Any, step: int) -> float | None:
        """World feedback, or None for a failed eval (an exception, NaN or None), logged once."""
        try:
            score = evaluate_preserving_state(self.world_feedback, model, tokenizer, check=False)
        except Exception as exc:  # noqa: BLE001 - a failing judge must not kill the run
            return self.session.evals.failed(step, f"{type(exc).__name__}: {exc}", exc)
        return self.session.evals.accept(step, score, "world_feedback's score")


class _MetricFeedback(EvalStopCallback, mode=FeedbackMode.METRIC):
    """A metric of the trainer's own evaluation, decided at each ``on_evaluate``. The trainer must
    evaluate (``eval_strategy`` not ``"no"``: checked when training begins) and report the metric
    (checked at the first eval, listing the names there are). The trainer has logged the eval before
    ``on_evaluate``: the ``evalstop/*`` metrics go out in a log event of their own."""

    @classmethod
    def _default_direction(cls, world_feedback: Any, quiet: bool) -> str | None:
        return infer_direction(world_feedback)  # said at WARNING when training begins

    def on_train_begin(self, args, state, control, **kwargs):
        strategy = getattr(args, "eval_strategy", None)
        if strategy is not None and getattr(strategy, "value", strategy) == "no":
            raise ValueError(f"EvalStopCallback({self.world_feedback!r}) reads a metric of the trainer's evaluation, "
                             "but the trainer never evaluates (eval_strategy='no'); set eval_strategy='steps' with "
                             "eval_steps (or 'epoch') and an eval_dataset, or pass a world_feedback callable with "
                             "eval_every.")
        super().on_train_begin(args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics=None, model=None, processing_class=None, **kwargs):
        metrics = metrics if metrics is not None else {}
        name = self.world_feedback
        if name not in metrics:
            close = difflib.get_close_matches(name, [str(m) for m in metrics], n=1)
            raise ValueError(f"EvalStopCallback: metric {name!r} is not in the evaluation metrics; "
                             f"available: {', '.join(sorted(metrics)) or '(none)'}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}.")
        score = self.session.evals.accept(state.global_step, metrics[name], f"metric {name!r}")
        tokenizer = processing_class if processing_class is not None else kwargs.get("tokenizer")
        out = self._decide(state, control, _Eval(state.global_step, score, model, tokenizer), metrics)
        handler, _ = calling_trainer()
        if handler is not None:  # the report_to integrations (and the printer) see them at this step
            handler.on_log(args, state, control, logs=dict(out))


class _ExternalFeedback(EvalStopCallback, mode=FeedbackMode.EXTERNAL):
    """``evalstop evaluate`` workers score the snapshots the run publishes every ``eval_every`` steps (the
    trainer's own ``checkpoint-<step>``); a watcher thread learns of a stop, which every rank applies at
    the next step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshots: list[int] = []  # steps whose snapshots this process published and has not pruned
        self._watcher: DecisionWatcher | None = None

    @classmethod
    def _check(cls, world_feedback: Any, eval_every: Any, restored: bool) -> None:
        _check_every(eval_every, "external_eval=True")
        if world_feedback is not None and not restored:
            raise ValueError("EvalStopCallback: with external_eval=True the world feedback runs in "
                             "'evalstop evaluate' workers; pass world_feedback=None.")

    @classmethod
    def _default_direction(cls, world_feedback: Any, quiet: bool) -> str | None:
        return None

    def on_train_begin(self, args, state, control, **kwargs):
        requested = self.session.job_id or default_job_id(args)
        super().on_train_begin(args, state, control, **kwargs)
        current = self.session.job_id
        if self._is_main and requested and current and current != requested:  # a rerun: NAME-2, ...
            keep_earlier_bests(self.client, requested, current, args.output_dir)
        if self._is_main and self._watcher is None:
            self._watcher = DecisionWatcher(self.client, self.session.job_id or "")

    def on_step_end(self, args, state, control, **kwargs):
        self.session.beat()
        if state.global_step % self.eval_every == 0:
            control.should_save = True  # the trainer's own save path writes checkpoint-<step> (FSDP/ZeRO-3 too)
            control.should_log = True
        seen = self._watcher.stopped if self._is_main and self._watcher is not None else None
        message = share(None if seen is None else RankMessage.from_view(seen, stop=True))
        if message is None:
            return
        s = self.session
        s.adopt(message)
        control.should_training_stop = True
        s.stop_after_external_eval(state.global_step, None if seen is None else _decided_at(seen))
        stopped = {"evalstop/stop": 1, "evalstop/best_score": s.best_score, "evalstop/stop_lag": s.stop_lag}
        self._log_later(state, control, state.global_step, {k: v for k, v in stopped.items() if v is not None})
        if self._is_main:
            self._prune(final=True)

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        path = snapshot_path(args.output_dir, step)
        if not self._is_main or step % self.eval_every != 0 or step in self._snapshots or not path.is_dir():
            return
        self._snapshots.append(step)
        self.session.publish_snapshot(step, str(path))
        self._prune()

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        if self._watcher is not None:
            self._watcher.close()

    def _prune(self, final: bool = False) -> None:
        """Delete published snapshots already scored and not the best (``final``: all but the best)."""
        if not self.keep_snapshots:
            prune_snapshots(self.client, self.session.job_id or "", self._output_dir or ".", self._snapshots,
                            final=final)


def _decided_at(view: Any) -> int | None:
    """The step of the eval that stopped the job: the decision's last step, else the last step fed."""
    steps = view.decision.evidence.get("steps") if view.decision is not None else None
    return steps[-1] if steps else view.last_step
