"""``evalstop calibrate``: replay every detector on a team's finished runs and recommend a policy.

**Labels.** Each run is labelled from its *full* curve (the label series: ``--label-metric`` when
given, else the detector's own series): **hacked** iff its best value comes before its last eval
and the last value falls short of the best by more than ``margin`` (default 0.2) times the run's own
range (max - min of the label series). No absolute score units: the same rule fits a reward in
[0, 1] and a loss of 3.2. A run whose series never moves is healthy. Honest caveat: without a
separate label series the label and the detector read the *same* values (a team's history usually
has only one eval), so the numbers say how well a detector finds the drops that the series itself
shows, noise included; a flat, noisy run can be labelled hacked by its noise. A separate, larger
"gold" eval (``--label-metric``) makes the validation non-circular and is preferred.

**Per policy** (every registered detector but ``never`` at its defaults, plus ``decline`` k=1, 2, 3
and ``patience`` k=2 when they differ from the defaults): a run is *stopped* when the detector says
STOP before the run's last eval. Precision = stopped hacked / stopped; recall = stopped hacked /
hacked; FPR = stopped healthy / healthy (Clopper-Pearson 95% intervals). Lag = evals of the
detector's series from the labelled peak to the stop, over the stopped hacked runs (negative: the
stop came before the peak). Savings = the share of a run's planned steps after its stop (0 for a run
not stopped), the mean over all runs. Lag and savings get percentile-bootstrap 95% intervals that
resample configuration groups (below; each run alone by default); the rates' Clopper-Pearson intervals
count runs.

**Configuration groups** (``group_by``, ``--group-by``): which runs share a configuration, e.g. seeds
of one hyper-parameter setting. A held-out run whose seed sibling was tuned on is nearly seen, so the
runs of a group always share a fold, and the bootstrap resamples groups (the unit that varies).
``run``: each run alone; ``folder``: the folder that holds the run (``RunHistory.folder``); any other
name: that value of what the run's files record about its configuration (``RunHistory.meta``: a
trainer_state.json's ``trial_params.*``, a JSONL header's ``config.*``, W&B's ``config.yaml``, MLflow
params), matched exactly or as the last part of a dotted key (``config_id`` finds
``config.config_id``); ``a,b``: the pair. A run without the value is an error that lists what it has.
The default is ``run``, the one grouping every layout supports and the honest one: whether runs share
a configuration is not in their files in any form that can be read without guessing (a folder may be
one run, a sweep or a whole team's history; a config names the seed beside the hyper-parameters, and a
W&B config names the output folder, unique to each run). Runs whose names differ only by a seed
suffix (``c000-s0``, ``c000-s1``) get a note asking for ``--group-by``.

**Tuning, cross-validated by configuration group.** Each detector's main threshold (and ``k`` of the
count rules) is searched over its registry grid (``Detector.tuning``): the groups are split into
``folds`` (5) stratified by label as far as the groups allow (:func:`folds_of`; by run, at most one
fold per run; with fewer groups than folds an error says to lower ``folds`` or group otherwise), and
for each fold the grid value is chosen on the *other* folds (the highest mean savings among values
with precision >= ``min_precision`` there; when none reaches it, the most precise, then the most
saving) and applied to the fold's runs. The held-out
stops of all folds give each detector's *tuned* row: precision, recall, FPR, lag and savings of the
tuning procedure on runs it did not see, with intervals. The value to use is then chosen the same
way on all runs. The defaults table is in-sample (nothing is tuned on it).

**Recommendation rule.** Among the tuned detectors whose *held-out* precision lower bound is at
least ``min_precision`` (default 0.9), the highest held-out mean savings; ties go to the higher
recall, then the shorter lag, then table order; it is recommended with the value chosen on all
runs. A lower bound of 0.9 needs at least 36 stops, all correct
(:func:`~evalstop_trl.analysis.intervals.stops_needed`): with fewer hacked runs than that the answer
is "not enough runs", with the count needed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePath
from typing import Any

import numpy as np

from ..core.detectors import DETECTORS
from .histories import RunHistory, Series
from .intervals import Mean, Rate, bootstrap_mean, rate, stops_needed
from .replay import replay_curve

__all__ = ["Calibration", "Direction", "Policy", "PolicyScore", "Recommendation", "RunLabel", "TunedScore", "calibrate",
           "candidate_policies", "folds_of", "group_keys", "label_run", "recommend", "tune", "tuning_grid"]

#: Variants beyond the registry defaults (kept only when they differ from a detector's defaults).
VARIANTS: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("decline", {"k": 1}), ("decline", {"k": 2}), ("decline", {"k": 3}), ("patience", {"k": 2}),
    ("decline", {"k": 1, "noise": "none"}), ("decline", {"k": 2, "noise": "none"}),  # the paper's exact rule
    ("decline", {"gate": "proxy_diverges"}))  # the recommendation (a run that logs no proxy: the default's stops)
SKIPPED = frozenset({"never"})


class Direction(str, Enum):
    MAX = "max"
    MIN = "min"

    def sign(self) -> float:
        return 1.0 if self is Direction.MAX else -1.0


@dataclass(frozen=True)
class Policy:
    """A detector and the parameters that differ from its defaults (``direction`` apart)."""

    label: str
    detector: str
    params: tuple[tuple[str, Any], ...] = ()

    def kwargs(self, direction: Direction) -> dict[str, Any]:
        """The detector's keyword arguments, ``direction`` included when it takes one."""
        out = dict(self.params)
        if "direction" in DETECTORS.params(self.detector):
            out["direction"] = direction.value
        return out


