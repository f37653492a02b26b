"""Detectors: tables of series -> stop step / best step, and hypothesis properties."""

from __future__ import annotations

import math
import random
from types import MappingProxyType

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evalstop_trl.core.detectors import (
    DETECTORS,
    MAX_EXAMPLES,
    MAX_STEP,
    SATURATION,
    Action,
    Decision,
    NoiseLevel,
    Observation,
    RelativeNoiseLevel,
    create_detector,
    detector_params,
    least_squares_slope,
    pooled_sigma,
    relative_improvement,
    t_quantile,
    t_threshold,
    third_difference,
)
from evalstop_trl.core.records import MAX_STEP as RECORDS_MAX_STEP


def run(series, name="decline", progress=None, losses=None, **params):
    """Feed (step=10*i) observations; return (stop_step, best_step, best_score, decisions)."""
    det = create_detector(name, **params)
    decisions = []
    for i, score in enumerate(series):
        obs = Observation(
            job_id="j", step=10 * (i + 1), eval_score=score,
            train_loss=None if losses is None else losses[i],
            progress=None if progress is None else progress[i],
        )
        d = det.observe(obs)
        decisions.append(d)
        if d.action is Action.STOP:
            return obs.step, d.best_step, d.best_score, decisions
    return None, det.best_step, det.best_score, decisions


def reference_decline(series, k, min_delta, direction):
    """Independent statement of the rule over the scored points."""
    sign = 1 if direction == "max" else -1
    best_i, count, prev = None, 0, None
    for i, s in enumerate(series):
        if s is None:
            continue
        if best_i is None or sign * s > sign * series[best_i]:
            best_i = i
        count = count + 1 if prev is not None and sign * (prev - s) > min_delta else 0
        prev = s
        if count >= k:
            return 10 * (i + 1), 10 * (best_i + 1)
    return None, None if best_i is None else 10 * (best_i + 1)


@pytest.mark.parametrize(
    "k, min_delta, direction, series, stop_step, best_step",
    [
        (2, 0.0, "max", [0.5, 0.7, 0.6, 0.55], 40, 20),
        (2, 0.0, "max", [0.5, 0.7, 0.6, 0.65, 0.6, 0.5], 60, 20),
        (1, 0.0, "max", [0.5, 0.7, 0.6], 30, 20),
        (3, 0.0, "max", [0.5, 0.7, 0.6, 0.55], None, 20),
        (2, 0.0, "max", [0.5, 0.5, 0.5, 0.5], None, 10),  # ties: earliest best, no decline
        (2, 0.06, "max", [0.5, 0.7, 0.65, 0.6], None, 20),  # declines of 0.05 < min_delta
        (2, 0.04, "max", [0.5, 0.7, 0.65, 0.6], 40, 20),
        (2, 0.0, "min", [2.0, 1.5, 1.6, 1.7], 40, 20),  # loss-like metric
        (2, 0.0, "max", [0.5, None, 0.4, None, 0.3], 50, 10),  # None neither counts nor resets
        (2, 0.0, "max", [0.9, 0.8, 0.85, 0.7, 0.6], 50, 10),
    ],
)
def test_decline_table(k, min_delta, direction, series, stop_step, best_step):
    got_stop, got_best, _, _ = run(series, "decline", k=k, min_delta=min_delta, direction=direction, noise="none")
    assert (got_stop, got_best) == (stop_step, best_step)
    assert (got_stop, got_best) == reference_decline(series, k, min_delta, direction)


def test_decline_reason_reads_like_a_sentence():
    _, _, _, decisions = run([0.71, 0.69, 0.66], k=2, noise="none")
    d = decisions[-1]
    assert d.action is Action.STOP
    assert d.reason == "2 consecutive declines: 0.71 → 0.69 → 0.66 at step 30"
    assert d.evidence["scores"] == [0.71, 0.69, 0.66]
    assert d.best_step == 10 and d.best_score == 0.71


_BAR = "the declines must add up to more than {} = noise_z 2 × √2 × noise {}, paired per-example"


@pytest.mark.parametrize(
    "params, scores_noises, reasons",
    [
        # a fall of 0.02 counts as a decline, but a run of declines stops only beyond 2 x sqrt(2) x 0.05 = 0.1414
        ({}, [(0.7, 0.05), (0.68, 0.05)],
         [f"0 consecutive decline(s) of 2 ({_BAR.format('0.1414', '0.05')})",
          f"1 consecutive decline(s) of 2 ({_BAR.format('0.1414', '0.05')})"]),
        ({"k": 1}, [(0.7, 0.01), (0.6, 0.01)],
         [f"0 consecutive decline(s) of 1 ({_BAR.format('0.02828', '0.01')})",
          "1 consecutive declines: 0.7 → 0.6 at step 20: falls of 7.1 noise units, 7.1 in all (needed 2; noise 0.01, "
          "paired per-example)"]),
        ({"min_delta": 0.2}, [(0.7, 0.01), (0.6, 0.01)],
         [f"0 consecutive decline(s) of 2 (each decline must exceed min_delta 0.2; {_BAR.format('0.02828', '0.01')})"]
         * 2),
        ({"direction": "min", "noise_z": 3.0}, [(1.0, 0.1)],
         ["0 consecutive rise(s) of 2 (the rises must add up to more than 0.4243 = noise_z 3 × √2 × noise 0.1, paired "
          "per-example)"]),
        ({}, [(0.7, None), (0.6, None)], ["0 consecutive decline(s) of 2", "1 consecutive decline(s) of 2"]),
        ({"noise": "none"}, [(0.7, 0.1), (0.6, 0.1)], ["0 consecutive decline(s) of 2", "1 consecutive decline(s) of 2"]),
    ],
)
def test_a_per_example_evals_reason_names_the_noise_threshold_that_decided_it(params, scores_noises, reasons):
    det = create_detector("decline", **params)
    got = [det.observe(Observation("j", 10 * (i + 1), s, eval_n=None if noise is None else 32, eval_noise=noise)).reason
           for i, (s, noise) in enumerate(scores_noises)]
    assert got == reasons


def test_stop_is_sticky():
    det = create_detector("decline", k=1)
    det.observe(Observation("j", 1, 0.5))
    stop = det.observe(Observation("j", 2, 0.4))
    assert det.observe(Observation("j", 3, 0.9)) is stop


