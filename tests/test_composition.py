"""The composition matrix (issue 20): the ways users combine EvalStop, each a real tiny hacked GRPO run.

Factors: store {embedded (SQLite in the output folder), HTTP + SQLite (a real ``evalstop serve``), HTTP +
PostgreSQL (``evalstop serve --db postgresql://...``)} x world feedback {callable, metric (the trainer's
own evaluation), external (``evalstop evaluate`` workers)} x launch {direct, under ``evalstop run``} x
scenario {fresh, resume (SIGKILLed at step 35, rerun with ``resume_from_checkpoint`` and a longer
``max_steps``), rerun (the same output folder again, another seed and a longer ``max_steps``), killed
(SIGKILLed at step 35: ``lost`` after the lease; a launcher records how its child died)}.

Each defect of issue 20 is a row, named after it; the rows :func:`pairwise` adds after them cover every
remaining pair of factor values (greedy, deterministic). ``test_the_table_is_the_docstrings`` keeps this
table equal to :data:`ROWS`:

    row  name                        store        feedback  launch    scenario
    1    D1-launcher-callback        embedded     callable  launcher  fresh
    2    D2-external-embedded        embedded     external  direct    fresh
    3    D3-killed-lost              http_sqlite  callable  direct    killed
    4    D3-killed-launcher-failed   http_pg      external  launcher  killed
    5    D4-rerun-best               embedded     metric    direct    rerun
    6    D5-changed-max-steps        http_pg      callable  direct    resume
    7    D7-integrations-see-scores  http_pg      metric    direct    fresh
    8    D8-diagnostics              http_sqlite  callable  direct    fresh
    9    D9-inspect-embedded         embedded     metric    launcher  killed
    10   D10-launcher-exit-0         http_pg      callable  launcher  rerun
    11   pairs-11                    http_sqlite  metric    launcher  resume
    12   pairs-12                    http_sqlite  external  direct    rerun
    13   pairs-13                    embedded     external  direct    resume
    14   D6-metric-without-eval      embedded     metric    direct    fresh   (no training: eval_strategy="no")
    15   S1-shadow-mode              http_sqlite  callable  launcher  fresh   (shadow=True: trains to its end)
    16   B1-run-browser              http_pg      callable  direct    fresh   (tags, hparams, browse, export)
    17   U1-user-callback-first      embedded     callable  direct    fresh   (a user callback before it runs first)
    18   P1-per-example              http_pg      callable  launcher  resume  (per-prompt scores: paired noise)
    19   G1-proxy-gate               http_sqlite  callable  direct    fresh   (gate: proxy_diverges, the eval's proxy)
    20   L1-metric-from-jsonl        http_sqlite  log-jsonl launcher  fresh   (no callback: verl's file logger)
    21   L2-metric-from-verl         embedded     log-verl  launcher  fresh   (no callback: verl's console log)
    22   L3-metric-from-tb           http_pg      log-tb    launcher  fresh   (no callback: TensorBoard)

Every training row asserts: the stop step is the one ``create_detector("decline", k=2)`` gives on the
scores the coordinator recorded (external: the decision's step, and the stop lag), the best step and
score, the job's final status read back through the API (stopped / lost / failed), the job type, the
launcher's exit status, and the checkpoints on disk (the best kept, nothing newer than the best after a
stop). Defect rows assert their defect on top (see :data:`DEFECTS`). ``S1-shadow-mode`` (issue 18, shadow
mode) runs ``EvalStopCallback(shadow=True)`` under the launcher against a real service: the run trains to
its end, the job finishes with its would-stop at the step the detector gives, and `evalstop shadow-report`
judges it. ``B1-run-browser`` (issue 19) runs ``EvalStopCallback(tags=...)`` against a real service on
PostgreSQL: the job is found by its tag, carries the trainer's hyperparameters, its CSV export equals
its recorded reports, the tenant's summary counts its stop and the steps it saved, and once stopped it
can be deleted (its audit line stays). ``U1-user-callback-first`` (issue 24) lists a callback of the
user's before ``EvalStopCallback``: it runs first at every step (the world feedback sees the mark it
set at the eval's own step), and the trainer's callback list is as the user built it.
``P1-per-example`` (issue 28) returns the gold eval's 32 per-prompt scores: every report carries n = 32
and a paired noise level except the first eval of each process (nothing to pair with; the resumed
process starts afresh), and the stop is the one ``decline`` gives with that noise. ``G1-proxy-gate`` (issue 44) is the
recommendation: the same per-prompt scores returned as a ``WorldFeedback`` with the proxy reward's
expected score of the same continuations, and ``gate="proxy_diverges"``: every report carries that
proxy (not the trainer's logged batch reward), and the stop is the gated rule's on the recorded scores
and proxies, saying once how far the proxy rose. ``L1``-``L3`` (a row per
``--metric-from`` format) train with no EvalStopCallback: the job writes its gold eval to a log as verl's file
logger, verl's console logger or TensorBoard writes it, ``evalstop run --metric-from`` reads it with the
parsers of ``evalstop replay``, and the launcher stops the process at the eval ``decline`` stops on the
logged scores (SIGTERM; exit 0). External rows start their worker
before the training process. A row takes 15-40 s on 2 cores.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from evalstop_trl.clients.embedded import EmbeddedClient  # noqa: E402
from evalstop_trl.clients.http import EvalStopClient  # noqa: E402
from evalstop_trl.clients.local import LocalServer  # noqa: E402
from evalstop_trl.core.coordinator import Coordinator  # noqa: E402
from evalstop_trl.core.detectors import Observation, ProxyGate, create_detector  # noqa: E402
from evalstop_trl.stores.sqlite import SQLiteStore  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "composition_job.py"
FACTORS = (("embedded", "http_sqlite", "http_pg"), ("callable", "metric", "external"), ("direct", "launcher"),
           ("fresh", "resume", "rerun", "killed"))
LEASE_S = 3  # HTTP services run with --lease-s 3; an embedded file is read with EVALSTOP_LEASE_S=3
DIE_AT = 35  # after checkpoint-30, before any stop (gold peaks near step 30: the stop comes at 50 or later)


@dataclass(frozen=True)
class Row:
    name: str
    store: str
    mode: str
    launch: str
    scenario: str
    note: str = ""

    @property
    def defect(self) -> str:
        """``D1`` ... ``D10`` for a defect's row, else ``""``."""
        return self.name.split("-")[0] if self.name.startswith("D") else ""

    @property
    def values(self) -> tuple[str, str, str, str]:
        return (self.store, self.mode, self.launch, self.scenario)


