"""Markdown and terminal tables for simulation results."""

from __future__ import annotations

from typing import Any

from .metrics import DEFINITIONS

PAPER = {
    "jct_change": -0.094, "gpu_hours_change": -0.218, "precision": 0.983, "recall": 0.993, "fpr": 0.015,
    "stop_at_fpr": 0.645, "stop_at_precision": 0.571, "loss_plateau_recall": 0.383, "loss_plateau_precision": 0.570,
}


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:+.{digits}f}%"


def rate(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def ci(pair) -> str:
    if not pair or pair[0] != pair[0]:
        return ""
    return f" [{100 * pair[0]:.1f}, {100 * pair[1]:.1f}]"


def run_table(res: dict[str, Any]) -> str:
    """Terminal table of one `platform-sim run` result."""
    b, r, ch, det = res["base"], res["run"], res["changes"], res["detection"]
    oracle = " (ORACLE: reads ground truth)" if res.get("is_oracle") else ""
    lines = [
        f"{res['scheduler']} alone vs {res['scheduler']} + {res['overlay']}{oracle}, {res['seeds']} seed(s), "
        f"{len(res['jct_base_h']) // max(res['seeds'], 1)} jobs each",
        f"{'metric':<34}{'base':>12}{'+overlay':>12}{'change':>10}   95% CI",
    ]
    rows = [
        ("mean JCT, completed jobs (h)", None, None, "jct_change"),
        ("mean JCT, all jobs (h)", "mean_jct_h", "mean_jct_h", "jct_change_all"),
        ("p95 JCT (h)", "p95_jct_h", "p95_jct_h", "p95_jct_change"),
        ("makespan (h)", "makespan_h", "makespan_h", "makespan_change"),
        ("GPU-hours (total)", "gpu_hours", "gpu_hours", "gpu_hours_change"),
        ("W_post (GPU-h after gold peak)", "w_post", "w_post", "w_post_change"),
        ("W_unprod (GPU-h after delivered)", "w_unprod", "w_unprod", "w_unprod_change"),
        ("W_ovh (eval/ckpt/restart GPU-h)", "w_ovh", "w_ovh", "w_ovh_change"),
    ]
    for label, kb, kr, kc in rows:
        vb = f"{b[kb]:.2f}" if kb else ""
        vr = f"{r[kr]:.2f}" if kr else ""
        lines.append(f"{label:<34}{vb:>12}{vr:>12}{pct(ch[kc]['mean']):>10}  {ci(ch[kc]['ci'])}")
    lines.append(f"{'utilisation':<34}{b['utilisation']:>12.3f}{r['utilisation']:>12.3f}")
    lines.append(f"{'delivered gold (RLHF mean)':<34}{b['delivered_gold_rlhf']:>12.3f}{r['delivered_gold_rlhf']:>12.3f}")
    lines.append(f"paired permutation p (completed-jobs JCT): {res['p_value']:.2g}")
    c = det["counts"]
    lines.append(
        f"detection over RLHF jobs: precision {rate(det['precision'])}{ci(det['precision_ci'])}, "
        f"recall {rate(det['recall'])}{ci(det['recall_ci'])}, FPR {rate(det['fpr'])}{ci(det['fpr_ci'])} "
        f"(definition B, harmful stops); FPR by label (A) {rate(det['fpr_label'])}"
    )
    lines.append(f"  counts: {c['tp']} hacked stopped of {c['hacked']}; {c['fp_b']} harmful and {c['fp_a']} "
                 f"label-only stops of {c['healthy']} healthy")
    return "\n".join(lines)


def markdown_report(res: dict[str, Any]) -> str:
    """`DIR/report.md` for `platform-sim reproduce`."""
    h, iv = res["headline"], res["intervals"]
    hi = iv["headline"]
    out = [
        "# EvalStop platform simulation: reproduction of the paper's tables",
        "",
        f"{res['seeds']} seeds, config `{res['config']['name']}` ({res['config']['workload']['n_jobs']} jobs, "
        f"{res['config']['cluster']['nodes'] * res['config']['cluster']['gpus_per_node']} GPUs, load "
        f"{res['config']['workload']['load']}). Intervals are 95% bootstrap intervals over seeds; the p-value is a "
        "paired sign-flip permutation test on per-seed mean JCT of the completed jobs.",
        "",
        f"## Headline: EvalStop (decline, k={res['config']['overlay']['evalstop']['k']}) + {h['scheduler']} "
        f"vs {h['scheduler']} alone",
        "",
        "| metric | measured | 95% interval | paper |",
        "|---|---|---|---|",
        f"| mean JCT, completed jobs | {pct(h['jct_change'])} | {ci(hi['jct_change'])} | -9.4% (p < 0.05) |",
        f"| mean JCT, all jobs (departure = completion or stop) | {pct(h['jct_change_all'])} | {ci(hi['jct_change_all'])} | not reported |",
        f"| total GPU-hours (the paper's 'wasted compute') | {pct(h['gpu_hours_change'])} | {ci(hi['gpu_hours_change'])} | -21.8% |",
        f"| W_post (GPU-h on hacked jobs after the gold peak) | {pct(h['w_post_change'])} | {ci(hi['w_post_change'])} | |",
        f"| W_unprod (GPU-h after the delivered checkpoint) | {pct(h['w_unprod_change'])} | {ci(hi['w_unprod_change'])} | |",
        f"| precision (definition B) | {rate(h['precision'])} | {ci(hi['precision'])} | 98.3% |",
        f"| recall | {rate(h['recall'])} | {ci(hi['recall'])} | 99.3% |",
        f"| FPR (definition B, harmful stops) | {rate(h['fpr'])} | {ci(hi['fpr'])} | 1.5% |",
        f"| FPR (definition A, label) | {rate(h['fpr_label'])} | | |",
        f"| p-value, completed-jobs JCT | {h['p_value']:.2g} | | < 0.05 |",
        "",
        "## Baselines (on {})".format(h["scheduler"]),
        "",
        "| overlay | precision | recall | FPR (B) | FPR (A) | completed-jobs JCT | GPU-hours | paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    paper_b = {"stop_at": "FPR 64.5%, precision 57.1%, similar JCT gain", "loss_plateau": "recall 38.3%, precision 57.0%",
               "oracle": "(upper limit; ORACLE reads ground truth)"}
    for name, b in res["baselines"].items():
        label = name + (" (ORACLE)" if b.get("is_oracle") else "")
        out.append(f"| {label} | {rate(b['precision'])} | {rate(b['recall'])} | {rate(b['fpr'])} | {rate(b['fpr_label'])} | "
                   f"{pct(b['jct_change'])} | {pct(b['gpu_hours_change'])} | {paper_b[name]} |")
    out += ["", "## Composability: EvalStop's completed-jobs JCT change on each base scheduler", "",
            "| base scheduler | JCT change | 95% interval |", "|---|---|---|"]
    for s, v in res["composability"].items():
        out.append(f"| {s} | {pct(v)} | {ci(iv['composability'][s])} |")
    out += ["", "Paper: 8.9% to 25.2% gain across FIFO, SJF-Est, SRTF-Est, LossAware.", "",
            "## Detection vs eval noise sigma", "", "| sigma | precision | recall | FPR (B) | FPR (A) |", "|---|---|---|---|---|"]
    for r in res["noise"]:
        out.append(f"| {r['sigma']} | {rate(r['precision'])}{ci(r['precision_ci'])} | {rate(r['recall'])} | {rate(r['fpr'])} | {rate(r['fpr_label'])} |")
    out += ["", "Paper: precision 100% -> 81% over sigma 0.01 -> 0.12 (>= 91% for sigma <= 0.05).", "",
            "## Precision vs hacking base rate", "", "| hack fraction | precision | recall | FPR (B) |", "|---|---|---|---|"]
    for r in res["base_rate"]:
        out.append(f"| {r['hack_fraction']} | {rate(r['precision'])}{ci(r['precision_ci'])} | {rate(r['recall'])} | {rate(r['fpr'])} |")
    out += ["", "Paper: precision >= 89% for base rates 20-80%.", "", "## Decline threshold k", "",
            "| k | precision | recall | FPR (B) | completed-jobs JCT | GPU-hours |", "|---|---|---|---|---|---|"]
    for r in res["k"]:
        out.append(f"| {r['k']} | {rate(r['precision'])} | {rate(r['recall'])} | {rate(r['fpr'])} | {pct(r['jct_change'])} | {pct(r['gpu_hours_change'])} |")
    out += ["", "## Eval cadence together with k", "", "| evals per job | k | precision | recall | FPR (B) | completed-jobs JCT |",
            "|---|---|---|---|---|---|"]
    for r in res["evals_k"]:
        out.append(f"| {r['evals_per_job']} | {r['k']} | {rate(r['precision'])} | {rate(r['recall'])} | {rate(r['fpr'])} | {pct(r['jct_change'])} |")
    q, w = res["quality"], res["wasted"]
    out += ["", "## Delivered quality and the oracle limit", "",
            f"Mean delivered gold over RLHF jobs: base {q['delivered_gold_base']:.3f}, EvalStop {q['delivered_gold_evalstop']:.3f}, "
            f"Oracle-Stop {q['delivered_gold_oracle']:.3f} (regret vs oracle {q['regret_vs_oracle']:.3f}). EvalStop saves "
            f"{rate(q['savings_fraction_of_oracle'])} of the GPU-hours the oracle saves.", "",
            "| run | GPU-hours | W_post | W_unprod | W_ovh |", "|---|---|---|---|---|"]
    for name, v in w.items():
        out.append(f"| {name} | {v['gpu_hours']:.0f} | {v['w_post']:.0f} | {v['w_unprod']:.0f} | {v['w_ovh']:.0f} |")
    out += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    out += ["", "The paper's 'wasted compute -21.8%' is compared with the total GPU-hours change; "
            "its FPRs with definition B (harmful stops)."]
    return "\n".join(out) + "\n"
