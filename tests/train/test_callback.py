"""EvalStopCallback with real TRL trainers training real tiny models (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from evalstop_trl import Coordinator, MemoryStore  # noqa: E402
from evalstop_trl.train.callback import EvalStopCallback  # noqa: E402
from evalstop_trl.train.tiny import PRESETS, GoldEval, label_trace, run_tiny  # noqa: E402
from tests.conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow


def test_hacked_grpo_is_stopped_and_best_checkpoint_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = run_tiny("grpo", "hacked", output_dir=tmp_path, max_steps=300, eval_every=15)
    assert run.stopped_at is not None and run.stopped_at < 300, run.trace
    assert "consecutive declines" in run.reason
    golds = [t["gold"] for t in run.trace]
    assert run.best_score == max(golds) and run.best_step == run.trace[golds.index(max(golds))]["step"]
    assert run.trace[-1]["proxy"] > run.trace[0]["proxy"]  # the proxy kept improving
    best = AutoModelForCausalLM.from_pretrained(run.best_checkpoint)
    tok = AutoTokenizer.from_pretrained(run.best_checkpoint)
    assert GoldEval(PRESETS["hacked"])(best, tok) == pytest.approx(run.best_score, abs=1e-5)
    # the embedded coordinator's SQLite file says the same
    from evalstop_trl import SQLiteStore

    coord = Coordinator(SQLiteStore(tmp_path / "trainer" / "evalstop.db"))
    (job,) = coord.list_jobs("local")
    assert job.status == "stopped" and job.acked and job.best_checkpoint == run.best_checkpoint
    coord.close()


def test_healthy_grpo_runs_to_the_end(tmp_path):
    run = run_tiny("grpo", "healthy", output_dir=tmp_path, max_steps=150, eval_every=15)
    assert run.stopped_at is None and run.steps_done == 150
    assert not label_trace([t["gold"] for t in run.trace])


def test_callback_does_not_perturb_training(tmp_path):
    def losses(run):
        return [(h["step"], h.get("loss"), h.get("reward")) for h in run.log_history if "loss" in h]

    with_cb = run_tiny("grpo", "hacked", output_dir=tmp_path / "a", max_steps=40, eval_every=5, stop=False)
    without = run_tiny("grpo", "hacked", output_dir=tmp_path / "b", max_steps=40, with_evalstop=False)
    assert losses(with_cb) == losses(without) and len(losses(with_cb)) == 8


@pytest.mark.parametrize("given", [False, True], ids=["in-callbacks", "trainer="])
@pytest.mark.parametrize("trainer", ["grpo", "rloo", "dpo", "online_dpo", "sft"])
def test_every_trainer_stops_on_a_stop_decision(tmp_path, trainer, given):
    run = run_tiny(trainer, "hacked", output_dir=tmp_path, max_steps=40, eval_every=5, detector="stop_at", fraction=0.5,
                   pass_trainer=given)
    assert run.stopped_at == 20 and run.steps_done == 20, (trainer, run.steps_done)
    assert len(run.trace) == 4 and all(t["gold"] is not None for t in run.trace)
    if trainer in ("grpo", "rloo", "online_dpo"):
        assert run.trace[-1]["proxy"] is not None  # the trainer's reward was forwarded
    assert run.trace[-1]["loss"] is not None
    # each eval's evalstop/* metrics in log_history once, at its step, in an entry of their own: the trainer's
    # own metrics (a TRL trainer's reward, flushed by its log()) are neither taken nor repeated
    ours = [h for h in run.log_history if "evalstop/stop" in h]
    assert [(h["step"], h["evalstop/stop"]) for h in ours] == [(5, 0), (10, 0), (15, 0), (20, 1)], ours
    assert all(k.startswith("evalstop/") or k in ("step", "epoch") for h in ours for k in h), ours
    assert all(len([h for h in run.log_history if h["step"] == s and "loss" in h]) == 1 for s in (5, 10, 15, 20))


def test_peft_lora_best_adapter_is_saved_and_loadable(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = run_tiny("grpo", "hacked", output_dir=tmp_path, max_steps=30, eval_every=10, peft=True,
                   detector="stop_at", fraction=0.6)
    best = Path(run.best_checkpoint)
    assert (best / "adapter_config.json").exists() and not (best / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base-model")
    model = PeftModel.from_pretrained(base, best)
    assert sum(p.numel() for n, p in model.named_parameters() if "lora" in n) > 0


def test_against_a_live_server(server, tmp_path):
    token = server.add_tenant("lab")
    server.start()
    run = run_tiny("grpo", "hacked", output_dir=tmp_path, coordinator=server.url, token=token, job_id="lab-hacked",
                   max_steps=300, eval_every=15)
    assert run.stopped_at is not None and run.stopped_at < 300
    from evalstop_trl.clients.http import EvalStopClient

    with EvalStopClient(server.url, token) as c:
        job = c.status("lab-hacked")
        assert job.status == "stopped" and job.acked and job.best_step == run.best_step
        assert [a.kind.value for a in c.audit()] == ["stop", "ack"]


@pytest.mark.parametrize("where", ["embedded", "http"])
def test_a_real_run_with_per_example_world_feedback(where, server, tmp_path):
    """GRPO on the hacked preset, its world feedback the gold eval's 32 per-prompt scores: every
    report stores the mean (the float eval's score), n = 32 and, from the second eval on, a paired
    noise level; the run stops once its declines add up to more than the default's noise, the larger
    of that paired noise and the run's own eval-to-eval noise (here the latter: the same 32 prompts
    move little between two checkpoints, the checkpoints drift more), and its best reloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evalstop_trl.analysis.replay import load_curve, replay_curve
    from evalstop_trl.clients.http import EvalStopClient

    kwargs = {}
    if where == "http":
        kwargs = {"coordinator": server.url, "token": server.add_tenant("lab"), "job_id": "lab-pe"}
        server.start()
    run = run_tiny("grpo", "hacked", output_dir=tmp_path, max_steps=300, eval_every=15,
                   world_feedback=GoldEval(PRESETS["hacked"], per_example=True), **kwargs)
    assert run.stopped_at is not None and run.stopped_at < 300, run.trace
    if where == "http":
        with EvalStopClient(server.url, kwargs["token"]) as c:
            reports, job = c.reports("lab-pe"), c.status("lab-pe")
    else:
        from evalstop_trl import SQLiteStore

        coord = Coordinator(SQLiteStore(tmp_path / "trainer" / "evalstop.db"))
        (job,) = coord.list_jobs("local")
        reports = coord.reports("local", job.job_id)
        coord.close()
    assert [r.eval_n for r in reports] == [32] * len(reports)
    assert reports[0].eval_noise is None and all(r.eval_noise > 0 for r in reports[1:])
    evidence = job.decision.evidence
    assert evidence["noise_source"] == "the run's eval-to-eval" and evidence["noise"] > reports[-1].eval_noise
    assert evidence["noise_z"] == 2.0 and evidence["needed"] == pytest.approx(2.0 * 2 ** 0.5 * evidence["noise"])
    assert evidence["fall"] > evidence["needed"]  # so beyond the paired noise too
    # the trainer's own logs carry the evidence: evalstop replay reads it back and decides as the service did
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": run.log_history}))
    curve = load_curve(tmp_path / "trainer_state.json")
    assert curve.metric == "evalstop/score" and [n for n, _ in curve.evidence] == [32] * len(reports)
    assert curve.evidence[0][1] is None
    assert [noise for _, noise in curve.evidence[1:]] == pytest.approx([r.eval_noise for r in reports[1:]], rel=1e-12)
    assert replay_curve(curve, planned_steps=300).stop_step == reports[-1].step
    best = AutoModelForCausalLM.from_pretrained(run.best_checkpoint)
    tok = AutoTokenizer.from_pretrained(run.best_checkpoint)
    assert GoldEval(PRESETS["hacked"])(best, tok) == pytest.approx(run.best_score, abs=1e-5)


