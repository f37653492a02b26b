"""Relative GPU speeds from the Sia artifact's measured step times (the defaults of ``cluster.speeds``).

The Sia artifact (``siasosp23/artifacts``, ``sia-simulator/traces/<model>/placements-<cluster>.csv``,
columns ``placement,local_bsz,step_time,sync_time`` in either order) holds measured step times per
placement and local batch size on four clusters: ``dgx-ext`` (A100), ``azure`` (V100, ND40rs_v2),
``rtx`` (RTX 2080Ti) and ``aws`` (T4, g4dn). The speed of a cluster's GPU for one model is the
geometric mean, over the local batch sizes every cluster measured on one GPU (placement ``1``), of
``step_time(dgx-ext) / step_time(cluster)``: 1.0 is the A100, the simulator's reference GPU.

    git clone https://github.com/siasosp23/artifacts /tmp/sia   # or any copy of sia-simulator/traces
    python scripts/gpu_speeds.py /tmp/sia/sia-simulator/traces --json speeds.json

prints a Markdown table (one row per model, one column per GPU) and writes JSON; the simulator's
defaults use the ``bert`` row (transformer jobs, as RLHF jobs are).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

#: Sia's cluster name -> the GPU model its nodes hold (and the pool name the simulator uses)
CLUSTERS = {"dgx-ext": "a100", "azure": "v100", "rtx": "rtx", "aws": "t4"}
REFERENCE = "dgx-ext"


def single_gpu_step_times(path: Path) -> dict[int, float]:
    """local batch size -> step time (s) of the one-GPU placement in one placements file."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"placement", "local_bsz", "step_time"} - set(rows[0] if rows else ())
    if missing:
        raise SystemExit(f"{path}: not a Sia placements file (missing columns: {', '.join(sorted(missing))})")
    return {int(r["local_bsz"]): float(r["step_time"]) for r in rows if r["placement"].strip() == "1"}


def speeds(traces: Path) -> dict[str, dict[str, float]]:
    """model -> {GPU model -> speed relative to the A100}, for every model with all four clusters."""
    out: dict[str, dict[str, float]] = {}
    for model_dir in sorted(p for p in traces.iterdir() if p.is_dir()):
        files = {c: model_dir / f"placements-{c}.csv" for c in CLUSTERS}
        if not all(f.exists() for f in files.values()):
            continue
        times = {c: single_gpu_step_times(f) for c, f in files.items()}
        common = sorted(set.intersection(*(set(t) for t in times.values())))
        if not common:
            continue
        out[model_dir.name] = {
            CLUSTERS[c]: math.exp(sum(math.log(times[REFERENCE][b] / t[b]) for b in common) / len(common))
            for c, t in times.items()}
    if not out:
        raise SystemExit(f"{traces}: no model directory has placements-{{{','.join(CLUSTERS)}}}.csv; "
                         "pass the artifact's sia-simulator/traces directory")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="the Sia artifact's sia-simulator/traces directory")
    ap.add_argument("--json", type=Path, help="also write the speeds here")
    args = ap.parse_args(argv)
    table = speeds(args.traces)
    gpus = list(CLUSTERS.values())
    print("| model | " + " | ".join(gpus) + " |")
    print("|---|" + "---|" * len(gpus))
    for model, row in table.items():
        print(f"| {model} | " + " | ".join(f"{row[g]:.2f}" for g in gpus) + " |")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
