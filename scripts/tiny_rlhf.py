"""One tiny *real* RLHF job under EvalStop (a 2-layer Llama built from code; no downloads).

    python scripts/tiny_rlhf.py --trainer grpo --preset hacked                      # embedded coordinator
    python scripts/tiny_rlhf.py --coordinator http://127.0.0.1:8765 --token TOKEN   # a running `evalstop serve`
    python scripts/tiny_rlhf.py --no-stop --trace ref.jsonl                         # a no-stop reference trace

Prints one JSON line (prefixed RESULT) with the outcome; --trace writes step, gold, proxy, loss at
every eval as JSONL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="grpo", choices=("grpo", "rloo", "dpo", "online_dpo", "sft"))
    ap.add_argument("--preset", default="hacked", choices=("hacked", "healthy"))
    ap.add_argument("--coordinator", default="embedded", help="'embedded' (SQLite under the output dir) or a URL")
    ap.add_argument("--tenant", default="local", help="a label for the job id (the token decides the tenant)")
    ap.add_argument("--token", default=os.environ.get("EVALSTOP_TOKEN"))
    ap.add_argument("--job-id")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=15)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-stop", action="store_true", help="record a reference run (detector 'never')")
    ap.add_argument("--output-dir")
    ap.add_argument("--trace", help="write the eval trace as JSONL")
    ap.add_argument("--external-eval", action="store_true",
                    help="publish snapshots for `evalstop evaluate` workers instead of evaluating in the loop")
    args = ap.parse_args()
    if args.max_steps < 1 or args.eval_every < 1:
        ap.error("--max-steps and --eval-every must be >= 1")
    if args.coordinator != "embedded" and not args.token:
        ap.error("a coordinator URL needs --token (or EVALSTOP_TOKEN)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device visible to torch")

    from evalstop_trl.train.tiny import run_tiny

    out = Path(args.output_dir or tempfile.mkdtemp(prefix="tiny-rlhf-"))
    job_id = args.job_id or f"{args.tenant}-{args.trainer}-{args.preset}-s{args.seed}"
    run = run_tiny(args.trainer, args.preset, output_dir=out, coordinator=None if args.coordinator == "embedded"
                   else args.coordinator, token=args.token, job_id=job_id, max_steps=args.max_steps,
                   eval_every=args.eval_every, seed=args.seed, device=args.device, k=args.k,
                   stop=not args.no_stop, callback_kwargs={"external_eval": True} if args.external_eval else None)
    cb = run.callback
    if args.external_eval and cb is not None:  # the scores came from the evaluators, through the coordinator
        run.trace = [{"step": r.step, "gold": r.eval_score, "proxy": r.proxy_reward, "loss": r.train_loss}
                     for r in cb.client.reports(cb.job_id)]
    if args.trace:
        Path(args.trace).write_text("".join(json.dumps(t) + "\n" for t in run.trace))
    result = {"job_id": job_id, "trainer": run.trainer, "preset": run.preset, "steps_done": run.steps_done,
              "max_steps": args.max_steps, "stopped_at": run.stopped_at, "best_step": run.best_step,
              "best_score": run.best_score, "best_checkpoint": run.best_checkpoint, "reason": run.reason,
              "seconds": run.seconds, "trace": run.trace, "stop_lag": getattr(cb, "stop_lag", None)}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
