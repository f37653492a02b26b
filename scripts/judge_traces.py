"""A second real task: a learned judge (world feedback) vs an exact rule (gold), on tiny TRL runs.

    python scripts/judge_traces.py --run --workers 1    # train the runs (no stopping), store the traces
    python scripts/judge_traces.py                      # evaluate every registered detector on them

The exact command that produced ``configs/traces/judge/`` (80 runs, seeds 0-79, one run per seed,
200 steps each, an eval every 10 steps; 26.5 minutes in one process on 2 cores shared with other
work, 2026-12-01)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/judge_traces.py --run --workers 1

The task, the model and both evals are in ``evalstop_trl.train.judge`` (its docstring has the details):
a 3-layer Llama of width 32 (the first set: 2 layers of width 64) learns to continue letter prompts
with letters that alternate vowels and consonants. The trainer (GRPO for even seeds, RLOO for odd)
optimises a hackable proxy, ``alternation + w_vowel * vowel share``; each run draws its own
``w_vowel`` (uniform in [0, 2]) and learning rate (log-uniform in [2e-4, 1e-3]) from its seed, so
no two runs share a configuration.

* ``world_feedback`` (the only series a detector sees): a small MLP judge, trained in code on 2,000
  synthetic strings with their own prompts, labelled by the rule plus label noise, then frozen; it
  scores completions sampled on 16 held-out prompts x 4 samples.
* ``gold`` (the label's series): the exact rule on 256 other held-out prompts x 4 completions
  sampled with a fixed seed (deterministic).

The prompt pools (judge training, trainer, feedback, gold) are pairwise disjoint; ``manifest.json``
in the traces folder records them, each run's configuration and the judge's quality.

**Label** (relative to each run's own gold range, no absolute score units): a run is *hacked* iff
its gold peaks before its last eval and the last gold is below the peak by more than
``REL_MARGIN`` (20%) of the run's gold range (max - min); otherwise *healthy*. Affine changes of the
gold's units (x a, + b, a > 0) never change a label.

Every detector of ``evalstop_trl.core.detectors.DETECTORS`` is replayed at its registry defaults on
each run's world feedback (``evalstop_trl.analysis.replay``, the code of ``evalstop replay``). A run
is flagged if the detector stops it before its last eval. FP (A) = healthy and flagged; FP (B), the
harmful one and the headline, = healthy, flagged, and the gold of the checkpoint delivered (the best
world-feedback eval up to the stop, as a platform would keep) below the last gold by more than
``REL_MARGIN`` of the run's range. Lag = evals from the gold peak to the stop, over the true
positives. Rates come with Clopper-Pearson 95% intervals, the median lag with a distribution-free
95% interval (order statistics).

Per eval line of a trace (JSONL): ``step``, ``world_feedback``, ``gold``, ``proxy_reward``,
``train_loss``.

**Per-example world feedback** (``--per-example``, ``configs/traces/judge-per-example/``): the same
runs (seeds, configurations, prompts), the judge's 64 per-example scores (16 prompts x 4 samples, by
position) instead of their mean; each line also has ``eval_n`` and ``eval_noise``, the paired noise
level against the previous eval (:mod:`evalstop_trl.core.examples`), and every detector is evaluated
with and without it ("+ paired noise"). The command that produced them (80 runs, 2026-12-02)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/judge_traces.py --run --per-example --workers 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import real_traces as rt  # noqa: E402  (the first set's trace format, reader and intervals)

from evalstop_trl.analysis.calibrate import declined  # noqa: E402
from evalstop_trl.analysis.intervals import binomial_cdf  # noqa: E402
from evalstop_trl.analysis.replay import Curve, replay_curve  # noqa: E402
from evalstop_trl.core.detectors import DETECTORS  # noqa: E402

TRACES = ROOT / "configs" / "traces" / "judge"
#: the same task with per-example world feedback (each line also has the eval's n and paired noise)
TRACES_PER_EXAMPLE = ROOT / "configs" / "traces" / "judge-per-example"
MANIFEST = "manifest.json"
RUNS, MAX_STEPS, EVAL_EVERY = 80, 200, 10
REL_MARGIN = 0.2
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python scripts/judge_traces.py --run --workers 1"
COMMAND_PER_EXAMPLE = "OMP_NUM_THREADS=1 .venv/bin/python scripts/judge_traces.py --run --per-example --workers 2"


# ----------------------------------------------------------------------------- training (torch)
def manifest(runs: int, max_steps: int, eval_every: int, per_example: bool = False) -> dict[str, Any]:
    """What the traces were made from: the prompt pools, the judge's quality, every run's design."""
    from dataclasses import asdict

    from evalstop_trl.train import judge as J

    pools = J.prompt_sets()
    jd = J.train_judge(pools.judge)
    return {
        "command": COMMAND_PER_EXAMPLE if per_example else COMMAND, "max_steps": max_steps, "eval_every": eval_every,
        "rel_margin": REL_MARGIN, **({"per_example": True} if per_example else {}),
        "model": {"hidden": J.HIDDEN, "layers": J.LAYERS, "heads": J.HEADS},
        "judge": {"train_strings": len(pools.judge), "label_noise": J.JUDGE_LABEL_NOISE, **asdict(jd.quality)},
        "feedback": {"prompts": len(pools.feedback), "samples": J.FEEDBACK_SAMPLES},
        "gold": {"prompts": len(pools.gold), "samples": J.GOLD_SAMPLES},
        "prompt_pools": asdict(pools),
        "runs": {(c := J.run_config(s)).name: asdict(c) for s in range(runs)},
    }


#: the judge's fit, computed by torch kernels whose float results differ across CPUs and thread counts
#: (and training amplifies the difference: mae 0.12934 committed, 0.12962 seen on another machine), so it
#: is compared with this relative tolerance; everything else in a manifest is a setting, compared exactly
JUDGE_FIT, JUDGE_FIT_REL = ("mae", "correlation"), 0.02


def same_manifest(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two manifests (or two ``judge`` entries) describe the same traces: equal settings, and a
    judge fit within :data:`JUDGE_FIT_REL`.

    >>> same_manifest({"judge": {"mae": 0.12934, "label_noise": 0.15}}, {"judge": {"mae": 0.12962, "label_noise": 0.15}})
    True
    >>> same_manifest({"judge": {"mae": 0.12934, "label_noise": 0.15}}, {"judge": {"mae": 0.2, "label_noise": 0.15}})
    False
    >>> same_manifest({"judge": {"mae": 0.13, "label_noise": 0.15}}, {"judge": {"mae": 0.13, "label_noise": 0.2}})
    False
    """
    if "judge" in a or "judge" in b:
        rest = {k: v for k, v in a.items() if k != "judge"} == {k: v for k, v in b.items() if k != "judge"}
        return rest and same_manifest(a.get("judge", {}), b.get("judge", {}))
    fit = [k for k in JUDGE_FIT if k in a or k in b]
    if {k: v for k, v in a.items() if k not in fit} != {k: v for k, v in b.items() if k not in fit}:
        return False
    return all(k in a and k in b and math.isclose(a[k], b[k], rel_tol=JUDGE_FIT_REL) for k in fit)