class _Args:
    def __init__(self, out):
        self.output_dir = str(out)


class _State:
    def __init__(self, step=0, max_steps=100):
        self.global_step, self.max_steps, self.is_world_process_zero = step, max_steps, True
        self.log_history = []


class _Control:
    should_training_stop = False
    should_log = False
    should_save = False


def _eval_step(cb, tmp_path, step, control, model):
    """What a trainer does at an eval step: on_step_end, then (should_log) on_log with the step's logs."""
    state = _State(step)
    cb.on_step_end(_Args(tmp_path), state, control, model=model)
    assert control.should_log  # the callback asked for this step's log
    cb.on_log(_Args(tmp_path), state, control, logs={"loss": 0.1 * step})


def test_world_feedback_may_return_tensor_scalars_and_nan_is_a_missing_eval(tmp_path, caplog):
    values = iter([torch.tensor(0.5), torch.tensor(float("nan")), None, torch.tensor(0.6)])
    cb = EvalStopCallback(lambda m, t: next(values), eval_every=1, coordinator=Coordinator(MemoryStore()),
                          job_id="t", save_best=False)
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    model = torch.nn.Linear(1, 1)
    for step in (1, 2, 3, 4):
        _eval_step(cb, tmp_path, step, _Control(), model)
    assert [h["eval_score"] for h in cb.history] == [0.5, None, None, pytest.approx(0.6)]
    assert cb.best_score == pytest.approx(0.6) and cb.history[0]["train_loss"] == pytest.approx(0.1)  # this step's loss
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 2 and "score is nan" in failed[0] and "score is None" in failed[1]  # each one (issue 20.8)