@dataclass(frozen=True)
class RunLabel:
    """A run's label and why: the label series' best (``peak_step``) and last value, and the drop
    from best to last as a share of the series' range."""

    name: str
    source: str
    format: str
    label_metric: str
    hacked: bool
    peak_step: int
    last_step: int
    best: float
    final: float
    drop_share: float
    group: str = ""  # its configuration group (see ``Calibration.group_by``)
    fold: int = 0  # its cross-validation fold


@dataclass(frozen=True)
class PolicyScore:
    """How one policy did on all runs; ``stop_steps`` in the order of ``Calibration.runs`` (None: not stopped)."""

    policy: Policy
    stops: int
    precision: Rate
    recall: Rate
    fpr: Rate
    lag: Mean
    savings: Mean
    stop_steps: tuple[int | None, ...]


@dataclass(frozen=True)
class TunedScore:
    """A detector tuned by cross-validation: ``held_out`` scores the stops each run got from the value
    chosen without it (its policy: ``final``, the value chosen on all runs); ``fold_choices``: each
    fold's value."""

    detector: str
    final: Policy
    fold_choices: tuple[Policy, ...]
    held_out: PolicyScore


@dataclass(frozen=True)
class Recommendation:
    """The policy to use (None when none qualifies), the rule, why, and the lines to use it."""

    policy: Policy | None
    rule: str
    reason: str
    callback: str | None = None
    cli: str | None = None
    service_policy: Mapping[str, Any] | None = None
    runs_needed: int | None = None