#: issue 20's defects, one row each: (name, store, feedback, launch, scenario, what the row asserts on top)
DEFECTS = (
    ("D1-launcher-callback", "embedded", "callable", "launcher", "fresh",
     "item 1: evalstop run registers first without planned_steps; the callback adopts the job (no 409)"),
    ("D2-external-embedded", "embedded", "external", "direct", "fresh",
     "item 2: an `evalstop evaluate --db` worker started before the job scores it, and the run stops"),
    ("D3-killed-lost", "http_sqlite", "callable", "direct", "killed",
     "item 3: a SIGKILLed job ends lost after the lease (--lease-s 3)"),
    ("D3-killed-launcher-failed", "http_pg", "external", "launcher", "killed",
     "item 3: a SIGKILLed child ends lost, its death recorded by its launcher"),
    ("D4-rerun-best", "embedded", "metric", "direct", "rerun",
     "item 4: the rerun (NAME-2) keeps its best elsewhere; evalstop-best still holds the first run's"),
    ("D5-changed-max-steps", "http_pg", "callable", "direct", "resume",
     "item 5: the resume with a longer max_steps extends the plan (planned_steps 100) instead of crashing"),
    ("D7-integrations-see-scores", "http_pg", "metric", "direct", "fresh",
     "item 7: a report_to integration (before the user's callbacks) sees evalstop/* at every eval"),
    ("D8-diagnostics", "http_sqlite", "callable", "direct", "fresh",
     "item 8: a minimised loss-like feedback whose 2nd eval raises: the failure at WARNING, "
     "evalstop/eval_failures in log_history, the stop line at WARNING, a reason that says 'rose'"),
    ("D9-inspect-embedded", "embedded", "metric", "launcher", "killed",
     "item 9: evalstop status --db, evalstop replay DB --job, evalstop audit --db read the embedded file"),
    ("D10-launcher-exit-0", "http_pg", "callable", "launcher", "rerun",
     "item 10: a stopped job under the launcher exits 0; job type grpo; checkpoints newer than the best removed"),
)


def _pairs(values: tuple[str, ...]) -> set[tuple]:
    return {(i, values[i], j, values[j]) for i, j in itertools.combinations(range(len(values)), 2)}


