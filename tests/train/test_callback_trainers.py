"""Issue 20, the training side, each with a real tiny transformers/TRL trainer (CPU): the launcher's job
adopted and its plan extended, the job type from the trainer, bests that never go backwards,
``load_best_at_end``, checkpoints past the best removed, metric mode that cannot silently do nothing,
and ``evalstop/*`` metrics that reach the ``report_to`` integrations in every mode (with ``trainer=``) and
``log_history`` (without it)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from evalstop_trl import Coordinator, MemoryStore  # noqa: E402
from evalstop_trl.clients.embedded import EmbeddedClient  # noqa: E402
from evalstop_trl.train.callback import EvalStopCallback  # noqa: E402

pytestmark = pytest.mark.slow


def _trainer(out: Path, cb: EvalStopCallback | None, max_steps: int, callbacks=(), **args):
    """A plain transformers Trainer on a tiny causal LM (the cheapest real trainer); ``cb`` None: add it later."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from evalstop_trl.train.tiny import build_model, build_tokenizer, make_prompts

    tok = build_tokenizer()
    ds = Dataset.from_dict(dict(tok([p + "eeee" for p in make_prompts(64, 1)], add_special_tokens=False)))
    kw = dict(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8, report_to="none", use_cpu=True,
              save_strategy="no", logging_steps=5, disable_tqdm=True, learning_rate=1e-3)
    kw.update(args)
    trainer = Trainer(model=build_model(tok), args=TrainingArguments(**kw), train_dataset=ds,
                      eval_dataset=ds.select(range(16)), processing_class=tok,
                      callbacks=[c for c in (cb, *callbacks) if c is not None],
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.remove_callback(PrinterCallback)
    return trainer


def _scripted(scores):
    it = iter(scores)
    return lambda model, tokenizer: next(it)


# ---------------------------------------------------------------------------------------------- 20.1, 20.5, 20.10
def test_under_the_launcher_the_callback_adopts_the_job_and_a_longer_resume_extends_it(server, tmp_path,
                                                                                        monkeypatch):
    from evalstop_trl.clients.http import EvalStopClient

    token = server.add_tenant("lab")
    server.start()
    with EvalStopClient(server.url, token) as c:
        c.register_job("launched")  # what `evalstop run` does first: no planned steps, no type
    for name, value in (("EVALSTOP_URL", server.url), ("EVALSTOP_TOKEN", token), ("EVALSTOP_JOB_ID", "launched")):
        monkeypatch.setenv(name, value)  # what `evalstop run` exports to its command
    out = tmp_path / "run"
    cb = EvalStopCallback(_scripted([0.5, 0.6]), eval_every=5, heartbeat_s=0.001)
    _trainer(out, cb, max_steps=10, save_strategy="steps", save_steps=5).train()
    assert cb.job_id == "launched" and cb.job_type == "other"  # a plain Trainer; adopted, no 409, no "-2"
    assert cb.session.heartbeat.sent > 0  # the steps between evals renewed the lease
    with EvalStopClient(server.url, token) as c:
        job = c.status("launched")
        assert (job.job_type, job.planned_steps, job.n_reports, job.status) == ("other", 10, 2, "finished")
    # the same job resumed with a longer max_steps: an extended plan, audited, never "use the same max_steps"
    again = EvalStopCallback(_scripted([0.7, 0.8]), eval_every=5)
    _trainer(out, again, max_steps=20, save_strategy="steps", save_steps=5).train(resume_from_checkpoint=True)
    assert again.job_id == "launched" and [h["step"] for h in again.history][-2:] == [15, 20]
    with EvalStopClient(server.url, token) as c:
        job = c.status("launched")
        reasons = [a.reason for a in c.audit("launched") if a.kind.value == "amended"]
    assert (job.planned_steps, job.n_reports) == (20, 4) and any("planned_steps 10 -> 20" in r for r in reasons)


def test_the_job_type_comes_from_the_trainers_arguments():
    from transformers import TrainingArguments
    from trl import DPOConfig, GRPOConfig, RLOOConfig, SFTConfig
    from trl.experimental.online_dpo import OnlineDPOConfig

    from evalstop_trl.train.callback import infer_job_type

    bare = object.__new__  # the class is what counts: no arguments need building here
    assert [infer_job_type(bare(c)) for c in (GRPOConfig, RLOOConfig, DPOConfig, OnlineDPOConfig, SFTConfig,
                                              TrainingArguments)] == ["grpo", "rloo", "dpo", "online_dpo", "sft", "other"]
    assert infer_job_type(None) is None and infer_job_type(object()) is None

    class MyGRPOConfig(GRPOConfig):
        pass

    assert infer_job_type(bare(MyGRPOConfig)) == "grpo"
    given = EvalStopCallback("eval_reward", job_type="rlhf")
    assert given.job_type == "rlhf"  # a type the user gives is never replaced


# ---------------------------------------------------------------------------------------------- 20.4, 20.10
def test_bests_never_go_backwards_the_best_is_loaded_and_later_checkpoints_go(tmp_path, caplog):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    common = dict(save_strategy="steps", save_steps=5)
    first = EvalStopCallback(_scripted([0.5, 0.7, 0.6, 0.4]), eval_every=5, job_id="run", load_best_at_end=True)
    trainer = _trainer(out, first, max_steps=40, **common)
    trainer.train()
    assert (first.stopped_at, first.best_step) == (20, 10)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-5"]  # 15, 20 removed
    best = load_file(str(out / "evalstop-best" / "model.safetensors"))
    model = trainer.model.state_dict()
    assert all(torch.equal(model[k], v) for k, v in best.items())  # load_best_at_end: the step-10 weights
    # a rerun into the same folder is job run-2: its worse best never replaces run's
    rerun = EvalStopCallback(_scripted([0.4, 0.3, 0.2]), eval_every=5, job_id="run", keep_checkpoints=True)
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        _trainer(out, rerun, max_steps=40, **common).train()
    assert (rerun.job_id, rerun.stopped_at, rerun.best_step) == ("run-2", 15, 5)
    from evalstop_trl.train.checkpoints import read_best

    assert (read_best(out)["job_id"], read_best(out)["step"]) == ("run", 10)
    assert read_best(out, "evalstop-best-run-2")["step"] == 5
    assert rerun.best_checkpoint == str(out / "evalstop-best-run-2")
    assert "holds job 'run''s best" in caplog.text and "is not better than theirs" in caplog.text
    assert (out / "checkpoint-15").is_dir()  # keep_checkpoints=True: nothing removed


# ---------------------------------------------------------------------------------------------- 20.6
def test_metric_mode_refuses_a_trainer_that_never_evaluates_and_names_a_misspelt_metric(tmp_path):
    never = _trainer(tmp_path / "a", EvalStopCallback("eval_loss"), max_steps=10)  # eval_strategy="no"
    with pytest.raises(ValueError, match="never evaluates \\(eval_strategy='no'\\).*eval_strategy='steps'"):
        never.train()
    assert never.state.global_step == 0  # before the first step, not after a silent run
    misspelt = _trainer(tmp_path / "b", EvalStopCallback("eval_los"), max_steps=10, eval_strategy="steps",
                        eval_steps=5)
    with pytest.raises(ValueError, match="metric 'eval_los' is not in.*eval_loss.*did you mean 'eval_loss'"):
        misspelt.train()
    assert misspelt.state.global_step == 5  # at the first eval


# ---------------------------------------------------------------------------------------------- 20.7, 20.8
class Integration(TrainerCallback):
    """Stands for a ``report_to`` integration (wandb, tensorboard, ...): the trainer puts those first."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({**(logs or {}), "_step": state.global_step})


class PostScores(TrainerCallback):
    """Stands for ``evalstop evaluate`` workers: scores each published snapshot (declining)."""

    def __init__(self, coord: Coordinator, scores) -> None:
        self.client, self.scores = EmbeddedClient(coord), iter(scores)

    def on_save(self, args, state, control, **kwargs):
        self.client.post_eval("ext", state.global_step, next(self.scores))


def _mode(mode: str, coord: Coordinator, **kw):
    """The callback's options, the extra callbacks and the trainer's arguments of one feedback mode: a
    callable whose second eval fails, the trainer's eval_loss, or external evaluators (declining: a stop)."""
    extra, args = [], {}
    if mode == "callable":
        def flaky(model, tokenizer):
            flaky.n = getattr(flaky, "n", 0) + 1
            if flaky.n == 2:
                raise TimeoutError("the judge timed out")
            return 0.5

        options = dict(world_feedback=flaky, eval_every=5, detector="never")
    elif mode == "metric":
        options = dict(world_feedback="eval_loss", detector="never")
        args = dict(eval_strategy="steps", eval_steps=5)
    else:
        options = dict(external_eval=True, eval_every=5)
        extra = [PostScores(coord, [0.5, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])]
    return dict(options, coordinator=coord, job_id="ext", **kw), extra, args


def _evalstop_logs(logs):
    return [e for e in logs if any(k.startswith("evalstop/") for k in e)]


@pytest.mark.parametrize("mode", ["callable", "metric", "external"])
def test_report_to_integrations_get_the_evalstop_metrics_in_every_mode(tmp_path, monkeypatch, mode, caplog):
    """With ``trainer=`` (as TRL's callbacks take it) the metrics go out through ``trainer.log`` at the
    eval's step: the integrations, which the trainer runs before the user's callbacks, get them, and
    ``log_history`` holds each once. The trainer's callback list stays as built."""
    import transformers.trainer

    monkeypatch.setattr(transformers.trainer, "get_reporting_integration_callbacks", lambda report_to: [Integration])
    coord = Coordinator(MemoryStore())
    options, extra, args = _mode(mode, coord)
    trainer = _trainer(tmp_path, None, max_steps=15 if mode != "external" else 40, **args)
    built = list(trainer.callback_handler.callbacks)
    cb = EvalStopCallback(**options, trainer=trainer)
    for c in (cb, *extra):
        trainer.add_callback(c)
    assert trainer.callback_handler.callbacks == [*built, cb, *extra]  # nothing inserted, nothing moved
    (integration,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, Integration)]
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        if mode == "external":  # the stop reaches the loop through a watcher thread: slow the steps down a little
            trainer.add_callback(_Slow())
        trainer.train()
    assert [c for c in trainer.callback_handler.callbacks if not isinstance(c, _Slow)] == [*built, cb, *extra]
    seen = _evalstop_logs(integration.logs)
    history = _evalstop_logs(trainer.state.log_history)
    assert [{k: v for k, v in e.items() if k.startswith("evalstop/")} for e in seen] == \
        [{k: v for k, v in h.items() if k.startswith("evalstop/")} for h in history]  # the same, once each
    assert [e["_step"] for e in seen] == [h["step"] for h in history]
    if mode == "callable":
        assert [e["_step"] for e in seen] == [5, 10, 15]  # at the eval's own step
        assert [e["evalstop/eval_failures"] for e in seen] == [0, 1, 1]
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        assert [h["train_loss"] for h in cb.history] == [losses[5], losses[10], losses[15]]  # the step's own loss
        assert "TimeoutError: the judge timed out" in caplog.text
    elif mode == "metric":
        losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
        assert [e["_step"] for e in seen] == [5, 10, 15] and [e["evalstop/score"] for e in seen] == losses
        assert "metric 'eval_loss': lower is better (direction='min'" in caplog.text
    else:
        assert cb.stopped_at is not None and [e["evalstop/stop"] for e in seen] == [1]
        assert seen[0]["evalstop/best_score"] == 0.7 and seen[0]["_step"] == cb.stopped_at