@pytest.mark.parametrize(
    "k, min_delta, series, stop_step, best_step",
    [
        (2, 0.0, [0.5, 0.7, 0.7, 0.7], 40, 20),  # flat stops patience, not decline
        (2, 0.0, [0.5, 0.7, 0.6, 0.8, 0.75, 0.79], 60, 40),
        (2, 0.1, [0.5, 0.55, 0.58, 0.9], 30, 30),  # small gains do not reset the counter
        (3, 0.0, [0.5, 0.4, 0.6, 0.5, 0.5, 0.5], 60, 30),
    ],
)
def test_patience_table(k, min_delta, series, stop_step, best_step):
    got_stop, got_best, _, _ = run(series, "patience", k=k, min_delta=min_delta)
    assert (got_stop, got_best) == (stop_step, best_step)


def test_decline_and_patience_differ_on_a_plateau():
    plateau = [0.5, 0.8, 0.8, 0.8, 0.8]
    assert run(plateau, "decline", k=2)[0] is None
    assert run(plateau, "patience", k=2)[0] == 40


@pytest.mark.parametrize(
    "fraction, progress, stop_step",
    [(0.65, [0.2, 0.4, 0.6, 0.8], 40), (0.6, [0.2, 0.4, 0.6, 0.8], 30), (0.65, None, None), (1.0, [0.5, 0.99], None)],
)
def test_stop_at_table(fraction, progress, stop_step):
    assert run([0.1, 0.2, 0.3, 0.4][: len(progress or [0] * 4)], "stop_at", progress=progress, fraction=fraction)[0] == stop_step


@pytest.mark.parametrize(
    "window, tolerance, losses, stop_step",
    [
        (2, 0.03, [1.0, 0.8, 0.7, 0.69, 0.685], 50),
        (2, 0.03, [1.0, 0.8, 0.6, 0.45, 0.35], None),
        (1, 0.1, [1.0, 0.95], 20),
        (2, 0.03, [1.0, None, 0.99, None, 0.985], 50),  # None losses skipped
    ],
)
def test_loss_plateau_table(window, tolerance, losses, stop_step):
    series = [0.1 * i for i in range(len(losses))]
    assert run(series, "loss_plateau", losses=losses, window=window, tolerance=tolerance)[0] == stop_step


def test_never_tracks_best_but_never_stops():
    stop, best, score, _ = run([0.3, 0.9, 0.1, 0.0, -1.0], "never")
    assert stop is None and best == 20 and score == 0.9


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("nope", {}, "valid detectors are: cusum, decline, drop, loss_plateau, never, patience, sequential, stop_at, trend"),
        ("decline", {"kk": 2}, "Unknown parameter(s) kk for detector 'decline'; valid parameters are: k, min_delta, noise, noise_z, direction"),
        ("decline", {"k": 0}, "k must be an integer in [1, 1000], but got k=0."),
        ("decline", {"k": 1.5}, "k must be an integer in [1, 1000]"),
        ("patience", {"min_delta": -1}, "min_delta must be a finite number in [0, 1e+06]"),
        ("decline", {"direction": "up"}, "direction must be 'max' or 'min'"),
        ("stop_at", {"fraction": 0}, "fraction must be in (0, 1]"),
        ("loss_plateau", {"window": 0}, "window must be an integer in [1, 1000]"),
        ("never", {"k": 2}, "Unknown parameter(s) k for detector 'never'"),
        ("drop", {"window": 0}, "window must be an integer in [1, 1000], but got window=0."),
        ("drop", {"z": -1}, "z must be a finite number in [0, 100], but got z=-1."),
        ("drop", {"noise_prior": 0}, "noise_prior must be a finite number in [1e-12, 1e+06], but got noise_prior=0."),
        ("trend", {"noise_prior": 5e-324}, "noise_prior must be a finite number in [1e-12, 1e+06], "
                                           "but got noise_prior=5e-324."),
        ("cusum", {"noise_prior": 1e7}, "noise_prior must be a finite number in [1e-12, 1e+06], but got noise_prior="),
        ("drop", {"prior_evals": 0}, "prior_evals must be a finite number in [0.001, 1000], but got prior_evals=0."),
        ("cusum", {"prior_evals": 1e-4}, "prior_evals must be a finite number in [0.001, 1000], but got prior_evals="),
        ("trend", {"window": 1}, "window must be an integer in [2, 1000], but got window=1."),
        ("trend", {"prior_evals": 1e9}, "prior_evals must be a finite number in [0.001, 1000]"),
        ("cusum", {"threshold": math.inf}, "threshold must be a finite number in [0, 100]"),
        ("cusum", {"k": 2}, "Unknown parameter(s) k for detector 'cusum'; valid parameters are: window, drift, "
                            "threshold, noise_prior, noise_rel, prior_evals, direction"),
        ("drop", {"noise_rel": 0}, "noise_rel must be a finite number in [1e-06, 100], but got noise_rel=0."),
        ("sequential", {"span": 0}, "span must be in (0, 1], but got span=0."),
        ("sequential", {"min_evals": 1}, "min_evals must be an integer in [2, 1000], but got min_evals=1."),
        ("sequential", {"noise_prior": 0.1}, "Unknown parameter(s) noise_prior for detector 'sequential'"),
    ],
)
def test_registry_errors(name, params, message):
    with pytest.raises(ValueError) as exc:
        create_detector(name, **params)
    assert message in str(exc.value)


def test_registry_lists_every_detector_with_params():
    assert set(DETECTORS) == {"decline", "patience", "stop_at", "loss_plateau", "drop", "trend", "cusum", "sequential", "never"}
    assert detector_params("decline") == {"k": 2, "min_delta": 0.0, "noise": "run", "noise_z": 2.0, "direction": "max"}