def pairwise(rows: list[Row]) -> list[Row]:
    """``rows`` and, while a pair of factor values is uncovered, the first combination (in
    :data:`FACTORS` order) that covers the most uncovered pairs."""
    needed = set().union(*(_pairs(v) for v in itertools.product(*FACTORS)))
    covered = set().union(*(_pairs(r.values) for r in rows))
    out = list(rows)
    while needed - covered:
        best = max(itertools.product(*FACTORS), key=lambda v: len(_pairs(v) - covered))
        out.append(Row(f"pairs-{len(out) + 1}", *best))
        covered |= _pairs(best)
    return out


ROWS = pairwise([Row(*d) for d in DEFECTS]) + [
    Row("D6-metric-without-eval", "embedded", "metric", "direct", "fresh",
        "item 6: metric mode with eval_strategy='no' fails at on_train_begin naming eval_strategy"),
    Row("S1-shadow-mode", "http_sqlite", "callable", "launcher", "fresh",
        "shadow mode: would-stop recorded, never stopped, the launcher lets the run finish"),
    Row("B1-run-browser", "http_pg", "callable", "direct", "fresh",
        "run browser: tags and hparams recorded, found by tag, exported, summarised, deleted"),
    Row("U1-user-callback-first", "embedded", "callable", "direct", "fresh",
        "a user's callback listed before EvalStopCallback runs before it: the eval sees its step"),
    Row("P1-per-example", "http_pg", "callable", "launcher", "resume",
        "per-example world feedback: n and the paired noise in every report, the decision uses them"),
    Row("G1-proxy-gate", "http_sqlite", "callable", "direct", "fresh",
        "the recommendation: per-prompt scores and the proxy of the same continuations, gate proxy_diverges"),
    Row("L1-metric-from-jsonl", "http_sqlite", "log-jsonl", "launcher", "fresh", "no callback: verl's file logger"),
    Row("L2-metric-from-verl", "embedded", "log-verl", "launcher", "fresh", "no callback: verl's console log"),
    Row("L3-metric-from-tb", "http_pg", "log-tb", "launcher", "fresh", "no callback: TensorBoard")]
_NOTES = {"D6": '   (no training: eval_strategy="no")', "S1": "   (shadow=True: trains to its end)",
          "B1": "   (tags, hparams, browse, export)", "U1": "   (a user callback before it runs first)",
          "P1": "  (per-prompt scores: paired noise)", "G1": "   (gate: proxy_diverges, the eval's proxy)", "L1": "   (no callback: verl's file logger)",
          "L2": "   (no callback: verl's console log)", "L3": "   (no callback: TensorBoard)"}


def table() -> str:
    lines = [f"{'row':<5}{'name':<28}{'store':<13}{'feedback':<10}{'launch':<10}scenario"]
    for i, r in enumerate(ROWS, 1):
        extra = _NOTES.get(r.name[:2], "")
        lines.append(f"{i:<5}{r.name:<28}{r.store:<13}{r.mode:<10}{r.launch:<10}{r.scenario}{extra}")
    return "\n".join(lines)


def test_the_table_is_the_docstrings():
    assert table() in "\n".join(line[4:] for line in __doc__.splitlines()), "\n" + table()
    assert len(ROWS) == len({r.name for r in ROWS})
    assert not set().union(*(_pairs(v) for v in itertools.product(*FACTORS))) - set().union(
        *(_pairs(r.values) for r in ROWS))


# ---------------------------------------------------------------------------------------------- running
def _env(token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALSTOP_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if token:
        env["EVALSTOP_TOKEN"] = token
    return env


@dataclass
class Target:
    """Where a row's job reports: the embedded file in the output folder, or a real `evalstop serve`."""

    store: str
    out: Path
    url: str | None = None
    token: str | None = None
    server: LocalServer | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def db(self) -> Path:
        return self.out / "evalstop.db"

    def client(self):
        if self.url:
            return EvalStopClient(self.url, self.token, retries=0)
        return EmbeddedClient(Coordinator(SQLiteStore(self.db), lease_s=LEASE_S), tenant="local")

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if self.server is not None:
            self.server.stop()


def _target(row: Row, tmp_path: Path, request) -> Target:
    out = tmp_path / "out"
    out.mkdir()
    if row.store == "embedded":
        return Target(row.store, out)
    db = request.getfixturevalue("pg_dsn") if row.store == "http_pg" else str(tmp_path / "coord.db")
    server = LocalServer(db, tenants=("lab",), args=("--lease-s", str(LEASE_S)), log=tmp_path / "serve.log").start()
    return Target(row.store, out, server.url, server.tokens["lab"], server)


def _worker(t: Target, log: Path) -> subprocess.Popen:
    where = ["--url", t.url] if t.url else ["--db", str(t.db)]
    p = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "evaluate", *where, "--fn",
                          "evalstop_trl.train.tiny:gold_hacked", "--root", str(t.out), "--lease-s", "30"],
                         cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=_env(t.token))  # noqa: SIM115
    t.procs.append(p)
    return p


