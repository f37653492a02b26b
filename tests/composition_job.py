"""A tiny hacked GRPO job for tests/test_composition.py, run as a real process, directly or under
``evalstop run -- python tests/composition_job.py ...`` (not a test module: it trains when run).

    python tests/composition_job.py --out DIR --mode callable|metric|external [--max-steps 90]
        [--eval-every 10] [--job-id J] [--coordinator URL] [--resume] [--die-at STEP] [--result FILE]

World feedback: ``log-jsonl`` / ``log-verl`` / ``log-tb`` have no EvalStopCallback at all: the gold eval is
written every ``eval_every`` steps to a log as verl's file logger (``--out/metrics.jsonl``), verl's console
logger (``--out/verl.log``) or TensorBoard (``--out/tb``) write it, for ``evalstop run --metric-from``;
``callable`` runs the gold eval in the loop; ``metric`` reads the trainer's own
evaluation (a gold reward function of weight 0 gives ``eval_rewards/gold/mean``); ``external`` publishes
snapshots for ``evalstop evaluate --fn evalstop_trl.train.tiny:gold_hacked`` workers. The trainer saves
``checkpoint-N`` every ``eval_every`` steps into ``--out`` (the embedded store is ``--out/evalstop.db``).
``--die-at STEP`` SIGKILLs the process at the end of that step (a preemption, an OOM kill: no atexit).
The token of ``--coordinator`` comes from ``$EVALSTOP_TOKEN``. On a normal exit ``--result`` (default
``--out/result.json``) gets what the callback saw.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from evalstop_trl.train.tiny import (
    GoldEval,
    Preset,
    build_model,
    build_tokenizer,
    make_prompts,
    proxy_reward,
    save_tiny,
)

# lr 1e-3: gold peaks near step 30 and falls from 40, so eval_every=10 stops at step 50 (decline, k=2)
PRESET = Preset("hacked", lr=1e-3)
METRIC = "eval_rewards/gold/mean"


#: the log-* modes: (file under --out, --metric-from kind, key) -- the key as each stack names a validation score
LOG_MODES = {"log-jsonl": ("metrics.jsonl", "jsonl", "val-core/tiny/gold/mean@1"),
             "log-verl": ("verl.log", "verl_console", "val/test_score/tiny"),
             "log-tb": ("tb", "tensorboard", "eval/gold")}


class LogWriter(TrainerCallback):
    """Writes the gold eval every ``every`` steps the way a stack without a callback logs it."""

    def __init__(self, mode: str, out: Path, every: int) -> None:
        self.name, self.kind, self.key = LOG_MODES[mode]
        self.path, self.every, self.gold, self.writer = out / self.name, every, GoldEval(PRESET), None

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.every:
            return
        from evalstop_trl.train.evaluation import evaluate_preserving_state

        step, value = state.global_step, evaluate_preserving_state(self.gold, model, processing_class)
        with open(self.path.parent / "scores.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "score": value}) + "\n")
        if self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = self.writer or SummaryWriter(str(self.path))
            self.writer.add_scalar("train/loss", 1.0 / step, step)
            self.writer.add_scalar(self.key, value, step)
            self.writer.flush()
            return
        with open(self.path, "a") as f:
            if self.kind == "jsonl":
                f.write(json.dumps({"step": step, "elapsed_seconds": 1.0, "data": {self.key: value, "actor/kl": 0.1}})
                        + "\n")
            else:
                f.write(f"(TaskRunner pid={os.getpid()}) step:{step} - actor/kl:np.float64(0.1) - {self.key}:{value:.4f}\n")


class DieAt(TrainerCallback):
    """SIGKILL this process at the end of ``step`` (after the trainer's checkpoint of an earlier step)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class Slow(TrainerCallback):
    """``delay`` seconds more per step (external mode: a real step takes longer than a tiny eval)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.delay)


class Integration(TrainerCallback):
    """Records every log it is given, like a ``report_to`` integration (placed where transformers puts
    them: before the user's callbacks)."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({"step": state.global_step, **{k: v for k, v in (logs or {}).items()
                                                        if isinstance(v, (int, float))}})


class StepMark(TrainerCallback):
    """A user's callback listed before EvalStopCallback: it marks each step, and the world feedback
    records the mark it sees (the eval's own step when the callbacks run in the user's order)."""

    def __init__(self) -> None:
        self.step = -1

    def on_step_end(self, args, state, control, **kwargs):
        self.step = state.global_step


class Marked:
    """The gold eval, recording the mark of ``StepMark`` at each call."""

    def __init__(self, mark: StepMark) -> None:
        self.gold, self.mark, self.seen = GoldEval(PRESET), mark, []

    def __call__(self, model, tokenizer) -> float:
        self.seen.append(self.mark.step)
        return self.gold(model, tokenizer)


class FlakyLoss:
    """A loss-like world feedback (1 - gold, lower is better) whose eval at ``fail_at`` raises."""

    def __init__(self, fail_at: int) -> None:
        self.gold, self.fail_at, self.calls = GoldEval(PRESET), fail_at, 0

    def __call__(self, model, tokenizer) -> float:
        self.calls += 1
        if self.calls == self.fail_at:
            raise TimeoutError("the judge timed out")
        return 1.0 - self.gold(model, tokenizer)


