"""A sequential test of the recent mean against the best earlier mean (the recommended rule until
issue 44's proxy gate; the rule whose precision held in nearly every cell of the simulator's
pre-registered sweeps, docs/results.md)."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, NamedTuple

from .base import (
    MAX_WINDOW,
    SATURATION,
    Detector,
    Observed,
    _check_int,
    _check_number,
    _continue,
    _fmt,
    _push,
    _stop,
)
from .noise import _NO_SCALE, MAX_NOISE_REL, MAX_Z, MIN_NOISE_REL, exceeds, t_quantile, third_difference


class _Sequential(NamedTuple):
    """:class:`SequentialDetector`'s state."""

    recent: tuple[float, ...] = ()  # the last 2 * window evals (signed)
    diffs: tuple[float, ...] = ()  # their third differences
    low: float = 0.0
    high: float = 0.0
    best: float | None = None  # best w-mean that ended before the last w evals
    w: int = 0  # the run length ``best`` was built for
    looks: int = 0


class SequentialDetector(Detector):
    """The recommended rule for new users: a scale-free, cadence-aware sequential drop test.

    Scores are signed so that higher is better. With ``w`` evals per ``span`` of training (``w =
    round(span * n / progress)``, between 1 and ``window``; 1 when the report has no progress), it
    compares the mean of the last ``w`` evals with the best earlier ``w``-eval mean (one that ended
    before the last ``w`` began)::

        stat = (best earlier w-mean - mean of the last w) / (sigma * sqrt(2 / w))

    and STOPs when ``stat`` exceeds a threshold that grows with the number of looks::

        threshold = t_quantile(z, k) + sqrt(2 ln(n / w))

    ``n / w`` is the number of ``w``-eval blocks seen: the best of that many block means of a flat
    run sits about ``sqrt(2 ln(n / w))`` noise units above its level, so a fixed threshold would stop
    more flat runs the more often they are evaluated; this one does not. Averaging over a fixed
    share of training (not a fixed number of evals) makes 5, 10, 20 or 40 evals per job see about
    the same evidence; the cost is that a job whose reports carry no progress (no planned steps) is
    judged eval by eval (``w = 1``).

    ``sigma`` is the job's own noise level: the root mean square of the last ``2 * window`` third
    differences of its evals over sqrt(20) (exact for independent noise, blind to any quadratic
    trend), never below ``noise_rel`` times the range of the job's evals so far (a relative floor,
    which keeps a lucky small estimate from the first few evals from stopping a run on noise).
    ``t_quantile`` widens ``z`` for the ``k`` differences the level rests on (Student's t).

    Every quantity is a difference of scores over a difference of scores, so the decisions are the
    same in any units (``a * score + b``, a > 0). No stop before ``min_evals`` evals (nor before
    ``2 w``). State: ``4 * window`` numbers; work per report O(window). Reports without an eval are
    skipped. Defaults: ``scripts/tune_detectors.py`` (tuning seeds < 1000;
    ``configs/sweep/tuning-log.jsonl``).

    Example::

        >>> from evalstop_trl.core.detectors import Observation, create_detector

        >>> det = create_detector("sequential")
        >>> scores = [0.30, 0.62, 0.80, 0.90, 0.93, 0.88, 0.74, 0.55]
        >>> [det.observe(Observation("j", 10 * (i + 1), s, progress=(i + 1) / 10)).action.value
        ...  for i, s in enumerate(scores)][-3:]
        ['continue', 'stop', 'stop']
    """

    name = "sequential"
    tuning = MappingProxyType({"z": (0.5, 0.75, 1.0, 1.5, 2.0)})

    def __init__(self, z: float = 0.75, span: float = 0.15, window: int = 8, noise_rel: float = 0.02,
                 min_evals: int = 4, direction: str = "max") -> None:
        super().__init__(direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)
        self.span = _check_number("span", span, 0.0, 1.0)
        if self.span == 0:
            raise ValueError("span must be in (0, 1], but got span=0.")
        self.window = _check_int("window", window, 1, MAX_WINDOW)
        self.noise_rel = _check_number("noise_rel", noise_rel, MIN_NOISE_REL, MAX_NOISE_REL)
        self.min_evals = _check_int("min_evals", min_evals, 2, MAX_WINDOW)
        self._sign = 1.0 if direction == "max" else -1.0

    def _start(self) -> _Sequential:
        return _Sequential()

    def run_length(self, looks: int, progress: float | None) -> int:
        """Evals per ``span`` of training, from the evals so far and the progress (1 without)."""
        if progress is None or progress <= 0:
            return 1
        if self.span * looks >= self.window * progress:
            return self.window
        # half up, with a tolerance for the rounding of looks / progress: with evenly spaced evals
        # 0.15 * 7 / 0.7 is 1.5000000000000002 and 0.15 * 4 / 0.4 is 1.4999999999999998, and w must
        # not flip between 1 and 2 from one eval to the next
        return max(1, int(self.span * looks / progress + 0.5 + 1e-9))

    @staticmethod
    def _reference(recent: tuple[float, ...], w: int, kept: int, best: float | None) -> float | None:
        """The best earlier ``w``-mean: rebuilt from the evals in memory when the cadence changed
        (or at the first eval), else updated with the ``w``-mean that ended ``w`` evals ago."""
        if w != kept:
            best = None
            prefix = [0.0]
            for v in recent:  # running sums: O(window) even if the cadence changes at every report
                prefix.append(prefix[-1] + v)
            for end in range(w, len(prefix) - w):
                m = (prefix[end] - prefix[end - w]) / w
                best = m if best is None or m > best else best
        elif len(recent) >= 2 * w:
            m = sum(recent[-2 * w:-w]) / w
            best = m if best is None or m > best else best
        return best

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        recent, diffs, low, high, best, kept, looks = rule
        y = self._sign * obs.eval_score
        if not -SATURATION <= y <= SATURATION:
            y = math.copysign(SATURATION, y)
        size = 2 * self.window
        if len(recent) >= 3:
            diffs = _push(diffs, third_difference(recent[-3], recent[-2], recent[-1], y), size)
        if not looks:
            low = high = y
        elif y < low:
            low = y
        elif y > high:
            high = y
        recent = _push(recent, y, size)
        n = looks = looks + 1
        w = self.run_length(looks, obs.progress)
        best = self._reference(recent, w, kept, best)
        rule = _Sequential(recent, diffs, low, high, best, w, looks)
        if n < self.min_evals or n < 2 * w or best is None or not diffs:
            return rule, _continue(f"{n} eval(s), need {max(self.min_evals, 2 * w, 4)}", best_step, best_score)
        rng = high - low
        k = len(diffs)
        if obs.eval_noise is None:
            sigma = max(self.noise_rel * rng, math.sqrt(sum(d * d for d in diffs) / (20.0 * k)))
        else:  # the eval's own paired noise level, on eval_n - 1 degrees of freedom
            sigma = max(self.noise_rel * rng, obs.eval_noise)
            k = max(k, obs.eval_n - 1 if obs.eval_n else 0)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        now = sum(recent[-w:]) / w
        stat = (best - now) / (sigma * math.sqrt(2.0 / w))
        threshold = t_quantile(self.z, k) + math.sqrt(2.0 * math.log(n / w))
        evidence = {"stat": stat, "threshold": threshold, "sigma": sigma, "run": w, "looks": n}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"mean of the last {w} eval(s) is {_fmt(stat)} noise units below the best earlier {w}-eval mean "
                f"(> {_fmt(threshold)} after {n} looks; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)} after {n} looks", best_step,
                               best_score, **evidence)


