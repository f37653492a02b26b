"""Gavel's heterogeneity-aware max-min fairness as a linear program (the :class:`~platform_sim.schedulers.Gavel`
scheduler's policy half).

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads"
(OSDI'20; ``stanford-futuredata/gavel``, ``scheduler/policies/max_min_fairness.py``,
``MaxMinFairnessPolicyWithPerf``). An allocation ``X[j, r]`` is the fraction of time job ``j`` runs on
GPU type (pool) ``r``. It maximises the smallest normalised effective throughput

    min_j  gpus_j * sum_r T[j, r] X[j, r] / T_equal[j]

subject to ``sum_r X[j, r] <= 1`` (a job runs in one place at a time), ``sum_j gpus_j X[j, r] <=
capacity_r`` (a type's GPUs) and ``0 <= X <= 1`` (0 where the job's gang does not fit the pool).
``T[j, r]`` is the job's throughput on type ``r`` (its speed there) and ``T_equal[j]`` the throughput
of an equal time share of every type it fits, the paper's ``X^equal`` (section 4.1). (Gavel's code
takes the normaliser from a second, heterogeneity-blind max-min LP instead; that LP's optimum is not
unique, so the normaliser would depend on the solver's vertex.) The ``gpus_j`` factor is Gavel's scale
factor: a job on one GPU gets more time than one on eight at equal throughput.

Solved with HiGHS through :func:`scipy.optimize.linprog` (``pip install 'evalstop[gavel]'``): one
variable per (job, pool) and one for the minimum; ``m`` jobs over ``n`` pools is ``m * n + 1``
variables and ``2m + n`` rows. On one pool (a uniform cluster) the program is max-min fair sharing of
``capacity`` GPU shares capped at each gang's size, whose optimum is water-filling
(:func:`water_fill`, no solver): every job's share rises together, a job's stops at its gang.

Example (one pool of one GPU, two 1-GPU jobs: each gets half the time)::

    >>> import numpy as np
    >>> x, t = max_min_allocation(np.ones((2, 1)), np.array([1, 1]), np.array([1]))
    >>> x.round(6).tolist(), round(t, 6)
    ([[0.5], [0.5]], 0.5)
"""

from __future__ import annotations

import numpy as np

__all__ = ["max_min_allocation", "water_fill"]


def water_fill(gpus: np.ndarray, capacity: float) -> np.ndarray:
    """Max-min fair time fractions on one pool: shares ``min(gpus_j, L)`` with ``sum = capacity``
    (all 1 when every gang fits at once); the LP's optimum with the fairest spread of the rest."""
    gpus = np.asarray(gpus, dtype=float)
    if gpus.sum() <= capacity:
        return np.ones(len(gpus))
    order = np.sort(gpus)
    left, level = float(capacity), 0.0
    for i, g in enumerate(order):  # the smallest gangs fill first; the rest share what is left
        share = left / (len(order) - i)
        if g > share:
            level = share
            break
        left -= g
    return np.minimum(gpus, level) / gpus


def max_min_allocation(throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, float]:
    """Gavel's max-min fair allocation and its objective (the smallest normalised throughput).

    Args:
        throughput: ``(m, n)``, job ``j``'s throughput on pool ``r`` (> 0).
        gpus: ``(m,)``, each job's gang size.
        capacity: ``(n,)``, each pool's GPUs (a gang larger than a pool cannot run there).

    Returns:
        ``(X, t)``: the ``(m, n)`` time fractions and ``min_j`` of the normalised throughput.

    Raises:
        ValueError: shapes that disagree, a job that fits no pool, or a throughput <= 0.
    """
    throughput = np.asarray(throughput, dtype=float)
    gpus = np.asarray(gpus, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    m, n = throughput.shape
    if gpus.shape != (m,) or capacity.shape != (n,):
        raise ValueError(f"throughput is {m} x {n}, so gpus needs {m} values and capacity {n}; "
                         f"got {gpus.shape} and {capacity.shape}")
    if m == 0:
        return np.zeros((0, n)), 0.0
    if not np.all(throughput > 0):
        raise ValueError("every throughput must be > 0")
    fits = gpus[:, None] <= capacity[None, :]
    if not fits.any(axis=1).all():
        raise ValueError(f"job(s) {np.flatnonzero(~fits.any(axis=1)).tolist()} fit no pool")
    if n == 1:
        x = water_fill(gpus, capacity[0])
        return x[:, None], float(np.min(gpus * x))
    from scipy.optimize import linprog  # the 'gavel' extra (the CLI says so when it is missing)
    from scipy.sparse import coo_array

    equal = np.where(fits, throughput, 0.0).sum(axis=1) / fits.sum(axis=1)  # X^equal: equal time on each type
    weight = np.where(fits, throughput / equal[:, None] * gpus[:, None], 0.0)

    k = m * n  # x flattened row-major (job, pool), then t
    jobs = np.repeat(np.arange(m), n)
    pools = np.tile(np.arange(n), m)
    cols = np.arange(k)
    # rows 0..m-1: t - sum_r weight x <= 0; m..2m-1: sum_r x <= 1; 2m..2m+n-1: sum_j gpus x <= capacity
    rows = np.concatenate([jobs, np.arange(m), m + jobs, 2 * m + pools])
    cc = np.concatenate([cols, np.full(m, k), cols, cols])
    vals = np.concatenate([-weight.ravel(), np.ones(m), np.ones(k), np.repeat(gpus, n)])
    a_ub = coo_array((vals, (rows, cc)), shape=(2 * m + n, k + 1)).tocsr()
    b_ub = np.concatenate([np.zeros(m), np.ones(m), capacity])
    cost = np.zeros(k + 1)
    cost[k] = -1.0
    bounds = np.column_stack([np.zeros(k + 1), np.append(fits.ravel().astype(float), np.inf)])
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:  # pragma: no cover - a feasible, bounded LP by construction (X = 0 is feasible)
        raise RuntimeError(f"Gavel's allocation LP failed: {res.message}")
    return np.clip(res.x[:k].reshape(m, n), 0.0, 1.0), float(res.x[k])