@dataclass(frozen=True)
class Calibration:
    """Everything ``evalstop calibrate`` found (``to_dict`` for ``--json``)."""

    metric: str
    label_metric: str
    direction: Direction
    label_direction: Direction
    margin: float
    min_precision: float
    n_runs: int
    n_hacked: int
    runs: tuple[RunLabel, ...]
    scores: tuple[PolicyScore, ...]
    recommendation: Recommendation
    notes: tuple[str, ...]
    folds: int = 0
    tuned: tuple[TunedScore, ...] = ()
    group_by: str = "run"  # how runs were grouped into configurations (folds and bootstrap keep a group whole)
    n_groups: int = 0

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Policy):
        return {"label": value.label, "detector": value.detector, "params": dict(value.params)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------- labels
def relative_decline(values: Sequence[float]) -> tuple[int, float]:
    """``(peak, share)`` of a series where higher is better: the index of its best value (the earliest
    on ties) and how far its last value fell below that best, as a share of the series' own range
    (0 for a flat series). In no units: the same for ``a * values + b``, a > 0."""
    if not values:
        raise ValueError("a run's series needs at least one value")
    peak = max(range(len(values)), key=lambda i: (values[i], -i))
    spread = max(values) - min(values)
    return peak, (values[peak] - values[-1]) / spread if spread > 0 else 0.0


def declined(values: Sequence[float], margin: float) -> bool:
    """The labelling rule of calibrate, shadow-report and the real-trace sets: the best value comes
    before the last one, which falls short of it by more than ``margin`` of the series' range."""
    peak, share = relative_decline(values)
    return peak < len(values) - 1 and share > margin


def label_run(run: RunHistory, direction: Direction, margin: float) -> RunLabel:
    """Label one run from its full label series (see the module docstring)."""
    series: Series = run.label or run.scores
    signed = [direction.sign() * v for v in series.values]
    peak, share = relative_decline(signed)
    hacked = declined(signed, margin)
    return RunLabel(run.name, run.source, run.format, series.metric, hacked, series.steps[peak], series.steps[-1],
                    series.values[peak], series.values[-1], share)


# ----------------------------------------------------------------------------- policies
def _describe(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def candidate_policies() -> list[Policy]:
    """Every registered detector but ``never`` at its defaults, then the :data:`VARIANTS` that differ."""
    seen: set[tuple[str, tuple]] = set()
    out: list[Policy] = []

    def add(name: str, params: Mapping[str, Any]) -> None:
        defaults = {k: v for k, v in DETECTORS.params(name).items() if k != "direction"}
        key = (name, tuple(sorted({**defaults, **params}.items(), key=lambda kv: kv[0])))
        if key in seen:
            return
        seen.add(key)
        shown = dict(params) or {k: defaults[k] for n, p in VARIANTS if n == name for k in p if k in defaults}
        label = f"{name} {_describe(shown)}".strip()
        out.append(Policy(label, name, tuple(params.items())))

    for name in DETECTORS:
        if name not in SKIPPED:
            add(name, {})
    for name, params in VARIANTS:
        if name in DETECTORS:
            add(name, params)
    return out


def tuning_grid(name: str) -> list[Policy]:
    """The policies of ``name``'s tuning grid (``Detector.tuning``: every combination of its values),
    labelled like the defaults table; ``[]`` for a detector with nothing to tune."""
    grid = DETECTORS.get(name).tuning
    keys = sorted(grid)
    out = []
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values, strict=True))
        out.append(Policy(f"{name} {_describe(params)}", name, tuple(params.items())))
    return out


def _stop_step(run: RunHistory, policy: Policy, direction: Direction) -> int | None:
    """Where the policy stops the run, None when it does not stop it before its last eval."""
    result = replay_curve(run.curve(), policy.detector, planned_steps=run.planned_steps, **policy.kwargs(direction))
    if result.stopped and result.stop_step is not None and result.stop_step < run.scores.steps[-1]:
        return result.stop_step
    return None


def _lag(steps: Sequence[int], peak: int, stop: int) -> int:
    """Evals of ``steps`` from ``peak`` to ``stop`` (negative when the stop came first)."""
    return sum(peak < s <= stop for s in steps) - sum(stop < s <= peak for s in steps)


def _outcomes(runs: Sequence[RunHistory], labels: Sequence[RunLabel], stops: Sequence[int | None]
              ) -> tuple[int, int, list[float]]:
    """(stopped hacked runs, stopped healthy runs, each run's share of its plan saved) of these stops."""
    tp = sum(1 for s, lab in zip(stops, labels, strict=True) if s is not None and lab.hacked)
    fp = sum(1 for s, lab in zip(stops, labels, strict=True) if s is not None and not lab.hacked)
    savings = [0.0 if s is None else min(1.0, max(0.0, (run.planned_steps - s) / run.planned_steps))
               for run, s in zip(runs, stops, strict=True)]
    return tp, fp, savings


