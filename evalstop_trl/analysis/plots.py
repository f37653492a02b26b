"""Curve plots for the command line: ``evalstop status JOB --plot OUT.png`` and ``evalstop replay FILE
--plot OUT.png``.

World feedback, proxy reward and train loss are drawn in panels that share one step axis; the best
step (dashed, bluish green) and the stop step (solid, vermillion) are marked in every panel, and the
steps a stopped job did not have to run are shaded. Colours are the Okabe-Ito palette and every mark
also has its own line style and a label, so nothing depends on telling colours apart.

Matplotlib is imported when a plot is drawn (its Agg canvas; no GUI, no global pyplot state). The
choice of markers is pure and tested on its own:

>>> stop_step({"status": "stopped", "last_step": 140}, [], [{"kind": "stop", "at": 5.0, "evidence": {"step": 120}}])
120
>>> [(m.label, m.step, m.score) for m in pick_markers([10, 20, 30], [0.5, 0.7, 0.6], best_step=20, stop_step=30)]
[('best', 20, 0.7), ('stop', 30, 0.6)]
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .replay import Curve, ReplayResult

__all__ = ["COLORS", "FORMATS", "Marker", "pick_markers", "plot_curves", "plot_job", "plot_replay", "stop_step"]

#: Okabe-Ito colours of each series and marker
COLORS = {
    "eval_score": "#0072B2",
    "proxy_reward": "#E69F00",
    "train_loss": "#CC79A7",
    "best": "#009E73",
    "stop": "#D55E00",
    "would stop": "#56B4E9",
}
#: line style, point marker and whether the point is hollow, per marker label
_MARKER_STYLES = {"best": ("--", "o", True), "stop": ("-", "X", False), "would stop": (":", "D", True)}
_STYLES = {"eval_score": "-", "proxy_reward": "--", "train_loss": ":"}
_LABELS = {"eval_score": "world feedback (eval score)", "proxy_reward": "proxy reward", "train_loss": "train loss"}
#: file suffixes a plot can be written as
FORMATS = (".png", ".svg", ".pdf")
_STOP_KINDS = ("stop", "manual_stop")


@dataclass(frozen=True, slots=True)
class Marker:
    """A marked step: ``label`` is "best", "stop" or "would stop" (shadow mode); ``score`` is the world
    feedback reported at that step (None when that step has no eval score)."""

    label: str
    step: int
    score: float | None


def stop_step(job: Mapping[str, Any], reports: Sequence[Mapping[str, Any]],
              audit: Sequence[Mapping[str, Any]]) -> int | None:
    """The step at which a stopped job was stopped; None unless ``job["status"]`` is "stopped".

    The step named in the stop's audit evidence (a detector stop) wins; else (a manual stop) the last
    report received before the stop; else the job's last step. The dashboard's ``stopStep`` does the
    same.

    Args:
        job: the API's job object (``status``, ``last_step``).
        reports: the job's reports (``step``, ``received_at``), in step order.
        audit: the job's audit records (``kind``, ``at``, ``evidence``), oldest first.
    """
    if job.get("status") != "stopped":
        return None
    record = next((a for a in audit if a.get("kind") in _STOP_KINDS), None)
    if record is not None:
        step = (record.get("evidence") or {}).get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
        before = [r["step"] for r in reports if r.get("received_at", math.inf) <= record.get("at", -math.inf)]
        if before:
            return before[-1]
    last = job.get("last_step")
    return last if isinstance(last, int) else None


def pick_markers(steps: Sequence[int], scores: Sequence[float | None], best_step: int | None,
                 stop_step: int | None, would_stop_step: int | None = None) -> tuple[Marker, ...]:
    """The markers to draw: the best step, the stop step, the would-stop step of a shadow-mode job
    (each only when known), with the world feedback at that step when it was reported."""
    at = dict(zip(steps, scores, strict=True))
    out = []
    for label, step in (("best", best_step), ("stop", stop_step), ("would stop", would_stop_step)):
        if step is not None:
            out.append(Marker(label, step, at.get(step)))
    return tuple(out)


def _check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"cannot write a plot as {path.name!r}: the file name must end in "
                         f"{', '.join(FORMATS)}")
    return path


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def plot_curves(path: str | Path, steps: Sequence[int], series: Mapping[str, Sequence[float | None]],
                markers: Sequence[Marker] = (), *, title: str = "", note: str = "",
                planned_steps: int | None = None, labels: Mapping[str, str] | None = None) -> Path:
    """Draw ``series`` (keys ``eval_score``, ``proxy_reward``, ``train_loss``; values per step, None
    where missing) in panels on one step axis, mark ``markers``, write ``path`` (.png, .svg or .pdf).

    Series without a single value are left out. Returns the path written.

    Raises:
        ValueError: an unsupported file suffix, or no series with any value.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = _check_path(path)
    names = {**_LABELS, **(labels or {})}
    keys = [k for k in ("eval_score", "proxy_reward", "train_loss") if _finite(series.get(k, ()))]
    if not keys:
        raise ValueError("nothing to plot: no step has a world-feedback score, proxy reward or train loss")
    fig = Figure(figsize=(9, 1.2 + 2.1 * len(keys)), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    stop = next((m for m in markers if m.label == "stop"), None)
    x_end = max([*steps, planned_steps or 0, *(m.step for m in markers)])
    for ax, key in zip(axes, keys, strict=True):
        pts = [(s, v) for s, v in zip(steps, series[key], strict=True) if v is not None and math.isfinite(v)]
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, _STYLES[key], color=COLORS[key], lw=2, label=names[key],
                marker="o" if key == "eval_score" and len(xs) <= 120 else None, ms=3.5)
        ax.set_ylabel(names[key].split(" (")[0])
        ax.grid(True, color="#e3e7eb", lw=0.8)
        if stop is not None and x_end > stop.step:
            ax.axvspan(stop.step, x_end, color="#eef0f2", zorder=0,
                       label="after the stop" if key == keys[0] else None)
        for m in markers:
            line, point, hollow = _MARKER_STYLES[m.label]
            ax.axvline(m.step, color=COLORS[m.label], ls=line, lw=1.8,
                       label=f"{m.label} step {m.step}" if key == keys[0] else None)
            if key == "eval_score" and m.score is not None:
                ax.plot([m.step], [m.score], point, ms=10, color=COLORS[m.label],
                        mfc="white" if hollow else COLORS[m.label], mew=2.5, zorder=5)
    axes[0].legend(loc="best", fontsize=8, framealpha=0.9)
    axes[-1].set_xlabel("step")
    axes[-1].set_xlim(min(0, min(steps)), x_end if x_end > 0 else 1)
    if title:
        axes[0].set_title(title, loc="left", fontsize=11, fontweight="bold")
    if note:
        fig.supxlabel("\n".join(textwrap.wrap(note, 110)), fontsize=8.5, color="#444")
    fig.savefig(path)
    return path


