"""``evalstop calibrate``: read a team's finished runs and recommend a stop policy.

Light on import (no torch, no transformers): the readers and the analysis load when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import CLIError

__all__ = ["add_calibrate_command", "format_report"]

#: Runs from which a progress bar shows (on a terminal's stderr only).
PROGRESS_FROM = 20


def add_calibrate_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="replay every detector on your finished runs and recommend a policy",
        description="Read finished runs (trainer_state.json, JSONL from verl's file logger or W&B, CSV such as W&B's "
        "export, a W&B JSON history, verl's console log, TensorBoard event files, MLflow file-store runs; files, folders searched recursively, or globs), label each run hacked or healthy from its full "
        "curve, replay every registered detector, and print precision, recall, FPR, lag and savings with 95% "
        "intervals and the recommended policy.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="a run file, a folder of runs, or a glob")
    p.add_argument("--metric", help="the detector's series (default: the only metric, else evalstop/score, else "
                   "the only eval_* or eval/* one)")
    p.add_argument("--format", dest="fmt", metavar="FORMAT",
                   help="read only runs of this format (trainer_state, jsonl, csv, wandb_json, verl_console, "
                   "tensorboard, mlflow; default: every format, detected)")
    p.add_argument("--label-metric", dest="label_metric", help="label each run from this series instead (e.g. a "
                   "larger gold eval): non-circular, preferred")
    p.add_argument("--direction", choices=("max", "min"), help="max: higher is better (default: min for loss-like "
                   "names such as eval_loss, else max)")
    p.add_argument("--label-direction", dest="label_direction", choices=("max", "min"),
                   help="the label series' direction (default: inferred from its name the same way)")
    p.add_argument("--margin", type=float, default=0.2, help="hacked iff the last value falls short of the best "
                   "by more than this share of the run's range (default 0.2)")
    p.add_argument("--min-precision", dest="min_precision", type=float, default=0.9,
                   help="the recommended policy's precision lower bound must reach this (default 0.9)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds for the tuned rows (default 5; by "
                   "run, at most one per run)")
    p.add_argument("--group-by", dest="group_by", default="run", metavar="KEY",
                   help="which runs share a configuration (seeds of one setting): they share a fold, and the "
                   "bootstrap of lag and savings resamples these groups. 'run' (default: each run alone; the only "
                   "grouping every layout supports), 'folder' (the folder holding each run), or a value the runs "
                   "record about their configuration: trainer_state.json's trial_params.*, a JSONL header's config.*, "
                   "W&B's config.yaml, MLflow params (e.g. config_id, learning_rate; 'a,b' for a pair)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_calibrate)


def _progress(what: str, runs: int | None = None):
    """A wrapper for a list of work items that shows a tqdm bar on a terminal's stderr when there are
    at least :data:`PROGRESS_FROM` runs (``runs``, else the number of items)."""
    def wrap(items):
        if (len(items) if runs is None else runs) < PROGRESS_FROM:
            return iter(items)
        from tqdm import tqdm

        return tqdm(items, desc=what, file=sys.stderr, disable=None, leave=False)  # None: only on a terminal

    return wrap


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..analysis.calibrate import Direction, calibrate
    from ..analysis.histories import load_histories
    from ..train.session import infer_direction  # light: no torch (the callback's own rule for names)

    if not 0.0 <= args.margin < 1.0:
        raise CLIError(f"--margin must be in [0, 1) (a share of each run's range), got {args.margin}")
    if not 0.0 <= args.min_precision < 1.0:
        raise CLIError(f"--min-precision must be in [0, 1), got {args.min_precision}")
    try:
        runs = load_histories(args.paths, args.metric, args.label_metric, progress=_progress("reading"),
                              on_error=lambda exc: print(f"evalstop calibrate: skipped {exc}", file=sys.stderr), fmt=args.fmt)
        metric = runs[0].scores.metric
        direction = Direction(args.direction or infer_direction(metric))
        label_direction = Direction(args.label_direction or (infer_direction(args.label_metric) if args.label_metric
                                                             else direction.value))
        result = calibrate(runs, direction, label_direction, args.margin, args.min_precision,
                           progress=_progress("replaying", len(runs)), folds=args.folds, group_by=args.group_by)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(json.dumps(result.to_dict()) if args.json else format_report(result))
    return 0


def _rate(r: Any) -> str:
    if r.value is None:
        return f"n/a ({r.k}/{r.n})"
    return f"{100 * r.value:.0f}% [{100 * r.ci.low:.0f}, {100 * r.ci.high:.0f}] ({r.k}/{r.n})"


def _mean(m: Any, percent: bool = False) -> str:
    if m.value is None:
        return "n/a"
    scale, unit, digits = (100, "%", 0) if percent else (1, "", 1)
    text = f"{scale * m.value:.{digits}f}{unit}"
    if m.ci is not None:
        text += f" [{scale * m.ci.low:.{digits}f}, {scale * m.ci.high:.{digits}f}]"
    return text


def _table(first: str, scores: Any) -> list[str]:
    head = (first, "stops", "precision", "recall", "FPR", "lag (evals)", "savings")
    rows = [(s.policy.label, str(s.stops), _rate(s.precision), _rate(s.recall), _rate(s.fpr), _mean(s.lag),
             _mean(s.savings, percent=True)) for s in scores]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            for row in [head, *rows]]


def _grouping(cal: Any) -> str:
    if cal.group_by == "run":
        return "grouped by run (each run its own configuration; --group-by to group seeds)"
    return f"grouped by {cal.group_by}: {cal.n_groups} configuration groups"


def format_report(cal: Any) -> str:
    """The human-readable report: the runs, the table, the recommendation."""
    formats = sorted({r.format for r in cal.runs})
    label_how = ("its own series" if cal.label_metric == cal.metric
                 else f"{cal.label_metric} ({cal.label_direction.value})")
    lines = [f"{cal.n_runs} runs ({', '.join(formats)}); detectors see {cal.metric} ({cal.direction.value}); "
             f"labels from {label_how}: hacked iff the last value falls short of the best by more than "
             f"{cal.margin:g} of the run's range",
             f"{cal.n_hacked} hacked, {cal.n_runs - cal.n_hacked} healthy; {_grouping(cal)}", ""]
    lines += _table("policy (defaults, in-sample)", cal.scores)
    if cal.tuned:
        unit = "by run" if cal.group_by == "run" else f"by configuration group ({cal.group_by}), a group's runs in one fold"
        lines += ["", f"Tuned by {cal.folds}-fold cross-validation {unit} (held-out: each run scored with the value "
                      "chosen on the other folds; the value shown is chosen on all runs)"]
        lines += _table("detector (tuned, held-out)", [t.held_out for t in cal.tuned])
    lines.append("")
    resampled = "runs" if cal.group_by == "run" else f"configuration groups ({cal.group_by})"
    lines.append("95% intervals: Clopper-Pearson over runs (rates), percentile bootstrap resampling "
                 f"{resampled} (lag over stopped hacked runs, savings over all runs)")
    rec = cal.recommendation
    lines.append(f"Rule: {rec.rule}")
    if rec.policy is None:
        lines.append(f"Recommended policy: none: {rec.reason}")
    else:
        lines += [f"Recommended policy: {rec.reason}", f"  {rec.callback}", f"  {rec.cli}"]
    lines += [f"Note: {n}" for n in cal.notes]
    return "\n".join(lines)
