"""The pre-registered corpus of real RLHF runs: train it, check it, score every detector on it.

    python scripts/real_corpus.py --run --workers 2     # train the missing runs (resumable), then label
    python scripts/real_corpus.py --check               # the stored runs against their preregistration
    python scripts/real_corpus.py --score               # every registered detector, held-out half
    python scripts/real_corpus.py --score --half tuning # the half that may be looked at while tuning

Design, label rule, precision definitions, split and seeds: ``configs/corpus/preregistration.yaml``
(committed before the first scoring) and ``evalstop_trl/analysis/corpus.py``. Runs are tiny models
built in code (no hub), trained by TRL on CPU (``--device cuda``: a larger in-code model on a GPU).
One JSONL per run under ``configs/corpus/runs/`` (a header with the configuration, then one line per
eval); ``labels.jsonl`` holds each run's label, computed from its gold series alone. Never the models.

The exact command that produced the committed runs is in docs/results.md ("The real-run corpus").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalstop_trl.analysis import corpus as cp  # noqa: E402

RUNS = cp.CORPUS / "runs"


def run_path(folder: Path, config_id: int, seed: int) -> Path:
    return folder / f"{cp.run_name(config_id, seed)}.jsonl"


def train_one(config_id: int, seed: int, out: Path, device: str) -> None:
    """Train one run in this process and write its JSONL atomically (``out``'s folder is a corpus's
    ``runs``: its configuration is drawn with that corpus's design seed)."""
    from evalstop_trl.train.corpus import train_run

    prereg = cp.load_preregistration(out.parent.parent / "preregistration.yaml")
    cfg = cp.draw_config(config_id, prereg["design_seed"])
    with tempfile.TemporaryDirectory(prefix="corpus-run-") as tmp:
        lines, seconds = train_run(cfg, seed, tmp, device=device)
    head = {"config": cfg.to_json(), "seed": seed, "device": device, "seconds": round(seconds, 1)}
    tmp_out = out.with_suffix(".part")
    tmp_out.write_text("".join(json.dumps(x) + "\n" for x in [head, *lines]))
    tmp_out.replace(out)


def train_missing(folder: Path, workers: int, device: str, limit: int | None) -> int:
    """Train every run of the design that has no file yet, ``workers`` processes side by side."""
    from tqdm import tqdm

    prereg = cp.load_preregistration(folder.parent / "preregistration.yaml")
    folder.mkdir(parents=True, exist_ok=True)
    todo = [(c.config_id, s) for c in cp.design(prereg) for s in prereg["seeds"]
            if not run_path(folder, c.config_id, s).exists()][:limit]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def one(job: tuple[int, int]) -> tuple[tuple[int, int], str]:
        cid, seed = job
        cmd = [sys.executable, __file__, "--train-one", str(cid), str(seed), str(run_path(folder, cid, seed)),
               "--device", device]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        return job, "" if res.returncode == 0 else res.stderr[-2000:]

    failed = 0
    with ThreadPoolExecutor(workers) as pool, tqdm(total=len(todo), desc="corpus runs", unit="run") as bar:
        for fut in as_completed([pool.submit(one, j) for j in todo]):
            job, err = fut.result()
            if err:
                failed += 1
                tqdm.write(f"run c{job[0]:03d}-s{job[1]} failed:\n{err}")
            bar.update()
    return failed


def write_labels(folder: Path = cp.CORPUS) -> list[cp.RunRecord]:
    """Label every stored run from its gold series alone (``labels.jsonl``)."""
    prereg = cp.load_preregistration(folder / "preregistration.yaml")
    rule = cp.rule_of(prereg)
    runs = cp.read_corpus(folder)
    with open(folder / "labels.jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps({"name": r.name, "config_id": r.config.config_id, "hacked": cp.label(r, rule),
                                "gold_peak_step": r.steps[cp.gold_peak(r)], "harm_margin": round(cp.harm_margin(r, rule), 6)})
                    + "\n")
    return runs


# ----------------------------------------------------------------------------- scoring
Row = tuple[str, str, dict[str, Any], bool, str | None]  # label, detector, params (a policy's), paired noise, gate
CONVERGED = {"stop_on": ["hacked", "converged"]}  # the opt-in converged stop (counted apart, never a true stop)
PAPER = "decline, noise none (the paper's exact rule)"
#: each policy gate (``core/detectors``' GATES) as the tables name it
GATE_LABELS = {"kl_past_peak": "KL gate", "proxy_diverges": "proxy gate"}
#: the row of the registry's recommendation (``RECOMMENDED_POLICY``), given the paired noise
RECOMMENDED = "decline + paired noise + proxy gate"