@dataclass
class Run:
    rc: int
    log: str
    result: dict | None


def _job(row: Row, t: Target, job_id: str, n: int, *args: str, timeout: float = 240) -> Run:
    """One training process (directly, or under `evalstop run`); its log and result.json."""
    result = t.out / f"result-{n}.json"
    cmd = [sys.executable, str(JOB), "--out", str(t.out), "--mode", row.mode, "--result", str(result), *args]
    if row.launch == "direct":
        cmd += ["--job-id", job_id] + (["--coordinator", t.url] if t.url else [])
    else:
        where = ["--url", t.url, "--lease-s", str(LEASE_S)] if t.url else ["--db", str(t.db)]
        cmd = [sys.executable, "-m", "evalstop_trl", "run", "--job-id", job_id, "--grace-s", "5", *where, "--",
               *cmd]
    log = t.out.parent / f"run-{n}.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env(t.token),
                            timeout=timeout).returncode
    return Run(rc, log.read_text(), json.loads(result.read_text()) if result.exists() else None)


def replay(scores: list[tuple], direction: str = "max", proxies: dict[int, float] | None = None):
    """What ``decline`` (k=2) decides on these (step, score[, eval_n, eval_noise]) reports, with
    ``proxies`` (step -> proxy reward) gated by the proxy gate: (stop step or None, best step, best
    score, reason)."""
    det = create_detector("decline", k=2, direction=direction)
    det = ProxyGate(det) if proxies is not None else det
    decision = None
    for step, score, *evidence in scores:
        n, noise = evidence or (None, None)
        proxy = proxies.get(step) if proxies is not None else None
        decision = det.observe(Observation("replay", step, score, eval_n=n, eval_noise=noise, proxy_reward=proxy))
        if decision.stop:
            return step, decision.best_step, decision.best_score, decision.reason
    return None, decision.best_step if decision else None, decision.best_score if decision else None, ""


def _checkpoints(out: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in out.iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))


def _wait_status(t: Target, job_id: str, wanted: str, timeout: float = 20.0):
    """The job once its status is ``wanted`` (a lease runs out in the service's sweeper), or as it is then."""
    deadline = time.monotonic() + timeout
    while True:
        c = t.client()
        try:
            job = c.status(job_id)
        finally:
            c.close()
        if job.status == wanted or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def _ok(run: Run, what: str) -> None:
    assert run.rc == 0 and run.result is not None, f"{what} exited {run.rc}:\n{run.log[-4000:]}"


# ------------------------------------------------------------------------------------------------ rows
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_composition(row: Row, tmp_path, request):
    t = _target(row, tmp_path, request)
    try:
        if row.defect == "D6":
            _metric_without_eval(row, t)
            return
        if row.name.startswith("S1"):
            _shadow_row(row, t)
            return
        if row.name.startswith("B1"):
            _browser_row(row, t)
            return
        if row.mode.startswith("log-"):
            _logs_row(row, t)
            return
        _train_row(row, t, tmp_path)
    finally:
        t.close()


