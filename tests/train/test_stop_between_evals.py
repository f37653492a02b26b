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
        stop = lambda: coord.stop("local", "by-hand", "looks hacked to me", actor="alice")  # noqa: E731
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
