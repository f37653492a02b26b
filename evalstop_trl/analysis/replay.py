"""Replay a recorded eval curve through a detector: what would EvalStop have done?

Reads every format of :mod:`.logs` (trainer_state.json, JSONL from verl's file logger or W&B, verl's
console log, CSV including W&B's export, a W&B JSON history) and TensorBoard event files, with the
same parsers as ``evalstop calibrate`` and ``evalstop run --metric-from``. In a trainer_state.json,
entries without the metric (training-loss logs) are skipped and ``max_steps`` gives the planned
steps; in a CSV, empty cells are missing values.

The metric defaults to the only numeric column besides ``step`` (and ``epoch``), else the first
``eval_*`` key (throughput keys such as ``eval_runtime`` excluded). Points are taken in step order.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.codec import json_safe
from ..core.detectors import GATES, MAX_EXAMPLES, Action, Decision, Observation, create_detector
from ..core.examples import EVIDENCE_NAMES, evidence_keys
from ..core.klclock import KL_KEYS
from ..core.logged import LOGGED, first_logged, with_evidence

__all__ = ["Curve", "ReplayError", "ReplayResult", "load_curve", "replay_curve"]

_NOT_METRICS = {"step", "epoch", "total_flos", "global_step"}
_NOT_SCORES = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_model_preparation_time"}


def is_evidence(key: str) -> bool:
    """Whether a logged key is an eval's evidence, not a metric to watch."""
    return key.rpartition("/")[2] in EVIDENCE_NAMES  # the logged names: core.examples.evidence_keys


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message must not carry a caller's megabytes; an
    integer too long to print is described by its size)."""
    if isinstance(value, int) and abs(value) >= 10 ** 30:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def evidence_of(where: str, step: int, n: Any, noise: Any) -> tuple[int | None, float | None]:
    """One eval's logged evidence, checked: ``n`` a whole number in [1, MAX_EXAMPLES], ``noise``
    finite and >= 0 (None: not logged). Raises :class:`ReplayError` saying which value is wrong."""
    if n is not None and not (type(n) in (int, float) and 1 <= n <= MAX_EXAMPLES and float(n).is_integer()):
        raise ReplayError(f"{where}: eval_n at step {step} is {_short(n)}; the number of examples must be a whole "
                          f"number from 1 to {MAX_EXAMPLES}")
    if noise is not None and not (type(noise) in (int, float) and 0 <= noise <= sys.float_info.max):
        raise ReplayError(f"{where}: eval_noise at step {step} is {_short(noise)}; a noise level must be finite "
                          "and >= 0")
    return (None if n is None else int(n)), (None if noise is None else float(noise))


class ReplayError(ValueError):
    """A file that cannot be replayed; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Curve:
    """One job's eval curve: steps in increasing order, a score per step, the train loss if known;
    ``evidence``: each eval's per-example (n, paired noise) when recorded (empty: plain scores);
    ``kls``: the policy's KL to its reference model at each eval, the latest logged at or before its
    step (empty: the log has none); ``proxies`` and ``lengths`` the same for the proxy reward and the
    mean completion length (:mod:`~evalstop_trl.core.logged`), a stop's evidence."""

    metric: str
    steps: tuple[int, ...]
    scores: tuple[float, ...]
    losses: tuple[float | None, ...]
    planned_steps: int | None = None
    source: str = ""
    evidence: tuple[tuple[int | None, float | None], ...] = ()
    kls: tuple[float | None, ...] = ()
    proxies: tuple[float | None, ...] = ()
    lengths: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class ReplayResult:
    stopped: bool
    stop_step: int | None
    best_step: int | None
    best_score: float | None
    reason: str
    decisions: tuple[Decision, ...]

    def to_dict(self) -> dict[str, Any]:
        """The outcome, and the last decision's evidence (a stop's: the falls, the noise, the KL clock)."""
        return {
            "stopped": self.stopped,
            "stop_step": self.stop_step,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "reason": self.reason,
            "evidence": json_safe(dict(self.decisions[-1].evidence)) if self.decisions else {},
        }


def _read_rows(path: Path, fmt: str | None = None) -> tuple[Any, str, int | None]:
    """Return (rows, an iterable that may be iterated more than once; format name; planned steps), read
    by the shared parsers of :mod:`.logs`."""
    from . import logs

    if path.is_dir() and fmt in (None, "tensorboard") and not (path / "trainer_state.json").exists():
        return _tensorboard_rows(path)
    if path.is_dir():
        candidate = path / "trainer_state.json"
        if candidate.exists():
            return _read_rows(candidate, fmt)
        raise ReplayError(f"{path} is a folder without a trainer_state.json or TensorBoard event files; pass a file")
    if fmt == "tensorboard" or (fmt is None and ".tfevents." in path.name):
        return _tensorboard_rows(path)
    try:
        rows, name, planned = logs.read_rows(path, fmt)
        if name in ("trainer_state", "wandb_json"):  # a JSON document is read whole anyway
            return list(rows), name, planned
        return _Reread(path, name), name, planned  # a line format: streamed again for each pass
    except logs.LogError as exc:
        raise ReplayError(str(exc)) from None