def _train_row(row: Row, t: Target, tmp_path: Path) -> None:
    job_id = f"comp-{ROWS.index(row) + 1}"
    external = row.mode == "external"
    # external: a real step is slower than a tiny eval, so the workers keep up (0.05 s more per step)
    steps, more = (["--max-steps", "130", "--slow", "0.05"], "140") if external else (["--max-steps", "90"], "100")
    extra = ["--flaky-at", "2", "--callback-kwargs", '{"direction": "min"}'] if row.defect == "D8" else []
    extra += ["--user-first"] if row.name.startswith("U1") else []
    extra += ["--per-example"] if row.name.startswith(("P1", "G1")) else []
    extra += ["--with-proxy", "--callback-kwargs", '{"gate": "proxy_diverges"}'] if row.name.startswith("G1") else []
    if external:
        _worker(t, tmp_path / "worker.log")  # before the training process (issue 20, item 2)
        time.sleep(1.0)
    killed_rc = -signal.SIGKILL if row.launch == "direct" else 128 + signal.SIGKILL
    first = _job(row, t, job_id, 1, *steps, *extra, *(["--die-at", str(DIE_AT)] if row.scenario in ("resume", "killed") else []))
    final_job = job_id
    if row.scenario in ("resume", "killed"):
        assert first.rc == killed_rc and first.result is None, f"exit {first.rc}:\n{first.log[-4000:]}"
    else:
        _ok(first, "the first run")
    if row.scenario == "killed":
        _check_killed(row, t, job_id)
        return
    if row.scenario == "resume":
        time.sleep(LEASE_S + 1)  # preempted longer than the lease: the job is lost meanwhile, and comes back
        run = _job(row, t, job_id, 2, *steps[:1], more, *steps[2:], *extra, "--resume")
        _ok(run, "the resumed run")
        assert run.result["job_id"] == job_id and run.result["attempt"] >= 2, run.result
    elif row.scenario == "rerun":
        before = _check_stopped(row, t, job_id, first)
        first_best = (before.best_step, before.best_checkpoint)
        run = _job(row, t, job_id, 2, *steps[:1], more, *steps[2:], *extra, "--seed", "1")
        _ok(run, "the rerun")
        final_job = run.result["job_id"]
        assert final_job != job_id, f"the rerun from step 0 reported to {job_id} again: {run.result}"
        # item 4: the first run's best is still where it was, still its own
        c = t.client()
        try:
            again = c.status(job_id)
        finally:
            c.close()
        kept = again.best_checkpoint
        if external and kept != first_best[1]:  # its kept snapshot moved out of the rerun's way, recorded
            assert Path(kept).name == f"evalstop-best-{job_id}", again
            first_best = (first_best[0], kept)
        assert (again.status, again.best_step, again.best_checkpoint) == ("stopped", *first_best), again
        info = json.loads((t.out / "evalstop-best" / "evalstop.json").read_text())
        assert (info["job_id"], info["step"]) == (job_id, first_best[0]), info
        assert Path(first_best[1]).exists(), f"the first run's best {first_best[1]} is gone"
    else:
        run = first
    job = _check_stopped(row, t, final_job, run, planned=int(more) if row.scenario != "fresh" else None)
    if row.defect == "D7":
        evals = {e["step"] for e in run.result["evalstop_logs"] if "evalstop/score" in e}
        seen = {e["step"] for e in run.result["integration_logs"] if "evalstop/score" in e}
        assert evals and seen == evals, (sorted(evals), run.result["integration_logs"])
    if row.name.startswith("P1"):
        _, reports = _job_and_scores(t, final_job)
        firsts = {reports[0][0], run.result["history"][0]["step"]}  # the first eval of each process
        assert [n for _, _, n, _ in reports] == [32] * len(reports), reports
        assert all((noise is None) == (step in firsts) for step, _, _, noise in reports), (firsts, reports)
        assert all(noise is None or noise > 0 for *_, noise in reports), reports
    if row.name.startswith("G1"):
        # the reports carry the proxy of the eval's continuations (WorldFeedback.proxy), not the trainer's
        # logged reward: the training log's batch rewards are other numbers
        proxies = _proxies(t, final_job)
        trained = {e["step"]: e["reward"] for e in run.result["reward_logs"]}
        assert proxies and all(p is not None for p in proxies.values()), proxies
        assert not any(math.isclose(p, trained.get(s, -1.0)) for s, p in proxies.items()), (proxies, trained)
        assert job.policy["gate"] == "proxy_diverges" and job.decision.reason.count("; proxy +") == 1
        assert job.decision.evidence["proxy_since_best"] > 0, job.decision
    if row.name.startswith("U1"):
        evals = [h["step"] for h in run.result["history"]]
        assert evals and run.result["marks_seen"] == evals, run.result  # StepMark ran first at each eval step
        names = run.result["callbacks"]
        assert names == ["DefaultFlowCallback", "StepMark", "Integration", "EvalStopCallback"], names
    if row.defect == "D8":
        assert re.search(r"\b(rose|rises?)\b", job.decision.reason) and "decline" not in job.decision.reason, \
            job.decision.reason
        assert re.search(r"the eval at step 20 failed .*TimeoutError", run.log), run.log[-3000:]
        assert re.search(r"EvalStop: stopping at step \d+", run.log), run.log[-3000:]
        failures = [e.get("evalstop/eval_failures") for e in run.result["evalstop_logs"] if e["step"] >= 20]
        assert failures and all(f == 1 for f in failures), run.result["evalstop_logs"]


