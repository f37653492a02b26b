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


def seeds_text(res: dict[str, Any]) -> str:
    start = res.get("seed_start", 0)
    return f"{res['seeds']} seed(s), {start}-{start + res['seeds'] - 1}"


def type_table(by_type: dict[str, Any]) -> list[str]:
    """Markdown rows of detection per job type (counts over all seeds)."""
    out = ["| job type | hacked | healthy | stopped | TP | harmful stops (B) | label-only stops | precision | recall | FPR (B) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for t, d in by_type.items():
        c = d["counts"]
        out.append(f"| {t} | {c['hacked']} | {c['healthy']} | {c['flagged']} | {c['tp']} | {c['fp_b']} | "
                   f"{c['fp_a'] - c['fp_b']} | {rate(d['precision'])} | {rate(d['recall'])} | {rate(d['fpr'])} |")
    return out


def run_table(res: dict[str, Any]) -> str:
    """Terminal table of one `platform-sim run` result."""
    b, r, ch, det = res["base"], res["run"], res["changes"], res["detection"]
    oracle = " (ORACLE: reads ground truth)" if res.get("is_oracle") else ""
    lines = [
        f"{res['scheduler']} alone vs {res['scheduler']} + {res['overlay']}{oracle}, {seeds_text(res)}, "
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
    c = det["counts"]
    lines.append(f"harmful stops (definition B) beside that JCT: {c['fp_b']} over {res['seeds']} seed(s)")
    lines.append(f"paired permutation test (completed-jobs JCT): {p_value(res['p_value'])}")
    lines.append(
        f"detection over watched jobs: precision {rate(det['precision'])}{ci(det['precision_ci'])}, "
        f"recall {rate(det['recall'])}{ci(det['recall_ci'])}, FPR {rate(det['fpr'])}{ci(det['fpr_ci'])} "
        f"(definition B, harmful stops); FPR by label (A) {rate(det['fpr_label'])}"
    )
    lines.append(f"  counts: {c['tp']} hacked stopped of {c['hacked']}; {c['fp_b']} harmful and {c['fp_a']} "
                 f"label stops of {c['healthy']} healthy")
    for t, d in res.get("detection_by_type", {}).items():
        k = d["counts"]
        lines.append(f"  {t:<10} {k['flagged']} stopped: {k['tp']} of {k['hacked']} hacked, {k['fp_b']} harmful and "
                     f"{k['fp_a']} label stops of {k['healthy']} healthy")
    return "\n".join(lines)


def markdown_report(res: dict[str, Any]) -> str:
    """`DIR/report.md` for `platform-sim reproduce`."""
    h, iv = res["headline"], res["intervals"]
    hi = iv["headline"]
    ov = res["config"]["overlay"]["evalstop"]
    watched = ", ".join(res.get("watched", [])) or "RLHF jobs"
    out = [
        "# EvalStop platform simulation: reproduction of the paper's tables",
        "",
        f"{seeds_text(res)}, config `{res['config']['name']}` ({res['config']['workload']['n_jobs']} jobs, "
        f"{res['config']['cluster']['nodes'] * res['config']['cluster']['gpus_per_node']} GPUs, load "
        f"{res['config']['workload']['load']}). Intervals are 95% bootstrap intervals over seeds; the p-value is a "
        "paired sign-flip permutation test on per-seed mean JCT of the completed jobs (20,000 draws: it cannot "
        "resolve p below 1e-4). Harmful stops are counted over all seeds and stand beside every JCT figure: the "
        "completed-jobs JCT does not penalise them.",
        "",
        f"## Headline: EvalStop ({ov.get('detector', 'decline')}, k={ov.get('k')}, watching {watched}) + "
        f"{h['scheduler']} vs {h['scheduler']} alone",
        "",
        "| metric | measured | 95% interval | paper |",
        "|---|---|---|---|",
        f"| mean JCT, completed jobs | {pct(h['jct_change'])} ({p_value(h['p_value'])}; {h.get('harmful_stops', 'n/a')} "
        f"harmful stops) | {ci(hi['jct_change'])} | -9.4% (p < 0.05) |",
        f"| mean JCT, all jobs (departure = completion or stop) | {pct(h['jct_change_all'])} | {ci(hi['jct_change_all'])} | not reported |",
        f"| total GPU-hours (the paper's 'wasted compute') | {pct(h['gpu_hours_change'])} | {ci(hi['gpu_hours_change'])} | -21.8% |",
        f"| W_post (GPU-h on hacked jobs after the gold peak) | {pct(h['w_post_change'])} | {ci(hi['w_post_change'])} | |",
        f"| W_unprod (GPU-h after the delivered checkpoint) | {pct(h['w_unprod_change'])} | {ci(hi['w_unprod_change'])} | |",
        f"| precision (definition B) | {rate(h['precision'])} | {ci(hi['precision'])} | 98.3% |",
        f"| recall | {rate(h['recall'])} | {ci(hi['recall'])} | 99.3% |",
        f"| FPR (definition B, harmful stops) | {rate(h['fpr'])} | {ci(hi['fpr'])} | 1.5% |",
        f"| FPR (definition A, label) | {rate(h['fpr_label'])} | | |",
        f"| retention: GPU-h saved on hacked jobs / the oracle's | {rate(res['quality'].get('retention'))} | "
        f"{ci(iv.get('retention'))} | |",
        "",
        "Detection per job type (the headline pools the watched types):",
        "",
        *type_table(h.get("by_type", {})),
        "",
        "## Baselines (on {})".format(h["scheduler"]),
        "",
        "| overlay | precision | recall | FPR (B) | FPR (A) | completed-jobs JCT | harmful stops | GPU-hours | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    paper_b = {"stop_at": "FPR 64.5%, precision 57.1%, similar JCT gain", "loss_plateau": "recall 38.3%, precision 57.0%",
               "oracle": "(upper limit; ORACLE reads ground truth)"}
    for name, b in res["baselines"].items():
        label = name + (" (ORACLE)" if b.get("is_oracle") else "")
        out.append(f"| {label} | {rate(b['precision'])} | {rate(b['recall'])} | {rate(b['fpr'])} | {rate(b['fpr_label'])} | "
                   f"{pct(b['jct_change'])} | {b.get('harmful_stops', 'n/a')} | {pct(b['gpu_hours_change'])} | "
                   f"{paper_b[name]} |")
    out += ["", "StopAt cuts each watched job at exactly its `fraction` of planned work and delivers the state at the cut.",
            "", "## Composability: EvalStop's completed-jobs JCT change on each base scheduler", "",
            "| base scheduler | JCT change | 95% interval | harmful stops |", "|---|---|---|---|"]
    harm = res.get("composability_harmful_stops", {})
    for sched, v in res["composability"].items():
        out.append(f"| {sched} | {pct(v)} | {ci(iv['composability'][sched])} | {harm.get(sched, 'n/a')} |")
    out += ["", "Paper: 8.9% to 25.2% gain across FIFO, SJF-Est, SRTF-Est, LossAware.", "",
            "## Detection vs eval noise sigma", "", "| sigma | precision | recall | FPR (B) | FPR (A) |", "|---|---|---|---|---|"]
    for r in res["noise"]:
        out.append(f"| {r['sigma']} | {rate(r['precision'])}{ci(r['precision_ci'])} | {rate(r['recall'])} | {rate(r['fpr'])} | {rate(r['fpr_label'])} |")
    out += ["", "Paper: precision 100% -> 81% over sigma 0.01 -> 0.12 (>= 91% for sigma <= 0.05).", "",
            "## Precision vs hacking base rate", "", "| hack fraction | precision | recall | FPR (B) |", "|---|---|---|---|"]
    for r in res["base_rate"]:
        out.append(f"| {r['hack_fraction']} | {rate(r['precision'])}{ci(r['precision_ci'])} | {rate(r['recall'])} | {rate(r['fpr'])} |")
    out += ["", "Paper: precision >= 89% for base rates 20-80%.", "", "## Decline threshold k", "",
            "| k | precision | recall | FPR (B) | completed-jobs JCT | harmful stops | GPU-hours |", "|---|---|---|---|---|---|---|"]
    for r in res["k"]:
        out.append(f"| {r['k']} | {rate(r['precision'])} | {rate(r['recall'])} | {rate(r['fpr'])} | {pct(r['jct_change'])} | "
                   f"{r.get('harmful_stops', 'n/a')} | {pct(r['gpu_hours_change'])} |")
    out += ["", "## Eval cadence together with k", "",
            "| evals per job | k | precision | recall | FPR (B) | completed-jobs JCT | harmful stops |",
            "|---|---|---|---|---|---|---|"]
    for r in res["evals_k"]:
        out.append(f"| {r['evals_per_job']} | {r['k']} | {rate(r['precision'])} | {rate(r['recall'])} | {rate(r['fpr'])} | "
                   f"{pct(r['jct_change'])} | {r.get('harmful_stops', 'n/a')} |")
    out += detector_section(res)
    q, w = res["quality"], res["wasted"]
    out += ["", "## Delivered quality and the oracle limit", "",
            f"Mean delivered gold over RLHF jobs: base {q['delivered_gold_base']:.3f}, EvalStop {q['delivered_gold_evalstop']:.3f}, "
            f"Oracle-Stop {q['delivered_gold_oracle']:.3f} (regret vs oracle {q['regret_vs_oracle']:.3f}). Retention, like for "
            f"like: EvalStop saves {rate(q.get('retention'))}{ci(q.get('retention_ci'))} of the GPU-hours the oracle saves on "
            f"hacked jobs. (All GPU-hours saved over the oracle's, {rate(q['savings_fraction_of_oracle'])}, is not like for "
            "like: it counts stops of healthy jobs the oracle never makes.)", "",
            "| run | GPU-hours | W_post | W_unprod | W_ovh |", "|---|---|---|---|---|"]
    for name, v in w.items():
        out.append(f"| {name} | {v['gpu_hours']:.0f} | {v['w_post']:.0f} | {v['w_unprod']:.0f} | {v['w_ovh']:.0f} |")
    out += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    out += ["", "The paper's 'wasted compute -21.8%' is compared with the total GPU-hours change; "
            "its FPRs with definition B (harmful stops)."]
    return "\n".join(out) + "\n"


def detector_section(res: dict[str, Any]) -> list[str]:
    """The detector comparison (``results.json["detectors"]``) as markdown."""
    rows = res.get("detectors")
    if not rows:
        return []
    out = ["", "## Detectors compared (EvalStop's rule swapped, same jobs, same seeds)", "",
           f"{seeds_text(res)}; each detector watches what EvalStop watches; retention = GPU-hours saved on "
           "hacked jobs / the oracle's; harmful stops summed over seeds; intervals: 95% bootstrap over seeds.", "",
           "| detector | params | sigma | evals/job | precision | recall | FPR (B) | retention | completed-jobs JCT | "
           "harmful stops |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        out.append(f"| {r['detector']} | {params} | {r['sigma']} | {r['evals_per_job']} | "
                   f"{rate(r['precision'])}{ci(r.get('precision_ci'))} | {rate(r['recall'])}{ci(r.get('recall_ci'))} | "
                   f"{rate(r['fpr'])} | {rate(r['retention'])}{ci(r.get('retention_ci'))} | {pct(r['jct_change'])} | "
                   f"{r['harmful_stops']} |")
    return out