class After(Integration):
    """A callback listed after EvalStopCallback (the trainer's printer is one)."""


@pytest.mark.parametrize("mode", ["callable", "metric", "external"])
def test_without_the_trainer_the_metrics_reach_log_history_and_the_callbacks_after_it(tmp_path, monkeypatch, mode):
    """``EvalStopCallback`` only in ``callbacks=[...]``: the same evals and stops; the metrics in
    ``log_history`` at the eval's step, and in the trainer's next log for the callbacks after it (the
    eval step's own log in callable mode, the next log in metric mode). The integrations, which run
    before the user's callbacks, miss them."""
    import transformers.trainer

    monkeypatch.setattr(transformers.trainer, "get_reporting_integration_callbacks", lambda report_to: [Integration])
    coord = Coordinator(MemoryStore())
    options, extra, args = _mode(mode, coord)
    cb, after = EvalStopCallback(**options), After()
    trainer = _trainer(tmp_path, cb, max_steps=15 if mode != "external" else 40, callbacks=[*extra, after], **args)
    (integration,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, Integration)
                      and not isinstance(c, After)]
    if mode == "external":
        trainer.add_callback(_Slow())
    trainer.train()
    assert _evalstop_logs(integration.logs) == []
    history = _evalstop_logs(trainer.state.log_history)
    seen = _evalstop_logs(after.logs)
    if mode == "callable":
        assert [h["step"] for h in history] == [5, 10, 15] and [h["evalstop/eval_failures"] for h in history] == [0, 1, 1]
        assert [e["_step"] for e in seen] == [5, 10, 15] and all("loss" in e for e in seen)  # the step's own log
    elif mode == "metric":
        losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
        assert [h["step"] for h in history] == [5, 10, 15] and [h["evalstop/score"] for h in history] == losses
        assert [e["_step"] for e in seen] == [10, 15, 15]  # one log later: the last in the end-of-training log
        assert [e["evalstop/score"] for e in seen] == losses
    else:
        assert cb.stopped_at is not None and [(h["step"], h["evalstop/stop"]) for h in history] == [(cb.stopped_at, 1)]
        assert [(e["_step"], e["evalstop/stop"]) for e in seen] == [(cb.stopped_at, 1)]  # the stop's step logs


def test_a_trainer_without_a_log_method_is_refused():
    with pytest.raises(TypeError, match="EvalStopCallback: trainer must be the trainer .* but got dict"):
        EvalStopCallback("eval_loss", trainer={})


class _Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)
