"""Gavel's max-min fairness LP: hand-worked allocations, constraints, gangs that do not fit, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.allocation import max_min_allocation, water_fill


def test_one_pool_shares_time_equally_and_weights_by_gang_size():
    x, t = max_min_allocation(np.ones((2, 1)), np.array([1, 1]), np.array([1]))
    assert x[:, 0] == pytest.approx([0.5, 0.5]) and t == pytest.approx(0.5)
    # a 2-GPU and a 1-GPU job on 2 GPUs: equal GPU shares, 2 x0 = x1, 2 x0 + x1 <= 2 -> x0 = 1/2, x1 = 1
    x, t = max_min_allocation(np.ones((2, 1)), np.array([2, 1]), np.array([2]))
    assert x[:, 0] == pytest.approx([0.5, 1.0]) and t == pytest.approx(1.0)


def test_two_pools_by_hand():
    # job 0: 1.2 on a100, 1.0 on t4 (normaliser 1.1); job 1: 1.0 and 0.1 (0.55); one GPU each.
    # With x0a = a, x0t = 1 - a, x1a = 1 - a, x1t = a: job 0 gets (1.2a + 1 - a) / 1.1, job 1
    # (1 - a + 0.1a) / 0.55; equal at a = 1/2, where both are 1.0
    x, t = max_min_allocation(np.array([[1.2, 1.0], [1.0, 0.1]]), np.array([1, 1]), np.array([1, 1]))
    assert t == pytest.approx(1.0, abs=1e-7)


def test_a_gang_gets_no_time_on_a_pool_it_does_not_fit():
    x, t = max_min_allocation(np.array([[1.0, 2.0], [1.0, 2.0]]), np.array([8, 1]), np.array([8, 4]))
    assert x[0, 1] == 0.0 and x[0, 0] > 0
    with pytest.raises(ValueError, match=r"job\(s\) \[0\] fit no pool"):
        max_min_allocation(np.ones((1, 2)), np.array([16]), np.array([8, 4]))
    with pytest.raises(ValueError, match="gpus needs 1 values and capacity 2"):
        max_min_allocation(np.ones((1, 2)), np.array([1, 1]), np.array([8, 4]))
    with pytest.raises(ValueError, match="every throughput must be > 0"):
        max_min_allocation(np.zeros((1, 1)), np.array([1]), np.array([8]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 3), st.integers(0, 10_000))
def test_the_allocation_fits_the_cluster_and_nobody_gets_less_than_t(m, n, seed):
    rng = np.random.default_rng(seed)
    throughput = rng.uniform(0.1, 2.0, (m, n))
    capacity = rng.choice([4, 8, 16], n)
    gpus = rng.choice([1, 2, 4], m)
    x, t = max_min_allocation(throughput, gpus, capacity)
    assert np.all(x >= 0) and np.all(x.sum(axis=1) <= 1 + 1e-7)
    assert np.all((gpus[:, None] * x).sum(axis=0) <= capacity + 1e-6)
    fits = gpus[:, None] <= capacity[None, :]
    equal = (throughput * fits).sum(axis=1) / fits.sum(axis=1)
    got = gpus * (throughput * x).sum(axis=1) / equal
    assert t > 0 and np.all(got >= t - 1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=15), st.sampled_from([8, 16]))
def test_water_filling_reaches_the_lps_optimum_on_one_pool(gpus, capacity):
    from scipy.optimize import linprog

    g = np.array(gpus, dtype=float)
    x = water_fill(g, capacity)
    assert np.all(x <= 1) and (g * x).sum() <= capacity + 1e-9
    m = len(g)  # the LP, solved directly: max t, t <= g_j x_j, sum g_j x_j <= C, 0 <= x <= 1
    a = np.zeros((m + 1, m + 1))
    a[:m, :m] = -np.diag(g)
    a[:m, m] = 1
    a[m, :m] = g
    res = linprog(np.r_[np.zeros(m), -1.0], A_ub=a, b_ub=np.r_[np.zeros(m), capacity],
                  bounds=[(0, 1)] * m + [(0, None)], method="highs")
    assert float(np.min(g * x)) == pytest.approx(res.x[m], abs=1e-7)
