"""What the wall costs: one 200-job run with each built-in overlay in-process vs sealed.

For each overlay (``evalstop``, ``loss_plateau``, ``stop_at``, ``none``) on the default config's
200-job workload (seed 0, a fixed salt), median over ``--repeat`` runs of:

* ``in-process``: the run with the overlay in the engine's process;
* ``sealed``: the same run with :class:`~platform_sim.sealed.SealedOverlay`, the child's start
  included (a fresh Python per run);
* ``start``: starting a child and building the overlay (to its ready message);
* ``per eval``: (sealed - in-process - start) / evals the child answered: the round trip;
* the same as CPU time (this process plus the reaped child): what the wall costs on an idle core;
* ``pair``: ``platform-sim run`` for one seed (base run + overlay run), in-process vs sealed (the
  child starts during the base run).

Every sealed run's outcomes are checked against the in-process run's (the script fails otherwise).

    python scripts/bench_sealed.py [--repeat 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from platform_sim.config import load_config  # noqa: E402
from platform_sim.engine import Simulation  # noqa: E402
from platform_sim.overlays import create_overlay  # noqa: E402
from platform_sim.schedulers import create_scheduler  # noqa: E402
from platform_sim.sealed import SealedOverlay  # noqa: E402
from platform_sim.sealed_run import run_salted  # noqa: E402
from platform_sim.views import VirtualClock  # noqa: E402
from platform_sim.workload import generate_workload  # noqa: E402

OVERLAYS = ("evalstop", "loss_plateau", "stop_at", "none")
SALT = 2026


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _ms(fn, repeat: int, cpu: list | None = None) -> tuple[float, object]:
    """Median wall ms of ``repeat`` calls (and, into ``cpu``, the median CPU ms of this process plus
    its reaped children: robust to the machine's load)."""
    times, cpus, out = [], [], None
    for _ in range(repeat):
        c, t = time.process_time() + _children_cpu(), time.perf_counter()
        out = fn()
        times.append(1000 * (time.perf_counter() - t))
        cpus.append(1000 * (time.process_time() + _children_cpu() - c))
    if cpu is not None:
        cpu.append(statistics.median(cpus))
    return statistics.median(times), out


def bench_overlay(cfg, wl, name: str, repeat: int) -> dict:
    block = cfg.overlay.block(name)

    def inproc():
        return Simulation(wl, cfg, create_scheduler(cfg.scheduler.name), create_overlay(name, wl, **block)).run()

    def sealed():
        with SealedOverlay(name, block) as ov:
            res = Simulation(wl, cfg, create_scheduler(cfg.scheduler.name), ov).run()
        return res, ov

    def start():
        with SealedOverlay(name, block) as ov:
            ov.attach(VirtualClock(), wl.n_evals)

    cpu: list[float] = []
    t_in, res_in = _ms(inproc, repeat, cpu)
    t_sealed, (res_sealed, ov) = _ms(sealed, repeat, cpu)
    if res_sealed != res_in:
        raise SystemExit(f"{name}: the sealed run's result differs from the in-process run's")
    t_start, _ = _ms(start, repeat, cpu)
    evals = sum(o.evals_done for o in res_in.outcomes) if ov._wants_evals else 0
    per_eval = (t_sealed - t_in - t_start) / evals * 1000 if evals else None
    per_eval_cpu = (cpu[1] - cpu[0] - cpu[2]) / evals * 1000 if evals else None
    return {"overlay": name, "inproc_ms": t_in, "sealed_ms": t_sealed, "start_ms": t_start, "evals": evals,
            "per_eval_us": per_eval, "stops": sum(o.stopped for o in res_in.outcomes), "inproc_cpu_ms": cpu[0],
            "sealed_cpu_ms": cpu[1], "start_cpu_ms": cpu[2], "per_eval_cpu_us": per_eval_cpu}


def bench_pair(cfg, repeat: int) -> dict:
    kw = {"seeds": 1, "workers": 1, "salt": SALT}
    t_in, a = _ms(lambda: run_salted(cfg, sealed=False, **kw), repeat)
    t_sealed, b = _ms(lambda: run_salted(cfg, sealed=True, **kw), repeat)
    if a.result.to_json() != b.result.to_json():
        raise SystemExit("the sealed pair's result differs from the in-process pair's")
    return {"inproc_ms": t_in, "sealed_ms": t_sealed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the numbers as JSON")
    args = p.parse_args()
    cfg = load_config()
    wl = generate_workload(cfg, 0, salt=SALT)
    rows = [bench_overlay(cfg, wl, name, args.repeat) for name in OVERLAYS]
    pair = bench_pair(cfg, args.repeat)
    print(f"one {cfg.workload.n_jobs}-job run, {cfg.scheduler.name}, median of {args.repeat} (ms)")
    print(f"{'overlay':<13} {'in-process':>10} {'sealed':>8} {'start':>7} {'evals':>6} {'per eval (us)':>14} {'stops':>6}"
          f"   CPU ms (engine + child): {'in-process':>10} {'sealed':>7} {'start':>6} {'per eval (us)':>14}")
    for r in rows:
        per = "-" if r["per_eval_us"] is None else f"{r['per_eval_us']:.0f}"
        per_cpu = "-" if r["per_eval_cpu_us"] is None else f"{r['per_eval_cpu_us']:.0f}"
        print(f"{r['overlay']:<13} {r['inproc_ms']:>10.1f} {r['sealed_ms']:>8.1f} {r['start_ms']:>7.1f} {r['evals']:>6} "
              f"{per:>14} {r['stops']:>6}   {'':>24} {r['inproc_cpu_ms']:>10.1f} {r['sealed_cpu_ms']:>7.1f} "
              f"{r['start_cpu_ms']:>6.1f} {per_cpu:>14}")
    print(f"platform-sim run, 1 seed, {cfg.overlay.name} (base + overlay run): in-process {pair['inproc_ms']:.0f} ms, "
          f"sealed {pair['sealed_ms']:.0f} ms")
    if args.json:
        out = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": platform.platform(),
               "cpus": os.cpu_count(), "load": os.getloadavg(), "python": platform.python_version(),
               "repeat": args.repeat, "runs": rows, "pair": pair}
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