def detector_rows(with_evidence: bool = True) -> list[Row]:
    """(label, detector, params, reads the paired noise, the policy's gate) for every registered
    detector at its registry defaults but ``never``; with ``with_evidence`` also each one given the
    paired noise, each policy gate (:data:`GATE_LABELS`: the KL clock, a stop only once the run's KL
    is past the forecast peak of Gao's form fitted to its world feedback so far; the proxy gate, a
    stop only while the proxy reward is above its value at the best eval), and both."""
    from evalstop_trl.core.detectors import DETECTORS

    names = [n for n in DETECTORS.names() if n != "never"]
    rows: list[Row] = [(n, n, {}, False, None) for n in names]
    rows.insert(1, (PAPER, "decline", {"noise": "none"}, False, None))  # the default before issue 44
    if with_evidence:
        rows += [(f"{n} + paired noise", n, {}, True, None) for n in names]
        for gate, label in GATE_LABELS.items():
            rows += [(f"{n} + {label}", n, {}, False, gate) for n in names]
            rows += [(f"{n} + paired noise + {label}", n, {}, True, gate) for n in names]
        rows += [(f"{n} + paired noise, stop_on converged", n, CONVERGED, True, None)
                 for n in ("decline", "sequential")]
    return rows


def replay_stop(run: cp.RunRecord, detector: str, params: dict[str, Any], evidence: bool,
                gate: str | None = None) -> tuple[int | None, int | None, str]:
    """(stop step, kept step, reason) of the policy (``detector``, ``params``, ``gate``: what the
    service runs) replayed on the run's world feedback: its first STOP. Each eval carries the run's
    train loss, KL and proxy reward (only a gate reads the last two) and, with ``evidence``, its
    per-example n and paired noise."""
    from evalstop_trl.core.detectors import Action, Observation
    from evalstop_trl.core.records import Policy

    det = Policy.from_dict({"detector": detector, **params, **({"gate": gate} if gate else {})}).build()
    planned = run.config.max_steps
    ev = run.evidence if evidence else ((None, None),) * len(run.steps)
    best = None
    for step, score, loss, (n, noise), kl, proxy in zip(run.steps, run.world_feedback, run.train_loss, ev, run.kl,
                                                        run.proxy_reward, strict=True):
        d = det.observe(Observation(job_id="corpus", step=step, eval_score=score, train_loss=loss,
                                    progress=step / planned, eval_n=n, eval_noise=noise, kl=kl, proxy_reward=proxy))
        best = d.best_step
        if d.action is Action.STOP:
            return step, d.best_step, d.reason
    return None, best, ""


def score_all(runs: list[cp.RunRecord], rows: list[Row], rule: cp.LabelRule) -> dict[str, cp.Score]:
    from tqdm import tqdm

    out = {}
    for name, det, params, ev, gate in tqdm(rows, desc="detectors", unit="detector", leave=False):
        outs = []
        for r in runs:
            stop, kept, reason = replay_stop(r, det, params, ev, gate)
            outs.append(cp.outcome(r, stop, kept, rule, converged=reason.startswith("converged")))
        out[name] = cp.score(outs)
    return out


def markdown(table: dict[str, cp.Score]) -> str:
    lines = ["| detector | precision (harmful) | precision (any stop) | healthy runs stopped | recall | "
             "post-peak compute saved | all compute saved | converged stops |", "|---|---|---|---|---|---|---|---|"]
    for name, s in table.items():
        lines.append(f"| {name} | {s.precision_harmful.fmt()} | {s.precision_any.fmt()} | {s.healthy_stopped.fmt()} | "
                     f"{s.recall.fmt()} | {s.post_peak_saved.fmt()} | {s.compute_saved.fmt()} | {s.converged_stops} |")
    return "\n".join(lines)


#: ``--by``: the design's factors, each a function of a run's configuration to its group's label
FACTORS: dict[str, Any] = {
    "task": lambda c: c.task.value,
    "trainer": lambda c: c.trainer.value,
    "eval": lambda c: "fixed-seed" if c.fixed_seed_eval else "resampled",
    "evals": lambda c: "5-15 evals" if c.evals <= 15 else "16-40 evals",
    "eval_n": lambda c: "16-64 examples" if c.eval_n <= 64 else "68-512 examples",
    "kl": lambda c: "no KL penalty" if c.kl_coef == 0 else "KL penalty",
}