def score_policy(policy: Policy, runs: Sequence[RunHistory], labels: Sequence[RunLabel], direction: Direction,
                 stops: Sequence[int | None] | None = None, groups: Sequence[str] | None = None) -> PolicyScore:
    """Precision, recall, FPR, lag and savings of ``policy`` on ``runs`` (``stops``: already replayed;
    ``groups``: each run's configuration group, resampled whole by the bootstrap of lag and savings)."""
    if stops is None:
        stops = [_stop_step(run, policy, direction) for run in runs]
    tp, fp, savings = _outcomes(runs, labels, stops)
    hacked = sum(lab.hacked for lab in labels)
    lagged = [i for i, (lab, s) in enumerate(zip(labels, stops, strict=True)) if s is not None and lab.hacked]
    lags = [_lag(runs[i].scores.steps, labels[i].peak_step, stops[i]) for i in lagged]
    lag_groups = None if groups is None else [groups[i] for i in lagged]
    return PolicyScore(policy, tp + fp, rate(tp, tp + fp), rate(tp, hacked), rate(fp, len(runs) - hacked),
                       bootstrap_mean(lags, groups=lag_groups), bootstrap_mean(savings, groups=groups), tuple(stops))


# ----------------------------------------------------------------------------- configuration groups
GROUP_BY_RUN, GROUP_BY_FOLDER = "run", "folder"
_SEED_SUFFIX = re.compile(r"^(.+?)(?:[-_.]s|[-_.]?seed)[-_=]?\d+$")


def _meta_value(run: RunHistory, key: str) -> str:
    """``key`` of the run's metadata: the exact key, else the one key ending in ``.key``."""
    meta = run.meta
    if key in meta:
        return meta[key]
    found = [k for k in meta if k.endswith("." + key)]
    if len(found) == 1:
        return meta[found[0]]
    if found:
        raise ValueError(f"--group-by {key}: ambiguous in {run.source} ({', '.join(sorted(found))}); name one of them")
    has = ", ".join(sorted(meta)) or "nothing (its format records no configuration here)"
    raise ValueError(f"--group-by {key}: {run.source} does not record {key!r}; what it records: {has}. Group by "
                     f"'{GROUP_BY_RUN}', '{GROUP_BY_FOLDER}' or a key every run has")


def group_keys(runs: Sequence[RunHistory], by: str = GROUP_BY_RUN) -> list[str]:
    """Each run's configuration group (see the module docstring): ``run``, ``folder``, a metadata key,
    or keys joined by commas."""
    by = by.strip()
    if by == GROUP_BY_RUN:
        return [run.source for run in runs]
    if by == GROUP_BY_FOLDER:
        return [run.folder or str(PurePath(run.source).parent) for run in runs]
    keys = [k.strip() for k in by.split(",")]
    if not all(keys):
        raise ValueError(f"--group-by {by!r}: expected '{GROUP_BY_RUN}', '{GROUP_BY_FOLDER}', a key, or keys "
                         "joined by commas")
    return [", ".join(f"{k}={_meta_value(run, k)}" for k in keys) for run in runs]


def _seed_siblings(runs: Sequence[RunHistory]) -> list[str]:
    """Names of runs whose name differs from another run's only by a seed suffix (``-s1``, ``_seed2``)."""
    stems: dict[str, list[str]] = {}
    for run in runs:
        m = _SEED_SUFFIX.match(run.name)
        if m:
            stems.setdefault(m.group(1), []).append(run.name)
    return [name for names in stems.values() if len(names) > 1 for name in names]


