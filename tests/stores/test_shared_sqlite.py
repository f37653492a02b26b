"""One embedded evalstop.db, two processes' coordinators: a training job and an `evalstop evaluate --db`
worker (issue 20, defect 2). Each sees what the other wrote: the worker scores a job registered
after it started, and the training side learns the stop the worker's score decided."""

from __future__ import annotations

import pytest

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.core.errors import NotFound
from evalstop_trl.core.requests import AckRequest, ClaimRequest, EvalResult, JobRequest, ReportRequest, SnapshotRequest
from evalstop_trl.core.store import StoreError


def _pair(path):
    worker = Coordinator(SQLiteStore(path, shared=True))  # started first: the file has no job yet
    trainer = Coordinator(SQLiteStore(path, shared=True))
    return trainer, worker


def test_a_worker_started_first_scores_a_later_job_and_the_trainer_sees_the_stop(tmp_path):
    trainer, worker = _pair(tmp_path / "evalstop.db")
    trainer.register_job("local", JobRequest("run", "grpo", 100))
    for step in (10, 20, 30, 40):
        trainer.publish_snapshot("local", "run", SnapshotRequest(step, f"/out/checkpoint-{step}"))
    for score in (0.5, 0.6, 0.55, 0.5):  # two declines after the best at step 20
        task = worker.claim_eval("local", ClaimRequest("w1", 60))
        worker.post_eval("local", "run", task.step, EvalResult(score, "w1"))
    view = trainer.status("local", "run")  # the training process's own coordinator
    assert (view.status, view.best_step, view.decision.action.value) == ("stopped", 20, "stop")
    assert trainer.ack("local", "run", AckRequest("/out/checkpoint-20", 45)).acked
    assert worker.status("local", "run").acked
    trainer.close()
    worker.close()


def test_writes_on_stale_state_are_refused_and_reloaded(tmp_path):
    a, b = _pair(tmp_path / "evalstop.db")
    a.register_job("local", JobRequest("j", "grpo"))
    a.report("local", "j", ReportRequest(1, eval_score=0.5))
    b.report("local", "j", ReportRequest(2, eval_score=0.4))  # b re-reads the job a wrote, then writes
    assert a.report("local", "j", ReportRequest(3, eval_score=0.3)).stop  # a re-reads b's report: two declines
    assert b.status("local", "j").status == "stopped"
    a.close()
    b.close()


@pytest.mark.parametrize(("catch_up", "read_first"), [(False, True), (True, True), (True, False)],
                         ids=["new version below", "new version equal", "new version equal, a report first"])
def test_a_job_deleted_and_registered_again_by_one_process_is_the_new_one_in_the_other(tmp_path, catch_up,
                                                                                       read_first):
    """b holds a stopped job (its version moved on with each report); a deletes it and registers the id
    again (a rerun: its version starts again). b answers for the new job, whether the new one's version
    is below b's or has caught up with it exactly, and whether b first reads the job or first gets
    the new job's next report (a write at b's version: refused as another job's, then re-read)."""
    from evalstop_trl.core.requests import ReasonRequest

    a, b = _pair(tmp_path / "evalstop.db")
    policy = {"detector": "decline", "k": 1, "noise": "none"}
    a.register_job("local", JobRequest("rerun", "grpo", policy=policy))
    for step, score in enumerate([0.5, 0.6, 0.4], start=1):
        b.report("local", "rerun", ReportRequest(step, eval_score=score))
    assert b.status("local", "rerun").status == "stopped"
    a.delete_job("local", "rerun", ReasonRequest("rerun"))
    a.register_job("local", JobRequest("rerun", "grpo", policy=policy))
    if catch_up:  # the new job's writes bring its version to the old one's
        for step, score in enumerate([0.1, 0.2, 0.3], start=1):
            a.report("local", "rerun", ReportRequest(step, eval_score=score))
    assert b.store.job_versions("local", ["rerun"])["rerun"][1] == (4 if catch_up else 1)
    if read_first:
        new = b.status("local", "rerun")
        assert (new.status, new.n_reports) == (("running", 3) if catch_up else ("pending", 0)), new
    else:
        assert b.report("local", "rerun", ReportRequest(4, eval_score=0.35)).action.value == "continue"
        assert [r.step for r in a.reports("local", "rerun")] == [1, 2, 3, 4]
        assert a.status("local", "rerun").best_step == 4
    a.close()
    b.close()


def test_an_unshared_file_is_not_reread(tmp_path):
    """The service owns its file (no version reads per report): another writer is not seen."""
    a = Coordinator(SQLiteStore(tmp_path / "own.db"))
    b = Coordinator(SQLiteStore(tmp_path / "own.db", shared=True))
    b.register_job("local", JobRequest("j", "grpo"))
    with pytest.raises(NotFound):
        a.status("local", "j")
    a.close()
    b.close()


def test_two_workers_never_lease_one_snapshot_twice(tmp_path):
    trainer, w1 = _pair(tmp_path / "evalstop.db")
    w2 = Coordinator(SQLiteStore(tmp_path / "evalstop.db", shared=True))
    trainer.register_job("local", JobRequest("run", "grpo"))
    for step in range(1, 7):
        trainer.publish_snapshot("local", "run", SnapshotRequest(step, f"/s/{step}"))
    got = [c.claim_eval("local", ClaimRequest(name, 60)) for _ in range(3) for c, name in ((w1, "w1"), (w2, "w2"))]
    assert sorted(t.step for t in got) == [1, 2, 3, 4, 5, 6]
    assert w1.claim_eval("local", ClaimRequest("w1", 60)) is None
    for c in (trainer, w1, w2):
        c.close()
    with pytest.raises(StoreError):
        w2.claim_eval("local", ClaimRequest("w2", 60))  # closed: refused, not silently served