class _Trainer:
    """The part of a trainer ``trainer=`` uses: ``log``, whose log event clears ``should_log`` as the
    trainer's handler does."""

    def __init__(self, state, control):
        self.state, self.control, self.logs = state, control, []

    def log(self, logs):
        self.logs.append({**logs, "step": self.state.global_step})
        self.control.should_log = False


def test_with_the_trainer_the_metrics_go_out_through_its_log_after_its_own_log(tmp_path):
    """Decided in the eval step's log, the metrics wait for the next event outside it and go out through
    ``trainer.log`` at the same step; a log the trainer still owes (the epoch's) stays asked for."""
    state, control = _State(), _Control()
    trainer = _Trainer(state, control)
    cb = EvalStopCallback(lambda m, t: 0.5, eval_every=1, coordinator=Coordinator(MemoryStore()), job_id="t",
                          save_best=False, trainer=trainer)
    cb.on_train_begin(_Args(tmp_path), state, control)
    state.global_step = 1
    cb.on_step_end(_Args(tmp_path), state, control, model=torch.nn.Linear(1, 1))
    cb.on_log(_Args(tmp_path), state, control, logs={"loss": 0.1})
    assert trainer.logs == [] and state.log_history == []  # not from inside the trainer's own log
    control.should_log = True  # the end of the epoch asks for a log
    cb.on_epoch_end(_Args(tmp_path), state, control)
    assert [(e["step"], e["evalstop/score"]) for e in trainer.logs] == [(1, 0.5)] and control.should_log
    cb.on_step_begin(_Args(tmp_path), state, control)
    assert len(trainer.logs) == 1 and cb.history[0]["train_loss"] == pytest.approx(0.1)  # sent once


def test_world_feedback_may_return_per_example_scores(tmp_path, caplog):
    """A list, an array or a mapping of per-example scores: the report carries their mean, their
    number and the paired noise level against the previous eval (none at the first); a bad score
    among them is a failed eval, and the next eval pairs with the last good one (issue 28 item 1)."""
    from evalstop_trl.core.examples import paired_noise

    evals = [[0.5, 0.7, 0.9, 0.1], torch.tensor([0.6, 0.7, 0.7, 0.2]), [0.5, float("nan"), 0.1, 0.1],
             {0: 0.4, 1: 0.6, 2: 0.8, 3: 0.0}]
    values = iter(evals)
    coord = Coordinator(MemoryStore())
    cb = EvalStopCallback(lambda m, t: next(values), eval_every=1, coordinator=coord, job_id="pe", save_best=False)
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    model = torch.nn.Linear(1, 1)
    for step in (1, 2, 3, 4):
        _eval_step(cb, tmp_path, step, _Control(), model)
    second = paired_noise(dict(enumerate(evals[0])), dict(enumerate(evals[1].tolist())))
    fourth = paired_noise(dict(enumerate(evals[1].tolist())), evals[3])
    stored = coord.reports("local", "pe")
    assert [(r.eval_score, r.eval_n, r.eval_noise) for r in stored] == [
        (pytest.approx(0.55), 4, None), (pytest.approx(0.55), 4, pytest.approx(second)), (None, None, None),
        (pytest.approx(0.45), 4, pytest.approx(fourth))]
    assert [h.get("eval_n") for h in cb.history] == [4, 4, None, 4]
    assert any("per-example score of example 1 is nan" in r.getMessage() for r in caplog.records)


