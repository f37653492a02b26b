"""Markdown and terminal tables for simulation results."""

from __future__ import annotations

import numpy as np

from .config import ClusterConfig
from .metrics import DEFINITIONS
from .results import PairResult, ReproduceResult
from .stats import CI, Metric, Rates
from .workload import Workload


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:+.{digits}f}%"


def rate(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def ci(pair: CI | None) -> str:
    if not pair or pair[0] is None or pair[0] != pair[0]:
        return ""
    return f" [{100 * pair[0]:.1f}, {100 * pair[1]:.1f}]"


#: the smallest p a 20,000-draw sign-flip test can report is 1/20,001 (about 5e-5): print a bound
P_FLOOR = 1e-4


def p_value(p: float | None) -> str:
    """``p = 0.003``, or ``p < 1e-4`` at the resolution of the permutation test."""
    if p is None or p != p:
        return "p = n/a"
    return f"p < {P_FLOOR:.0e}" if p < P_FLOOR else f"p = {p:.2g}"


def seeds_text(res: PairResult | ReproduceResult) -> str:
    return f"{res.seeds} seed(s), {res.seed_start}-{res.seed_start + res.seeds - 1}"


def cluster_text(cluster: ClusterConfig) -> str:
    """``64 GPUs`` or, for a mixed cluster, ``64 GPUs in 3 pools: t4 6x4 at speed 0.25, ...``."""
    if not cluster.pools:
        return f"{cluster.total_gpus} GPUs"
    pools = ", ".join(f"{name} {p.nodes}x{p.gpus_per_node} at speed {cluster.speeds.get(name, float('nan')):g}"
                      for name, p in cluster.pools.items())
    return f"{cluster.total_gpus} GPUs in {len(cluster.pools)} pools: {pools}"


def type_table(by_type: dict[str, Rates]) -> list[str]:
    """Markdown rows of detection per job type (counts over all seeds)."""
    out = ["| job type | hacked | healthy | stopped | TP | harmful stops (B) | label-only stops | precision | recall | FPR (B) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for t, d in by_type.items():
        c = d.counts
        out.append(f"| {t} | {c.hacked} | {c.healthy} | {c.flagged} | {c.tp} | {c.fp_b} | "
                   f"{c.fp_a - c.fp_b} | {rate(d.precision)} | {rate(d.recall)} | {rate(d.fpr)} |")
    return out


def run_table(res: PairResult) -> str:
    """Terminal table of one `platform-sim run` result."""
    b, r, ch, det = res.base, res.run, res.changes, res.detection
    oracle = " (ORACLE: reads ground truth)" if res.is_oracle else ""
    lines = [
        f"{res.scheduler} alone vs {res.scheduler} + {res.overlay}{oracle}, {seeds_text(res)}, "
        f"{len(res.jct_base_h) // max(res.seeds, 1)} jobs each",
        f"{'metric':<34}{'base':>12}{'+overlay':>12}{'change':>10}   95% CI",
    ]
    rows: list[tuple[str, float | None, float | None, Metric]] = [
        ("mean JCT, completed jobs (h)", res.mean_jct_completed_base_h, res.mean_jct_completed_h, ch.jct_change),
        ("mean JCT, all jobs (h)", b.mean_jct_h, r.mean_jct_h, ch.jct_change_all),
        ("p95 JCT (h)", b.p95_jct_h, r.p95_jct_h, ch.p95_jct_change),
        ("makespan (h)", b.makespan_h, r.makespan_h, ch.makespan_change),
        ("GPU-hours (total)", b.gpu_hours, r.gpu_hours, ch.gpu_hours_change),
        ("W_post (GPU-h after gold peak)", b.w_post, r.w_post, ch.w_post_change),
        ("W_unprod (GPU-h after delivered)", b.w_unprod, r.w_unprod, ch.w_unprod_change),
        ("W_ovh (eval/ckpt/restart GPU-h)", b.w_ovh, r.w_ovh, ch.w_ovh_change),
    ]
    for label, vb, vr, change in rows:
        base_text = f"{vb:.2f}" if vb is not None else ""
        run_text = f"{vr:.2f}" if vr is not None else ""
        lines.append(f"{label:<34}{base_text:>12}{run_text:>12}{pct(change.mean):>10}  {ci(change.ci)}")
        if label.startswith("GPU-hours") and b.gpu_hours_by_pool:  # a mixed cluster: where they went
            for pool, hours in b.gpu_hours_by_pool.items():
                lines.append(f"{'  of which on ' + pool:<34}{hours:>12.2f}{r.gpu_hours_by_pool.get(pool, 0.0):>12.2f}")
            lines.append(f"{'  total in reference GPU-hours':<34}{b.ref_gpu_hours:>12.2f}{r.ref_gpu_hours:>12.2f}")
    lines.append(f"{'utilisation':<34}{b.utilisation:>12.3f}{r.utilisation:>12.3f}")
    lines.append(f"{'delivered gold (RLHF mean)':<34}{b.delivered_gold_rlhf:>12.3f}{r.delivered_gold_rlhf:>12.3f}")
    c = det.counts
    lines.append(f"harmful stops (definition B) beside that JCT: {c.fp_b} over {res.seeds} seed(s)")
    lines.append(f"paired permutation test (completed-jobs JCT): {p_value(res.p_value)}")
    lines.append(
        f"detection over watched jobs: precision {rate(det.precision)}{ci(det.precision_ci)}, "
        f"recall {rate(det.recall)}{ci(det.recall_ci)}, FPR {rate(det.fpr)}{ci(det.fpr_ci)} "
        f"(definition B, harmful stops); FPR by label (A) {rate(det.fpr_label)}"
    )
    lines.append(f"  counts: {c.tp} hacked stopped of {c.hacked}; {c.fp_b} harmful and {c.fp_a} "
                 f"label stops of {c.healthy} healthy")
    for t, d in res.detection_by_type.items():
        k = d.counts
        lines.append(f"  {t:<10} {k.flagged} stopped: {k.tp} of {k.hacked} hacked, {k.fp_b} harmful and "
                     f"{k.fp_a} label stops of {k.healthy} healthy")
    return "\n".join(lines)


PAPER_BASELINES = {"stop_at": "FPR 64.5%, precision 57.1%, similar JCT gain", "loss_plateau": "recall 38.3%, precision 57.0%",
                   "oracle": "(upper limit; ORACLE reads ground truth)"}


def markdown_report(res: ReproduceResult) -> str:
    """`DIR/report.md` for `platform-sim reproduce`."""
    h, hr, cfg, q = res.headline, res.headline.rates, res.config, res.quality
    ov = cfg.overlay.block("evalstop")
    watched = ", ".join(res.watched) or "RLHF jobs"
    out = [
        "# EvalStop platform simulation: reproduction of the paper's tables",
        "",
        f"{seeds_text(res)}, config `{cfg.name}` ({cfg.workload.n_jobs} jobs, "
        f"{cluster_text(cfg.cluster)}, load "
        f"{cfg.workload.load}). Intervals are 95% bootstrap intervals over seeds; the p-value is a "
        "paired sign-flip permutation test on per-seed mean JCT of the completed jobs (20,000 draws: it cannot "
        "resolve p below 1e-4). Harmful stops are counted over all seeds and stand beside every JCT figure: the "
        "completed-jobs JCT does not penalise them.",
        "",
        f"## Headline: EvalStop ({ov.get('detector', 'decline')}, k={ov.get('k')}, watching {watched}) + "
        f"{h.scheduler} vs {h.scheduler} alone",
        "",
        "| metric | measured | 95% interval | paper |",
        "|---|---|---|---|",
        f"| mean JCT, completed jobs | {pct(h.jct_change.mean)} ({p_value(h.p_value)}; {hr.harmful_stops} "
        f"harmful stops) | {ci(h.jct_change.ci)} | -9.4% (p < 0.05) |",
        f"| mean JCT, all jobs (departure = completion or stop) | {pct(h.jct_change_all.mean)} | "
        f"{ci(h.jct_change_all.ci)} | not reported |",
        f"| total GPU-hours (the paper's 'wasted compute') | {pct(h.gpu_hours_change.mean)} | "
        f"{ci(h.gpu_hours_change.ci)} | -21.8% |",
        f"| W_post (GPU-h on hacked jobs after the gold peak) | {pct(h.w_post_change.mean)} | {ci(h.w_post_change.ci)} | |",
        f"| W_unprod (GPU-h after the delivered checkpoint) | {pct(h.w_unprod_change.mean)} | "
        f"{ci(h.w_unprod_change.ci)} | |",
        f"| precision (definition B) | {rate(hr.precision)} | {ci(hr.precision_ci)} | 98.3% |",
        f"| recall | {rate(hr.recall)} | {ci(hr.recall_ci)} | 99.3% |",
        f"| FPR (definition B, harmful stops) | {rate(hr.fpr)} | {ci(hr.fpr_ci)} | 1.5% |",
        f"| FPR (definition A, label) | {rate(hr.fpr_label)} | | |",
        f"| retention: GPU-h saved on hacked jobs / the oracle's | {rate(q.retention)} | {ci(q.retention_ci)} | |",
        "",
        "Detection per job type (the headline pools the watched types):",
        "",
        *type_table(h.by_type),
        "",
        f"## Baselines (on {h.scheduler})",
        "",
        "| overlay | precision | recall | FPR (B) | FPR (A) | completed-jobs JCT | harmful stops | GPU-hours | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, b in res.baselines.items():
        label = name + (" (ORACLE)" if b.is_oracle else "")
        br = b.rates
        out.append(f"| {label} | {rate(br.precision)} | {rate(br.recall)} | {rate(br.fpr)} | {rate(br.fpr_label)} | "
                   f"{pct(b.jct_change)} | {br.harmful_stops} | {pct(b.gpu_hours_change)} | "
                   f"{PAPER_BASELINES[name]} |")
    out += ["", "StopAt cuts each watched job at exactly its `fraction` of planned work and delivers the state at the cut.",
            "", "## Composability: EvalStop's completed-jobs JCT change on each base scheduler", "",
            "| base scheduler | JCT change | 95% interval | harmful stops |", "|---|---|---|---|"]
    for sched, g in res.composability.items():
        out.append(f"| {sched} | {pct(g.jct_change.mean)} | {ci(g.jct_change.ci)} | {g.harmful_stops} |")
    out += ["", "Paper: 8.9% to 25.2% gain across FIFO, SJF-Est, SRTF-Est, LossAware.", "",
            "## Detection vs eval noise sigma", "", "| sigma | precision | recall | FPR (B) | FPR (A) |", "|---|---|---|---|---|"]
    for n in res.noise:
        r = n.rates
        out.append(f"| {n.sigma} | {rate(r.precision)}{ci(r.precision_ci)} | {rate(r.recall)} | {rate(r.fpr)} | "
                   f"{rate(r.fpr_label)} |")
    out += ["", "Paper: precision 100% -> 81% over sigma 0.01 -> 0.12 (>= 91% for sigma <= 0.05).", "",
            "## Precision vs hacking base rate", "", "| hack fraction | precision | recall | FPR (B) |", "|---|---|---|---|"]
    for br_row in res.base_rate:
        r = br_row.rates
        out.append(f"| {br_row.hack_fraction} | {rate(r.precision)}{ci(r.precision_ci)} | {rate(r.recall)} | {rate(r.fpr)} |")
    out += ["", "Paper: precision >= 89% for base rates 20-80%.", "", "## Decline threshold k", "",
            "| k | precision | recall | FPR (B) | completed-jobs JCT | harmful stops | GPU-hours |", "|---|---|---|---|---|---|---|"]
    for kr in res.k:
        r = kr.rates
        out.append(f"| {kr.k} | {rate(r.precision)} | {rate(r.recall)} | {rate(r.fpr)} | {pct(kr.jct_change)} | "
                   f"{r.harmful_stops} | {pct(kr.gpu_hours_change)} |")
    out += ["", "## Eval cadence together with k", "",
            "| evals per job | k | precision | recall | FPR (B) | completed-jobs JCT | harmful stops |",
            "|---|---|---|---|---|---|---|"]
    for ek in res.evals_k:
        r = ek.rates
        out.append(f"| {ek.evals_per_job} | {ek.k} | {rate(r.precision)} | {rate(r.recall)} | {rate(r.fpr)} | "
                   f"{pct(ek.jct_change)} | {r.harmful_stops} |")
    out += detector_section(res)
    out += ["", "## Delivered quality and the oracle limit", "",
            f"Mean delivered gold over RLHF jobs: base {q.delivered_gold_base:.3f}, EvalStop {q.delivered_gold_evalstop:.3f}, "
            f"Oracle-Stop {q.delivered_gold_oracle:.3f} (regret vs oracle {q.regret_vs_oracle:.3f}). Retention, like for "
            f"like: EvalStop saves {rate(q.retention)}{ci(q.retention_ci)} of the GPU-hours the oracle saves on "
            f"hacked jobs. (All GPU-hours saved over the oracle's, {rate(q.savings_fraction_of_oracle)}, is not like for "
            "like: it counts stops of healthy jobs the oracle never makes.)", "",
            "| run | GPU-hours | W_post | W_unprod | W_ovh |", "|---|---|---|---|---|"]
    for name, v in res.wasted.items():
        out.append(f"| {name} | {v.gpu_hours:.0f} | {v.w_post:.0f} | {v.w_unprod:.0f} | {v.w_ovh:.0f} |")
    out += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    out += ["", "The paper's 'wasted compute -21.8%' is compared with the total GPU-hours change; "
            "its FPRs with definition B (harmful stops)."]
    return "\n".join(out) + "\n"


def detector_section(res: ReproduceResult) -> list[str]:
    """The detector comparison (``ReproduceResult.detectors``) as markdown."""
    if not res.detectors:
        return []
    out = ["", "## Detectors compared (EvalStop's rule swapped, same jobs, same seeds)", "",
           f"{seeds_text(res)}; each detector watches what EvalStop watches; retention = GPU-hours saved on "
           "hacked jobs / the oracle's; harmful stops summed over seeds; intervals: 95% bootstrap over seeds.", "",
           "| detector | params | sigma | evals/job | precision | recall | FPR (B) | retention | completed-jobs JCT | "
           "harmful stops |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in res.detectors:
        r = row.rates
        params = ", ".join(f"{k}={v}" for k, v in row.params.items())
        out.append(f"| {row.detector} | {params} | {row.sigma} | {row.evals_per_job} | "
                   f"{rate(r.precision)}{ci(r.precision_ci)} | {rate(r.recall)}{ci(r.recall_ci)} | "
                   f"{rate(r.fpr)} | {rate(row.retention)}{ci(row.retention_ci)} | {pct(row.jct_change)} | "
                   f"{r.harmful_stops} |")
    return out


#: GPU-count classes of :func:`workload_table`: (label, lowest, highest)
GPU_CLASSES = (("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), ("9-32", 9, 32), (">32", 33, 1 << 62))


def _type_rows(wl: Workload, label: str) -> list[str]:
    gpus = np.asarray(wl.gpus)
    hours = wl.duration_s / 3600.0
    types = np.array(wl.job_types())
    total_gh = float(np.sum(gpus * hours))
    rows = []
    for name in [*sorted(set(types.tolist())), "all"]:
        sel = np.ones(len(types), bool) if name == "all" else types == name
        g, h = gpus[sel], hours[sel]
        shares = " | ".join(f"{100 * np.mean((g >= lo) & (g <= hi)):.0f}%" for _, lo, hi in GPU_CLASSES)
        rows.append(f"| {label} | {name} | {sel.sum()} ({100 * sel.mean():.0f}%) | "
                    f"{100 * float(np.sum(g * h)) / total_gh:.0f}% | {shares} | {np.median(h):.2f} | "
                    f"{np.quantile(h, 0.9):.2f} |")
    return rows


def trace_lines(wl: Workload) -> list[str]:
    """Where a trace workload's jobs came from: the file, the window, what was dropped (none: synthetic)."""
    src = wl.source
    if src is None:
        return []
    dropped = ", ".join(f"{v} {k}" for k, v in src.dropped) or "none"
    skipped = ", ".join(f"{v} {k}" for k, v in src.skipped) or "none"
    return [f"trace {src.format} {src.path}: {src.rows} usable jobs (rows skipped: {skipped})",
            f"window: {len(wl)} jobs from {src.start_s / 3600:.1f} h over {src.span_s / 3600:.1f} h recorded, "
            f"offered load {src.recorded_load:.3g} as recorded; arrival times x{src.time_scale:.3g}; dropped in the "
            f"window: {dropped}"]


def workload_table(wl: Workload, synthetic: Workload | None = None) -> str:
    """Markdown: jobs, GPU-hour share, GPU-count shares and duration quantiles per job type, for
    ``wl`` and (beside it) a ``synthetic`` workload; the trace window's counts where ``wl`` has one."""
    src = wl.source
    lines = [*trace_lines(wl), ""] if src is not None else []
    head = " | ".join(f"{c} GPUs" for c, _, _ in GPU_CLASSES)
    lines += [f"| workload | type | jobs | GPU-h | {head} | median h | p90 h |",
              "|---|---|---|---|" + "---|" * len(GPU_CLASSES) + "---|---|"]
    lines += _type_rows(wl, "trace" if src is not None else "synthetic")
    if synthetic is not None:
        lines += _type_rows(synthetic, "synthetic")
    return "\n".join(lines)
