"""EvalStop's headline under every base scheduler, on synthetic and trace arrivals (issue 26 item 4).

For each registered base scheduler and each arrival source, SRTF-Est-style pairs (the scheduler
alone vs with the configured EvalStop overlay) over ``--seeds`` seeds from ``--seed-start`` (never
tuned on: tuning stays below 1000): GPU-hours, completed-jobs and all-jobs JCT changes with 95%
bootstrap intervals, precision, recall and FPR (definition B). Arrivals: the synthetic workload and,
with ``--trace FORMAT:PATH`` (repeatable), a cluster trace's window (``workload.source``). With
``--measured PATH`` (repeatable) every arrival source is run again with its RLHF jobs on the measured
curves of the real-run corpus at PATH (``curves.source: measured:PATH``, docs/simulator.md): one row per
base scheduler beside the fitted curves' row. Writes a Markdown table, a JSON file and a PNG figure
(GPU-hours change per scheduler and source).

    python scripts/platform_table.py --seeds 30 --seed-start 6000 \\
        --trace philly_csv:/data/philly.csv --measured configs/corpus --out results/platform
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_sim.config import MEASURED, load_config, parse_value  # noqa: E402
from platform_sim.experiments import run_seeds  # noqa: E402
from platform_sim.measured import load_measured  # noqa: E402
from platform_sim.report import ci, cluster_text, pct, rate  # noqa: E402
from platform_sim.results import json_safe  # noqa: E402
from platform_sim.schedulers import SCHEDULERS  # noqa: E402


def sources(traces: list[str], measured: list[str] | None = None) -> dict[str, dict]:
    """Arrival source name -> config overrides; with ``measured`` corpus folders, each arrival source again
    per corpus, its RLHF jobs on that corpus's measured curves (after the fitted sources)."""
    out = {"synthetic": {}}
    for item in traces:
        fmt, sep, path = item.partition(":")
        if not sep:
            raise SystemExit(f"--trace takes FORMAT:PATH (e.g. philly_csv:/data/philly.csv), but got {item!r}")
        out[f"{fmt} ({Path(path).name})"] = {"workload.source.kind": "trace", "workload.source.format": fmt,
                                            "workload.source.path": str(Path(path).resolve())}
    fitted = list(out.items())
    for folder in measured or []:
        corpus = {"curves.source": f"{MEASURED}{Path(folder).resolve()}"}
        for name, over in fitted:
            out[f"{name}, measured curves ({Path(folder).name})"] = {**over, **corpus}
    return out


def measure(seeds: int, seed_start: int, traces: list[str], workers: int | None, config: str | None,
            sets: dict | None = None, measured: list[str] | None = None) -> list[dict]:
    base = load_config(config).replace(**(sets or {}))
    rows = []
    for source, over in sources(traces, measured).items():
        if "curves.source" in over:  # read the corpus once, before the workers fork: every seed sees the same runs
            load_measured(over["curves.source"].removeprefix(MEASURED))
        for name in SCHEDULERS.names():
            cfg = base.replace(**{**over, "scheduler.name": name})
            t0 = time.perf_counter()
            res = run_seeds(cfg, seeds, workers, progress=True, seed_start=seed_start)
            ch, det = res.changes, res.detection
            rows.append({
                "source": source, "scheduler": name, "curves": cfg.curves.source, "cluster": cluster_text(cfg.cluster),
                "seeds": seeds,
                "seed_start": seed_start,
                "gpu_hours": ch.gpu_hours_change.mean, "gpu_hours_ci": ch.gpu_hours_change.ci,
                "jct_completed": ch.jct_change.mean, "jct_completed_ci": ch.jct_change.ci,
                "jct_all": ch.jct_change_all.mean, "jct_all_ci": ch.jct_change_all.ci,
                "mean_jct_base_h": res.base.mean_jct_h, "mean_jct_h": res.run.mean_jct_h,
                "precision": det.precision, "precision_ci": det.precision_ci, "recall": det.recall,
                "recall_ci": det.recall_ci, "fpr": det.fpr, "fpr_ci": det.fpr_ci, "fpr_label": det.fpr_label,
                "fpr_label_ci": det.fpr_label_ci, "wall_s": time.perf_counter() - t0,
            })
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| arrivals | base scheduler | mean JCT alone -> with EvalStop (h) | GPU-hours | JCT, completed jobs | "
             "JCT, all jobs | precision | recall | FPR (B) | healthy jobs stopped at all |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['source']} | {r['scheduler']} | {r['mean_jct_base_h']:.2f} -> {r['mean_jct_h']:.2f} | {pct(r['gpu_hours'])}{ci(r['gpu_hours_ci'])} | "
            f"{pct(r['jct_completed'])}{ci(r['jct_completed_ci'])} | {pct(r['jct_all'])}{ci(r['jct_all_ci'])} | "
            f"{rate(r['precision'])}{ci(r['precision_ci'])} | {rate(r['recall'])}{ci(r['recall_ci'])} | "
            f"{rate(r['fpr'])}{ci(r['fpr_ci'])} | {rate(r.get('fpr_label'))}{ci(r.get('fpr_label_ci'))} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["scheduler"] for r in rows))
    srcs = list(dict.fromkeys(r["source"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(srcs)
    for ax, key, label in zip(axes, ("gpu_hours", "jct_completed"), ("GPU-hours", "JCT of completed jobs"), strict=True):
        for i, src in enumerate(srcs):
            sel = [next(r for r in rows if r["source"] == src and r["scheduler"] == n) for n in names]
            xs = [j + (i - (len(srcs) - 1) / 2) * width for j in range(len(names))]
            err = [[100 * (r[key] - r[f"{key}_ci"][0]) for r in sel], [100 * (r[f"{key}_ci"][1] - r[key]) for r in sel]]
            ax.bar(xs, [100 * r[key] for r in sel], width, yerr=err, capsize=3, label=src)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_ylabel(f"{label}: change with EvalStop (%)", fontsize=8)
        ax.axhline(0, color="black", lw=0.6)
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"EvalStop on each base scheduler ({rows[0]['seeds']} seeds from {rows[0]['seed_start']}; 95% intervals)\n"
                 f"{rows[0].get('cluster', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--seed-start", type=int, default=6000)
    ap.add_argument("--trace", action="append", default=[], metavar="FORMAT:PATH", help="a cluster trace (repeatable)")
    ap.add_argument("--measured", action="append", default=[], metavar="PATH",
                    help="a real-run corpus folder (repeatable; e.g. configs/corpus): every source again on its measured curves")
    ap.add_argument("--config", help="YAML config (default: configs/sim/rlhf_heavy.yaml)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "platform")
    args = ap.parse_args(argv)
    if args.seed_start < 1000:
        print("note: seeds below 1000 are the tuning seeds; claims belong on seeds never tuned on", file=sys.stderr)
    sets = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes KEY=VALUE, but got {item!r}")
        sets[key] = parse_value(value)
    rows = measure(args.seeds, args.seed_start, args.trace, args.workers, args.config, sets, args.measured)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    (args.out / "platform_table.md").write_text(text + "\n")
    (args.out / "platform_table.json").write_text(json.dumps(json_safe(rows), indent=1))
    print(text)
    print(f"wrote {args.out / 'platform_table.md'}, .json and {figure(rows, args.out / 'platform_table.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