def test_world_feedback_may_return_the_proxys_score_of_its_completions(tmp_path, caplog):
    """WorldFeedback(scores, proxy=...): the report carries that proxy, not the trainer's logged reward
    (the log below says reward 9.0 at every step), so gate="proxy_diverges" compares the proxy of the
    eval's own completions: a fall with the proxy down is held, one with the proxy up stops. A proxy
    that is not a finite number is a failed eval."""
    from evalstop_trl import WorldFeedback

    evals = [WorldFeedback([0.5, 0.7], proxy=0.4), WorldFeedback([0.6, 0.8], proxy=0.5),
             WorldFeedback([0.5, 0.7], proxy=0.45), WorldFeedback([0.7, 0.9], proxy=0.6),
             WorldFeedback([0.6, 0.8], proxy=0.7)]
    values = iter(evals)
    coord = Coordinator(MemoryStore())
    cb = EvalStopCallback(lambda m, t: next(values), eval_every=1, coordinator=coord, job_id="px", save_best=False,
                          k=1, noise="none", gate="proxy_diverges")
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    model = torch.nn.Linear(1, 1)
    stops, reasons = [], []
    for step in (1, 2, 3, 4, 5):
        state, control = _State(step), _Control()
        cb.on_step_end(_Args(tmp_path), state, control, model=model)
        cb.on_log(_Args(tmp_path), state, control, logs={"loss": 0.1, "reward": 9.0})
        stops.append(bool(control.should_training_stop))
        reasons.append(cb.session.decision.reason)
    assert [r.proxy_reward for r in coord.reports("local", "px")] == pytest.approx([0.4, 0.5, 0.45, 0.6, 0.7])
    assert stops == [False, False, False, False, True]
    assert reasons[2].startswith("held by the proxy gate (proxy -0.05 since the best eval"), reasons[2]
    assert "proxy +0.1 since the best eval" in reasons[4], reasons[4]
    with pytest.raises(ValueError, match="proxy must be a finite number"):
        WorldFeedback(0.5, proxy=float("nan"))


def test_on_eval_error_raise_and_stop(tmp_path):
    def broken(m, t):
        raise TimeoutError("the judge timed out")

    model = torch.nn.Linear(1, 1)
    cb = EvalStopCallback(broken, eval_every=1, coordinator=Coordinator(MemoryStore()), job_id="r",
                          save_best=False, max_eval_failures=2, on_eval_error="raise")
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    _eval_step(cb, tmp_path, 1, _Control(), model)
    with pytest.raises(RuntimeError, match="2 evals in a row failed.*TimeoutError: the judge timed out"):
        cb.on_step_end(_Args(tmp_path), _State(2), _Control(), model=model)
    coord = Coordinator(MemoryStore())
    cb = EvalStopCallback(broken, eval_every=1, coordinator=coord, job_id="s", save_best=False,
                          max_eval_failures=2, on_eval_error="stop")
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    control = _Control()
    for step in (1, 2):
        _eval_step(cb, tmp_path, step, control, model)
    assert control.should_training_stop and cb.stopped_at == 2
    assert coord.status("local", "s").status == "stopped" and "2 evals in a row failed" in cb.decision.reason


def test_metric_mode_and_missing_metric(tmp_path):
    cb = EvalStopCallback("eval_reward", coordinator=Coordinator(MemoryStore()), job_id="m", save_best=False)
    cb.on_train_begin(_Args(tmp_path), _State(), _Control())
    control = _Control()
    for step, v in [(10, 0.5), (20, 0.4), (30, 0.3)]:
        cb.on_evaluate(_Args(tmp_path), _State(step), control, metrics={"eval_reward": v, "eval_loss": 1.0})
    assert control.should_training_stop and cb.best_step == 10 and cb.direction == "max"
    with pytest.raises(ValueError, match="metric 'eval_reward' is not in the evaluation metrics; available: eval_loss"):
        cb.on_evaluate(_Args(tmp_path), _State(40), _Control(), metrics={"eval_loss": 1.0})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_feedback": lambda m, t: 0.0}, "eval_every must be an integer >= 1"),
        ({"world_feedback": None}, "needs world_feedback"),
        ({"world_feedback": "eval_x", "detector": "nope"}, "valid detectors are"),
        ({"world_feedback": "eval_x", "k": 0}, r"k must be an integer in \[1, 1000\]"),
        ({"world_feedback": "eval_x", "enforce": True}, "Unknown parameter.s. enforce for detector 'decline'"),
        ({"world_feedback": 3}, "must be a callable or a metric name"),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EvalStopCallback(**kwargs)