def _logs_row(row: Row, t: Target) -> None:
    """A job without a callback, watched through its logs (``evalstop run --metric-from``)."""
    from tests.composition_job import LOG_MODES

    name, kind, key = LOG_MODES[row.mode]
    job_id = f"comp-{ROWS.index(row) + 1}"
    where = ["--url", t.url, "--lease-s", str(LEASE_S)] if t.url else ["--db", str(t.db)]
    cmd = [sys.executable, "-m", "evalstop_trl", "run", "--job-id", job_id, "--grace-s", "2", *where,
           "--metric-from", f"{kind}:{t.out / name}", "--metric", key, "--",
           sys.executable, str(JOB), "--out", str(t.out), "--mode", row.mode, "--max-steps", "150", "--slow", "0.2"]
    log = t.out.parent / "run-1.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env(t.token), timeout=240).returncode
    written = [json.loads(line) for line in (t.out / "scores.jsonl").read_text().splitlines()]
    stop, best_step, best_score, _ = replay([(w["step"], w["score"]) for w in written])
    assert stop is not None, f"decline never stops on {written}: the row shows nothing"
    assert rc == 0, f"evalstop run exited {rc}:\n{log.read_text()[-4000:]}"  # 0: EvalStop stopped it
    assert written[-1]["step"] < 150, f"the job ran to its end: {written}"  # a step takes 0.2 s more: 30 s to go
    job, scores = _job_and_scores(t, job_id)
    assert job.status == "stopped" and job.decision.stop and f"at step {stop}" in job.decision.reason, (job, stop)
    assert [s for s, *_ in scores if s <= stop] == [w["step"] for w in written if w["step"] <= stop]
    assert [v for s, v, *_ in scores if s <= stop] == pytest.approx([w["score"] for w in written if w["step"] <= stop],
                                                                     abs=1e-3)  # the console log prints 4 digits
    assert job.best_step == best_step and "launcher_sigterm" in _audit_kinds(t, job_id)


def _job_and_scores(t: Target, job_id: str):
    """The job as the API shows it, and its recorded (step, eval score, eval_n, eval_noise) in step order."""
    c = t.client()
    try:
        return c.status(job_id), [(r.step, r.eval_score, r.eval_n, r.eval_noise)
                                  for r in sorted(c.reports(job_id), key=lambda r: r.step)]
    finally:
        c.close()


def _proxies(t: Target, job_id: str) -> dict[int, float]:
    """The proxy reward of each recorded report, by step."""
    c = t.client()
    try:
        return {r.step: r.proxy_reward for r in c.reports(job_id)}
    finally:
        c.close()


def _shadow_row(row: Row, t: Target) -> None:
    job_id = f"comp-{ROWS.index(row) + 1}"
    run = _job(row, t, job_id, 1, "--max-steps", "90", "--callback-kwargs", '{"shadow": true}')
    _ok(run, "the shadow run")
    job, scores = _job_and_scores(t, job_id)
    would, _, _, reason = replay(scores)
    best_step = max(scores, key=lambda s: s[1])[0]
    assert would is not None, f"the detector never stops on {scores}: the shadow row shows nothing"
    assert (run.result["steps_done"], run.result["stopped_at"], job.status) == (90, None, "finished"), (run.result, job)
    # the rule's reason, then what the run logs beside its evals (the trainer's reward, as a stop's evidence)
    assert job.would_stop_step == would and job.would_stop.reason.startswith(f"{reason}; proxy "), (job.would_stop,
                                                                                                    would, reason)
    assert job.policy["mode"] == "shadow" and not job.decision.stop
    assert job.best_step == best_step == run.result["best_step"], (job.best_step, best_step, scores)
    assert "would_stop" in _audit_kinds(t, job_id) and "launcher_sigterm" not in _audit_kinds(t, job_id)
    assert re.search(rf"shadow mode, not stopping\): would stop at step {would}", run.log), run.log[-3000:]
    report = subprocess.run([sys.executable, "-m", "evalstop_trl", "shadow-report", "--url", t.url, "--json"],
                            capture_output=True, text=True, env=_env(t.token), timeout=60)
    verdict = json.loads(report.stdout)["jobs"][0]
    assert (verdict["job_id"], verdict["would_stop_step"], verdict["last_step"]) == (job_id, would, 90), verdict
    assert verdict["verdict"] in ("right", "early"), verdict