def plot_job(path: str | Path, job: Mapping[str, Any], reports: Sequence[Mapping[str, Any]],
             audit: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Plot one job of the service from its API objects (``evalstop status JOB --plot OUT.png``).

    Args:
        job: the job object (``GET /v1/jobs/{id}``).
        reports: its reports (``GET /v1/jobs/{id}/reports``), in step order.
        audit: its audit records (``GET /v1/audit``), used to find the stop step.
    """
    if not reports:
        raise ValueError(f"job {job.get('job_id')!r} has no reports yet: nothing to plot")
    steps = [r["step"] for r in reports]
    series = {k: [r.get(k) for r in reports] for k in ("eval_score", "proxy_reward", "train_loss")}
    stop = stop_step(job, reports, audit)
    would = job.get("would_stop_step")
    markers = pick_markers(steps, series["eval_score"], job.get("best_step"), stop, would)
    decision = job.get("decision") or {}
    title = f"{job.get('job_id')} ({job.get('job_type')}): {job.get('status')}"
    if stop is not None:
        title += f" at step {stop}"
    if job.get("best_step") is not None:
        title += f"; best step {job['best_step']} ({job['best_score']:.4g})"
    note = decision.get("reason", "") if job.get("status") == "stopped" else ""
    if would is not None:  # shadow mode: where it would have stopped, and why
        title += f"; shadow: would stop at step {would}"
        note = (job.get("would_stop") or {}).get("reason", "")
    return plot_curves(path, steps, series, markers, title=title, note=note, planned_steps=job.get("planned_steps"))


def plot_replay(path: str | Path, curve: Curve, result: ReplayResult, *, detector: str = "") -> Path:
    """Plot a replayed curve (``evalstop replay FILE --plot OUT.png``): the score, the train loss
    when the file has one, and where the detector would have stopped."""
    series = {"eval_score": list(curve.scores), "train_loss": list(curve.losses)}
    markers = pick_markers(curve.steps, curve.scores, result.best_step, result.stop_step)
    what = f"stop at step {result.stop_step}" if result.stopped else "no stop"
    title = f"{curve.metric}: {detector + ' would ' if detector else ''}{what}"
    if result.best_step is not None:
        title += f"; best step {result.best_step} ({result.best_score:.4g})"
    return plot_curves(path, list(curve.steps), series, markers, title=title, note=result.reason,
                       planned_steps=curve.planned_steps, labels={"eval_score": f"world feedback ({curve.metric})"})
