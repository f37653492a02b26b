"""Before and after in one run: the simulator benchmark and the load test, on an earlier commit and on
the working tree, alternated round by round on the same machine (so both see the same load).

The earlier commit is checked out in a temporary git worktree; each round runs
``scripts/bench_sim.py --seeds 0 --scale 200 --scale-schedulers srtf_est`` and, unless
``--skip-load``, ``scripts/load_test.py --backends sqlite`` with Optuna's RDBStorage as the anchor, in
both trees, then prints medians over the rounds and can write JSON. The same virtual environment
runs both trees (each process imports its own tree's packages first).

    python scripts/bench_before_after.py [--before 1a1b8e6] [--rounds 3] [--repeat 31]
                                         [--jobs 100 --reports 20] [--skip-load] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run_json(tree: Path, script: str, args: list[str], scripts: Path | None = None) -> dict:
    """``script`` of ``scripts`` (default: the tree's own) run in ``tree`` with the tree's packages."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str((scripts or tree / "scripts") / script), *args, "--json", str(out)], cwd=tree,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    data = json.loads(out.read_text())
    out.unlink()
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="1a1b8e6", help="the earlier commit (default: the main before issue 16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=31, help="runs per simulator timing")
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--reports", type=int, default=20)
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds must be in 1..20")

    work = Path(tempfile.mkdtemp(prefix="evalstop-before-"))
    before = work / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), args.before], cwd=ROOT, check=True)
    trees = {"before": before, "after": ROOT}
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in trees}
    try:
        for r in range(args.rounds):
            for name, tree in trees.items():
                sim = _run_json(tree, "bench_sim.py", ["--repeat", str(args.repeat), "--seeds", "0", "--scale", "200",
                                                       "--scale-schedulers", "srtf_est"])
                row = sim["single_run_ms"]["srtf_est"]
                got = {"sim_srtf_evalstop_ms": row["evalstop"], "sim_srtf_alone_ms": row["none"],
                       "sim_overlay_ms": row["evalstop_in_overlay"]}
                if not args.skip_load:
                    # today's load generator in both trees (it measures the server's CPU); the servers it
                    # starts run the tree's own package (cwd and PYTHONPATH)
                    load = _run_json(tree, "load_test.py", ["--backends", "sqlite", "--jobs", str(args.jobs),
                                                            "--reports", str(args.reports)], ROOT / "scripts")
                    got.update(load_sqlite_rps=load["sqlite"]["evalstop"]["rate"],
                               server_cpu_ms_per_report=load["sqlite"]["evalstop"]["server_cpu_ms_per_report"],
                               load_sqlite_paced_p50_ms=load["sqlite"]["evalstop_paced"]["p50_ms"],
                               optuna_rps=load["optuna_rdb_sqlite"]["rate"], load_ratio=load["ratio"])
                for k, v in got.items():
                    samples[name].setdefault(k, []).append(v)
                print(f"round {r + 1}/{args.rounds} {name}: " + ", ".join(f"{k}={v:.2f}" for k, v in got.items()),
                      file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)

    medians = {name: {k: statistics.median(v) for k, v in s.items()} for name, s in samples.items()}
    print(f"before = {args.before}, after = the working tree; medians of {args.rounds} alternated rounds")
    print(f"{'measure':<32}{'before':>10}{'after':>10}{'change':>9}")
    for k in medians["after"]:
        b, a = medians["before"][k], medians["after"][k]
        print(f"{k:<32}{b:>10.2f}{a:>10.2f}{(a / b - 1) * 100:>8.0f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "before": args.before, "rounds": args.rounds, "samples": samples, "medians": medians}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
