"""What a run logs beside its evals, as a stop's evidence (issue 44): the keys read from a trainer's
logs (:data:`REWARD_KEYS`, :data:`LOSS_KEYS`, :data:`LENGTH_KEYS`; the KL's are the KL clock's,
:data:`~evalstop_trl.core.klclock.KL_KEYS`) and :func:`with_evidence`, which a stop carries in the
coordinator and in ``evalstop replay``. A proxy reward still rising while world feedback falls is
the mark of reward hacking; response length that grows with it is a classic symptom (a policy padding
its answers for a reward model that likes long ones). Evidence only: never required, never decided on.

    >>> since_best(200.0, 270.0)
    0.35
    >>> describe(0.35)
    'length +35% since the best eval'
    >>> since_best(0.0, 10.0) is None, since_best(None, 10.0) is None
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .browse import finite_float
from .detectors import Decision
from .detectors.proxygate import describe_proxy
from .klclock import KL_KEYS

__all__ = ["LENGTH_KEYS", "LOGGED", "LOSS_KEYS", "REWARD_KEYS", "TRAIN_PREFIX", "describe", "first_logged",
           "logged_length", "logged_names", "read_logged", "since_best", "with_evidence"]

#: Keys of a trainer's logs read as the proxy reward, and as the train loss (the first present wins):
#: TRL's GRPO/RLOO ``reward``, OpenRLHF's ``reward``, TRL's online trainers' ``objective/scores``, DPO's
#: margins; verl's ``critic/score/mean`` (the reward function's score of the rollouts, before its KL penalty)
REWARD_KEYS = ("reward", "rewards/mean", "objective/scores", "objective/rlhf_reward", "rewards/margins",
               "rewards/chosen", "critic/score/mean")
LOSS_KEYS = ("loss", "train_loss")

#: Keys of a trainer's logs read as the mean completion length of the latest step's rollouts (tokens),
#: the first present wins (TRL's GRPO and RLOO log ``completions/mean_length``, older TRL
#: ``completion_length``, verl ``response_length/mean``, OpenRLHF ``response_length``): the callback
#: reports it with each eval, ``evalstop run --metric-from`` with each eval it reads
LENGTH_KEYS = ("completions/mean_length", "completion_length", "response_length/mean", "response_length")

#: what a report carries beside its eval, read from a trainer's log: the report's field -> its keys (the
#: first present wins, :func:`first_logged`) and the least value it may take (None: any finite number).
#: The session, ``evalstop run --metric-from`` and ``evalstop replay`` read a log record with it.
LOGGED: Mapping[str, tuple[tuple[str, ...], float | None]] = MappingProxyType({
    "train_loss": (LOSS_KEYS, None), "proxy_reward": (REWARD_KEYS, None), "kl": (KL_KEYS, None),
    "length": (LENGTH_KEYS, 0.0)})


def read_logged(values: Mapping[str, Any]) -> dict[str, float]:
    """Each field of :data:`LOGGED` a log record gives.

        >>> read_logged({"loss": 0.5, "reward": 0.2, "objective/kl": -0.01, "completion_length": -1})
        {'train_loss': 0.5, 'proxy_reward': 0.2, 'kl': -0.01}
    """
    out = {}
    for field, (keys, low) in LOGGED.items():
        value = first_logged(values, keys, low)
        if value is not None:
            out[field] = value
    return out


#: transformers' W&B and TensorBoard integrations log a training metric ``KEY`` as ``train/KEY``
#: (``train/reward``, ``train/objective/kl``): each key is also read under this prefix
TRAIN_PREFIX = "train/"


def first_logged(values: Mapping[str, Any], keys: Sequence[str], low: float | None = None) -> float | None:
    """The value of the first of ``keys`` (each as it is, then under :data:`TRAIN_PREFIX`) that a log
    record holds as a finite number (at least ``low`` when given): what the session, ``evalstop run
    --metric-from``, ``evalstop replay`` and ``calibrate`` read. None when it holds none (text, a bool,
    NaN, an infinity and an integer beyond a float are not numbers).

        >>> first_logged({"train/reward": 0.4, "train/loss": 1.2}, REWARD_KEYS)
        0.4
    """
    for name in logged_names(keys):
        value = finite_float(values.get(name))
        if value is not None and (low is None or value >= low):
            return value
    return None


def logged_names(keys: Sequence[str]) -> tuple[str, ...]:
    """The names ``keys`` are logged under, in the order they are read: each key, then under
    :data:`TRAIN_PREFIX`."""
    return tuple(name for key in keys for name in (key, TRAIN_PREFIX + key))


def logged_length(values: Mapping[str, Any]) -> float | None:
    """A log record's mean completion length (:data:`LENGTH_KEYS`, a number >= 0), else None."""
    return first_logged(values, LENGTH_KEYS, 0.0)


def since_best(best: float | None, now: float | None) -> float | None:
    """The relative change of the length from the best eval's report to ``now`` (+0.35: 35% longer);
    None when either is unknown or the best's length is 0 (no relative change)."""
    if best is None or now is None or not best > 0:
        return None
    return (now - best) / best


def describe(change: float) -> str:
    """A stop's reason suffix for a relative change (see :func:`since_best`)."""
    return f"length {change:+.0%} since the best eval"


def with_evidence(decision: Decision, best_proxy: float | None, best_length: float | None, proxy: float | None,
                  length: float | None) -> Decision:
    """A detector's stop with what the run logs beside its evals as evidence, each when known at both
    the best eval and the stop: how the proxy reward moved since the best eval (``proxy_since_best``)
    and the relative change of the completion length (``length_since_best``). Never changes the
    decision; the same decision when neither is known (or a change overflows a float). A stop that
    already says how the proxy moved (a policy's ``gate: proxy_diverges``) keeps its own clause."""
    reason, evidence = decision.reason, {}
    moved = proxy - best_proxy if best_proxy is not None and proxy is not None else None
    if moved is not None and math.isfinite(moved) and "proxy_since_best" not in decision.evidence:
        # finite reports 1e308 apart differ by infinity: unsaid
        reason, evidence["proxy_since_best"] = f"{reason}; {describe_proxy(moved)}", moved
    change = since_best(best_length, length)
    if change is not None and math.isfinite(change):
        reason, evidence["length_since_best"] = f"{reason}; {describe(change)}", change
    if not evidence:
        return decision
    return Decision(decision.action, reason, decision.best_step, decision.best_score, {**decision.evidence, **evidence})