def _browser_row(row: Row, t: Target) -> None:
    import csv
    import io

    job_id = f"comp-{ROWS.index(row) + 1}"
    run = _job(row, t, job_id, 1, "--max-steps", "90", "--callback-kwargs", '{"tags": {"sweep": "b1", "seed": 0}}')
    _ok(run, "the tagged run")
    job = _check_stopped(row, t, job_id, run)
    c = t.client()
    try:
        page = c.browse_jobs(tag="sweep=b1")
        assert [v.job_id for v in page.jobs] == [job_id] and page.total == 1, page
        assert dict(job.tags) == {"seed": "0", "sweep": "b1"}, job.tags
        h = job.hparams
        assert h["max_steps"] == 90 and h["learning_rate"] > 0 and h["per_device_train_batch_size"] >= 1, h
        assert h["model_name"], h
        exported = [(int(r["step"]), float(r["eval_score"]) if r["eval_score"] else None)
                    for r in csv.DictReader(io.StringIO(c.export_reports(job_id)))]
        assert exported == [(r.step, r.eval_score) for r in c.reports(job_id)], exported
        summary = c.summary()
        assert summary.stopped_by_detector == 1 and summary.steps_saved == job.planned_steps - job.last_step, summary
        c.delete_job(job_id, "composition clean-up")
        assert c.browse_jobs(tag="sweep=b1").total == 0
        assert [a.kind.value for a in c.audit(job_id)][-1] == "deleted"
    finally:
        c.close()


def _check_stopped(row: Row, t: Target, job_id: str, run: Run, planned: int | None = None):
    """The job stopped where the detector says on its recorded scores, with that best, and what is on disk."""
    job, scores = _job_and_scores(t, job_id)
    direction = "min" if row.defect == "D8" else "max"
    proxies = _proxies(t, job_id) if row.name.startswith("G1") else None
    stop_step, best_step, best_score, reason = replay(scores, direction, proxies)
    res = run.result
    assert stop_step is not None, f"the detector never stops on {scores}"
    assert job.status == "stopped", (job.status, job.decision, scores)
    assert job.job_type == "grpo", job.job_type
    assert job.decision is not None and job.decision.stop and f"at step {stop_step}" in job.decision.reason, \
        (job.decision, stop_step)
    assert (job.best_step, res["best_step"]) == (best_step, best_step), (job, res, scores)
    assert math.isclose(job.best_score, best_score, rel_tol=1e-9) and math.isclose(res["best_score"], best_score,
                                                                                    rel_tol=1e-9)
    if row.mode == "external":
        assert res["stopped_at"] is not None and res["stopped_at"] >= stop_step, res
        assert res["stop_lag"] == res["stopped_at"] - stop_step, res
    else:
        assert res["stopped_at"] == stop_step and res["steps_done"] == stop_step, res
    if planned is not None:
        assert job.planned_steps == planned, job.planned_steps
    # on disk: the best is kept and says whose it is; nothing newer than the best after the stop
    best = Path(job.best_checkpoint or "")
    assert job.best_checkpoint and best.is_dir() and best == Path(res["best_checkpoint"]), (job.best_checkpoint, res)
    info = json.loads((best / "evalstop.json").read_text())  # external mode too: its best snapshot, moved
    assert (info["job_id"], info["step"]) == (job_id, best_step) and best.name.startswith("evalstop-best"), info
    newer = [s for s in _checkpoints(t.out) if s > best_step]
    assert not newer, f"checkpoints newer than the best ({best_step}) left after the stop: {newer}"
    if row.launch == "launcher":
        assert run.rc == 0  # item 10: a stop is not a failure a scheduler would retry
    if row.defect == "D1":
        assert job.planned_steps == 90, job.planned_steps  # the callback filled in the launcher's registration
    if row.defect == "D10":
        assert "launcher_exit" in _audit_kinds(t, job_id)
    return job


