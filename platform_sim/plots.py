"""PNG figures (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .results import DetectorRow, PairResult, ReproduceResult, SweepRow  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_run(res: PairResult, path: str | Path) -> Path:
    """JCT distribution (CDF) of a run: base alone vs with the overlay."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for jct, label in ((res.jct_base_h, res.scheduler), (res.jct_run_h, f"{res.scheduler} + {res.overlay}")):
        x = np.sort(jct)
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (hours, departure = completion or stop)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT CDF, {res.seeds} seed(s)")
    ax.legend()
    return _save(fig, path)


def _nan(x: float | None) -> float:
    """None (an undefined rate) as NaN: a gap in a line."""
    return float("nan") if x is None else x


def plot_sweep(rows: Sequence[SweepRow], path: str | Path) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [r.value for r in rows]
    a1.plot(xs, [_nan(r.rates.precision) for r in rows], marker="o", label="precision")
    a1.plot(xs, [_nan(r.rates.recall) for r in rows], marker="o", label="recall")
    a1.plot(xs, [_nan(r.rates.fpr) for r in rows], marker="o", label="fpr")
    a1.set_xlabel(rows[0].param)
    a1.set_ylabel("rate")
    a1.legend()
    a2.plot(xs, [r.changes.jct_change.mean for r in rows], marker="o", label="jct_change")
    a2.plot(xs, [r.changes.jct_change_all.mean for r in rows], marker="o", label="jct_change_all")
    a2.plot(xs, [r.changes.gpu_hours_change.mean for r in rows], marker="o", label="gpu_hours_change")
    a2.set_xlabel(rows[0].param)
    a2.set_ylabel("change vs base alone")
    a2.legend()
    return _save(fig, path)


def plot_reproduce(res: ReproduceResult, out: str | Path) -> list[Path]:
    out = Path(out)
    paths = []
    # 1. JCT distribution per scheduler, with and without EvalStop
    fig, ax = plt.subplots(figsize=(8, 4.5))
    data, labels = [], []
    for s, v in res.jct_hours.items():
        data += [v.base, v.evalstop]
        labels += [s, f"{s}\n+EvalStop"]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("JCT (hours, all jobs)")
    ax.set_title("JCT distribution per base scheduler, with and without EvalStop")
    paths.append(_save(fig, out / "jct_distribution.png"))
    # 2. P/R/FPR vs noise
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r.sigma for r in res.noise]
    ax.plot(xs, [_nan(r.rates.precision) for r in res.noise], marker="o", label="precision")
    ax.plot(xs, [_nan(r.rates.recall) for r in res.noise], marker="o", label="recall")
    ax.plot(xs, [_nan(r.rates.fpr) for r in res.noise], marker="o", label="fpr")
    ax.set_xlabel("eval noise sigma")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Detection vs eval noise")
    paths.append(_save(fig, out / "noise.png"))
    # 3. precision vs base rate
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r.hack_fraction for r in res.base_rate]
    ax.plot(xs, [_nan(r.rates.precision) for r in res.base_rate], marker="o", label="precision")
    ax.plot(xs, [_nan(r.rates.recall) for r in res.base_rate], marker="s", label="recall")
    ax.axhline(0.89, ls="--", c="grey", label="paper floor 0.89")
    ax.set_xlabel("hacking base rate")
    ax.set_ylim(0.5, 1.02)
    ax.legend()
    ax.set_title("Precision vs hacking base rate")
    paths.append(_save(fig, out / "base_rate.png"))
    # 4. k sensitivity
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    ks = [r.k for r in res.k]
    a1.plot(ks, [_nan(r.rates.precision) for r in res.k], marker="o", label="precision")
    a1.plot(ks, [_nan(r.rates.recall) for r in res.k], marker="o", label="recall")
    a1.plot(ks, [_nan(r.rates.fpr) for r in res.k], marker="o", label="fpr")
    a1.set_xlabel("k (consecutive declines)")
    a1.legend()
    a2.plot(ks, [r.jct_change for r in res.k], marker="o", label="completed-jobs JCT")
    a2.plot(ks, [r.gpu_hours_change for r in res.k], marker="s", label="GPU-hours")
    a2.set_xlabel("k")
    a2.set_ylabel("change vs base alone")
    a2.legend()
    paths.append(_save(fig, out / "k_sensitivity.png"))
    # 5. wasted compute breakdown
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.25
    for i, (n, c) in enumerate(res.wasted.items()):
        ax.bar([j + i * width for j in range(4)], [c.gpu_hours, c.w_post, c.w_unprod, c.w_ovh], width,
               label=n + (" (ORACLE)" if n == "oracle" else ""))
    ax.set_xticks([j + width for j in range(4)], ["total GPU-h", "W_post", "W_unprod", "W_ovh"])
    ax.set_ylabel("GPU-hours per run")
    ax.legend()
    ax.set_title("Compute breakdown")
    paths.append(_save(fig, out / "wasted_compute.png"))
    if res.detectors:
        paths.append(plot_detectors(res.detectors, out / "detectors.png"))
    return paths


