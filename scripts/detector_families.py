"""Every registered detector on each hacked-curve family (``curves.hacked_families``), paired per seed.

    .venv/bin/python scripts/detector_families.py --seed-start 5000 --seeds 30 [--decline-noise run] --json families.json

For each family, every hacked RLHF job's curve is of that family (shares 1.0); healthy jobs, LoRA and
DPO are unchanged. Each detector runs as EvalStop's rule on SRTF-Est at eval noise 0.04 and 0.12 with
10 evals per job (``platform_sim.comparison``). Rates pool the seeds; retention = GPU-hours saved on
hacked jobs / Oracle-Stop's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from platform_sim.comparison import aggregate_detectors, detector_seed  # noqa: E402
from platform_sim.config import config_from_dict, load_config  # noqa: E402
from platform_sim.curves import FAMILIES  # noqa: E402
from platform_sim.experiments import _map  # noqa: E402

SETTINGS = ((0.04, 10), (0.12, 10))


def _seed(args: tuple[dict, int]) -> dict:
    cfg_dict, seed = args
    cfg = config_from_dict(cfg_dict)
    return detector_seed(cfg, seed, cfg.scheduler.name, settings=SETTINGS)


def family_config(family: str, decline_noise: str = "none"):
    return load_config().replace(**{"curves.hacked_families.shares": {f: float(f == family) for f in FAMILIES},
                                    "overlay.evalstop.noise": decline_noise})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--decline-noise", dest="decline_noise", default="none", choices=("none", "paired", "run"),
                    help="decline's noise: none (the paper's exact rule, the config's; default) or run (the "
                    "service's default decline)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = {}
    print("| family | detector | sigma | precision | recall | FPR (B) | retention | harmful stops | hacked jobs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        cfg = family_config(family, args.decline_noise)
        per_seed = _map(_seed, [(cfg.to_dict(), args.seed_start + s) for s in range(args.seeds)], args.workers,
                        False, family)
        rows = aggregate_detectors(cfg, per_seed, SETTINGS)
        out[family] = [r.to_dict() for r in rows]
        for r in rows:
            f = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
            print(f"| {family} | {r.detector} | {r.sigma} | {f(r.rates.precision)} | {f(r.rates.recall)} | "
                  f"{f(r.rates.fpr)} | {f(r.retention)} | {r.rates.harmful_stops} | {r.rates.counts.hacked} |",
                  flush=True)
    print(f"\nseeds {args.seed_start}-{args.seed_start + args.seeds - 1}, {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
