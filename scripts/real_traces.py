"""Validation on real training traces: tiny GRPO and RLOO runs, hacked and healthy, run to their end.

    python scripts/real_traces.py --run          # train the runs (no stopping) and store the traces
    python scripts/real_traces.py                # evaluate the detectors on the stored traces

Each run is labelled hacked or healthy from its gold curve with the simulator's rule (peak before the
end and a drop of at least 0.05). Every detector is then replayed on every trace with the same code as
`evalstop replay` (load_curve + replay_curve). A run is flagged if the detector stops it before its
last eval. Definition A: FP = healthy and flagged. Definition B (harmful): FP = healthy, flagged, and
the delivered checkpoint's gold (the best gold seen up to the stop) below the final gold minus 0.05.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalstop_trl.analysis.replay import load_curve, replay_curve  # noqa: E402
from evalstop_trl.train.tiny import label_trace  # noqa: E402

TRACES = ROOT / "configs" / "traces"
MAX_STEPS = 300
EVAL_EVERY = 15
DETECTORS = [
    ("decline k=1", "decline", {"k": 1}),
    ("decline k=2", "decline", {"k": 2}),
    ("decline k=3", "decline", {"k": 3}),
    ("patience k=2", "patience", {"k": 2}),
    ("stop_at 0.65", "stop_at", {"fraction": 0.65}),
    ("loss_plateau w=2 tol=3%", "loss_plateau", {"window": 2, "tolerance": 0.03}),
]


def run_one(trainer: str, preset: str, seed: int) -> Path:
    out = TRACES / f"{trainer}-{preset}-s{seed}.jsonl"
    cmd = [sys.executable, str(ROOT / "scripts" / "tiny_rlhf.py"), "--trainer", trainer, "--preset", preset,
           "--seed", str(seed), "--max-steps", str(MAX_STEPS), "--eval-every", str(EVAL_EVERY), "--no-stop",
           "--trace", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return out


def evaluate(paths: list[Path], margin: float = 0.05) -> dict:
    runs = []
    for p in paths:
        curve = load_curve(p, "gold")
        golds = list(curve.scores)
        runs.append({"name": p.stem, "curve": curve, "hacked": label_trace(golds, margin), "gold_end": golds[-1],
                     "last_step": curve.steps[-1]})
    table = []
    for label, name, params in DETECTORS:
        tp = fp_a = fp_b = 0
        stops = {}
        for r in runs:
            res = replay_curve(r["curve"], name, planned_steps=MAX_STEPS, **params)
            flagged = res.stopped and res.stop_step < r["last_step"]
            stops[r["name"]] = res.stop_step if flagged else None
            if flagged and r["hacked"]:
                tp += 1
            elif flagged:
                fp_a += 1
                fp_b += res.best_score < r["gold_end"] - margin
        hacked = sum(r["hacked"] for r in runs)
        healthy = len(runs) - hacked
        table.append({
            "detector": label, "tp": tp, "fp_a": fp_a, "fp_b": fp_b, "hacked": hacked, "healthy": healthy,
            "precision": tp / (tp + fp_b) if tp + fp_b else None, "recall": tp / hacked if hacked else None,
            "fpr": fp_b / healthy if healthy else None, "fpr_label": fp_a / healthy if healthy else None,
            "precision_label": tp / (tp + fp_a) if tp + fp_a else None, "stops": stops,
        })
    return {"runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs], "table": table}


def fmt(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="train the runs first (about 6 min on 2 cores)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.run:
        TRACES.mkdir(parents=True, exist_ok=True)
        jobs = [(t, p, s) for t in ("grpo", "rloo") for p in ("hacked", "healthy") for s in range(args.seeds)]
        with ThreadPoolExecutor(args.workers) as pool:
            for path in pool.map(lambda j: run_one(*j), jobs):
                print(f"wrote {path.relative_to(ROOT)}", flush=True)
    paths = sorted(TRACES.glob("*.jsonl"))
    if not paths:
        print("no traces under configs/traces: run with --run first", file=sys.stderr)
        return 2
    res = evaluate(paths)
    print(f"{len(paths)} real traces ({sum(r['hacked'] for r in res['runs'])} hacked by the gold-curve rule):")
    for r in res["runs"]:
        print(f"  {r['name']:<24} {'hacked' if r['hacked'] else 'healthy':<8} final gold {r['gold_end']:.3f}")
    print("\n| detector | precision (B) | recall | FPR (B) | FPR (A) | precision (A) |\n|---|---|---|---|---|---|")
    for t in res["table"]:
        print(f"| {t['detector']} | {fmt(t['precision'])} | {fmt(t['recall'])} | {fmt(t['fpr'])} | "
              f"{fmt(t['fpr_label'])} | {fmt(t['precision_label'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
