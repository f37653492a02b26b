"""Per-example world feedback (issue 28 item 1): the paired noise level and what the detectors make of it."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from evalstop_trl.core.detectors import DETECTORS, MAX_EXAMPLES, Action, Observation, create_detector
from evalstop_trl.core.examples import MAX_KEPT_EXAMPLES, is_per_example, paired_noise, per_example, summarize


def test_the_paired_noise_is_the_sd_of_the_differences_over_root_2m():
    prev = {"a": 0.2, "b": 0.9, "c": 0.5, "d": 0.1}
    cur = {"a": 0.3, "b": 0.7, "c": 0.5, "e": 1.0}  # "d" and "e" are not shared
    diffs = [0.1, -0.2, 0.0]
    assert paired_noise(prev, cur) == pytest.approx(statistics.stdev(diffs) / math.sqrt(2 * 3), rel=1e-12)
    assert paired_noise(prev, {"a": 1.0, "z": 0.0}) is None  # one shared example: no level
    assert paired_noise({}, cur) is None


def test_the_between_example_variance_cancels():
    """Examples of very different difficulty, each moved by a small noise: the paired level is the
    noise's, while the plain standard error sd/sqrt(n) is many times larger."""
    rng = random.Random(5)
    difficulty = [rng.uniform(0, 1) for _ in range(250)]
    first = [d + rng.gauss(0, 0.01) for d in difficulty]
    second = [d + rng.gauss(0, 0.01) for d in difficulty]
    ev = summarize(second, summarize(first, None))
    plain_se = statistics.stdev(second) / math.sqrt(250)
    assert ev.noise == pytest.approx(0.01 / math.sqrt(250), rel=0.2)  # the noise of one eval's mean
    assert plain_se > 10 * ev.noise


def test_summaries_of_sequences_mappings_and_arrays():
    np = pytest.importorskip("numpy")
    a = summarize(np.array([1.0, 0.0, 1.0]), None)
    assert (a.mean, a.n, a.noise) == (pytest.approx(2 / 3), 3, None)
    b = summarize([np.float32(1.0), 1, 0], a)  # positions pair with the array's
    assert b.n == 3 and b.noise == pytest.approx(paired_noise({0: 1.0, 1: 0.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 0.0}))
    c = summarize({"p1": 0.5, 7: 0.25}, None)
    assert c.mean == pytest.approx(0.375) and dict(c.scores) == {"p1": 0.5, 7: 0.25}
    assert is_per_example([0.5]) and is_per_example({"a": 1}) and is_per_example(np.zeros(2))
    assert not any(is_per_example(v) for v in (0.5, 1, "0.5", b"1", np.float64(0.5), np.zeros(())))


@pytest.mark.parametrize("value, message", [
    ([], "returned 0 per-example scores; give 1 to 100000"),
    ([0.5, math.nan], "the per-example score of example 1 is nan; each must be a finite number"),
    ([0.5, "x"], "the per-example score of example 1 is 'x'"),
    ({("a", 1): 0.5}, "keyed by example ids (str of at most 256 characters, or int), but got the key ('a', 1)"),
    ({"x" * 300: 0.5}, "but got the key 'xxxxx"),
    ({True: 0.5}, "but got the key True"),
])
def test_bad_per_example_scores_are_clear_errors(value, message):
    with pytest.raises(ValueError, match=_escape(message)):
        per_example(value)


def test_per_example_scores_are_bounded():
    with pytest.raises(ValueError, match=f"returned {MAX_KEPT_EXAMPLES + 1} per-example scores"):
        per_example([0.0] * (MAX_KEPT_EXAMPLES + 1))


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("kwargs, message", [
    ({"eval_score": 0.5, "eval_n": 0}, "eval_n must be an integer in [1, 1000000000]"),
    ({"eval_score": 0.5, "eval_n": MAX_EXAMPLES + 1}, "eval_n must be an integer in [1, 1000000000]"),
    ({"eval_score": 0.5, "eval_n": 2.0}, "eval_n must be an integer"),
    ({"eval_score": 0.5, "eval_n": True}, "eval_n must be an integer"),
    ({"eval_score": 0.5, "eval_noise": -0.1}, "eval_noise must be >= 0"),
    ({"eval_score": 0.5, "eval_noise": math.nan}, "eval_noise must be finite"),
    ({"eval_n": 10}, "eval_n and eval_noise describe an eval score"),
])
def test_an_observation_checks_its_evidence(kwargs, message):
    with pytest.raises(ValueError, match=_escape(message)):
        Observation("j", 1, **kwargs)


def _stops(detector, scores, eval_noise=None, n=250, **params):
    det = create_detector(detector, **params)
    for i, s in enumerate(scores):
        d = det.observe(Observation("j", 10 * i, s, eval_n=None if eval_noise is None else n,
                                    eval_noise=None if eval_noise is None or i == 0 else eval_noise))
        if d.action is Action.STOP:
            return 10 * i, d
    return None, d


def test_decline_counts_only_falls_beyond_the_paired_noise():
    wobble = [0.50, 0.52, 0.515, 0.51, 0.53, 0.525, 0.52]  # falls of 0.005: noise at a level of 0.01
    assert _stops("decline", wobble, noise="none")[0] == 30  # the paper's rule on plain numbers stops at the wobble
    for noise in ("paired", "run"):  # 0.01 in all is within 2 x sqrt(2) x 0.01 of the eval before the declines
        assert _stops("decline", wobble, eval_noise=0.01, noise=noise)[0] is None
    real = [0.50, 0.55, 0.60, 0.55, 0.50, 0.45]
    step, d = _stops("decline", real, eval_noise=0.01, noise="paired")
    assert step == 40 and d.evidence["noise"] == 0.01 and d.evidence["needed"] == pytest.approx(2 * math.sqrt(2) * 0.01)
    step, d = _stops("decline", real, eval_noise=0.01)  # the default: the larger of the paired and the run's own noise
    assert step == 40 and d.evidence["noise"] >= 0.01 and d.evidence["noise_units"] > 2
    assert _stops("decline", real, eval_noise=0.01, noise_z=0.0)[0] == _stops("decline", real, noise="none")[0]  # z=0: the paper's


@pytest.mark.parametrize("name", sorted(DETECTORS.names()))
def test_without_evidence_every_detector_decides_as_before(name):
    """A plain number (eval_n and eval_noise None) gives the decisions of a plain Observation."""
    rng = random.Random(hash(name) % 1000)
    scores = [0.5 + 0.3 * math.sin(i / 4) + rng.gauss(0, 0.02) for i in range(40)]
    a, b = create_detector(name), create_detector(name)
    for i, s in enumerate(scores):
        assert a.observe(Observation("j", i, s, progress=i / 40)) == b.observe(
            Observation("j", i, s, None, None, "rlhf", i / 40, None, None))


@pytest.mark.parametrize("name", ["drop", "trend", "cusum", "sequential"])
def test_the_noise_robust_rules_use_a_supplied_level(name):
    """A curve whose fall lies well within a large supplied noise level is not stopped, while the
    same curve with a tiny level is stopped no later than with the rule's own estimate."""
    curve = [0.30 + 0.04 * i for i in range(10)] + [0.66 - 0.03 * i for i in range(10)]
    own = _stops(name, curve)[0]
    tiny = _stops(name, curve, eval_noise=1e-4)[0]
    huge = _stops(name, curve, eval_noise=1.0)[0]
    assert tiny is not None and (own is None or tiny <= own) and huge is None, (own, tiny, huge)