def train_many(seeds: list[int], folder: Path, max_steps: int, eval_every: int,
               expected: dict[str, Any] | None = None, per_example: bool = False) -> None:
    """Train runs ``seeds`` one after the other in this process, each to its end (no detector), and write
    each trace to ``folder`` (printing ``wrote NAME`` after each). The judge is trained once; with
    ``expected`` (the manifest's judge quality) it must match it (ValueError otherwise)."""
    import tempfile
    from dataclasses import asdict

    import torch

    from evalstop_trl.train import judge as J

    torch.set_num_threads(1)
    pools = J.prompt_sets()
    jd = J.train_judge(pools.judge)
    got = asdict(jd.quality)
    if expected is not None and not same_manifest({k: got[k] for k in expected}, expected):
        raise ValueError(f"the judge trained here ({got}) is not the manifest's ({expected})")
    for seed in seeds:
        cfg = J.run_config(seed)
        feedback = J.JudgeFeedback(jd, pools.feedback, stream=seed, per_example=per_example)
        rec = rt.trace_recorder(feedback, J.RuleGold(pools.gold), eval_every)
        with tempfile.TemporaryDirectory(prefix="judge-trace-") as tmp:
            J.run_judge_task(cfg, tmp, max_steps, callbacks=[rec], prompts=pools)
        out = folder / f"{cfg.name}.jsonl"
        out.write_text("".join(rt.trace_line(row) for row in rec.trace))
        print(f"wrote {out.name}", flush=True)


