"""A training loop that ignores EvalStop's stop flag: the case ``evalstop run`` exists for.

It reports a recorded tiny-GRPO trace (``configs/traces/grpo-hacked-s0.jsonl`` by default: real
world-feedback scores of a hacked run) one eval every ``--pace`` seconds to the job that its
launcher exported (``EVALSTOP_URL``, ``EVALSTOP_TOKEN``, ``EVALSTOP_JOB_ID``), never looks at the
decision, and after the trace keeps "training" until it is killed. It also ignores SIGTERM unless
``--honour-sigterm``, like a loop stuck in a collective.

    evalstop run --grace-s 2 -- python scripts/stubborn_loop.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalstop_trl.clients.http import EvalStopClient  # noqa: E402

TRACE = Path(__file__).resolve().parent.parent / "configs" / "traces" / "grpo-hacked-s0.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--pace", type=float, default=0.2, help="seconds between evals")
    ap.add_argument("--honour-sigterm", action="store_true")
    args = ap.parse_args()
    for name in ("EVALSTOP_URL", "EVALSTOP_TOKEN", "EVALSTOP_JOB_ID"):
        if not os.environ.get(name):
            ap.error(f"{name} is not set: run me under 'evalstop run -- python {sys.argv[0]}'")
    if not args.honour_sigterm:
        signal.signal(signal.SIGTERM, lambda *a: print("stubborn loop: SIGTERM ignored", flush=True))
    job = os.environ["EVALSTOP_JOB_ID"]
    rows = [json.loads(line) for line in Path(args.trace).read_text().splitlines() if line.strip()]
    with EvalStopClient(os.environ["EVALSTOP_URL"], os.environ["EVALSTOP_TOKEN"]) as client:
        for row in rows:
            client.report(job, row["step"], eval_score=row["gold"],
                          proxy_reward=row.get("proxy_reward", row.get("proxy")))  # the decision is ignored
            print(f"stubborn loop: step {row['step']} gold {row['gold']:.3f}", flush=True)
            time.sleep(args.pace)
    while True:  # "keeps training"
        time.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
