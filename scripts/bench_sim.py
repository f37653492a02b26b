"""Simulator speed benchmark: prints a table and can write JSON (recorded in BENCHMARKS.md).

1. median time of one 200-job SRTF-Est + EvalStop run (the Coordinator in the loop),
   for every base scheduler;
2. `platform-sim reproduce` wall time at N seeds (default 30);
3. scaling: 200 / 2,000 / 20,000 / 100,000 jobs with GPUs scaled in proportion (time, events/s).

    python scripts/bench_sim.py [--repeat 21] [--seeds 30] [--scale 200,2000,20000,100000]
                                [--scale-scheduler fifo] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from platform_sim.config import load_config  # noqa: E402
from platform_sim.experiments import reproduce, simulate  # noqa: E402
from platform_sim.schedulers import SCHEDULERS  # noqa: E402
from platform_sim.workload import generate_workload  # noqa: E402


def one_run_ms(cfg, scheduler: str, overlay: str, repeat: int) -> tuple[float, float, int]:
    """(median ms, fastest ms, events) over ``repeat`` runs of seed 0's workload."""
    wl = generate_workload(cfg, 0)
    simulate(cfg, 0, scheduler, overlay, wl)  # warm up
    times, events = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        r = simulate(cfg, 0, scheduler, overlay, wl)
        times.append(time.perf_counter() - t)
        events = r.events
    return statistics.median(times) * 1000, min(times) * 1000, events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=31)
    ap.add_argument("--seeds", type=int, default=30, help="seeds for the reproduce timing (0: skip)")
    ap.add_argument("--scale", default="200,2000,20000,100000")
    ap.add_argument("--scale-schedulers", default="fifo,srtf_est")
    ap.add_argument("--scale-budget-s", type=float, default=300.0,
                    help="skip larger sizes of a scheduler once one size took longer than this")
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = load_config()
    out = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           f"Python {platform.python_version()}", "single_run_ms": {}, "scaling": []}

    print(f"{'one 200-job run (ms)':<22}{'none median':>12}{'none min':>10}{'+EvalStop median':>18}"
          f"{'+EvalStop min':>15}{'events':>8}")
    for s in SCHEDULERS:
        base_ms, base_min, _ = one_run_ms(cfg, s, "none", args.repeat)
        es_ms, es_min, ev = one_run_ms(cfg, s, "evalstop", args.repeat)
        out["single_run_ms"][s] = {"none": base_ms, "none_min": base_min, "evalstop": es_ms, "evalstop_min": es_min,
                                   "events": ev}
        print(f"{s:<22}{base_ms:>12.1f}{base_min:>10.1f}{es_ms:>18.1f}{es_min:>15.1f}{ev:>8}")

    if args.seeds:
        t = time.perf_counter()
        reproduce(cfg, args.seeds, progress=False)
        out["reproduce_s"] = time.perf_counter() - t
        out["reproduce_seeds"] = args.seeds
        print(f"\nplatform-sim reproduce, {args.seeds} seeds, {os.cpu_count()} workers: {out['reproduce_s']:.1f} s")

    print(f"\n{'scaling (+EvalStop)':<22}{'jobs':>8}{'GPUs':>8}{'time (s)':>10}{'events':>10}{'events/s':>10}")
    for s in args.scale_schedulers.split(","):
        for n in (int(x) for x in args.scale.split(",")):
            nodes = max(1, round(8 * n / 200))
            c = cfg.replace(**{"workload.n_jobs": n, "cluster.nodes": nodes, "scheduler.name": s})
            wl = generate_workload(c, 0)
            t = time.perf_counter()
            r = simulate(c, 0, s, "evalstop", wl)
            dt = time.perf_counter() - t
            row = {"scheduler": s, "jobs": n, "gpus": nodes * 8, "time_s": dt, "events": r.events,
                   "events_per_s": r.events / dt}
            out["scaling"].append(row)
            print(f"{s:<22}{n:>8}{nodes * 8:>8}{dt:>10.2f}{r.events:>10}{r.events / dt:>10.0f}", flush=True)
            if dt > args.scale_budget_s:
                print(f"{s:<22}(larger sizes skipped: over the {args.scale_budget_s:.0f} s budget)")
                break
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