def generate(folder: Path, runs: int, max_steps: int, eval_every: int, workers: int, per_example: bool = False) -> None:
    """Write the manifest, then train every run not yet in ``folder``: ``workers`` fresh processes (one
    torch thread each) share the runs. A folder made with other settings is refused."""
    from tqdm import tqdm

    from evalstop_trl.train.judge import run_config

    folder.mkdir(parents=True, exist_ok=True)
    new = manifest(runs, max_steps, eval_every, per_example)
    path = folder / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        if not same_manifest({k: v for k, v in old.items() if k != "runs"}, {k: v for k, v in new.items() if k != "runs"}):
            raise ValueError(f"{path} was made with other settings; use another --traces folder or remove it")
        new["runs"] = {**old["runs"], **new["runs"]}
    path.write_text(json.dumps(new, indent=1) + "\n")
    todo = [s for s in range(runs) if not (folder / f"{run_config(s).name}.jsonl").exists()]
    bar = tqdm(total=len(todo), desc="judge runs", unit="run")

    def worker(seeds: list[int]) -> None:
        cmd = [sys.executable, __file__, "--train-seeds", ",".join(map(str, seeds)), "--traces", str(folder),
               "--max-steps", str(max_steps), "--eval-every", str(eval_every)] + (["--per-example"] if per_example else [])
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) as proc:
            for line in proc.stdout:
                if line.startswith("wrote "):
                    bar.update(1)
                    bar.write(line.rstrip())
            err = proc.stderr.read()
        if proc.returncode:
            raise RuntimeError(f"runs {seeds} failed:\n{err[-3000:]}")

    chunks = [todo[i::workers] for i in range(workers) if todo[i::workers]]
    with ThreadPoolExecutor(max(len(chunks), 1)) as pool:
        list(pool.map(worker, chunks))
    bar.close()


# ----------------------------------------------------------------------------- evaluation (no torch)
def label(golds: tuple[float, ...] | list[float], rel_margin: float = REL_MARGIN) -> bool:
    """Hacked iff the gold peak (its first maximum) is before the last eval and the last gold is below
    the peak by more than ``rel_margin`` of the run's gold range (max - min). Unit-free.

    >>> label([0.1, 0.5, 0.3]), label([0.1, 0.5, 0.45]), label([0.1, 0.3, 0.5]), label([2.0, 2.0])
    (True, False, False, False)
    """
    if not golds:
        raise ValueError("label needs a non-empty gold series")
    if not 0 <= rel_margin < 1:
        raise ValueError(f"rel_margin must be in [0, 1), got {rel_margin!r}")
    return declined(list(golds), rel_margin)


def median_interval(values: list[float], alpha: float = 0.05) -> tuple[float, float, float] | None:
    """The median and a distribution-free interval for it with coverage >= 1 - alpha: the order
    statistics x_(j) and x_(n+1-j), j the largest with P(Binomial(n, 1/2) < j) <= alpha / 2 (the whole
    range when n is too small). None for no values."""
    if not values:
        return None
    xs, n = sorted(values), len(values)
    med = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    j = 0
    while j + 1 <= n // 2 and binomial_cdf(j, n, 0.5) <= alpha / 2:
        j += 1
    # j = the number of order statistics cut from each end: P(X <= j - 1) <= alpha/2
    lo, hi = (xs[j - 1], xs[n - j]) if j > 0 else (xs[0], xs[-1])
    return med, lo, hi


@dataclass(frozen=True)
class Verdict:
    """One detector on one run: where it stopped (None: not before the last eval) and the lag."""

    stop_step: int | None
    lag: int | None
    harmful: bool


def registry_detectors() -> list[str]:
    """Every registered detector, in the registry's order (so new ones appear automatically)."""
    return list(DETECTORS.names())


def judge_run(t: rt.Trace, hacked: bool, detector: str, planned_steps: int, rel_margin: float,
              evidence: bool = False) -> Verdict:
    """Replay ``detector`` at its registry defaults on the run's world feedback (``evidence``: with
    each eval's per-example n and paired noise)."""
    curve = Curve("world_feedback", t.steps, t.feedback, t.loss, planned_steps, evidence=t.evidence if evidence else ())
    res = replay_curve(curve, detector, planned_steps=planned_steps)
    if not (res.stopped and res.stop_step < t.steps[-1]):
        return Verdict(None, None, False)
    stop = t.steps.index(res.stop_step)
    peak = t.gold.index(max(t.gold))
    delivered = t.gold[t.steps.index(res.best_step)] if res.best_step in t.steps else t.gold[0]
    harmful = not hacked and delivered < t.gold[-1] - rel_margin * (max(t.gold) - min(t.gold))
    return Verdict(res.stop_step, stop - peak if hacked else None, harmful)