@pytest.mark.parametrize("field", ["eval_score", "train_loss", "proxy_reward"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_rejected(field, bad):
    with pytest.raises(ValueError, match=f"{field} must be finite"):
        Observation("j", 1, **{field: bad})


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_bad_steps_are_rejected(step):
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        Observation("j", step)


def test_steps_are_bounded_like_the_service():
    assert MAX_STEP == RECORDS_MAX_STEP == 2**53
    assert Observation("j", MAX_STEP).step == MAX_STEP
    with pytest.raises(ValueError, match=r"step must be at most 9007199254740992, but got 9007199254740993\."):
        Observation("j", MAX_STEP + 1)


# ----------------------------------------------------------------------------- properties
scores = st.floats(min_value=-10, max_value=10, allow_nan=False, width=32)
series_st = st.lists(st.one_of(scores, st.none()), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(scores, min_size=1, max_size=30), st.integers(1, 4))
def test_non_decreasing_never_stops(values, k):
    assert run(sorted(values), "decline", k=k)[0] is None


@settings(max_examples=200, deadline=None)
@given(series_st, st.integers(1, 4), st.sampled_from([0.0, 0.01, 0.1]), st.sampled_from(["max", "min"]))
def test_decline_matches_reference(series, k, min_delta, direction):
    got = run(series, "decline", k=k, min_delta=min_delta, direction=direction, noise="none")
    assert (got[0], got[1]) == reference_decline(series, k, min_delta, direction)


@settings(max_examples=100, deadline=None)
@given(st.floats(-5, 5, allow_nan=False), st.lists(st.floats(0.01, 1), min_size=1, max_size=10),
       st.integers(1, 5))
def test_stops_exactly_at_kth_consecutive_decline(start, drops, k):
    series = [start]
    for d in drops:
        series.append(series[-1] - d)
    stop = run(series, "decline", k=k, noise="none")[0]
    expected = 10 * (k + 1) if len(drops) >= k else None
    assert stop == expected


@settings(max_examples=200, deadline=None)
@given(series_st, st.integers(1, 3), st.floats(0, 0.5), st.floats(0, 0.5))
def test_larger_min_delta_never_stops_earlier(series, k, d1, d2):
    lo, hi = sorted((d1, d2))
    s_lo = run(series, "decline", k=k, min_delta=lo)[0]
    s_hi = run(series, "decline", k=k, min_delta=hi)[0]
    if s_hi is not None:
        assert s_lo is not None and s_lo <= s_hi


@settings(max_examples=200, deadline=None)
@given(series_st, st.integers(1, 3), st.sampled_from([0.0, 0.05]), st.sampled_from(["decline", "patience"]))
def test_min_mirrors_max_on_negated_series(series, k, min_delta, name):
    neg = [None if s is None else -s for s in series]
    a = run(series, name, k=k, min_delta=min_delta, direction="max")
    b = run(neg, name, k=k, min_delta=min_delta, direction="min")
    assert a[0] == b[0] and a[1] == b[1]


# ----------------------------------------------------------------------------- noise-robust detectors
@pytest.mark.parametrize("ys, d3", [((0, 0, 0, 0), 0), ((1, 2, 3, 4), 0), ((0, 1, 4, 9), 0), ((0, 0, 0, 1), 1),
                                    ((1, 0, 0, 0), -1), ((0.2, 0.6, 1.0, 1.0), -0.4)])
def test_third_difference_cancels_quadratics(ys, d3):
    assert third_difference(*ys) == pytest.approx(d3)


@pytest.mark.parametrize("z, dof, expected", [(2.0, 3, 2 + 10 / 12), (1.5, 5, 1.5 + 4.875 / 20), (1.0, 1e9, 1.0)])
def test_t_threshold_widens_for_few_degrees_of_freedom(z, dof, expected):
    assert t_threshold(z, dof) == pytest.approx(expected)


@pytest.mark.parametrize("prior, weight, sum_sq, n, expected", [
    (0.05, 2, 0.0, 0, 0.05), (0.05, 2, 0.008, 1, math.sqrt(0.013 / 3)), (0.1, 1, 0.0, 3, 0.05)])
def test_pooled_sigma(prior, weight, sum_sq, n, expected):
    assert pooled_sigma(prior, weight, sum_sq, n) == pytest.approx(expected)


@pytest.mark.parametrize("points, slope, sxx", [([(10, 1.0), (20, 0.9), (30, 0.8), (40, 0.7)], -0.01, 500),
                                                ([(1, 5.0), (1, 6.0)], 0.0, 0.0), ([(0, 0.0), (2, 1.0)], 0.5, 2.0)])
def test_least_squares_slope(points, slope, sxx):
    assert least_squares_slope(points) == pytest.approx((slope, sxx))


def test_noise_level_ignores_smooth_curves_and_finds_the_noise():
    smooth = NoiseLevel(0.05, 2.0)
    for i in range(50):
        smooth = smooth.add(1.0 + 0.3 * i - 0.01 * i * i)  # a quadratic: every third difference is 0
    assert smooth.n == 47 and smooth.sigma == pytest.approx(0.05 * math.sqrt(2 / 49))
    import random

    rng, noisy = random.Random(0), NoiseLevel(0.05, 2.0)
    for i in range(4000):
        noisy = noisy.add(math.sin(i / 200) + rng.gauss(0, 0.1))
    assert noisy.sigma == pytest.approx(0.1, rel=0.05)


PRIOR = {"noise_prior": 0.05, "prior_evals": 2.0}


@pytest.mark.parametrize(
    "name, params, series, stop_step, best_step",
    [
        # hand-checked: at step 60 the last two evals average 0.4, the best earlier pair 1.0; the noise
        # estimate is sqrt((2 * 0.05^2 + 0.4^2/20 + 0 + 0.4^2/20) / 5) = 0.0648: 9.3 noise units > 1.74
        ("drop", {"window": 2, "z": 1.5}, [0.2, 0.6, 1.0, 1.0, 0.6, 0.2], 60, 30),
        ("drop", {"window": 2, "z": 1.5}, [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], None, 60),  # rising: never
        ("drop", {"window": 1, "z": 1.5}, [0.5, 0.6, 0.58, 0.61], None, 40),  # a dip within the noise
        ("drop", {"window": 1, "z": 1.5}, [0.5, 0.6, 0.4], 30, 20),  # 0.2 below the best single eval
        ("drop", {"window": 2, "z": 1.5}, [0.5, None, 0.6, 0.7, None, 0.3, 0.2], 70, 40),  # None is skipped
        # hand-checked: slope -0.01 per step over steps 10-40, Sxx 500, sigma 0.05 (the third difference
        # is 0): t = 0.01 * sqrt(500) / 0.05 = 4.47 > t_threshold(2, 3) = 2.83
        ("trend", {"window": 4, "z": 2.0}, [1.0, 0.9, 0.8, 0.7], 40, 10),
        ("trend", {"window": 4, "z": 5.0}, [1.0, 0.9, 0.8, 0.7], None, 10),  # 4.47 < 5 + ...
        ("trend", {"window": 3, "z": 2.0}, [0.1, 0.5, 0.9, 0.8, 0.9, 1.0], None, 60),
        # cusum: shortfalls below the best mean, in noise units, minus the drift, add up
        ("cusum", {"window": 1, "drift": 0.5, "threshold": 3.0}, [1.0, 0.9, 0.85], 30, 10),
        ("cusum", {"window": 1, "drift": 0.5, "threshold": 3.0}, [1.0, 0.99, 1.0, 0.99, 1.0], None, 10),
        ("cusum", {"window": 2, "drift": 0.0, "threshold": 3.0}, [0.0, 1.0, 1.0, 0.5], 40, 20),
    ],
)
def test_noise_robust_table(name, params, series, stop_step, best_step):
    got_stop, got_best, _, decisions = run(series, name, **params, **PRIOR)
    assert (got_stop, got_best) == (stop_step, best_step)
    if stop_step is not None:
        assert "noise" in decisions[-1].reason and decisions[-1].evidence["threshold"] > 0


def test_drop_reason_and_evidence():
    d = run([0.2, 0.6, 1.0, 1.0, 0.6, 0.2], "drop", window=2, z=1.5, **PRIOR)[3][-1]
    assert d.action is Action.STOP
    assert d.evidence["z"] == pytest.approx(0.6 / math.sqrt(0.021 / 5))
    assert d.evidence["threshold"] == pytest.approx(t_threshold(1.5, 5))
    assert d.reason.startswith("mean of the last 2 evals is 0.6 below the best 2-eval mean")


@pytest.mark.parametrize("name", ["drop", "trend", "cusum"])
def test_noise_robust_memory_is_bounded_by_the_window(name):
    det = create_detector(name, window=3)
    for i in range(5000):
        det.observe(Observation("j", i, float(i % 7) * 0.01 + i, None, None, "rlhf", None))
    windows = [v for v in det.state.rule if isinstance(v, tuple) and not hasattr(v, "_fields")]
    assert windows and all(len(w) <= 3 for w in windows) and len(det.state.rule[0].last) <= 3


@settings(max_examples=200, deadline=None)
@given(st.lists(scores, min_size=1, max_size=30), st.sampled_from(["drop", "trend", "cusum"]), st.integers(2, 4))
def test_noise_robust_never_stop_a_non_decreasing_series(values, name, window):
    assert run(sorted(values), name, window=window, z=0.0, **PRIOR)[0] is None if name != "cusum" else \
        run(sorted(values), name, window=window, drift=0.0, threshold=0.0, **PRIOR)[0] is None


@settings(max_examples=200, deadline=None)
@given(series_st, st.sampled_from(["drop", "trend", "cusum"]), st.integers(2, 3))
def test_noise_robust_min_mirrors_max(series, name, window):
    neg = [None if s is None else -s for s in series]
    a = run(series, name, window=window, direction="max")
    b = run(neg, name, window=window, direction="min")
    assert a[0] == b[0] and a[1] == b[1]


def test_noise_robust_defaults_are_relative():
    """Issue 18: no absolute constant in score units by default (noise_prior None = relative)."""
    for name in ("drop", "trend", "cusum"):
        params = detector_params(name)
        assert params["noise_prior"] is None and 0 < params["noise_rel"] <= 1, name
        assert isinstance(create_detector(name).noise, RelativeNoiseLevel)
        assert isinstance(create_detector(name, noise_prior=0.03).noise, NoiseLevel)
    assert detector_params("drop")["window"] == 2 and detector_params("trend")["window"] == 5


#: Decisions of the pre-issue-18 code (commit cdbeba3) with an absolute noise_prior=0.03: a stored
#: policy that names it must replay exactly as before (stop step, best step, first evidence value).
OLD_ABSOLUTE = [
    ("drop", [0.7145, 0.9583, 0.9762, 0.9709, 0.8265, 0.535, 0.3292, -0.0214], (50, 30, 2.111146)),
    ("trend", [0.7145, 0.9583, 0.9762, 0.9709, 0.8265, 0.535, 0.3292, -0.0214], (60, 30, 10.477666)),
    ("cusum", [0.7145, 0.9583, 0.9762, 0.9709, 0.8265, 0.535, 0.3292, -0.0214], (50, 30, 4.278724)),
    ("drop", [0.5538, 0.7113, 0.8633, 0.9905, 0.9494, 0.9902, 0.9271, 0.9312, 0.8568, 0.7803], (90, 40, 2.189797)),
    ("trend", [0.5538, 0.7113, 0.8633, 0.9905, 0.9494, 0.9902, 0.9271, 0.9312, 0.8568, 0.7803], (80, 40, 1.276342)),
    ("cusum", [0.5538, 0.7113, 0.8633, 0.9905, 0.9494, 0.9902, 0.9271, 0.9312, 0.8568, 0.7803], (90, 40, 4.865546)),
]


@pytest.mark.parametrize("name, series, expected", OLD_ABSOLUTE)
def test_an_absolute_noise_prior_replays_as_before(name, series, expected):
    stop, best, _, decisions = run(series, name, noise_prior=0.03)
    assert (stop, best, round(next(iter(decisions[-1].evidence.values())), 6)) == expected


def test_relative_noise_level_scales_with_the_units():
    import random

    rng = random.Random(3)
    ys = [math.sin(i / 5) + rng.gauss(0, 0.1) for i in range(30)]
    base = RelativeNoiseLevel(0.1, 4.0)
    for y in ys:
        base = base.add(y)
    for a, b in [(0.01, -50.0), (100.0, 3.0)]:
        other = RelativeNoiseLevel(0.1, 4.0)
        for y in ys:
            other = other.add(a * y + b)
        assert other.sigma == pytest.approx(a * base.sigma, rel=1e-9) and other.dof == base.dof
    flat = RelativeNoiseLevel(0.1, 4.0)
    for _ in range(5):
        flat = flat.add(2.0)
    assert flat.sigma == 0.0  # every eval equal: no scale (the rules then never stop)
    assert all(d.action is Action.CONTINUE for d in run([2.0] * 8, "drop", window=1, z=0.0)[3])


@pytest.mark.parametrize("z", [0.5, 1.0, 1.5, 2.0, 2.5])
def test_t_quantile_against_the_exact_quantiles_of_one_and_two_degrees(z):
    p = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    exact1 = math.tan(math.pi * (p - 0.5))  # Cauchy
    exact2 = (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
    assert t_quantile(z, 2) == pytest.approx(exact2, rel=0.04)
    if z <= 1.5:
        assert t_quantile(z, 1) == pytest.approx(exact1, rel=0.04)
    assert t_quantile(z, 1e6) == pytest.approx(z, rel=1e-5)
    assert t_quantile(z, 3) > t_quantile(z, 10) > z


# ----------------------------------------------------------------------------- sequential (issue 18)
def _progress(n):
    return [(i + 1) / n for i in range(n)]


@pytest.mark.parametrize(
    "series, n_total, params, stop_step",
    [
        # hand-checked: 10 evals, span 0.15 -> w = 2; at the 7th eval the best earlier 2-eval mean is
        # 0.915, the last two average 0.81, the noise is the floor 0.02 * range 0.63 = 0.0126:
        # 0.105 / 0.0126 = 8.3 > t_quantile(0.75, 4) + sqrt(2 ln 3.5) = 2.41
        ([0.30, 0.62, 0.80, 0.90, 0.93, 0.88, 0.74, 0.55], 10, {}, 70),
        ([0.30, 0.62, 0.80, 0.90, 0.93, 0.88, 0.74, 0.55], 10, {"z": 10.0}, None),
        ([0.1 * i for i in range(12)], 12, {}, None),  # rising: never
        ([1.0] * 12, 12, {}, None),  # every eval equal: no noise scale, never
        ([0.5, 0.9, 0.2, 0.1, 0.0], 10, {"min_evals": 6}, None),  # fewer than min_evals
        # at 4 evals the noise rests on one third difference (1.7 / sqrt 20 = 0.38): 1.49 < 3.47
        ([0.5, 0.9, 0.2, 0.1], 10, {}, None),
        # 40 evals, span 0.15 -> w = 6: a single eval 4 noise units low is averaged away (see below)...
        ([1.0, 1.02] * 10 + [0.92] + [1.0, 1.02] * 9 + [1.0], 40, {}, None),
        # ...a sustained fall of the same size is not: the last 6 evals' mean is 3.3 > 2.4 units low
        ([1.0, 1.02] * 10 + [0.95, 0.93, 0.92, 0.9, 0.9, 0.88, 0.86], 40, {}, 230),
    ],
)
def test_sequential_table(series, n_total, params, stop_step):
    got, _, _, decisions = run(series, "sequential", progress=_progress(n_total)[:len(series)], **params)
    assert got == stop_step
    if stop_step is not None:
        ev = decisions[-1].evidence
        assert ev["stat"] > ev["threshold"] > 0 and "noise units below" in decisions[-1].reason


def test_sequential_without_progress_judges_eval_by_eval():
    series = [1.0, 1.02] * 10 + [0.92] + [1.0, 1.02] * 9 + [1.0]  # the single low eval of the table
    assert run(series, "sequential")[0] == 210  # no progress: w = 1, and it is 3.6 > 3.2 noise units low


def test_sequential_averages_over_a_share_of_training_when_progress_is_known():
    det = create_detector("sequential", span=0.1, window=8)
    for i in range(12):
        d = det.observe(Observation("j", i + 1, 0.1 * (i % 3), progress=(i + 1) / 40))
    assert d.evidence["run"] == 4 and d.evidence["looks"] == 12  # 0.1 x 40 evals
    no_progress = create_detector("sequential")
    for i in range(12):
        d = no_progress.observe(Observation("j", i + 1, 0.1 * (i % 3)))
    assert d.evidence["run"] == 1  # judged eval by eval


@pytest.mark.parametrize("n_total, span, w", [(10, 0.15, 2), (5, 0.15, 1), (20, 0.15, 3), (40, 0.15, 6),
                                             (10, 0.25, 3), (30, 0.05, 2), (7, 0.5, 4)])
def test_sequential_run_length_is_the_same_at_every_eval(n_total, span, w):
    """w = span x evals per job, half rounded up, at every eval (not flipping with float rounding)."""
    det = create_detector("sequential", span=span)
    for i in range(n_total):
        det.observe(Observation("j", i + 1, float(i % 2), progress=(i + 1) / n_total))
        assert det.state.rule.w == w, (i, det.state.rule.w)


def test_sequential_threshold_grows_with_the_looks():
    det = create_detector("sequential", span=0.1)
    thresholds = []
    for i in range(40):
        d = det.observe(Observation("j", i + 1, 1.0 + 0.01 * (-1) ** i, progress=(i + 1) / 40))
        if "threshold" in d.evidence:
            thresholds.append((d.evidence["looks"], d.evidence["threshold"]))
    late = [t for n, t in thresholds if n >= 20]
    assert late == sorted(late) and late[-1] > late[0] + 0.3


# ----------------------------------------------------------------------------- units (issue 18)
#: Detectors that read the eval score: decisions must not depend on the score's units. Exceptions:
#: ``stop_at`` (progress only), ``loss_plateau`` (reads the train loss; its tolerance is relative),
#: ``never``; and an explicit absolute ``noise_prior`` or ``min_delta`` (in score units by design).
SCORE_READERS = {
    "decline": [{}, {"k": 3}],
    "patience": [{}, {"k": 3}],
    "drop": [{}, {"window": 1, "z": 2.0}],
    "trend": [{}, {"window": 3}],
    "cusum": [{}, {"drift": 0.5}],
    "sequential": [{}, {"span": 0.05, "z": 0.5}],
}


def test_every_score_reading_detector_is_in_the_units_table():
    assert set(SCORE_READERS) == set(DETECTORS) - {"stop_at", "loss_plateau", "never"}


def _units_series():
    """Curves like the simulator's (rise, peak, fall or plateau) with noise, 5 to 40 evals."""
    import random

    rng = random.Random(18)
    out = []
    for i in range(60):
        n = (5, 10, 20, 40)[i % 4]
        peak, sigma = rng.uniform(0.2, 3.0), rng.choice([0.02, 0.05, 0.12, 0.2])
        xs = [(j + 1) / n / peak for j in range(n)]
        out.append([x * (1 - math.log(x)) + rng.gauss(0, sigma) for x in xs])
    return out


UNITS_SERIES = _units_series()


def _stops(name, params, series, a, b):
    det = create_detector(name, **params)
    n = len(series)
    for i, y in enumerate(series):
        d = det.observe(Observation("j", 100 * (i + 1), a * y + b, progress=(i + 1) / n))
        if d.action is Action.STOP:
            return i, d.best_step
    return None, det.best_step


@pytest.mark.parametrize("name, params", [(n, p) for n, ps in SCORE_READERS.items() for p in ps])
def test_decisions_do_not_depend_on_the_score_units(name, params):
    stopped = 0
    for series in UNITS_SERIES:
        base = _stops(name, params, series, 1.0, 0.0)
        stopped += base[0] is not None
        for a in (0.01, 0.1, 10.0, 100.0):
            for b in (-50.0, 0.0, 3.0):
                assert _stops(name, params, series, a, b) == base, (name, params, a, b, series)
    assert 0 < stopped < len(UNITS_SERIES)  # the table exercises both outcomes


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(SCORE_READERS)),
       ticks=st.lists(st.integers(-40, 40), min_size=4, max_size=30),
       with_progress=st.booleans())
@example(name="cusum", ticks=[0, 9, -9, 0], with_progress=False)  # its statistic lands on the threshold
def test_units_property(name, ticks, with_progress):
    """Any series on a grid of eighths (ties included), any of the units: the same decisions."""
    series = [t / 8 for t in ticks]
    n = len(series)

    def stops(a, b):
        det = create_detector(name)
        for i, y in enumerate(series):
            d = det.observe(Observation("j", 10 * (i + 1), a * y + b, progress=(i + 1) / n if with_progress else None))
            if d.action is Action.STOP:
                return i, d.best_step
        return None, det.best_step

    base = stops(1.0, 0.0)
    for a in (0.01, 0.1, 10.0, 100.0):
        for b in (-50.0, 0.0, 3.0):
            assert stops(a, b) == base, (a, b)


def test_win_rates_on_a_k_over_n_grid_decide_the_same_in_any_units():
    """Issue 28 item 5: scores k/250 (a win rate over 250 prompts) put statistics exactly on their
    thresholds; every score-reading detector still decides the same in every unit."""
    rng = random.Random(28)
    for _ in range(60):
        k, series = 125, []
        for _ in range(12):
            k = min(250, max(0, k + rng.choice((-9, -5, -1, 0, 1, 4, 9))))
            series.append(k / 250)
        for name in sorted(SCORE_READERS):
            base = _stops(name, {}, series, 1.0, 0.0)
            for a, b in ((0.01, 0.0), (100.0, 0.0), (1.0, 3.0), (10.0, -50.0)):
                assert _stops(name, {}, series, a, b) == base, (name, series, a, b)


def test_a_decline_exactly_at_the_paired_noise_is_a_tie_in_every_unit():
    """Win rates over 250 prompts: 6 prompts lose and 3 win between two evals, so the fall (3/250) is
    exactly sqrt(2) * the paired noise level ((a - b)^2 = a + b); rounding puts it on either side of
    the threshold depending on the units. A tie is within the noise: no decline, in every unit."""
    from evalstop_trl.core.examples import paired_noise

    before = {i: float(i < 125) for i in range(250)}
    after = dict(before)
    for i in range(6):
        after[i] = 0.0  # six wins lost
    for i in range(125, 128):
        after[i] = 1.0  # three gained
    noise = paired_noise(before, after)
    mean_before, mean_after = sum(before.values()) / 250, sum(after.values()) / 250
    assert (mean_before - mean_after) == pytest.approx(math.sqrt(2) * noise, rel=1e-12)
    for a, b in ((1.0, 0.0), (0.03, 0.0), (7.0, -3.0), (100.0, -50.0), (10.0, 50.0)):  # in the middle three the
        # rounding put the fall above the threshold before ties were kept apart
        det = create_detector("decline", k=1)
        det.observe(Observation("j", 10, a * mean_before + b, eval_n=250))
        d = det.observe(Observation("j", 20, a * mean_after + b, eval_n=250, eval_noise=a * noise))
        assert d.action is Action.CONTINUE, (a, b)
        d = det.observe(Observation("j", 30, a * (mean_after - 0.01) + b, eval_n=250, eval_noise=a * noise))
        assert d.action is Action.CONTINUE, (a, b)  # 0.01 < sqrt(2) * noise: within the noise
        d = det.observe(Observation("j", 40, a * (mean_after - 0.05) + b, eval_n=250, eval_noise=a * noise))
        assert d.action is Action.STOP, (a, b)  # 0.04 beyond it


def test_an_absolute_noise_prior_is_not_scale_free():
    """The documented exception: an explicit noise_prior is in score units."""
    changed = sum(_stops("trend", {"noise_prior": 0.09}, s, 1.0, 0.0) != _stops("trend", {"noise_prior": 0.09}, s, 0.1, 0.0)
                  for s in UNITS_SERIES)
    assert changed > 0


# ----------------------------------------------------------------------------- safe arithmetic (issues 16, 17)
#: Every numeric parameter of every registered detector with its allowed range (ints: k, window).
BOUNDS = {
    "decline": {"k": (1, 1000), "min_delta": (0.0, 1e6), "noise_z": (0.0, 100.0)},
    "patience": {"k": (1, 1000), "min_delta": (0.0, 1e6)},
    "stop_at": {"fraction": (5e-324, 1.0)},  # (0, 1]
    "loss_plateau": {"window": (1, 1000), "tolerance": (-1e6, 1e6)},
    "drop": {"window": (1, 1000), "z": (0.0, 100.0), "noise_prior": (1e-12, 1e6), "noise_rel": (1e-6, 100.0),
             "prior_evals": (1e-3, 1000.0)},
    "trend": {"window": (2, 1000), "z": (0.0, 100.0), "noise_prior": (1e-12, 1e6), "noise_rel": (1e-6, 100.0),
              "prior_evals": (1e-3, 1000.0)},
    "cusum": {"window": (1, 1000), "drift": (0.0, 100.0), "threshold": (0.0, 100.0), "noise_prior": (1e-12, 1e6),
              "noise_rel": (1e-6, 100.0), "prior_evals": (1e-3, 1000.0)},
    "sequential": {"z": (0.0, 100.0), "span": (5e-324, 1.0), "window": (1, 1000), "noise_rel": (1e-6, 100.0),
                   "min_evals": (2, 1000)},
    "never": {},
}


def _finite_evidence(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_finite_evidence(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def _feed_safely(name, params, rows):
    """Feed (step, eval_score, train_loss, progress[, eval_n, eval_noise]) rows; assert no exception
    and finite evidence."""
    det = create_detector(name, **params)
    for step, score, loss, progress, *evidence in rows:
        d = det.observe(Observation("j", step, score, loss, None, "rlhf", progress, *evidence))
        bad = {k: v for k, v in d.evidence.items() if not _finite_evidence(v)}
        assert not bad, (name, params, step, score, bad)
        assert d.best_score is None or math.isfinite(d.best_score)
    return det


def test_bounds_table_covers_every_detector_and_parameter():
    assert set(BOUNDS) == set(DETECTORS)
    for name, bounds in BOUNDS.items():
        assert set(bounds) == set(detector_params(name)) - {"direction", "noise"}, name  # two choices, not numbers


def test_decline_names_its_noise_choices():
    with pytest.raises(ValueError, match=r"^noise must be one of run, paired, none, but got noise='paper'\.$"):
        create_detector("decline", noise="paper")


@pytest.mark.parametrize("name, param", [(n, p) for n, b in BOUNDS.items() for p in b])
def test_the_bounds_are_exact(name, param):
    low, high = BOUNDS[name][param]
    create_detector(name, **{param: low})
    create_detector(name, **{param: high})
    if isinstance(low, int):
        below, above = low - 1, high + 1
    else:
        below, above = math.nextafter(low, -math.inf), math.nextafter(high, math.inf)
    for bad in (below, above):
        with pytest.raises(ValueError, match=f"^{param} must be"):
            create_detector(name, **{param: bad})


def test_issue_16_a_zero_noise_prior_is_refused_and_the_smallest_allowed_one_is_safe():
    params, scores = {"window": 2, "noise_prior": 5e-324}, [0, 0, 0, 1, 2]  # the report's exact repro
    with pytest.raises(ValueError, match=r"^noise_prior must be a finite number in \[1e-12, 1e\+06\], "
                                         r"but got noise_prior=5e-324\.$"):
        create_detector("trend", **params)
    for name in ("drop", "trend", "cusum"):  # the same scores at the smallest allowed priors: no ZeroDivisionError
        det = _feed_safely(name, {"window": 2, "noise_prior": 1e-12, "prior_evals": 1e-3},
                           [(i, float(s), None, None) for i, s in enumerate(scores)])
        assert det.state.rule[0].sigma > 0


@pytest.mark.parametrize("old, new, rel", [(1.0, 0.5, 0.5), (0.0, 3.0, 0.0), (1e-300, 1.0, -SATURATION),
                                           (-1e-300, -1.0, SATURATION), (1e308, -1e308, 2.0), (-1e308, 1e308, -2.0),
                                           (5e-324, -1e308, SATURATION)])
def test_relative_improvement_saturates(old, new, rel):
    assert relative_improvement(old, new) == rel


#: Score series at the edges of the float range (each value finite; steps up to MAX_STEP).
EXTREME_SERIES = {
    "huge alternating": [1e300, -1e300] * 6,
    "float max": [1.7976931348623157e308, -1.7976931348623157e308, 1.7976931348623157e308, 0.0] * 3,
    "tiny": [1e-300, -1e-300, 5e-324, 0.0, 1e-300, 2e-300] * 2,
    "constant": [0.0] * 12,
    "tiny then huge": [5e-324] * 5 + [1e300] * 2 + [-1e300] * 5,
    "the repro": [0.0, 0.0, 0.0, 1.0, 2.0] * 2,
}


def _corners(name):
    """Each parameter at its lower or upper bound (windows and k at their smallest two values, so
    that the rules get to compare within a short series); ``noise_prior`` also unset (relative)."""
    import itertools

    choices = []
    for param, (low, high) in BOUNDS[name].items():
        values = (low, low + 1) if isinstance(low, int) else (low, high)
        choices.append([(param, v) for v in values + ((None,) if param == "noise_prior" else ())])
    for combo in itertools.product(*choices):
        yield dict(combo)


@pytest.mark.parametrize("series", list(EXTREME_SERIES))
@pytest.mark.parametrize("direction", ["max", "min"])
@pytest.mark.parametrize("name", list(BOUNDS))
def test_extreme_parameters_and_scores_never_raise(name, direction, series):
    scores_ = EXTREME_SERIES[series]
    n = len(scores_)
    for params in _corners(name):
        for steps in ([0] * n, list(range(n)), [MAX_STEP - n + i for i in range(n)], [i * 10**14 for i in range(n)]):
            rows = [(step, s, s, min(1.0, i / 6)) for i, (step, s) in enumerate(zip(steps, scores_, strict=True))]
            _feed_safely(name, {**params, "direction": direction}, rows)


@pytest.mark.parametrize("name, extra", [("loss_plateau", {}), ("drop", {"noise_prior": 1e-12, "prior_evals": 1e-3}),
                                         ("trend", {"noise_prior": 1e-12, "prior_evals": 1e-3}),
                                         ("cusum", {"noise_prior": 1e-12, "prior_evals": 1e-3}),
                                         ("drop", {"noise_rel": 1e-6, "prior_evals": 1e-3}),
                                         ("cusum", {"noise_rel": 1e-6, "prior_evals": 1e-3}),
                                         ("sequential", {"noise_rel": 1e-6, "span": 1.0})])
def test_the_largest_windows_fill_safely(name, extra):
    low, high = BOUNDS[name]["window"]
    n = 2 * high + 5
    rows = [(i, (1e300 if i % 3 else -1e300) if i < high else 5e-324 * (i % 2), 1e-300 * (i % 5), (i + 1) / n)
            for i in range(n)]
    _feed_safely(name, {"window": high, **extra}, rows)


finite_scores = st.floats(allow_nan=False, allow_infinity=False)
extreme_scores = st.one_of(finite_scores, st.sampled_from([0.0, 5e-324, -5e-324, 1e-300, 1e300, -1e300,
                                                           1.7976931348623157e308, -1.7976931348623157e308]))


@st.composite
def _extreme_params(draw, name):
    params = {"direction": draw(st.sampled_from(["max", "min"]))}
    for param, (low, high) in BOUNDS[name].items():
        if isinstance(low, int):
            params[param] = draw(st.sampled_from([low, low + 1, low + 2]))
        elif param == "noise_prior":
            params[param] = draw(st.one_of(st.none(), st.sampled_from([low, high]), st.floats(low, high)))
        else:
            params[param] = draw(st.one_of(st.sampled_from([low, high]), st.floats(low, high)))
    return params


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(sorted(BOUNDS)))
def test_any_allowed_parameters_and_finite_scores_never_raise(data, name):
    params = data.draw(_extreme_params(name))
    rows = data.draw(st.lists(st.tuples(st.integers(0, MAX_STEP), st.one_of(st.none(), extreme_scores),
                                        st.one_of(st.none(), extreme_scores), st.floats(0, 1e300)),
                              min_size=1, max_size=25))
    if data.draw(st.booleans()):  # the steps of a training run: increasing
        rows = [(step, *rest) for step, (_, *rest) in zip(sorted(r[0] for r in rows), rows, strict=True)]
    if data.draw(st.booleans()):  # per-example evidence on the evals (issue 28): any count, any noise level
        noise = st.one_of(st.none(), st.sampled_from([0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308]),
                          st.floats(0, 1.7976931348623157e308))
        rows = [row if row[1] is None else (*row, data.draw(st.one_of(st.none(), st.integers(1, MAX_EXAMPLES))),
                                            data.draw(noise)) for row in rows]
    _feed_safely(name, params, rows)


# ----------------------------------------------------------------------------- state as a value
#: A few parameter sets for every registered detector (a new detector fails
#: test_state_cases_cover_every_detector until it is listed here).
STATE_CASES = {
    "decline": [{}, {"k": 1}, {"k": 3, "min_delta": 0.02, "direction": "min"}],
    "patience": [{}, {"k": 4, "min_delta": 0.01}, {"k": 1, "direction": "min"}],
    "stop_at": [{}, {"fraction": 0.3}, {"fraction": 1.0, "direction": "min"}],
    "loss_plateau": [{}, {"window": 1, "tolerance": 0.0}, {"window": 4, "tolerance": -0.05}],
    "drop": [{}, {"window": 1, "z": 0.5}, {"window": 3, "z": 2.0, "noise_prior": 0.02, "prior_evals": 1.0,
                                           "direction": "min"}],
    "trend": [{}, {"window": 2, "z": 0.5}, {"window": 4, "z": 2.0, "noise_prior": 0.02, "direction": "min"},
              {"window": 3, "noise_rel": 0.3, "prior_evals": 1.0}],
    "cusum": [{}, {"window": 1, "drift": 0.0, "threshold": 1.0},
              {"window": 3, "drift": 0.5, "threshold": 5.0, "noise_prior": 0.03, "direction": "min"}],
    "sequential": [{}, {"span": 0.3, "window": 3, "z": 0.5}, {"window": 1, "noise_rel": 0.2, "direction": "min"}],
    "never": [{}, {"direction": "min"}],
}
STATE_PARAMS = [(name, params) for name, cases in STATE_CASES.items() for params in cases]

rows_st = st.lists(st.tuples(st.one_of(st.none(), st.floats(-1, 1)), st.one_of(st.none(), st.floats(0.01, 2))),
                   max_size=40)


def _observations(rows, first_step):
    return [Observation("j", first_step + 10 * i, score, loss, None, "rlhf", (first_step + 10 * i) / 400)
            for i, (score, loss) in enumerate(rows)]


def _plain(d):
    return (d.action, d.reason, d.best_step, d.best_score, dict(d.evidence))


def _run_from(det, state, observations):
    out = []
    for obs in observations:
        state, d = det.decide(state, obs)
        out.append(_plain(d))
    return state, out


def test_state_cases_cover_every_detector():
    assert set(STATE_CASES) == set(DETECTORS)


@pytest.mark.parametrize("name, params", STATE_PARAMS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decide_is_pure_a_state_can_be_kept_and_decided_from_again(name, params, data):
    """A state is a value: deciding from it twice (after another series ran on from it) gives the
    same decisions, and the shortcut observe() decides as decide() does."""
    rows, extra = data.draw(rows_st), data.draw(rows_st)
    split = data.draw(st.integers(0, len(rows)))
    obs, ahead = _observations(rows, 10), _observations(extra, 10 * split + 10)
    det = create_detector(name, **params)
    reference = [_plain(det.observe(o)) for o in obs]  # one series kept in the detector
    kept, before = _run_from(det, det.start(), obs[:split])
    frozen = repr(kept)
    _run_from(det, kept, ahead)  # another series runs on from the kept state...
    assert repr(kept) == frozen  # ...and leaves it as it was
    assert before + _run_from(det, kept, obs[split:])[1] == reference
    assert before + _run_from(create_detector(name, **params), kept, obs[split:])[1] == reference


_VALUES = (int, float, str, type(None), Action, Decision, MappingProxyType)  # immutable (a Decision is frozen)


def _mutables(value, path):
    """Paths of mutable objects inside a state (there must be none)."""
    if isinstance(value, _VALUES):
        return
    if isinstance(value, tuple):  # a tuple or a NamedTuple
        for i, x in enumerate(value):
            yield from _mutables(x, f"{path}[{i}]")
        return
    yield f"{path}: {type(value).__name__}"


@pytest.mark.parametrize("name, params", STATE_PARAMS)
@pytest.mark.parametrize("n", [0, 3, 12, 40])
def test_a_state_holds_only_immutable_values(name, params, n):
    import random

    rng = random.Random(n)
    det = create_detector(name, **params)
    state, _ = _run_from(det, det.start(), _observations([(rng.uniform(-1, 1), rng.uniform(0.5, 1))
                                                           for _ in range(n)], 10))
    assert not list(_mutables(state, name))


def test_a_stopped_state_stays_stopped_and_resume_forgets_the_stop():
    det = create_detector("decline", k=1)
    state, _ = _run_from(det, det.start(), _observations([(0.5, None), (0.4, None)], 10))
    again, d = det.decide(state, Observation("j", 99, 0.9))
    assert again is state and d is state.stopped and d.stop
    resumed = det.resume(state)
    assert resumed.stopped is None and resumed.best_step == state.best_step
    assert not det.decide(resumed, Observation("j", 99, 0.9))[1].stop
