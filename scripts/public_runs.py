"""Replay every registered detector over real training logs you have locally: public runs as a check.

    python scripts/public_runs.py DIR [--metric KEY] [--json OUT]

DIR holds logs in any format ``evalstop replay`` reads (verl's console logs and file-logger JSONL, W&B
exports, TensorBoard, trainer_state.json), e.g. a local copy of the verl maintainers' example logs
(public repository ``eric-haibin-lin/verl-data``, branch ``experiments``: ``gsm8k/*.log``). Nothing is
copied into this repository: logs without a licence that allows it are read from your copy only.

For each run and detector (every registered detector at its registry defaults, ``never`` left out) it
prints whether and where the detector stops, the score of the checkpoint a platform would keep (the
best eval up to the stop) and the loss against the run's end (end score - kept score: positive is
what the stop cost; the run's own last eval is the reference, since a public run has no separate gold).

The metric defaults to the run's validation score: verl's ``val-core/.../reward/mean@1`` or
``val/test_score/...`` (the only one), else the replay's own choice. A run whose validation metric
cannot be found is listed with the reason and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalstop_trl.analysis.replay import Curve, ReplayError, load_curve, replay_curve  # noqa: E402
from evalstop_trl.core.detectors import DETECTORS, RECOMMENDED_POLICY  # noqa: E402

VALIDATION_PREFIXES = ("val-core/", "val/test_score/", "val/", "eval/", "eval_")


def logs_under(folder: Path) -> list[Path]:
    """Every file under ``folder`` that looks like a training log (hidden files and data skipped)."""
    skip = {".parquet", ".png", ".md", ".pt", ".bin", ".safetensors"}
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".") and p.suffix not in skip
                  or p.is_dir() and any(p.glob("*.tfevents.*")))


def validation_metric(path: Path) -> str | None:
    """The run's validation score's key, when exactly one key of the preferred prefixes is a score."""
    try:
        load_curve(path, "\x00no-such-metric")
    except ReplayError as exc:
        text = str(exc)
        if "metrics in the file:" not in text:
            raise
        keys = [k.strip() for k in text.split("metrics in the file:", 1)[1].split(",")]
    for prefix in VALIDATION_PREFIXES:
        found = [k for k in keys if k.startswith(prefix) and "loss" not in k and "length" not in k]
        if len(found) == 1:
            return found[0]
        reward = [k for k in found if k.endswith(("reward/mean@1", "score", "acc"))]
        if len(reward) == 1:
            return reward[0]
    return None


def policies() -> list[tuple[str, dict[str, Any]]]:
    """(label, replay_curve's keywords): every registered detector but ``never`` at its defaults, the
    paper's exact rule and the registry's recommendation (its gate reads the log's proxy reward)."""
    rows = [(name, {"detector": name}) for name in DETECTORS.names() if name != "never"]
    return rows + [("decline, paper", {"detector": "decline", "noise": "none"}),
                   ("recommended", dict(RECOMMENDED_POLICY))]


def replay_all(curve: Curve) -> list[dict[str, Any]]:
    end = curve.scores[-1]
    rows = []
    for label, policy in policies():
        res = replay_curve(curve, **policy)
        stopped = res.stopped and res.stop_step < curve.steps[-1]
        kept = res.best_score if stopped else end
        rows.append({"detector": label, "stop_step": res.stop_step if stopped else None, "kept": kept,
                     "loss_vs_end": round(end - kept, 4) if stopped else 0.0, "reason": res.reason})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="a folder of training logs you have locally")
    ap.add_argument("--metric", help="the validation key (default: found per run)")
    ap.add_argument("--json", help="write every run's rows as JSON")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"{folder}: not a folder", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    for path in logs_under(folder):
        try:
            metric = args.metric or validation_metric(path)
            if metric is None:
                print(f"{path.name}: skipped (no single validation score; name one with --metric)")
                continue
            curve = load_curve(path, metric)
        except ReplayError as exc:
            print(f"{path.name}: skipped ({str(exc)[:200]})")
            continue
        if len(curve.steps) < 3:
            print(f"{path.name}: skipped ({len(curve.steps)} evals)")
            continue
        rows = replay_all(curve)
        peak = max(curve.scores)
        out[path.name] = {"metric": metric, "evals": len(curve.steps), "last_step": curve.steps[-1],
                          "peak": peak, "end": curve.scores[-1], "rows": rows}
        print(f"\n{path.name}: {metric}, {len(curve.steps)} evals to step {curve.steps[-1]}; peak {peak:.3f}, "
              f"end {curve.scores[-1]:.3f}")
        print(f"  {'detector':<14}{'stop':>7}{'kept':>8}{'end-kept':>10}")
        for r in rows:
            stop = "-" if r["stop_step"] is None else str(r["stop_step"])
            print(f"  {r['detector']:<14}{stop:>7}{r['kept']:>8.3f}{r['loss_vs_end']:>10.3f}")
    if out:
        print("\nruns stopped at all, by detector (of", len(out), "runs):")
        for name in (r["detector"] for r in next(iter(out.values()))["rows"]):
            stops = [run for run in out.values() for r in run["rows"] if r["detector"] == name and r["stop_step"]]
            worst = max((r["loss_vs_end"] for run in out.values() for r in run["rows"] if r["detector"] == name),
                        default=0.0)
            print(f"  {name:<14}{len(stops):>3} stopped; worst loss against the end {worst:+.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if out else 1


if __name__ == "__main__":
    raise SystemExit(main())
