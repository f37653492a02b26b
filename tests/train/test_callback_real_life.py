"""The callback in real life (issue 10), each with a real tiny trainer: reruns, resumes, failing
evals, losses, visible scores, a coordinator that is down, a crashing trainer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from evalstop_trl import Coordinator, SQLiteStore  # noqa: E402
from evalstop_trl.core.detectors import Observation, create_detector  # noqa: E402
from evalstop_trl.train.callback import EvalStopCallback, default_job_id, infer_direction  # noqa: E402
from evalstop_trl.train.tiny import PRESETS, GoldEval, run_tiny  # noqa: E402
from tests.conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow


class CrashAt(TrainerCallback):
    """A preemption: the process dies at ``step`` (after the trainer saved its checkpoints)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"preempted at step {self.step}")


def _stop_step_of(history: list[tuple[int, float | None]], k: int = 2) -> int | None:
    det = create_detector("decline", k=k)
    for step, score in history:
        if det.observe(Observation("j", step, score)).stop:
            return step
    return None


def _jobs(db: Path) -> dict:
    coord = Coordinator(SQLiteStore(db))
    try:
        return {v.job_id: v for v in coord.list_jobs("local")}
    finally:
        coord.close()


def test_a_rerun_into_the_same_output_dir_is_a_new_run(tmp_path):
    first = run_tiny("grpo", "healthy", output_dir=tmp_path, max_steps=10, eval_every=5, stop=False)
    second = run_tiny("grpo", "healthy", output_dir=tmp_path, max_steps=10, eval_every=5, stop=False)
    base = first.callback.job_id
    assert second.callback.job_id == f"{base}-2"  # no 409, no crash: a new job
    jobs = _jobs(tmp_path / "trainer" / "evalstop.db")
    assert set(jobs) == {base, f"{base}-2"} and all(j.n_reports == 2 for j in jobs.values())


def test_default_job_ids_are_unique_per_output_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("EVALSTOP_JOB_ID", raising=False)

    class Args:
        def __init__(self, out, run_name=None):
            self.output_dir, self.run_name = str(out), run_name if run_name is not None else str(out)

    a, b = default_job_id(Args(tmp_path / "a" / "outputs")), default_job_id(Args(tmp_path / "b" / "outputs"))
    assert a != b and a.startswith("outputs-") and b.startswith("outputs-")
    assert default_job_id(Args(tmp_path / "outputs", "my-run")) == "my-run"
    monkeypatch.setenv("EVALSTOP_JOB_ID", "from-launcher")
    assert default_job_id(Args(tmp_path / "outputs")) == "from-launcher"