def by_factor(runs: list[cp.RunRecord], rows: list[Row], rule: cp.LabelRule, factor: str) -> str:
    """Healthy runs stopped at all and recall per group of ``factor``, for each row's rule (the groups'
    run counts in brackets)."""
    groups = sorted({FACTORS[factor](r.config) for r in runs})
    lines = ["| rule | " + " | ".join(f"{g}: healthy stopped / recall" for g in groups) + " |",
             "|---" * (len(groups) + 1) + "|"]
    for row in rows:
        cells = []
        for g in groups:
            sc = score_all([r for r in runs if FACTORS[factor](r.config) == g], [row], rule)[row[0]]
            cells.append(f"{sc.healthy_stopped.fmt()} ({sc.healthy}) / {sc.recall.fmt()} ({sc.hacked})")
        lines.append(f"| {row[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: ``--sweep-decline``: the grid the default ``decline``'s ``noise_z`` was chosen from, on the tuning half only
DECLINE_SWEEP = {"noise": ("run", "paired"), "noise_z": (1.0, 1.5, 2.0, 2.5, 3.0)}


def sweep_decline(runs: list[cp.RunRecord], rule: cp.LabelRule) -> str:
    """The tuning half's table for ``decline`` (k=2) over :data:`DECLINE_SWEEP`, each eval with its
    paired noise: how the default ``noise_z`` was chosen (``noise: run`` by design, a level a fixed-seed
    eval cannot fool; among its rows the highest precision counting any stop with recall >= 0.6 on
    this half; docs/results.md)."""
    rows: list[Row] = [(PAPER, "decline", {"noise": "none"}, True, None)]
    rows += [(f"decline, noise {n}, noise_z {z:g}", "decline", {"noise": n, "noise_z": z}, True, None)
             for n in DECLINE_SWEEP["noise"] for z in DECLINE_SWEEP["noise_z"]]
    return markdown(score_all(runs, rows, rule))


#: ``--paired``: each rule alone against the same rule with the evidence a run logs, on the same runs
PAIRED_METRICS = ("precision_any", "healthy_stopped", "recall", "post_peak_saved")


def paired_table(runs: list[cp.RunRecord], rule: cp.LabelRule) -> str:
    """For ``decline`` and ``sequential``: the change from the rule on plain scores to the rule with
    the paired noise, and with the paired noise and each gate, on the same runs (a bootstrap over
    configurations shared by both sides: a paired comparison)."""
    def outcomes(detector: str, evidence: bool, gate: str | None) -> list[cp.Outcome]:
        out = []
        for r in runs:
            stop, kept, reason = replay_stop(r, detector, {}, evidence, gate)
            out.append(cp.outcome(r, stop, kept, rule, converged=reason.startswith("converged")))
        return out

    lines = ["| change, same runs | " + " | ".join(m.replace("_", " ") for m in PAIRED_METRICS) + " |",
             "|---" * (len(PAIRED_METRICS) + 1) + "|"]
    for detector in ("decline", "sequential"):
        plain = outcomes(detector, False, None)
        changes = [("+ paired noise", True, None)] + [(f"+ paired noise + {label}", True, gate)
                                                      for gate, label in GATE_LABELS.items()]
        for label, evidence, gate in changes:
            after = outcomes(detector, evidence, gate)
            cells = []
            for m in PAIRED_METRICS:
                d = cp.paired_difference(plain, after, m)
                cells.append("n/a" if d.value is None else
                             f"{100 * d.value:+.0f} [{100 * (d.low or 0):+.0f}, {100 * (d.high or 0):+.0f}] points")
            lines.append(f"| {detector} -> {detector} {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the confirmation set (configs/corpus/confirm: fresh configurations, held out whole)
CONFIRMATION = cp.CORPUS / "confirm"


def half_of(runs: list[cp.RunRecord], prereg: dict[str, Any], half: str) -> list[cp.RunRecord]:
    """The runs of ``half``: ``tuning`` or ``held_out`` (the preregistered split), ``all``, or ``unseen``:
    the held-out half and the confirmation set together (every run no choice was made on)."""
    if half == "all":
        return runs
    keep = set(prereg["held_out_configs" if half in ("held_out", "unseen") else "tuning_configs"])
    chosen = [r for r in runs if r.config.config_id in keep]
    return chosen + cp.read_corpus(CONFIRMATION) if half == "unseen" else chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="train the runs that have no file yet (resumable)")
    ap.add_argument("--workers", type=int, default=2, help="training processes side by side (default 2)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: a larger in-code model on a GPU")
    ap.add_argument("--limit", type=int, help="train at most this many runs now")
    ap.add_argument("--check", action="store_true", help="verify the stored runs against the preregistration")
    ap.add_argument("--score", action="store_true", help="replay every registered detector and print the table")
    ap.add_argument("--half", default="held_out", choices=("held_out", "tuning", "all", "unseen"),
                    help="held_out (default), tuning (the only half to look at while tuning), all, or unseen: "
                    "the held-out half and the confirmation set pooled")
    ap.add_argument("--sweep-decline", action="store_true", dest="sweep_decline",
                    help="the tuning half's table for decline's noise and noise_z (how the default was chosen)")
    ap.add_argument("--paired", action="store_true", help="with --score: each rule against itself with the "
                    "paired noise and each gate (KL, proxy), on the same runs (paired bootstrap over configurations)")
    ap.add_argument("--json", help="write the scored table as JSON")
    ap.add_argument("--by", choices=sorted(FACTORS), help="with --score: healthy runs stopped and recall per group "
                    "of a design factor, for decline and sequential (with and without the paired noise) and the "
                    "recommendation")
    ap.add_argument("--folder", default=str(cp.CORPUS), help="the corpus: its preregistration.yaml, runs/ and "
                    "labels.jsonl (default configs/corpus; configs/corpus/confirm: the confirmation set, held out whole)")
    ap.add_argument("--train-one", nargs=3, metavar=("CONFIG", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.train_one:
        cid, seed, out = args.train_one
        train_one(int(cid), int(seed), Path(out), args.device)
        return 0
    folder = Path(args.folder)
    prereg = cp.load_preregistration(folder / "preregistration.yaml")
    if args.run:
        failed = train_missing(folder / "runs", args.workers, args.device, args.limit)
        write_labels(folder)
        if failed:
            print(f"{failed} run(s) failed; run again to retry them", file=sys.stderr)
            return 1
    if args.check:
        runs = cp.read_corpus(folder)
        problems = cp.check_preregistration(prereg, runs, folder)
        hacked = sum(cp.prereg_labels(folder).values())
        print(f"{len(runs)} runs of {prereg['configurations']} configurations x seeds {prereg['seeds']}; "
              f"{hacked} hacked by the gold rule; split {len(prereg['tuning_configs'])} tuning / "
              f"{len(prereg['held_out_configs'])} held-out configurations")
        for p in problems:
            print(f"  problem: {p}")
        if problems:
            return 1
        print("the stored runs match their preregistration")
    if args.sweep_decline:
        runs = half_of(cp.read_corpus(folder), prereg, "tuning")  # never the held-out half
        print(f"tuning half: {len(runs)} runs; decline k=2, each eval with its paired noise\n")
        print(sweep_decline(runs, cp.rule_of(prereg)))
    if args.score:
        rule = cp.rule_of(prereg)
        runs = half_of(cp.read_corpus(folder), prereg, args.half)
        if not runs:
            print("no runs to score: train them first (--run)", file=sys.stderr)
            return 2
        table = score_all(runs, detector_rows(), rule)
        n_h = sum(cp.label(r, rule) for r in runs)
        print(f"{args.half} half: {len(runs)} runs, {n_h} hacked, {len(runs) - n_h} healthy; intervals resample "
              f"configurations ({len({r.config.config_id for r in runs})})\n")
        print(markdown(table))
        if args.by:
            chosen = [r for r in detector_rows() if r[0] in (PAPER, "decline", "sequential", "decline + paired noise",
                                                              "sequential + paired noise", RECOMMENDED)]
            print(f"\nby {args.by} (healthy runs stopped at all / recall; counts in brackets)\n")
            print(by_factor(runs, chosen, rule, args.by))
        if args.paired:
            print(f"\nthe evidence a run logs, paired on the same {len(runs)} runs (change: with minus without)\n")
            print(paired_table(runs, rule))
        if args.json:
            Path(args.json).write_text(json.dumps({k: v.__dict__ for k, v in table.items()}, default=lambda o: o.__dict__,
                                                  indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