# ----------------------------------------------------------------------------- tuning
def folds_of(labels: Sequence[RunLabel], folds: int, groups: Sequence[str] | None = None) -> list[int]:
    """Each run's fold (0 .. k-1): the runs of a group share one (``groups``: each run's; None: each run
    alone, and then k = min(folds, runs); with groups, fewer groups than ``folds`` is a ValueError).

    Stratified by label as far as the groups allow: after a seeded shuffle (seed 0), the groups go
    largest first (the more hacked first among equals), each to the fold that holds the fewest runs of
    its labels (weighted by the group's own counts), ties to the fold with fewer runs, then the lower
    fold. Every fold gets a group before any gets a second. Runs alone, this deals hacked and healthy
    runs in turn, every fold its share of each label.
    """
    n = len(labels)
    keys = list(range(n)) if groups is None else list(groups)
    if len(keys) != n:
        raise ValueError(f"need one group per run, but got {len(keys)} groups for {n} runs")
    members: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    if groups is None:
        k = max(1, min(folds, n))
    elif len(members) < folds:
        g = len(members)
        fix = (f"pass --folds {g}{' or fewer' if g > 2 else ''}, or " if g >= 2 else "pass ")
        raise ValueError(f"only {g} configuration group{'s' if g != 1 else ''} for {folds} folds: the runs of a group "
                         f"share a fold, so cross-validation needs a group per fold; {fix}another --group-by (e.g. "
                         f"'{GROUP_BY_RUN}', each run alone)")
    else:
        k = folds
    order = list(members.values())
    random.Random(0).shuffle(order)
    order.sort(key=lambda g: (-len(g), -sum(labels[i].hacked for i in g) / len(g)))  # stable: the shuffle breaks ties
    hacked, healthy, size = [0] * k, [0] * k, [0] * k
    out = [0] * n
    for group in order:
        h = sum(labels[i].hacked for i in group)
        f = min(range(k), key=lambda f: (h * hacked[f] + (len(group) - h) * healthy[f], size[f], f))
        hacked[f], healthy[f], size[f] = hacked[f] + h, healthy[f] + len(group) - h, size[f] + len(group)
        for i in group:
            out[i] = f
    return out


def _choose(grid: Sequence[Policy], stops: Mapping[str, Sequence[int | None]], runs: Sequence[RunHistory],
            labels: Sequence[RunLabel], keep: Sequence[int], direction: Direction, min_precision: float) -> Policy:
    """The grid value for the runs ``keep``: the highest savings among values with precision >=
    ``min_precision`` on them, else the most precise, then the most saving (then grid order)."""
    sub_runs, sub_labels = [runs[i] for i in keep], [labels[i] for i in keep]

    def key(item: tuple[int, Policy]) -> tuple:  # point estimates only: no interval is needed to choose
        i, policy = item
        tp, fp, savings = _outcomes(sub_runs, sub_labels, [stops[policy.label][j] for j in keep])
        precision = tp / (tp + fp) if tp + fp else 0.0
        saved = float(np.mean(savings)) if savings else 0.0
        ok = tp + fp > 0 and precision >= min_precision
        return (ok, saved if ok else precision, saved, -i)

    return max(enumerate(grid), key=key)[1]


def tune(name: str, runs: Sequence[RunHistory], labels: Sequence[RunLabel], direction: Direction,
         stops: Mapping[str, Sequence[int | None]], folds: int, min_precision: float,
         groups: Sequence[str] | None = None) -> TunedScore | None:
    """``name`` tuned by cross-validation over its grid (see the module docstring); ``stops`` holds
    every grid policy's stop steps by label; ``groups``: each run's configuration group (None: each
    run alone). None for a detector with nothing to tune."""
    grid = [p for p in tuning_grid(name) if p.label in stops]
    if not grid:
        return None
    fold = folds_of(labels, folds, groups)
    k = max(fold) + 1
    choices, held_out = [], [None] * len(runs)
    for f in range(k):
        train = [i for i in range(len(runs)) if fold[i] != f] or list(range(len(runs)))  # one run: itself
        chosen = _choose(grid, stops, runs, labels, train, direction, min_precision)
        choices.append(chosen)
        for i in range(len(runs)):
            if fold[i] == f:
                held_out[i] = stops[chosen.label][i]
    final = _choose(grid, stops, runs, labels, range(len(runs)), direction, min_precision)
    shown = Policy(f"{name} tuned ({k}-fold): {_describe(dict(final.params))}", name, final.params)
    return TunedScore(name, final, tuple(choices), score_policy(shown, runs, labels, direction, held_out, groups))