def gold(prompts=None, completions=None, **kw) -> list[float]:
    """The gold reward of each completion (weight 0: only the trainer's evaluation reports it)."""
    return [str(c).count(PRESET.target) / max(len(str(c)), 1) for c in completions]


def build(a: argparse.Namespace):
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from evalstop_trl import EvalStopCallback

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    model = build_model(tok, seed=a.seed)
    save_tiny(model, tok, out / "base-model")
    prompts = make_prompts(512, a.seed + 1)
    kw = dict(job_id=a.job_id, coordinator=a.coordinator, heartbeat_s=1.0, **json.loads(a.callback_kwargs))
    extra: dict = {}
    reward_funcs = [proxy_reward(PRESET)]
    eval_dataset = None
    mark = StepMark() if a.user_first else None
    if a.mode == "callable":
        feedback = (FlakyLoss(a.flaky_at) if a.flaky_at else Marked(mark) if mark
                    else GoldEval(PRESET, per_example=a.per_example, with_proxy=a.with_proxy))
        cb = EvalStopCallback(feedback, eval_every=a.eval_every, **kw)
    elif a.mode == "metric":
        cb = EvalStopCallback(a.metric, **kw)
        reward_funcs.append(gold)
        extra = dict(reward_weights=[1.0, 0.0], eval_strategy=a.eval_strategy, eval_steps=a.eval_every,
                     per_device_eval_batch_size=16)
        eval_dataset = Dataset.from_dict({"prompt": make_prompts(8, 4242)})
    elif a.mode in LOG_MODES:
        cb = LogWriter(a.mode, out, a.eval_every)
    else:
        cb = EvalStopCallback(external_eval=True, eval_every=a.eval_every, **kw)
    args = GRPOConfig(output_dir=str(out), learning_rate=PRESET.lr, max_steps=a.max_steps, logging_steps=5,
                      lr_scheduler_type="constant", report_to="none", use_cpu=True, save_strategy="steps",
                      save_steps=a.eval_every, seed=a.seed, disable_tqdm=True, log_level="error",
                      per_device_train_batch_size=16, num_generations=8, max_completion_length=8, beta=0.0,
                      temperature=1.0, **extra)
    callbacks = ([mark] if mark else []) + [cb] + ([Slow(a.slow)] if a.slow else []) + ([DieAt(a.die_at)] if a.die_at else [])
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), eval_dataset=eval_dataset,
                          processing_class=tok, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    if isinstance(cb, EvalStopCallback):
        cb.trainer = trainer  # as trainer=: EvalStop's metrics go through trainer.log to report_to
    integration = Integration()
    handler = trainer.callback_handler.callbacks
    handler.insert(next(i for i, c in enumerate(handler) if c is cb or isinstance(c, (EvalStopCallback, LogWriter))),
                   integration)
    return trainer, cb, integration


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=("callable", "metric", "external", *LOG_MODES), required=True)
    p.add_argument("--max-steps", type=int, default=90)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--job-id")
    p.add_argument("--coordinator")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--die-at", type=int)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metric", default=METRIC)
    p.add_argument("--eval-strategy", default="steps")
    p.add_argument("--flaky-at", type=int, default=0, help="callable mode: 1 - gold, and the N-th eval raises")
    p.add_argument("--user-first", action="store_true",
                   help="callable mode: a user callback listed before EvalStopCallback marks each step")
    p.add_argument("--per-example", action="store_true",
                   help="callable mode: the gold eval's per-prompt scores (the detectors see their paired noise)")
    p.add_argument("--with-proxy", action="store_true", dest="with_proxy",
                   help="callable mode: a WorldFeedback with the proxy's expected score of the eval's continuations")
    p.add_argument("--callback-kwargs", default="{}", help="more EvalStopCallback options, as JSON")
    p.add_argument("--result")
    a = p.parse_args(argv)
    trainer, cb, integration = build(a)
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    if a.mode in LOG_MODES:
        Path(a.result or Path(a.out) / "result.json").write_text(json.dumps({"steps_done": trainer.state.global_step}))
        return 0
    result = {
        "job_id": cb.job_id, "steps_done": trainer.state.global_step, "stopped_at": cb.stopped_at,
        "best_step": cb.best_step, "best_score": cb.best_score, "best_checkpoint": cb.best_checkpoint,
        "attempt": cb.attempt, "stop_lag": cb.stop_lag, "reason": cb.decision.reason if cb.decision else "",
        "history": [{"step": h["step"], "eval_score": h.get("eval_score"), "eval_n": h.get("eval_n"),
                     "eval_noise": h.get("eval_noise")} for h in cb.history],
        "evalstop_logs": [h for h in trainer.state.log_history if any(k.startswith("evalstop/") for k in h)],
        "reward_logs": [{"step": h["step"], "reward": h["reward"]} for h in trainer.state.log_history if "reward" in h],
        "integration_logs": [h for h in integration.logs if any(k.startswith("evalstop/") for k in h)],
        "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
        "marks_seen": getattr(cb.world_feedback, "seen", None),
    }
    Path(a.result or Path(a.out) / "result.json").write_text(json.dumps(result))
    print(f"composition_job: job {cb.job_id} steps {result['steps_done']} stopped_at {cb.stopped_at} "
          f"best {cb.best_step} ({cb.best_score}) at {cb.best_checkpoint}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
