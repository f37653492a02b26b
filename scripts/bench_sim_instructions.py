"""Instructions per 200-job simulator run, counted by valgrind (callgrind): repeatable on a noisy VM.

Wall-clock medians on a shared 2-core machine move by 10% between invocations; an instruction count
does not (the same binary and inputs give the same count, whatever else the machine is doing). This
runs one seed-0 run of each ``--scheduler`` x ``--overlay`` under ``valgrind --tool=callgrind`` once
with 1 run and once with 6, and prints (count(6) - count(1)) / 5: the instructions of one run,
without the interpreter's start-up and imports. Needs ``valgrind`` (Debian package).

    python scripts/bench_sim_instructions.py [--scheduler srtf_est] [--overlay none,evalstop] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(scheduler: str, overlay: str, runs: int) -> None:
    sys.path.insert(0, str(ROOT))
    from platform_sim.config import load_config
    from platform_sim.engine import Simulation
    from platform_sim.policies import build_overlay, build_scheduler
    from platform_sim.workload import generate_workload

    cfg = load_config()
    wl = generate_workload(cfg, 0)
    for _ in range(runs):
        Simulation(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay)).run()


def instructions(scheduler: str, overlay: str, runs: int) -> int:
    """Instructions valgrind counts for a whole child process doing ``runs`` runs."""
    return callgrind_count([__file__, "--child", scheduler, overlay, str(runs)])


def callgrind_count(argv: list[str]) -> int:
    """Instructions valgrind (callgrind) counts for ``python argv...``, start-up included."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count:\n{out[-2000:]}")
    return int(found.group(1))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", default="srtf_est", help="comma-separated base schedulers")
    ap.add_argument("--overlay", default="none,evalstop", help="comma-separated overlays")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    rows = []
    print(f"{'one 200-job run':<28}{'M instructions':>16}")
    for scheduler in args.scheduler.split(","):
        for overlay in args.overlay.split(","):
            one, six = instructions(scheduler, overlay, 1), instructions(scheduler, overlay, 6)
            per_run = (six - one) / 5
            rows.append({"scheduler": scheduler, "overlay": overlay, "instructions": per_run})
            print(f"{scheduler + ' + ' + overlay:<28}{per_run / 1e6:>16.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"date": date.today().isoformat(), "machine": platform.platform(),
                                         "python": platform.python_version(), "runs": rows}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
