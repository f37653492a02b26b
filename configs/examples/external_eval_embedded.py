"""External evaluators on the embedded store: ``EvalStopCallback(external_eval=True, eval_every=10)`` with
no coordinator (SQLite in the output folder) and an ``evalstop evaluate --db`` worker on the same file
(docs/training.md, "World feedback from separate evaluators"). Under a minute on CPU.

    python configs/examples/external_eval_embedded.py [--out DIR]

The worker starts first, before the job exists. Every 10 steps the trainer saves ``checkpoint-N`` and
publishes it; the worker claims each snapshot, scores it with ``evalstop_trl.train.tiny:gold_hacked``
and posts the score; the coordinator feeds the scores to the detector in step order, and the training
process learns of the stop at its next step (the stop lag). The best snapshot is kept, the others are
pruned.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from transformers import TrainerCallback


class RealisticStep(TrainerCallback):
    """0.1 s more per step: a tiny step is faster than loading and scoring a snapshot, a real one is not."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder (default: a new temporary one)")
    a = p.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed arguments, not ours
    out = Path(a.out or tempfile.mkdtemp(prefix="evalstop-external-"))
    db = out / "trainer" / "evalstop.db"  # run_tiny's trainer writes to out/trainer: the callback's embedded store
    db.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"$ evalstop evaluate --db {db} --fn evalstop_trl.train.tiny:gold_hacked --root {out}", flush=True)
    log = open(out / "worker.log", "w")  # noqa: SIM115 - closed below
    worker = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "evaluate", "--db", str(db), "--fn",
                               "evalstop_trl.train.tiny:gold_hacked", "--root", str(out)],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        from transformers.utils import logging as hf_logging

        from evalstop_trl.train.tiny import Preset, run_tiny

        hf_logging.disable_progress_bar()
        run = run_tiny("grpo", Preset("hacked", lr=1e-3), output_dir=out, job_id="example-external",
                       max_steps=150, eval_every=10, callbacks=[RealisticStep()],
                       callback_kwargs={"external_eval": True})
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        log.close()
    cb = run.callback
    print(f"\ntraining: {run.steps_done} of 150 steps, stopped at {run.stopped_at} (stop lag {cb.stop_lag} steps "
          f"after the deciding eval): {run.reason or 'no stop'}")
    print(f"best step {run.best_step} (gold {run.best_score}), kept at {run.best_checkpoint}")
    left = sorted((p.name for p in (out / "trainer").glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))
    print(f"snapshots left: {', '.join(left) or 'none'}")
    scored = [line.split("evalstop evaluate: ", 1)[1] for line in (out / "worker.log").read_text().splitlines()
              if " -> " in line]
    print(f"the worker scored {len(scored)} snapshot(s): " + "; ".join(s.split(" (")[0] for s in scored))
    print(f"inspect: evalstop audit example-external --db {db}")
    return 0 if run.stopped_at is not None and run.stopped_at < 150 else 1


if __name__ == "__main__":
    raise SystemExit(main())
