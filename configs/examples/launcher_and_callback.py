"""The launcher and the callback together: ``evalstop run -- python train.py`` where train.py has an
``EvalStopCallback`` (docs/training.md, "Run a job under evalstop run"). Under a minute on CPU.

    python configs/examples/launcher_and_callback.py [--out DIR]

The launcher registers the job first (no planned steps: it does not know them), starts the training
command with ``EVALSTOP_URL``/``EVALSTOP_TOKEN``/``EVALSTOP_JOB_ID`` set, and keeps its lease with
heartbeats; the callback in the command adopts that job and fills in what it knows (its planned steps,
its job type), reports world feedback every 10 steps and stops the run when gold declines twice in a
row. No URL: the launcher serves an embedded coordinator over ``DIR/evalstop.db``, which is read back
here without a server. The same script is the training command (``--train``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

JOB_ID = "example-launcher"


def train(out: Path) -> None:
    """The training command: a tiny hacked GRPO run whose EvalStopCallback reports to $EVALSTOP_URL."""
    from transformers.utils import logging as hf_logging

    from evalstop_trl.train.tiny import Preset, run_tiny

    hf_logging.disable_progress_bar()
    run = run_tiny("grpo", Preset("hacked", lr=1e-3), output_dir=out, max_steps=90, eval_every=10,
                   training_args={"save_strategy": "steps", "save_steps": 10})
    print(f"[train] job {run.callback.job_id}: {run.steps_done} steps, stopped at {run.stopped_at}; best step "
          f"{run.best_step} (gold {run.best_score:.4f}) kept at {run.best_checkpoint}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder (default: a new temporary one)")
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="evalstop-launcher-"))
    if a.train:
        train(out)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    db = out / "evalstop.db"
    cmd = [sys.executable, "-m", "evalstop_trl", "run", "--db", str(db), "--job-id", JOB_ID, "--grace-s", "10",
           "--", sys.executable, str(Path(__file__).resolve()), "--train", "--out", str(out)]
    print("$ evalstop run --db", db, "--job-id", JOB_ID, "-- python", Path(__file__).name, "--train", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    code = subprocess.run(cmd, env=env).returncode
    print(f"\nevalstop run exited {code} (0: stopped by EvalStop or finished; a scheduler does not retry it)")

    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.coordinator import Coordinator
    from evalstop_trl.stores.sqlite import SQLiteStore

    client = EmbeddedClient(Coordinator(SQLiteStore(db)))  # the launcher's tenant is "local"
    job = client.status(JOB_ID)
    print(f"job {job.job_id} ({job.job_type}, planned {job.planned_steps} steps): {job.status}; "
          f"{job.decision.reason if job.decision else 'no decision'}")
    print(f"best step {job.best_step} (gold {job.best_score}), kept at {job.best_checkpoint}")
    left = sorted((p.name for p in (out / "trainer").glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))
    print(f"checkpoints left: {', '.join(left) or 'none'}")
    print(f"audit trail (also: evalstop audit {JOB_ID} --db {db}):")
    for a in client.audit(JOB_ID):
        print(f"  {a.kind.value:<16} {a.actor:<20} {a.reason}")
    return 0 if job.status == "stopped" and code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