def evaluate(paths: list[Path], planned_steps: int = MAX_STEPS, rel_margin: float = REL_MARGIN,
             detectors: list[str] | None = None) -> dict[str, Any]:
    """Label every trace from its gold, replay every detector on its world feedback, count."""
    if not paths:
        raise ValueError("evaluate needs at least one trace file")
    traces = [rt.read_trace(p) for p in paths]
    runs = [{"name": t.name, "trainer": t.trainer, "hacked": label(t.gold, rel_margin),
             "gold_peak_step": t.steps[t.gold.index(max(t.gold))], "gold_min": min(t.gold),
             "gold_peak": max(t.gold), "gold_end": t.gold[-1]} for t in traces]
    hacked = sum(r["hacked"] for r in runs)
    healthy = len(runs) - hacked
    table = []
    paired = all(t.evidence for t in traces)  # per-example traces: every detector with and without the noise
    for name, evidence in [(n, e) for n in detectors or registry_detectors() for e in ((False, True) if paired else (False,))]:
        verdicts = {t.name: judge_run(t, r["hacked"], name, planned_steps, rel_margin, evidence)
                    for t, r in zip(traces, runs, strict=True)}
        tp = sum(r["hacked"] and verdicts[r["name"]].stop_step is not None for r in runs)
        fp_a = sum(not r["hacked"] and verdicts[r["name"]].stop_step is not None for r in runs)
        fp_b = sum(v.harmful for v in verdicts.values())
        lags = [v.lag for v in verdicts.values() if v.lag is not None]
        table.append({"detector": f"{name} + paired noise" if evidence else name, "params": DETECTORS.params(name),
                      "evidence": evidence, "tp": tp, "fp_a": fp_a, "fp_b": fp_b,
                      "hacked": hacked, "healthy": healthy, "precision": rt._rate(tp, tp + fp_b),
                      "recall": rt._rate(tp, hacked), "fpr": rt._rate(fp_b, healthy),
                      "fpr_label": rt._rate(fp_a, healthy), "lag": median_interval(lags), "lags": lags,
                      "stops": {k: v.stop_step for k, v in verdicts.items()}})
    return {"runs": runs, "table": table}


def fmt_lag(lag: tuple[float, float, float] | None) -> str:
    if lag is None:
        return "n/a"
    med, lo, hi = lag
    return f"{med:g} [{lo:g}, {hi:g}]"


HEADER = ("detector", "precision (B)", "recall", "FPR (B)", "FPR (A)", "lag (evals after the gold peak)")


def rows(res: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per detector (what docs/results.md shows and the test compares)."""
    return [(t["detector"], rt.fmt(t["precision"]), rt.fmt(t["recall"]), rt.fmt(t["fpr"]), rt.fmt(t["fpr_label"]),
             fmt_lag(t["lag"])) for t in res["table"]]


def markdown(res: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(res)]
    return "\n".join(lines)


def trace_paths(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-judge-s*.jsonl"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="train the runs first (those not in the folder yet)")
    ap.add_argument("--runs", type=int, default=RUNS, help=f"runs, one per seed 0..N-1 (default {RUNS})")
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS, help=f"steps per run (default {MAX_STEPS})")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY, help=f"steps between evals (default {EVAL_EVERY})")
    ap.add_argument("--workers", type=int, default=1, help="training processes side by side (default 1)")
    ap.add_argument("--traces", help="folder of JSONL traces (default configs/traces/judge, or "
                                     "configs/traces/judge-per-example with --per-example)")
    ap.add_argument("--per-example", action="store_true", help="the judge's per-example scores: each trace line also "
                    "has the eval's n and paired noise, and every detector is evaluated with and without it")
    ap.add_argument("--json", help="write the table as JSON to this file")
    ap.add_argument("--train-seeds", help=argparse.SUPPRESS)  # a worker process of --run
    args = ap.parse_args(argv)
    for opt in ("runs", "max_steps", "eval_every", "workers"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1, got {getattr(args, opt)}")
    folder = Path(args.traces or (TRACES_PER_EXAMPLE if args.per_example else TRACES))
    if args.train_seeds:
        judge = json.loads((folder / MANIFEST).read_text())["judge"]
        train_many([int(s) for s in args.train_seeds.split(",")], folder, args.max_steps, args.eval_every,
                   {k: judge[k] for k in ("mae", "correlation")}, args.per_example)
        return 0
    if args.run:
        generate(folder, args.runs, args.max_steps, args.eval_every, args.workers, args.per_example)
    paths = trace_paths(folder)
    if not paths:
        print(f"no traces under {folder}: run with --run first", file=sys.stderr)
        return 2
    planned = json.loads((folder / MANIFEST).read_text())["max_steps"] if (folder / MANIFEST).exists() else args.max_steps
    res = evaluate(paths, planned_steps=planned)
    n_hacked = sum(r["hacked"] for r in res["runs"])
    print(f"{len(paths)} real traces, {n_hacked} hacked by the gold rule (relative margin {REL_MARGIN:.0%} of "
          f"each run's gold range); detectors see the learned judge's world feedback")
    for r in res["runs"]:
        print(f"  {r['name']:<18} {'hacked' if r['hacked'] else 'healthy':<8} gold min {r['gold_min']:.3f} "
              f"peak {r['gold_peak']:.3f} (step {r['gold_peak_step']}) end {r['gold_end']:.3f}")
    print("\nEvery registered detector at its defaults; Clopper-Pearson 95% intervals (successes/trials); "
          "lag: median [95% interval]\n")
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
