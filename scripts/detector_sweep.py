"""Run the pre-registered curve-level detector sweep (``platform_sim.sweep``) and print its tables.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/detector_sweep.py --json sweep.json --png docs/sweep.png

The plan (grid, frozen detector parameters, seed, curves per cell) is
``configs/sweep/preregistered.yaml``; ``--curves N`` overrides the curves per cell for a quick look
(a different count is then not the pre-registered run). Tables:

1. per detector, sigma x evals per job: how many of the cells (families x noise kinds x score units)
   have precision (B) and recall >= 95% (point estimates);
2. per detector, the same for Gaussian noise and the simulator's units only, one column per family
   (region: the (sigma, evals) pairs where *every* family passes);
3. units: per detector, the largest change of precision / recall between score units over all cells
   (0 for a scale-free rule);
4. the recommended detector's precision / recall / retention per family at sigma 0.04 and 0.12 with
   95% Wilson intervals (``--json`` holds every cell with every interval);
5. with ``--cells-table``: every detector's cells in the simulator's units at ``--cells-evals`` evals
   per job (default 10), one row per noise kind and sigma, with intervals (the Gao-form plan,
   ``configs/sweep/preregistered-gao-kl.yaml``, is read this way), and 6.: per detector over every
   cell in those units, how many keep precision (B) >= 95%, the lowest precision, and how many also
   save >= 40% of the post-peak compute (issue 28's target).

``win_rate`` cells have no sigma (their noise is the prompts' sampling): they show sigma 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from platform_sim.sweep import CellResult, load_plan, sweep_cells, wilson  # noqa: E402

PLAN = Path(__file__).resolve().parent.parent / "configs" / "sweep" / "preregistered.yaml"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def pass_grid(cells: list[CellResult], plan, label: str) -> dict[tuple[float, int], tuple[int, int]]:
    """(sigma, evals) -> (passing cells, cells) of one detector."""
    out: dict[tuple[float, int], list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        if c.detector == label:
            out[(c.sigma, c.evals)][0] += c.passes()
            out[(c.sigma, c.evals)][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def sigmas_run(plan) -> list[float]:
    """Every sigma some noise kind of ``plan`` is run at (0 for ``win_rate``), ascending."""
    return sorted({s for n in plan.noises for s in plan.sigmas_of(n)})


def cells_table(cells: list[CellResult], plan, evals: int) -> None:
    print(f"\n## 5. Every detector, simulator units, {evals} evals per job\n")
    print("| detector | noise | sigma | precision (B) [95% CI] | recall [95% CI] | healthy stopped | "
          "retention [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for c in cells:
        if c.scale == 1.0 and c.offset == 0.0 and c.evals == evals:
            pci, rci = wilson(c.tp, c.tp + c.harmful), wilson(c.tp, c.hacked)
            print(f"| {c.detector} | {c.noise} | {c.sigma:g} | {_pct(c.precision)} [{_pct(pci[0])}, {_pct(pci[1])}] | "
                  f"{_pct(c.recall)} [{_pct(rci[0])}, {_pct(rci[1])}] | {_pct(c.stop_rate_healthy)} | "
                  f"{_pct(c.retention)} [{_pct(c.retention_ci[0])}, {_pct(c.retention_ci[1])}] |")


def robustness_table(cells: list[CellResult], plan, precision: float = 0.95, saved: float = 0.40) -> None:
    print("\n## 6. Every detector over every cell in the simulator's units\n")
    print(f"| detector | cells with precision >= {precision:.0%} | lowest precision (cell) | "
          f"cells with precision >= {precision:.0%} and retention >= {saved:.0%} |")
    print("|---|---|---|---|")
    for label in [d.label for d in plan.detectors]:
        mine = [c for c in cells if c.detector == label and c.scale == 1.0 and c.offset == 0.0]
        ok = [c for c in mine if c.precision is not None and c.precision >= precision]
        worst = min((c for c in mine if c.precision is not None), key=lambda c: c.precision, default=None)
        where = "n/a" if worst is None else f"{_pct(worst.precision)} ({worst.noise}, sigma {worst.sigma:g}, {worst.evals} evals)"
        print(f"| {label} | {len(ok)} of {len(mine)} | {where} | "
              f"{sum(1 for c in ok if (c.retention or 0) >= saved)} |")


def print_tables(cells: list[CellResult], plan) -> dict:
    labels = [d.label for d in plan.detectors]
    sigmas = sigmas_run(plan)
    summary: dict = {"pass_grid": {}, "region_gaussian_unit": {}, "units_max_change": {}}
    print("\n## 1. Cells with P and R >= 95% (of families x noise kinds x score units)\n")
    print("| detector | sigma | " + " | ".join(f"{m} evals" for m in plan.evals) + " |")
    print("|---|---|" + "---|" * len(plan.evals))
    for label in labels:
        grid = pass_grid(cells, plan, label)
        summary["pass_grid"][label] = {f"{s}/{m}": grid[(s, m)] for s in sigmas for m in plan.evals}
        for s in sigmas:
            print(f"| {label} | {s} | " + " | ".join(f"{grid[(s, m)][0]}/{grid[(s, m)][1]}" for m in plan.evals) + " |")
    print("\n## 2. Gaussian noise, simulator units: families passing (P and R >= 95%)\n")
    fams = plan.families
    print("| detector | sigma | " + " | ".join(f"{m} evals" for m in plan.evals) + " |")
    print("|---|---|" + "---|" * len(plan.evals))
    for label in labels:
        sel = [c for c in cells if c.detector == label and c.noise == "gaussian" and c.scale == 1.0]
        region = []
        for s in plan.sigmas:
            row = []
            for m in plan.evals:
                ok = [c.family for c in sel if c.sigma == s and c.evals == m and c.passes()]
                row.append("all" if len(ok) == len(fams) else f"{len(ok)}/{len(fams)}")
                if len(ok) == len(fams):
                    region.append(f"{s}/{m}")
            print(f"| {label} | {s} | " + " | ".join(row) + " |")
        summary["region_gaussian_unit"][label] = region
    print("\n## 3. Units: largest change of precision / recall between score units (percentage points)\n")
    print("| detector | max change of P | max change of R | cells whose stops differ |")
    print("|---|---|---|---|")
    for label in labels:
        by_key: dict[tuple, list[CellResult]] = defaultdict(list)
        for c in cells:
            if c.detector == label:
                by_key[(c.family, c.noise, c.sigma, c.evals)].append(c)
        dp = dr = 0.0
        differ = 0
        for group in by_key.values():
            ps = [c.precision for c in group if c.precision is not None]
            rs = [c.recall for c in group if c.recall is not None]
            dp = max(dp, max(ps) - min(ps) if ps else 0.0)
            dr = max(dr, max(rs) - min(rs) if rs else 0.0)
            differ += len({(c.tp, c.harmful, c.healthy_stopped, c.retention) for c in group}) > 1
        summary["units_max_change"][label] = {"precision": dp, "recall": dr, "groups_that_differ": differ,
                                              "groups": len(by_key)}
        print(f"| {label} | {100 * dp:.1f} | {100 * dr:.1f} | {differ} of {len(by_key)} |")
    rec = labels[-1]
    print(f"\n## 4. {rec}: Gaussian noise, simulator units, 10 evals per job\n")
    print("| family | sigma | precision (B) [95% CI] | recall [95% CI] | healthy stopped | retention [95% CI] |")
    print("|---|---|---|---|---|---|")
    for c in cells:
        if c.detector == rec and c.noise == "gaussian" and c.scale == 1.0 and c.evals == 10 and c.sigma in (0.04, 0.12):
            pci, rci = wilson(c.tp, c.tp + c.harmful), wilson(c.tp, c.hacked)
            print(f"| {c.family} | {c.sigma} | {_pct(c.precision)} [{_pct(pci[0])}, {_pct(pci[1])}] | "
                  f"{_pct(c.recall)} [{_pct(rci[0])}, {_pct(rci[1])}] | {_pct(c.stop_rate_healthy)} | "
                  f"{_pct(c.retention)} [{_pct(c.retention_ci[0])}, {_pct(c.retention_ci[1])}] |")
    return summary


def plot(summary: dict, plan, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [d.label for d in plan.detectors]
    cols = (len(labels) + 1) // 2
    fig, grid = plt.subplots(2, cols, figsize=(3.0 * cols, 6.0), squeeze=False)
    axes = grid.ravel()
    for ax in axes[len(labels):]:
        ax.axis("off")
    for ax, label in zip(axes[:len(labels)], labels, strict=True):
        g = summary["pass_grid"][label]
        sigmas = sigmas_run(plan)
        share = np.array([[g[f"{s}/{m}"][0] / g[f"{s}/{m}"][1] for m in plan.evals] for s in sigmas])
        ax.imshow(share, vmin=0, vmax=1, cmap="RdYlGn", origin="lower", aspect="auto")
        for i in range(len(sigmas)):
            for j in range(len(plan.evals)):
                ax.text(j, i, f"{100 * share[i, j]:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(plan.evals)), [str(m) for m in plan.evals])
        ax.set_yticks(range(len(sigmas)), ["win rate" if s == 0 and "win_rate" in plan.noises else str(s) for s in sigmas])
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("evals per job", fontsize=7)
        ax.set_ylabel("eval noise sigma", fontsize=7)
    fig.suptitle(f"% of cells (families x noise kinds x units) with precision and recall >= 95%, "
                 f"seed {plan.seed}, {plan.curves_per_cell} curves per cell", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=str(PLAN))
    ap.add_argument("--curves", type=int, help="override curves per cell (not the pre-registered run)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--cells-table", action="store_true", help="print table 5 (every detector's cells)")
    ap.add_argument("--cells-evals", type=int, default=10, help="table 5's evals per job (default 10)")
    args = ap.parse_args(argv)
    plan = load_plan(args.plan, curves_per_cell=args.curves)
    t0 = time.perf_counter()
    cells = list(tqdm(sweep_cells(plan), total=plan.n_cells * len(plan.detectors), desc="sweep", mininterval=5))
    elapsed = time.perf_counter() - t0
    summary = print_tables(cells, plan)
    if args.cells_table:
        cells_table(cells, plan, args.cells_evals)
        robustness_table(cells, plan)
    n_curves = plan.n_cells // len(plan.scales) * plan.curves_per_cell
    print(f"\n{plan.n_cells} cells x {len(plan.detectors)} detectors, {plan.curves_per_cell} curves per cell "
          f"({n_curves} distinct noisy curves, each seen in {len(plan.scales)} units), seed {plan.seed}: {elapsed:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"plan": args.plan, "seed": plan.seed, "curves_per_cell": plan.curves_per_cell,
                                               "seconds": elapsed, "summary": summary,
                                               "cells": [c.to_dict() for c in cells]}, indent=1, default=str))
    if args.png:
        plot(summary, plan, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