class _Reread:
    """The rows of a line-format log, read again (streamed) at each iteration: a pass over a big log
    keeps one row at a time, never the file's rows all at once."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name

    def __iter__(self):
        from . import logs

        try:
            yield from logs.FORMATS[self.name].rows(self.path)
        except logs.LogError as exc:
            raise ReplayError(str(exc)) from None


def _tensorboard_rows(path: Path) -> tuple[list[dict[str, Any]], str, int | None]:
    """TensorBoard event files (a file, or every one under a folder) as rows, by the calibrate reader."""
    from . import logs

    files = (path,) if path.is_file() else tuple(sorted(p for p in path.rglob("*") if ".tfevents." in p.name
                                                        and p.is_file()))
    if not files:
        raise ReplayError(f"{path}: no TensorBoard event files (*tfevents*) here")
    try:
        series = logs.tensorboard_series(files)
    except logs.LogError as exc:
        raise ReplayError(str(exc)) from None
    by_step: dict[int, dict[str, Any]] = {}
    for key, points in series.items():
        for step, value in points.items():
            by_step.setdefault(step, {"step": step})[key] = value
    return [by_step[s] for s in sorted(by_step)], "tensorboard", None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _choose_metric(path: Path, rows: Any) -> str:
    keys: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in keys and k not in _NOT_METRICS and not is_evidence(k) and _is_number(v):
                keys.append(k)
    if len(keys) == 1:
        return keys[0]
    if "evalstop/score" in keys:  # what EvalStopCallback saw: the world-feedback score
        return "evalstop/score"
    evals = [k for k in keys if k.startswith("eval_") and k not in _NOT_SCORES]
    if len(evals) == 1:
        return evals[0]
    if len(evals) > 1:
        raise ReplayError(f"{path}: several evaluation metrics and none is evalstop/score: {', '.join(evals)}; "
                          "choose one with --metric (a loss wants --direction min)")
    if not keys:
        raise ReplayError(f"{path}: no numeric metric besides 'step' found")
    raise ReplayError(
        f"{path}: several metrics and none named eval_*: {', '.join(keys)}; choose one with --metric"
    )


def _step_of(path: Path, row: dict[str, Any], i: int) -> int:
    step = row.get("step")
    if _is_number(step) and float(step).is_integer() and step >= 0:
        return int(step)
    if step is None:
        raise ReplayError(f"{path}: entry {i + 1} has the metric but no 'step'")
    raise ReplayError(f"{path}: entry {i + 1} has step {step!r}; steps must be non-negative integers")


def load_curve(path: str | Path, metric: str | None = None, fmt: str | None = None, kl_metric: str | None = None) -> Curve:
    """Read ``path`` (its format detected, or ``fmt``: a name of :data:`.logs.FORMATS` or
    ``tensorboard``) and return the curve of ``metric`` (chosen as documented when None), with the
    KL of ``kl_metric`` (default: the first of :data:`~evalstop_trl.core.klclock.KL_KEYS` the log has)."""
    path = Path(path)
    rows, fmt, planned = _read_rows(path, fmt)
    if metric is None:
        metric = _choose_metric(path, rows)
    elif not any(metric in row for row in rows):
        present = sorted({k for row in rows for k, v in row.items() if k not in _NOT_METRICS})
        raise ReplayError(
            f"{path}: metric {metric!r} not found; metrics in the file: {', '.join(present) or '(none)'}"
        )
    if kl_metric is not None and not any(kl_metric in row for row in rows):
        raise ReplayError(f"{path}: KL metric {kl_metric!r} not found")
    kl_keys = (kl_metric,) if kl_metric is not None else KL_KEYS
    points: dict[int, float] = {}
    logged: dict[str, dict[int, float]] = {name: {} for name in LOGGED}  # a report's fields, by step
    evidence: dict[int, tuple[int | None, float | None]] = {}
    n_key, noise_key = evidence_keys(metric) or (None, None)
    for i, row in enumerate(rows):
        for name, (keys, low) in LOGGED.items():
            value = first_logged(row, kl_keys if name == "kl" else keys, low)
            if value is not None and (name == "kl" or "step" in row):
                logged[name][_step_of(path, row, i)] = value
        if metric not in row or row[metric] is None:
            continue
        value = row[metric]
        step = _step_of(path, row, i)
        if not _is_number(value):
            raise ReplayError(f"{path}: {metric} at step {step} is {value!r}, not a number")
        if not math.isfinite(value):
            raise ReplayError(f"{path}: {metric} at step {step} is {value!r}; scores must be finite")
        if step in points and points[step] != float(value):
            raise ReplayError(f"{path}: step {step} has two different values of {metric}: {points[step]} and {value}")
        points[step] = float(value)
        if n_key is not None and (row.get(n_key) is not None or row.get(noise_key) is not None):
            evidence[step] = evidence_of(str(path), step, row.get(n_key), row.get(noise_key))
    if not points:
        raise ReplayError(f"{path}: no entry has a value for {metric!r}")
    steps = tuple(sorted(points))
    losses = _latest(logged["train_loss"], steps)
    kls, proxies, lengths = (tuple(_latest(logged[name], steps)) if logged[name] else ()
                             for name in ("kl", "proxy_reward", "length"))
    recorded = tuple(evidence.get(s, (None, None)) for s in steps) if evidence else ()
    return Curve(metric, steps, tuple(points[s] for s in steps), tuple(losses), planned, fmt, recorded, kls,
                 proxies, lengths)


def _latest(values: dict[int, float], steps: tuple[int, ...]) -> list[float | None]:
    """At each of ``steps``, the latest of ``values`` logged at or before it (None before the first)."""
    logged = sorted(values)
    out: list[float | None] = []
    j, last = 0, None
    for s in steps:
        while j < len(logged) and logged[j] <= s:
            last = values[logged[j]]
            j += 1
        out.append(last)
    return out


def replay_curve(
    curve: Curve, detector: str = "decline", planned_steps: int | None = None, gate: str | None = None,
    **params: Any
) -> ReplayResult:
    """Feed ``curve`` to a fresh detector (with ``gate``, the policy's gate around it: ``kl_past_peak``
    reads the curve's KL, ``proxy_diverges`` its proxy reward); stop at the first STOP, which carries the proxy reward's and the completion
    length's change since the best eval when the curve has them (as the coordinator's stop does)."""
    det = create_detector(detector, **params)
    if gate is not None:
        if gate not in GATES:
            raise ReplayError(f"gate must be one of {', '.join(GATES)}, but got {gate!r}")
        det = GATES[gate](det)
    planned = planned_steps or curve.planned_steps
    decisions: list[Decision] = []
    decision: Decision | None = None
    evidence = curve.evidence or ((None, None),) * len(curve.steps)
    kls = curve.kls or (None,) * len(curve.steps)
    proxies = curve.proxies or (None,) * len(curve.steps)
    lengths = curve.lengths or (None,) * len(curve.steps)
    best_proxy = best_length = None
    for step, score, loss, (n, noise), kl, proxy, length in zip(curve.steps, curve.scores, curve.losses, evidence,
                                                                kls, proxies, lengths, strict=True):
        obs = Observation(
            job_id="replay", step=step, eval_score=score, train_loss=loss,
            progress=step / planned if planned else None, eval_n=n, eval_noise=noise, kl=kl, proxy_reward=proxy,
        )
        decision = det.observe(obs)
        if decision.best_step == step:
            best_proxy, best_length = proxy, length
        if decision.action is Action.STOP:
            decision = with_evidence(decision, best_proxy, best_length, proxy, length)
        decisions.append(decision)
        if decision.action is Action.STOP:
            return ReplayResult(True, step, decision.best_step, decision.best_score, decision.reason, tuple(decisions))
    assert decision is not None  # load_curve never returns an empty curve
    return ReplayResult(
        False, None, det.best_step, det.best_score,
        f"no stop over {len(curve.steps)} evals ({decision.reason})", tuple(decisions),
    )


def format_table(curve: Curve, result: ReplayResult) -> str:
    """A short human-readable table of the curve with the best and stop steps marked."""
    width = max(len(curve.metric), 10)
    lines = [f"{'step':>8}  {curve.metric:>{width}}  "]
    for step, score in zip(curve.steps, curve.scores, strict=True):
        mark = ""
        if step == result.best_step:
            mark = "<- best"
        if step == result.stop_step:
            mark = "<- STOP" if not mark else mark + ", STOP"
        if result.stop_step is not None and step > result.stop_step:
            mark = "(after stop)"
        lines.append(f"{step:>8}  {score:>{width}.4f}  {mark}")
    if result.stopped:
        summary = (f"STOP at step {result.stop_step}; best step {result.best_step} "
                   f"({curve.metric}={result.best_score:.4f}). Why: {result.reason}")
    else:
        summary = f"no stop; best step {result.best_step} ({curve.metric}={result.best_score:.4f}). {result.reason}"
    return "\n".join(lines + ["", summary])
