"""Issue 27 item 1: a stop decided between evals (a manual stop) reaches an in-loop trainer within one
heartbeat: a real tiny GRPO run, evals every 100 steps, stopped by hand at step 12, on the embedded
SQLite store and over HTTP on PostgreSQL."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from evalstop_trl.clients.http import EvalStopClient  # noqa: E402
from evalstop_trl.clients.local import LocalServer  # noqa: E402
from evalstop_trl.core.coordinator import Coordinator  # noqa: E402
from evalstop_trl.core.requests import ReasonRequest
from evalstop_trl.stores.sqlite import SQLiteStore  # noqa: E402
from evalstop_trl.train.tiny import run_tiny  # noqa: E402

pytestmark = pytest.mark.slow


class StopByHand(TrainerCallback):
    """Someone presses Stop on the dashboard at ``step`` (after EvalStop's own check of that step)."""

    def __init__(self, stop, step: int) -> None:
        self.stop, self.step = stop, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.stop()


@pytest.mark.parametrize("store", ["embedded", "http_pg"])
def test_a_manual_stop_reaches_the_trainer_within_one_heartbeat(store, tmp_path, request):
    if store == "embedded":
        coord = Coordinator(SQLiteStore(tmp_path / "evalstop.db"), lease_s=300)
        target, token, server = coord, None, None
        read = lambda: (coord.status("local", "by-hand"), coord.audit("local", "by-hand"))  # noqa: E731
        stop = lambda: coord.stop("local", "by-hand", ReasonRequest("looks hacked to me"), actor="alice")  # noqa: E731
    else:
        server = LocalServer(request.getfixturevalue("pg_dsn"), tenants=("lab",), log=tmp_path / "serve.log").start()
        target, token = server.url, server.tokens["lab"]
        client = EvalStopClient(server.url, token)
        read = lambda: (client.status("by-hand"), client.audit("by-hand"))  # noqa: E731
        stop = lambda: client.stop("by-hand", reason="looks hacked to me")  # noqa: E731
    try:
        run = run_tiny("grpo", "hacked", output_dir=tmp_path / "run", max_steps=60, eval_every=5 * 20,
                       coordinator=target, token=token, job_id="by-hand", callbacks=[StopByHand(stop, 12)],
                       callback_kwargs={"heartbeat_s": 1e-3})  # a heartbeat at every step
        view, audit = read()
    finally:
        if server is not None:
            client.close()
            server.stop()
    assert (run.stopped_at, run.steps_done) == (13, 13), (run.stopped_at, run.steps_done)  # the next step
    assert run.callback.decision.reason.startswith("manual stop by") and "looks hacked to me" in run.reason
    assert view.status == "stopped" and view.acked
    assert [a.kind.value for a in audit][-2:] == ["manual_stop", "ack"]
    assert any(h.get("evalstop/stop") == 1 and h["step"] == 13 for h in run.log_history)


def _stop_before_the_first_eval(tmp_path, caplog, save_best=True, **callback_kwargs):
    """A real tiny GRPO run (evals every 100 steps) stopped by hand at step 6, before its first eval."""
    import logging

    coord = Coordinator(SQLiteStore(tmp_path / "evalstop.db"), lease_s=300)
    stop = lambda: coord.stop("local", "early", ReasonRequest("wrong dataset"), actor="alice")  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="evalstop"):
        run = run_tiny("grpo", "hacked", output_dir=tmp_path / "run", max_steps=40, eval_every=100,
                       coordinator=coord, job_id="early", callbacks=[StopByHand(stop, 6)], save_best=save_best,
                       callback_kwargs={"heartbeat_s": 1e-3, **callback_kwargs})
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("EvalStop: stopping at step"))
    return run, coord.status("local", "early"), line


def test_a_manual_stop_before_the_first_eval_keeps_the_model_at_the_stop(tmp_path, caplog):
    import json

    run, view, line = _stop_before_the_first_eval(tmp_path, caplog)
    final = tmp_path / "run" / "trainer" / "evalstop-final"
    assert (run.stopped_at, run.best_step, run.best_checkpoint) == (7, None, None)
    assert run.callback.session.final_checkpoint == str(final)
    info = json.loads((final / "evalstop.json").read_text())
    assert (info["job_id"], info["step"], info["score"]) == ("early", 7, None)
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()
    assert not (tmp_path / "run" / "trainer" / "evalstop-best").exists()  # no eval scored it: not a "best"
    assert view.status == "stopped" and view.acked and view.best_checkpoint == str(final)
    assert line.endswith(f"best step none (score none), checkpoint {final} (the model at step 7: no eval scored one)")
    assert "None" not in line


@pytest.mark.parametrize(("kwargs", "kept"), [({"keep_best": "checkpoint"}, "checkpoint-7"),
                                              ({"save_best": False}, None)])
def test_a_manual_stop_before_the_first_eval_keeps_the_trainers_checkpoint_or_says_why_not(tmp_path, caplog,
                                                                                          kwargs, kept):
    run, view, line = _stop_before_the_first_eval(tmp_path, caplog, **kwargs)
    assert run.stopped_at == 7
    if kept:
        assert (tmp_path / "run" / "trainer" / kept / "model.safetensors").exists()
        assert line.endswith(f"checkpoint {tmp_path / 'run' / 'trainer' / kept} (the model at step 7: no eval "
                             "scored one)")
        assert view.best_checkpoint == str(tmp_path / "run" / "trainer" / kept)
    else:
        assert line.endswith("checkpoint none (no eval scored a model and save_best=False)")
        assert not (tmp_path / "run" / "trainer" / "evalstop-final").exists()