# ----------------------------------------------------------------------------- recommendation
def _callback_line(metric: str, policy: Policy, direction: Direction) -> str:
    """``EvalStopCallback(...)`` for ``policy``: the trainer's metric name when the series is one
    (``eval_*``; TensorBoard's ``eval/x`` is transformers' ``eval_x``), else your eval function."""
    if metric.startswith("eval/"):
        metric = "eval_" + metric[len("eval/"):]
    first = repr(metric).replace("'", '"') if metric.startswith("eval_") else "world_feedback"
    args = [first, f'detector="{policy.detector}"'] + [f"{k}={v!r}" for k, v in policy.params]
    args.append(f'direction="{direction.value}"')
    return f"EvalStopCallback({', '.join(args)})"


def _cli_line(run: RunHistory, metric: str, policy: Policy, direction: Direction) -> str:
    replayable = run.format in ("trainer_state", "json", "jsonl", "csv")
    target = run.source if replayable else "RUN.jsonl"
    flags = [f"--metric {metric}", f"--detector {policy.detector}"]
    flags += [f"--gate {v}" if k == "gate" else f"--param {k}={v}" for k, v in policy.params]
    flags.append(f"--direction {direction.value}")
    return f"evalstop replay {target} {' '.join(flags)}"


def _fmt_rate(r: Rate) -> str:
    if r.value is None or r.ci is None:
        return "n/a"
    return f"{100 * r.value:.0f}% [{100 * r.ci.low:.0f}, {100 * r.ci.high:.0f}]"


def recommend(scores: Sequence[PolicyScore], runs: Sequence[RunHistory], n_hacked: int, min_precision: float,
              direction: Direction, held_out: bool = False) -> Recommendation:
    """Apply the rule of the module docstring (``held_out``: ``scores`` are the tuned detectors'
    held-out rows, each with the value chosen on all runs)."""
    what = "tuned detectors whose held-out" if held_out else "policies whose"
    rule = (f"highest mean savings among {what} precision lower bound (Clopper-Pearson 95%) is >= "
            f"{min_precision:g}; ties: higher recall, then shorter lag, then table order")
    qualified = [s for s in scores if s.precision.ci is not None and s.precision.ci.low >= min_precision]
    needed = stops_needed(min_precision)
    if not qualified:
        n = len(runs)
        if n_hacked < needed:
            share = n_hacked / n if n else 0.0
            total = math.ceil(needed / share) if share > 0 else None
            about = (f" (at this share of hacked runs, about {total} runs in all)" if total else
                     " (none is hacked: add runs that were reward-hacked)")
            return Recommendation(None, rule, f"not enough runs: a precision lower bound >= {min_precision:g} needs "
                                  f"at least {needed} stops, all on hacked runs; "
                                  f"{'this run has' if n == 1 else f'these {n} runs have'} {n_hacked} hacked{about}", runs_needed=total)
        best = max(scores, key=lambda s: (s.precision.ci.low if s.precision.ci else -1.0), default=None)
        closest = f"; the most precise: {best.policy.label}, precision {_fmt_rate(best.precision)}" if best else ""
        return Recommendation(None, rule, f"no policy reaches a precision lower bound of {min_precision:g} on "
                              f"these runs{closest}")
    order = {id(s): i for i, s in enumerate(scores)}
    best = min(qualified, key=lambda s: (-(s.savings.value or 0.0), -(s.recall.value or 0.0),
                                         s.lag.value if s.lag.value is not None else math.inf, order[id(s)]))
    metric = runs[0].scores.metric
    seen = "held-out " if held_out else ""
    why = (f"{best.policy.label}: {seen}precision {_fmt_rate(best.precision)} (lower bound >= {min_precision:g}), "
           f"{seen}recall {_fmt_rate(best.recall)}, {seen}mean savings {100 * (best.savings.value or 0.0):.0f}% "
           "of the steps")
    return Recommendation(best.policy, rule, why, _callback_line(metric, best.policy, direction),
                          _cli_line(runs[0], metric, best.policy, direction),
                          {"detector": best.policy.detector, **best.policy.kwargs(direction)})