def test_url_without_token_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("EVALSTOP_TOKEN", raising=False)
    cb = EvalStopCallback("eval_x", coordinator="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="needs a token"):
        cb.on_train_begin(_Args(tmp_path), _State(), _Control())


DIST_WORKER = Path(__file__).resolve().parents[1] / "dist_worker.py"


@pytest.mark.parametrize("mode", ["rank0", "all"])
def test_two_processes_stop_together(tmp_path, mode):
    import signal

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(3):  # a free port may be taken by another test before torchrun binds it: try another
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
             str(DIST_WORKER), str(tmp_path), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:  # a hang: take the whole process group down, workers included
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if not (proc.returncode and "EADDRINUSE" in err):
            break
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    steps = sorted((tmp_path / f"rank{r}.txt").read_text() for r in (0, 1))
    assert steps[0] == steps[1] and steps[0].startswith("stopped at 12, best step ") and steps[0].endswith("stop")
    assert "best step None" not in steps[0]
    if mode == "all":  # both ranks ran the (collective) eval at every eval step; rank 0's score was used
        assert [(tmp_path / f"evals-rank{r}.txt").read_text().split() for r in (0, 1)] == [["2", "2"]] * 2
        assert float(steps[0].split("best score ")[1].split(",")[0]) < 100


def test_the_callback_is_one_plain_class_with_a_strategy_per_mode():
    from evalstop_trl.train.feedback import FEEDBACKS, FeedbackMode

    cases = [(EvalStopCallback(lambda m, t: 0.0, eval_every=5), FeedbackMode.CALLABLE),
             (EvalStopCallback("eval_reward"), FeedbackMode.METRIC),
             (EvalStopCallback(external_eval=True, eval_every=5), FeedbackMode.EXTERNAL)]
    for cb, mode in cases:
        assert type(cb) is EvalStopCallback and cb.mode is mode and cb.external_eval is (mode == "external")
        assert type(cb.feedback) is FEEDBACKS[mode] and cb.feedback.cb is cb
    assert set(FEEDBACKS) == set(FeedbackMode)
    # no descriptor of its own beyond plain read-only properties over its session
    own = {n: v for n, v in vars(EvalStopCallback).items() if hasattr(v, "__get__") and not callable(v)}
    assert all(isinstance(v, property) and v.fset is None for v in own.values()), own


def test_the_callback_takes_what_the_trainer_hands_it():
    """Issue 43.5: no frame walk, no edit of the trainer's list of callbacks, and strategies that use the
    callback's public surface (``feedback.Host``) only."""
    import inspect
    import re

    from evalstop_trl.train import callback, feedback

    assert "calling_handler" not in callback.__all__ and not hasattr(callback, "calling_handler")
    for module in (callback, feedback):
        source = inspect.getsource(module)
        assert not re.search(r"_getframe|f_locals|f_back|\.callbacks\s*=|callback_handler", source), module
    assert not re.search(r"\bcb\._", inspect.getsource(feedback))


def test_the_callback_keeps_no_state_in_a_checkpoint():
    """transformers rebuilds an ExportableState callback from a checkpoint with type(cb)(**args): a
    copy without the user's callable. The coordinator holds the job's history instead."""
    from transformers.trainer_callback import ExportableState

    assert not isinstance(EvalStopCallback(lambda m, t: 0.0, eval_every=5), ExportableState)


def _restorable_trainer(out, cb, max_steps, preempt_at=None):
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from evalstop_trl.train.tiny import build_model, build_tokenizer, make_prompts

    tok = build_tokenizer()
    ds = Dataset.from_dict(dict(tok([p + "eeee" for p in make_prompts(64, 1)], add_special_tokens=False)))
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8, report_to="none",
                             use_cpu=True, save_strategy="steps", save_steps=5, logging_steps=5, disable_tqdm=True,
                             restore_callback_states_from_checkpoint=True)
    trainer = Trainer(model=build_model(tok), args=args, train_dataset=ds, processing_class=tok, callbacks=[cb],
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.remove_callback(PrinterCallback)

    class Preempted(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == preempt_at:
                raise RuntimeError(f"preempted at step {preempt_at}")

    if preempt_at is not None:
        trainer.add_callback(Preempted())
    return trainer


def test_two_trainers_in_one_process_keep_their_own_world_feedback_across_a_restore(tmp_path):
    calls: dict[str, list[int]] = {"first": [], "a": [], "b": []}

    def feedback(name):
        def score(model, tokenizer):
            calls[name].append(1)
            return 0.5

        return score

    coord_a, coord_b = Coordinator(MemoryStore()), Coordinator(MemoryStore())

    def callback(name, coord, job_id):
        return EvalStopCallback(feedback(name), eval_every=5, coordinator=coord, job_id=job_id, detector="never",
                                save_best=False)

    with pytest.raises(RuntimeError, match="preempted"):  # after checkpoint-10
        _restorable_trainer(tmp_path / "a", callback("first", coord_a, "a"), max_steps=20, preempt_at=10).train()
    cb_a = callback("a", coord_a, "a")
    trainer_a = _restorable_trainer(tmp_path / "a", cb_a, max_steps=20)
    cb_b = callback("b", coord_b, "b")  # built last: the old process-wide "latest" callback
    trainer_b = _restorable_trainer(tmp_path / "b", cb_b, max_steps=10)
    trainer_a.train(resume_from_checkpoint=True)
    (live,) = [c for c in trainer_a.callback_handler.callbacks if isinstance(c, EvalStopCallback)]
    assert live is cb_a  # the user's own object, never a copy rebuilt from the checkpoint
    assert (len(calls["a"]), calls["b"]) == (2, [])  # steps 15 and 20
    assert [h["step"] for h in cb_a.history] == [15, 20] and cb_a.attempt == 2  # this process's; attached
    assert [r.step for r in coord_a.reports("local", "a")] == [5, 10, 15, 20] and not coord_b.list_jobs("local")
    trainer_b.train()
    assert (len(calls["a"]), len(calls["b"])) == (2, 2)
    assert cb_b.session is not cb_a.session and [h["step"] for h in cb_b.history] == [5, 10]
    assert [v.job_id for v in coord_b.list_jobs("local")] == ["b"]


def _half(model, tokenizer):
    return 0.5


def test_the_per_eval_line_shows_without_any_logging_configured(tmp_path):
    """A new user's script configures no logging: the per-eval INFO line still reaches stderr."""
    code = ("from evalstop_trl.train.tiny import run_tiny\n"
            f"run_tiny('grpo', 'hacked', output_dir={str(tmp_path)!r}, max_steps=10, eval_every=5, stop=False)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "EVALSTOP_URL": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line.split(":")[0] for line in out.stderr.splitlines() if line.startswith("EvalStop step ")] == \
        ["EvalStop step 5", "EvalStop step 10"], out.stderr[-3000:]


def test_a_callback_pickles():
    import pickle

    cb = EvalStopCallback(_half, eval_every=5, job_id="p", detector="stop_at", fraction=0.5)
    cb.history.append({"step": 5, "eval_score": 0.5, "train_loss": None, "proxy_reward": None})
    copy = pickle.loads(pickle.dumps(cb))
    assert type(copy) is EvalStopCallback and copy.mode is cb.mode and copy.feedback.cb is copy
    assert (copy.world_feedback, copy.job_id, dict(copy.params), copy.history) == \
        (_half, "p", {"fraction": 0.5, "direction": "max"}, cb.history)


def test_a_plain_torch_module_in_a_trainer_keeps_and_loads_its_best(tmp_path):
    """transformers' Trainer trains a plain nn.Module too; the best copy then holds its weights as
    model.safetensors (no save_pretrained to call) and load_best_at_end loads them back."""
    import torch
    from transformers import Trainer, TrainingArguments

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

    data = [{"x": torch.randn(4), "labels": torch.tensor(1.0)} for _ in range(32)]
    scores = iter([0.1, 0.5, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0])
    kept = {}

    def feedback(model, tokenizer):
        score = next(scores)
        if score == 0.5:
            kept["weight"] = model.lin.weight.detach().clone()
        return score

    args = TrainingArguments(str(tmp_path), max_steps=16, per_device_train_batch_size=2, report_to=[],
                             save_strategy="no", use_cpu=True, learning_rate=0.1, logging_strategy="no")
    cb = EvalStopCallback(feedback, eval_every=2, coordinator=Coordinator(MemoryStore()), load_best_at_end=True)
    model = Plain()
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    assert cb.stopped_at == 8 and cb.best_step == 4  # evals at 2, 4, 6, 8: 0.1, 0.5, 0.3, 0 (a fall beyond the noise)
    assert (Path(cb.best_checkpoint) / "model.safetensors").is_file()
    assert torch.equal(model.lin.weight, kept["weight"])  # the best weights are back in the model
