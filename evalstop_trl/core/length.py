"""A run's completion length as evidence (issue 44): response length that grows while world feedback
falls is a classic symptom of reward hacking (a policy padding its answers for a reward model that
likes long ones). A report carries the mean completion length of the latest training step's rollouts
(``length``, tokens); a detector's stop then says how it moved since the best eval. Evidence only:
never required, never decided on.

    >>> since_best(200.0, 270.0)
    0.35
    >>> describe(0.35)
    'length +35% since the best eval'
    >>> since_best(0.0, 10.0) is None, since_best(None, 10.0) is None
    (True, True)
"""

from __future__ import annotations

__all__ = ["LENGTH_KEYS", "describe", "since_best"]

#: Keys of a trainer's logs read as the mean completion length of the latest step's rollouts (tokens),
#: the first present wins (TRL's GRPO and RLOO log ``completions/mean_length``, older TRL
#: ``completion_length``, verl ``response_length/mean``, OpenRLHF ``response_length``): the callback
#: reports it with each eval, ``evalstop run --metric-from`` with each eval it reads
LENGTH_KEYS = ("completions/mean_length", "completion_length", "response_length/mean", "response_length")


def since_best(best: float | None, now: float | None) -> float | None:
    """The relative change of the length from the best eval's report to ``now`` (+0.35: 35% longer);
    None when either is unknown or the best's length is 0 (no relative change)."""
    if best is None or now is None or not best > 0:
        return None
    return (now - best) / best


def describe(change: float) -> str:
    """A stop's reason suffix for a relative change (see :func:`since_best`)."""
    return f"length {change:+.0%} since the best eval"