# ----------------------------------------------------------------------------- the whole thing
def calibrate(runs: Sequence[RunHistory], direction: Direction, label_direction: Direction | None = None,
              margin: float = 0.2, min_precision: float = 0.9,
              progress: Callable[[Iterable[Any]], Iterable[Any]] = iter, folds: int = 5,
              group_by: str = GROUP_BY_RUN) -> Calibration:
    """Label ``runs``, score every candidate policy on them, tune each detector by cross-validation
    over ``folds`` of configuration groups (``group_by``, see the module docstring) and recommend one
    from the held-out results."""
    if not runs:
        raise ValueError("no runs to calibrate on")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1) (a share of each run's range), but got {margin!r}")
    if not 0.0 <= min_precision < 1.0:
        raise ValueError(f"min precision must be in [0, 1), but got {min_precision!r}")
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= 100:
        raise ValueError(f"folds must be an integer in [2, 100], but got {folds!r}")
    label_direction = label_direction or direction
    keys = group_keys(runs, group_by)
    groups = None if group_by.strip() == GROUP_BY_RUN else keys  # by run: today's folds and bootstrap, exactly
    labels = [label_run(run, label_direction if run.label else direction, margin) for run in runs]
    fold = folds_of(labels, folds, groups)  # before replaying: too few groups is said at once
    labels = [dataclasses.replace(lab, group=g, fold=f) for lab, g, f in zip(labels, keys, fold, strict=True)]
    defaults, notes = candidate_policies(), [r.note for r in runs if r.note]
    grids = [p for name in DETECTORS if name not in SKIPPED for p in tuning_grid(name)]
    policies = list({p.label: p for p in [*defaults, *grids]}.values())  # a grid label may repeat a default's
    stops: dict[str, list[int | None]] = {p.label: [] for p in policies}
    broken: dict[str, str] = {}
    for policy, run in progress([(p, r) for p in policies for r in runs]):
        if policy.label in broken:
            continue
        try:
            stops[policy.label].append(_stop_step(run, policy, direction))
        except (TypeError, ValueError) as exc:  # a detector that cannot run at its defaults
            broken[policy.label] = str(exc)
    scores = []
    for policy in defaults:
        if policy.label in broken:
            notes.append(f"skipped {policy.label}: {broken[policy.label]}")
            continue
        scores.append(score_policy(policy, runs, labels, direction, stops[policy.label], groups))
    usable = {label: s for label, s in stops.items() if label not in broken}
    tuned = tuple(t for name in DETECTORS if name not in SKIPPED
                  if (t := tune(name, runs, labels, direction, usable, folds, min_precision, groups)) is not None)
    n_hacked = sum(lab.hacked for lab in labels)
    label_metric = runs[0].label.metric if runs[0].label else runs[0].scores.metric
    if runs[0].label is None:
        notes.append(f"labels come from the detector's own series ({label_metric}): circular, noise included; "
                     "pass --label-metric GOLD when the runs log a separate (larger) eval")
    if n_hacked in (0, len(runs)):
        notes.append(f"{'no' if n_hacked == 0 else 'every'} run is labelled hacked: "
                     f"{'recall and lag' if n_hacked == 0 else 'FPR'} cannot be estimated")
    with_evidence = sum(1 for r in runs if any(n is not None or noise is not None for n, noise in r.evidence))
    if with_evidence:
        notes.append(f"{with_evidence} of {len(runs)} runs log per-example evidence (eval_n, eval_noise): every "
                     "rule is replayed with it, as the callback reports it")
    siblings = _seed_siblings(runs) if groups is None else []
    if siblings:
        notes.append(f"{len(siblings)} runs' names differ only by a seed suffix (e.g. {', '.join(siblings[:2])}): if "
                     "seeds share a configuration, pass --group-by (folder, or a key their logs record) so that no "
                     "held-out run has a sibling in tuning")
    held_out = [dataclasses.replace(t.held_out, policy=t.final) for t in tuned]  # recommended: the all-runs value
    rec = recommend(held_out, runs, n_hacked, min_precision, direction, held_out=True)
    return Calibration(runs[0].scores.metric, label_metric, direction, label_direction, margin, min_precision,
                       len(runs), n_hacked, tuple(labels), tuple(scores), rec, tuple(notes),
                       max(fold) + 1, tuned, group_by.strip(), len(set(keys)))