def _resumable(restore: bool) -> dict:
    return dict(max_steps=200, eval_every=15, training_args={"save_strategy": "steps", "save_steps": 15,
                                                               "restore_callback_states_from_checkpoint": restore})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same run, never interrupted (computed once for both restore settings)."""
    run = run_tiny("grpo", "hacked", output_dir=tmp_path_factory.mktemp("whole"), **_resumable(False))
    assert run.stopped_at is not None
    return run


@pytest.mark.parametrize("restore", [False, True])
def test_a_resumed_run_stops_where_an_uninterrupted_one_does(tmp_path, restore, uninterrupted):
    common = _resumable(restore)
    whole = uninterrupted
    with pytest.raises(RuntimeError, match="preempted"):
        run_tiny("grpo", "hacked", output_dir=tmp_path / "cut", callbacks=[CrashAt(61)], **common)
    # a new process would build a new callback: so does this (the first one is gone with its trainer)
    resumed = run_tiny("grpo", "hacked", output_dir=tmp_path / "cut", resume_from_checkpoint=True, **common)
    user_cb = resumed.callback  # the object the user passed: transformers never replaces it
    assert user_cb.decision is not None and user_cb.decision.stop and user_cb.stopped_at == resumed.stopped_at
    jobs = _jobs(tmp_path / "cut" / "trainer" / "evalstop.db")
    assert list(jobs) == [user_cb.job_id]  # one job, attached to again: no 409, no "-2"
    (job,) = jobs.values()
    coord = Coordinator(SQLiteStore(tmp_path / "cut" / "trainer" / "evalstop.db"))
    stored = [(r.step, r.eval_score) for r in coord.reports("local", job.job_id)]
    coord.close()
    # the decline count survived the restart: the stop is where the stored history has k declines
    assert resumed.stopped_at == _stop_step_of(stored) == job.decision.evidence["steps"][-1]
    assert job.status == "stopped" and user_cb.best_step == job.best_step
    # the kept model is the reported best's, and says so
    best_dir = tmp_path / "cut" / "trainer" / "evalstop-best"
    info = json.loads((best_dir / "evalstop.json").read_text())
    assert (info["job_id"], info["step"]) == (job.job_id, job.best_step)
    assert info["score"] == pytest.approx(job.best_score)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(best_dir), AutoTokenizer.from_pretrained(best_dir)
    assert GoldEval(PRESETS["hacked"])(model, tok) == pytest.approx(job.best_score, abs=1e-5)
    # and an uninterrupted run of the same seed agrees (the trainer restores its RNG states)
    assert (resumed.stopped_at, user_cb.best_step) == (whole.stopped_at, whole.best_step)


def test_a_failing_eval_does_not_kill_the_run(tmp_path):
    gold = GoldEval(PRESETS["healthy"])
    calls = {"n": 0}

    def flaky(model, tok):  # an LLM judge that times out every other call, or answers NaN
        calls["n"] += 1
        if calls["n"] % 3 == 1:
            raise TimeoutError("judge timed out")
        return float("nan") if calls["n"] % 3 == 2 else gold(model, tok)

    run = run_tiny("grpo", "healthy", output_dir=tmp_path, max_steps=30, eval_every=5, world_feedback=flaky)
    assert run.steps_done == 30 and run.stopped_at is None
    assert [t["gold"] is None for t in run.trace] == [True, True, False, True, True, False]
    assert _jobs(tmp_path / "trainer" / "evalstop.db")[run.callback.job_id].status == "finished"


CRASHING = textwrap.dedent("""
    import sys
    from transformers import TrainerCallback
    from evalstop_trl.train.tiny import run_tiny
    class Boom(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 7:
                raise RuntimeError("CUDA error: an illegal memory access")
    run_tiny("grpo", "healthy", output_dir=sys.argv[1], max_steps=20, eval_every=5, callbacks=[Boom()])
""")


def test_a_crashing_trainer_marks_its_job_failed(tmp_path):
    done = subprocess.run([sys.executable, "-c", CRASHING, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "illegal memory access" in done.stderr
    (job,) = _jobs(tmp_path / "trainer" / "evalstop.db").values()
    assert job.status == "failed" and job.n_reports == 1  # not "running" forever


def test_eval_loss_is_minimised(tmp_path):
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from evalstop_trl.train.tiny import build_model, build_tokenizer, make_prompts

    assert infer_direction("eval_loss") == "min" and infer_direction("eval_reward") == "max"
    tok = build_tokenizer()
    texts = [p + "eeee" for p in make_prompts(256, 1)]
    ds = Dataset.from_dict(dict(tok(texts, add_special_tokens=False)))
    cb = EvalStopCallback("eval_loss", save_best=False)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=40, eval_strategy="steps", eval_steps=10,
                             per_device_train_batch_size=16, learning_rate=3e-3, report_to="none", use_cpu=True,
                             save_strategy="no", logging_steps=10, disable_tqdm=True)
    trainer = Trainer(model=build_model(tok), args=args, train_dataset=ds, eval_dataset=ds.select(range(32)),
                      processing_class=tok, callbacks=[cb], data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert losses == sorted(losses, reverse=True)  # it kept improving...
    assert cb.direction == "min" and cb.stopped_at is None and trainer.state.global_step == 40  # ...so no stop
    assert cb.best_score == pytest.approx(min(losses)) and cb.best_step == 40


def test_scores_are_visible_in_logs_and_replay(tmp_path):
    run = run_tiny("grpo", "hacked", output_dir=tmp_path, max_steps=30, eval_every=10, stop=False,
                   training_args={"save_strategy": "steps", "save_steps": 30})
    marks = [h for h in run.log_history if "evalstop/score" in h]
    assert [h["step"] for h in marks] == [10, 20, 30]
    assert all({"evalstop/best_score", "evalstop/stop"} <= set(h) for h in marks)
    assert run.trace[0]["loss"] is not None and run.trace[0]["proxy"] is not None  # this step's, not null
    state = tmp_path / "trainer" / "checkpoint-30" / "trainer_state.json"
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "replay", str(state), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["best_score"] == pytest.approx(max(t["gold"] for t in run.trace))


def test_a_coordinator_down_from_the_start_still_stops_and_the_outbox_flushes(tmp_path, server):
    down = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    embedded = run_tiny("grpo", "hacked", output_dir=tmp_path / "ref", max_steps=200, eval_every=15)
    offline = run_tiny("grpo", "hacked", output_dir=tmp_path / "off", max_steps=200, eval_every=15,
                       coordinator=down, token="es_unused", job_id="offline")
    assert offline.stopped_at == embedded.stopped_at  # the local detector decided, with the same policy
    outbox = tmp_path / "off" / "trainer" / "evalstop-outbox.jsonl"
    assert outbox.exists()
    token = server.add_tenant("lab")
    server.start()
    done = subprocess.run([sys.executable, "-m", "evalstop_trl", "outbox", "flush", str(outbox), "--url", server.url,
                           "--token", token], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from evalstop_trl.clients.http import EvalStopClient

    with EvalStopClient(server.url, token) as c:
        job = c.status("offline")
    assert job.status == "stopped" and job.best_step == embedded.best_step  # the service agrees, and now knows
    assert not outbox.exists()


def test_unrelated_runs_with_the_same_folder_name_do_not_collide(tmp_path):
    shared = Coordinator(SQLiteStore(tmp_path / "shared.db"))  # one coordinator for both, as a service would be
    a = run_tiny("grpo", "healthy", output_dir=tmp_path / "a", coordinator=shared, max_steps=10, eval_every=5,
                 stop=False)
    b = run_tiny("grpo", "healthy", output_dir=tmp_path / "b", coordinator=shared, max_steps=10, eval_every=5,
                 stop=False)  # both write to .../trainer
    assert a.callback.job_id != b.callback.job_id
    assert a.callback.job_id.startswith("trainer-") and b.callback.job_id.startswith("trainer-")
    assert sorted(v.n_reports for v in shared.list_jobs("local")) == [2, 2]
    shared.close()


def test_keep_best_checkpoint_keeps_the_trainers_own_checkpoint(tmp_path):
    run = run_tiny("grpo", "healthy", output_dir=tmp_path, max_steps=20, eval_every=10,
                   callback_kwargs={"keep_best": "checkpoint"})
    best = Path(run.best_checkpoint)
    assert best == tmp_path / "trainer" / f"checkpoint-{run.best_step}" and (best / "config.json").exists()
    assert not (tmp_path / "trainer" / "evalstop-best").exists()  # no extra copy of the model


class LogRecorder(TrainerCallback):
    """Stands for a report_to integration (wandb, tensorboard, trackio): records the logs it is given."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_integrations_after_the_callback_get_the_scores(tmp_path):
    recorder = LogRecorder()
    run = run_tiny("grpo", "hacked", output_dir=tmp_path, max_steps=20, eval_every=10, stop=False,
                   callbacks=[recorder])
    seen = [entry for entry in recorder.logs if "evalstop/score" in entry]
    assert len(seen) == 2 and all("loss" in entry for entry in seen)  # in the same log as the step's loss
    assert [e["evalstop/score"] for e in seen] == pytest.approx([t["gold"] for t in run.trace])
    # the trainer's callbacks stay as the user listed them: nothing of EvalStop's inserted or moved
    from transformers import Trainer, TrainingArguments

    from evalstop_trl.train.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    cb = EvalStopCallback("eval_reward")
    trainer = Trainer(model=build_model(tok), args=TrainingArguments(output_dir=str(tmp_path / "t"), report_to="none",
                                                                     use_cpu=True),
                      callbacks=[recorder, cb])
    mine = [c for c in trainer.callback_handler.callbacks if c is recorder or type(c).__module__.startswith("evalstop_trl")]
    assert mine == [recorder, cb]
