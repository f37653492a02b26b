"""Re-measure the headline (README, docs/results.md) and detector claims on seeds nobody tuned on, pooled, with intervals.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/remeasure_claims.py --ranges 5000:30,8000:30 --json claims.json

Per seed (default config, SRTF-Est, decline k=2 as EvalStop's rule): the paired completed-jobs JCT
change, the all-jobs JCT change, the total GPU-hours change and the detection counts of EvalStop
against the base alone, and the detector comparison of ``platform-sim reproduce``
(:func:`platform_sim.comparison.detector_seed`: every registered detector at sigma 0.04 / 0.08 /
0.12 x 10 evals and 0.04 x 20). Means and rates pool every seed of every range; intervals are 95%
bootstrap intervals over the pooled seeds (``platform_sim.stats``), so 60 seeds give one interval,
not two. Seeds below 1000 are refused (they are the tuning range). ``--png`` plots precision vs
retention per detector (``platform_sim.plots.plot_detectors``); ``--replot claims.json --png F``
redraws it from a saved ``--json`` without simulating.
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
from platform_sim.experiments import map_seeds, run_pair, simulate  # noqa: E402
from platform_sim.metrics import Detection  # noqa: E402
from platform_sim.results import DetectorRow  # noqa: E402
from platform_sim.stats import Metric, Rates  # noqa: E402
from platform_sim.workload import generate_workload  # noqa: E402


def _seed(args: tuple[dict, int]) -> tuple:
    cfg_dict, seed = args
    cfg = config_from_dict(cfg_dict)
    head = cfg.scheduler.name
    wl = generate_workload(cfg, seed)
    base = simulate(cfg, seed, head, "none", wl)
    pair = run_pair(cfg, wl, head, "evalstop", base).slim()
    return pair.changes, pair.run.detection, detector_seed(cfg, seed, head, base)


def parse_ranges(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        start, _, n = part.partition(":")
        seeds.extend(range(int(start), int(start) + int(n)))
    if min(seeds) < 1000:
        raise ValueError(f"seeds below 1000 are the tuning range; got {min(seeds)}")
    return seeds


def rows_from_json(path: str) -> list[DetectorRow]:
    """The detector rows of a saved ``--json`` (for ``--replot``)."""
    rows = []
    for d in json.loads(Path(path).read_text())["detectors"]:
        rates = Rates(Detection(**d["counts"]), tuple(d["precision_ci"]), tuple(d["recall_ci"]), tuple(d["fpr_ci"]))
        rows.append(DetectorRow(d["detector"], d["params"], d["sigma"], d["evals_per_job"], rates, d["retention"],
                                tuple(d["retention_ci"]), d["jct_change"], tuple(d["jct_change_ci"])))
    return rows


def _pct(m: float | None) -> str:
    return "n/a" if m is None else f"{100 * m:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranges", default="5000:30,8000:30", help="start:count[,start:count...]")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--png", help="precision vs retention per detector")
    ap.add_argument("--replot", metavar="JSON", help="only redraw --png from a saved --json")
    args = ap.parse_args(argv)
    if args.replot:
        from platform_sim.plots import plot_detectors

        plot_detectors(rows_from_json(args.replot), args.png or "detectors.png")
        return 0
    seeds = parse_ranges(args.ranges)
    cfg = load_config()
    t0 = time.perf_counter()
    per_seed = map_seeds(_seed, [(cfg.to_dict(), s) for s in seeds], args.workers, True, "claims")
    jct = Metric.over([c.jct_change for c, _, _ in per_seed])
    jct_all = Metric.over([c.jct_change_all for c, _, _ in per_seed])
    gpu = Metric.over([c.gpu_hours_change for c, _, _ in per_seed])
    rates = Rates.pool([d for _, d, _ in per_seed])
    rows = aggregate_detectors(cfg, [p for _, _, p in per_seed])
    ci = lambda m: f"[{100 * m.ci[0]:.1f}, {100 * m.ci[1]:.1f}]"  # noqa: E731
    print(f"\nseeds {args.ranges} ({len(seeds)} seeds), {time.perf_counter() - t0:.0f} s\n")
    print("| claim | pooled | 95% interval |\n|---|---|---|")
    print(f"| completed-jobs JCT | {100 * jct.mean:.1f}% | {ci(jct)} |")
    print(f"| all-jobs JCT | {100 * jct_all.mean:.1f}% | {ci(jct_all)} |")
    print(f"| total GPU-hours | {100 * gpu.mean:.1f}% | {ci(gpu)} |")
    print(f"| precision / recall / FPR (B) | {_pct(rates.precision)} / {_pct(rates.recall)} / {_pct(rates.fpr)} | "
          f"P {_pct(rates.precision_ci[0])}-{_pct(rates.precision_ci[1])}, R {_pct(rates.recall_ci[0])}-"
          f"{_pct(rates.recall_ci[1])} | harmful stops {rates.harmful_stops} |")
    print(f"| precision counting any stop / healthy jobs stopped at all | {_pct(rates.precision_label)} / "
          f"{_pct(rates.fpr_label)} | {_pct(rates.precision_label_ci[0])}-{_pct(rates.precision_label_ci[1])}, "
          f"{_pct(rates.fpr_label_ci[0])}-{_pct(rates.fpr_label_ci[1])} |")
    print("\n| detector | sigma | evals | precision [95%] | recall [95%] | retention [95%] | harmful stops |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.detector} | {r.sigma} | {r.evals_per_job} | {_pct(r.rates.precision)} "
              f"[{_pct(r.rates.precision_ci[0])}, {_pct(r.rates.precision_ci[1])}] | {_pct(r.rates.recall)} "
              f"[{_pct(r.rates.recall_ci[0])}, {_pct(r.rates.recall_ci[1])}] | {_pct(r.retention)} "
              f"[{_pct(r.retention_ci[0])}, {_pct(r.retention_ci[1])}] | {r.rates.harmful_stops} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "seeds": seeds, "jct_change": jct.to_dict(), "jct_change_all": jct_all.to_dict(),
            "gpu_hours_change": gpu.to_dict(), "rates": rates.to_dict(), "harmful_stops": rates.harmful_stops,
            "detectors": [r.to_dict() for r in rows]}, indent=1, default=str))
    if args.png:
        from platform_sim.plots import plot_detectors

        plot_detectors(rows, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