def plot_detectors(rows: Sequence[DetectorRow], path: str | Path) -> Path:
    """Precision vs oracle retention per detector: one line per detector through its settings; marker
    size gives the eval noise sigma, squares 20 evals per job. Two panels (all, and the crowded band of
    precision >= 0.9) and legends outside the axes, so no label covers a point."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [1, 1]})
    names = list(dict.fromkeys(r.detector for r in rows))
    for ax in axes:
        for i, name in enumerate(names):
            pts = [r for r in rows if r.detector == name and r.rates.precision is not None and r.retention is not None]
            if not pts:
                continue
            color = f"C{i % 10}"
            ax.plot([r.retention for r in pts], [r.rates.precision for r in pts], "-", c=color, alpha=0.4)
            for r in pts:
                ax.scatter(r.retention, r.rates.precision, s=20 + 400 * r.sigma, c=color, edgecolors="k",
                           marker="s" if r.evals_per_job != 10 else "o", linewidths=0.4,
                           label=name if (r is pts[0] and ax is axes[0]) else None)
        ax.axhline(0.98, ls=":", c="grey")
        ax.axvline(0.70, ls=":", c="grey")
        ax.set_xlabel("retention (GPU-h saved on hacked jobs / the oracle's)")
    axes[0].set_ylabel("precision (definition B)")
    axes[0].set_title("all settings")
    precisions = [r.rates.precision for r in rows if r.rates.precision is not None]
    axes[1].set_ylim(0.9, 1.0 + 0.005 if not precisions else max(1.0, max(precisions)) + 0.005)
    axes[1].set_title("precision >= 0.9")
    sizes = sorted({r.sigma for r in rows})
    keys = [axes[1].scatter([], [], s=20 + 400 * sg, c="white", edgecolors="k", label=f"sigma {sg}") for sg in sizes]
    keys.append(axes[1].scatter([], [], s=40, marker="s", c="white", edgecolors="k", label="20 evals per job"))
    zoomed = [r.retention for r in rows if r.rates.precision is not None and r.rates.precision >= 0.9
              and r.retention is not None]
    if zoomed:
        axes[1].set_xlim(min(zoomed) - 0.03, max(zoomed) + 0.03)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper right", bbox_to_anchor=(0.995, 0.9), title="detector")
    fig.legend(handles=keys, fontsize=8, loc="lower right", bbox_to_anchor=(0.995, 0.1), title="setting")
    fig.suptitle("Detectors: precision vs retention")
    fig.tight_layout(rect=(0, 0, 0.85, 0.95))
    fig.savefig(path, dpi=110)  # not _save: its tight_layout would pull the axes under the figure's legends
    plt.close(fig)
    return Path(path)