def _audit_kinds(t: Target, job_id: str) -> list[str]:
    c = t.client()
    try:
        return [a.kind.value for a in c.audit(job_id)]
    finally:
        c.close()


def _check_killed(row: Row, t: Target, job_id: str) -> None:
    wanted = "lost"  # killed from outside: its lease expires, directly or under a launcher (which records the kill)
    if t.url is None:
        time.sleep(LEASE_S + 1)
    job = _wait_status(t, job_id, wanted, timeout=LEASE_S * 5)
    c = t.client()
    try:
        scores = [(r.step, r.eval_score, r.eval_n, r.eval_noise) for r in sorted(c.reports(job_id), key=lambda r: r.step)]
    finally:
        c.close()
    stop_step, best_step, best_score, _ = replay(scores)
    assert job.status == wanted, (job.status, job.decision)
    assert stop_step is None and (job.decision is None or not job.decision.stop), (scores, job.decision)
    assert job.best_step == best_step and (best_step is None or math.isclose(job.best_score, best_score))
    if best_step is not None:  # the best so far is kept; the trainer's checkpoints up to the kill stay
        assert job.best_checkpoint and Path(job.best_checkpoint).is_dir(), job.best_checkpoint
    assert all(s <= DIE_AT for s in _checkpoints(t.out)), _checkpoints(t.out)
    if row.defect == "D9":
        _inspect_embedded(t, job_id, wanted, scores)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalstop_trl", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env or _env(), timeout=120)


def _inspect_embedded(t: Target, job_id: str, status: str, scores) -> None:
    """Item 9: the embedded file is read by status, replay and audit, without a server."""
    env = {**_env(), "EVALSTOP_LEASE_S": str(LEASE_S)}
    st = _cli("status", job_id, "--db", str(t.db), "--json", env=env)
    assert st.returncode == 0, st.stderr
    assert [j["status"] for j in json.loads(st.stdout)] == [status], st.stdout
    rp = _cli("replay", str(t.db), "--job", job_id, "--json")
    assert rp.returncode == 0, rp.stderr
    got = json.loads(rp.stdout)
    stop_step, best_step, best_score, _ = replay(scores)
    assert (got["stopped"], got["stop_step"], got["best_step"]) == (False, stop_step, best_step), got
    au = _cli("audit", job_id, "--db", str(t.db), "--json", env=env)
    assert au.returncode == 0, au.stderr
    assert "launcher_exit" in [a["kind"] for a in json.loads(au.stdout)], au.stdout


def _metric_without_eval(row: Row, t: Target) -> None:
    """Item 6: a metric the trainer never computes fails before training, naming eval_strategy."""
    run = _job(row, t, "comp-no-eval", 1, "--eval-strategy", "no", "--max-steps", "30")
    assert run.rc != 0 and "eval_strategy" in run.log, f"exit {run.rc}:\n{run.log[-3000:]}"
    assert _checkpoints(t.out) == [], _checkpoints(t.out)
    if t.db.exists():
        c = t.client()
        try:
            jobs = {j.job_id: j.status for j in c.list_jobs()}
        finally:
            c.close()
        assert jobs.get("comp-no-eval") in (None, "failed"), jobs


# -------------------------------------------------------------------------------- configs/examples
@pytest.mark.parametrize("script", ["launcher_and_callback.py", "external_eval_embedded.py"])
def test_the_examples_of_the_readme_combinations_run(script, tmp_path):
    """configs/examples: launcher + callback, and external evaluators on the embedded store."""
    r = subprocess.run([sys.executable, str(ROOT / "configs" / "examples" / script), "--out", str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "best step" in r.stdout, r.stdout  # exit 0: the example saw its run stopped


def test_the_readmes_own_model_example_stops_its_hacked_run(tmp_path):
    """configs/examples/own_model.py (the README's "your own model"): a GPT-2 and a tokenizer built in the
    script, a hackable reward, a held-out eval, nothing of evalstop but the callback (about 20 s on 2 cores)."""
    r = subprocess.run([sys.executable, str(ROOT / "configs" / "examples" / "own_model.py"), "--out",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # 0: stopped before the planned end
    said = [line for line in r.stdout.splitlines() if line.startswith(("stopped at step", "best: step"))]
    assert len(said) == 2 and (tmp_path / "out" / "run" / "evalstop-best" / "evalstop.json").is_file(), r.stdout[-3000:]
