"""Simulator speed benchmark: prints tables and can write JSON (recorded in BENCHMARKS.md).

1. one 200-job run, every base scheduler alone and + EvalStop (the Coordinator in the loop): median
   and fastest of ``--repeat`` runs, and for + EvalStop the share spent inside the overlay's calls
   (the Coordinator: registration and reports);
2. `platform-sim reproduce` wall time at N seeds (default 30; 0 skips it);
3. scaling: 200 / 2,000 / 20,000 / 100,000 jobs with GPUs scaled in proportion (8 nodes of 8 GPUs
   per 200 jobs), FIFO and SRTF-Est, alone and + EvalStop: time, events, events/s;
4. with ``--profile N``: a cProfile of one N-job SRTF-Est + EvalStop run (top functions by own time).

    python scripts/bench_sim.py [--repeat 31] [--seeds 30] [--scale 200,2000,20000,100000]
                                [--scale-schedulers fifo,srtf_est] [--profile 20000] [--json OUT]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from platform_sim.config import load_config  # noqa: E402
from platform_sim.engine import Simulation  # noqa: E402
from platform_sim.experiments import simulate  # noqa: E402
from platform_sim.policies import build_overlay, build_scheduler  # noqa: E402
from platform_sim.reproduction import reproduce  # noqa: E402
from platform_sim.schedulers import SCHEDULERS  # noqa: E402
from platform_sim.workload import generate_workload  # noqa: E402


def timed_overlay(overlay, spent: list[float]):
    """Wrap an overlay instance's hooks to add the time spent inside them to ``spent[0]``."""
    for name in ("attach", "on_arrival", "on_eval", "on_eval_id"):
        real = getattr(overlay, name)

        def hook(*args, _real=real):
            t = time.perf_counter()
            try:
                return _real(*args)
            finally:
                spent[0] += time.perf_counter() - t

        setattr(overlay, name, hook)
    return overlay


def one_run_ms(cfg, scheduler: str, overlay: str, repeat: int) -> dict:
    """Median and fastest ms over ``repeat`` runs of seed 0's workload, and the overlay's median share
    (from ``repeat`` more runs with its hooks timed: the timing wrappers are not in the run times)."""
    wl = generate_workload(cfg, 0)
    simulate(cfg, 0, scheduler, overlay, wl)  # warm up
    times, inside, events = [], [], 0
    for _ in range(repeat):
        sim = Simulation(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay))
        t = time.perf_counter()
        events = sim.run().events
        times.append(time.perf_counter() - t)
    for _ in range(repeat if overlay != "none" else 0):
        spent = [0.0]
        sim = Simulation(wl, cfg, build_scheduler(cfg, scheduler), timed_overlay(build_overlay(cfg, wl, overlay), spent))
        sim.run()
        inside.append(spent[0])
    return {"median_ms": statistics.median(times) * 1000, "min_ms": min(times) * 1000,
            "overlay_median_ms": statistics.median(inside) * 1000 if inside else 0.0, "events": events}


def scaled(cfg, n: int, scheduler: str):
    nodes = max(1, round(8 * n / 200))
    return cfg.replace(**{"workload.n_jobs": n, "cluster.nodes": nodes, "scheduler.name": scheduler}), nodes * 8


def profile(cfg, n: int, top: int = 25) -> str:
    c, _ = scaled(cfg, n, "srtf_est")
    wl = generate_workload(c, 0)
    prof = cProfile.Profile()
    prof.enable()
    simulate(c, 0, "srtf_est", "evalstop", wl)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=31)
    ap.add_argument("--seeds", type=int, default=30, help="seeds for the reproduce timing (0: skip)")
    ap.add_argument("--scale", default="200,2000,20000,100000")
    ap.add_argument("--scale-schedulers", default="fifo,srtf_est")
    ap.add_argument("--scale-budget-s", type=float, default=300.0,
                    help="skip larger sizes of a scheduler once one size took longer than this")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print a cProfile of one N-job run")
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = load_config()
    out = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           f"Python {platform.python_version()}", "single_run_ms": {}, "scaling": []}

    print(f"{'one 200-job run (ms)':<22}{'alone median':>13}{'min':>7}{'+EvalStop median':>18}{'min':>7}"
          f"{'in overlay':>12}{'engine':>8}{'events':>8}")
    for s in SCHEDULERS:
        alone = one_run_ms(cfg, s, "none", args.repeat)
        es = one_run_ms(cfg, s, "evalstop", args.repeat)
        engine = es["median_ms"] - es["overlay_median_ms"]
        out["single_run_ms"][s] = {"none": alone["median_ms"], "none_min": alone["min_ms"],
                                   "evalstop": es["median_ms"], "evalstop_min": es["min_ms"],
                                   "evalstop_in_overlay": es["overlay_median_ms"], "events": es["events"]}
        print(f"{s:<22}{alone['median_ms']:>13.1f}{alone['min_ms']:>7.1f}{es['median_ms']:>18.1f}{es['min_ms']:>7.1f}"
              f"{es['overlay_median_ms']:>12.1f}{engine:>8.1f}{es['events']:>8}", flush=True)

    if args.seeds:
        t = time.perf_counter()
        reproduce(cfg, args.seeds, progress=False)
        out["reproduce_s"] = time.perf_counter() - t
        out["reproduce_seeds"] = args.seeds
        print(f"\nplatform-sim reproduce, {args.seeds} seeds, {os.cpu_count()} workers: {out['reproduce_s']:.1f} s")

    print(f"\n{'scaling':<10}{'jobs':>8}{'GPUs':>8}{'alone (s)':>11}{'events/s':>10}{'+EvalStop (s)':>15}"
          f"{'events':>9}{'events/s':>10}")
    for s in args.scale_schedulers.split(","):
        for n in (int(x) for x in args.scale.split(",")):
            c, gpus = scaled(cfg, n, s)
            wl = generate_workload(c, 0)
            row = {"scheduler": s, "jobs": n, "gpus": gpus}
            for overlay, key in (("none", "alone"), ("evalstop", "evalstop")):
                t = time.perf_counter()
                r = simulate(c, 0, s, overlay, wl)
                dt = time.perf_counter() - t
                row.update({f"{key}_s": dt, f"{key}_events": r.events, f"{key}_events_per_s": r.events / dt})
            out["scaling"].append(row)
            print(f"{s:<10}{n:>8}{gpus:>8}{row['alone_s']:>11.2f}{row['alone_events_per_s']:>10.0f}"
                  f"{row['evalstop_s']:>15.2f}{row['evalstop_events']:>9}{row['evalstop_events_per_s']:>10.0f}",
                  flush=True)
            if row["evalstop_s"] > args.scale_budget_s:
                print(f"{s:<10}(larger sizes skipped: over the {args.scale_budget_s:.0f} s budget)")
                break

    if args.profile:
        text = profile(cfg, args.profile)
        out["profile"] = {"jobs": args.profile, "top": text}
        print(f"\ncProfile, one {args.profile}-job SRTF-Est + EvalStop run, by own time:\n{text}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
