"""Per-example world feedback: an eval as the mean of its examples' scores, its number of examples,
and its paired noise level against the previous eval on the examples both scored.

A world-feedback eval is nearly always a mean over examples scored again at every eval. Why the
noise comes from *paired* differences: the evals of one run score the same examples, so each
example's own difficulty is in every eval and cancels in a difference; what is left is the noise
of the policy's answers (and of the judge). The plain standard error ``sd / sqrt(n)`` keeps the
between-example variance, which is no noise for a comparison of two evals on the same examples
(for [0, 1] judge scores it is about 3x too large, and rules that use it almost never stop).

With ``d_i`` this eval's score of example ``i`` minus the previous eval's, over the ``m >= 2``
examples both scored, the difference of the two means has standard error ``sd(d) / sqrt(m)``, and
each eval carries half of its variance::

    noise = sd(d) / sqrt(2 m)

the level of one eval's score in the detectors' sense (``Observation.eval_noise``). An eval that
shares fewer than two examples with the previous one (the first eval, fresh example sets) has no
noise level: the detectors then estimate it from the scores as they do for a plain number.

Example::

    >>> first = summarize([1, 0, 1, 1], None)
    >>> first.mean, first.n, first.noise
    (0.75, 4, None)
    >>> second = summarize([1, 0, 0, 1], first)
    >>> second.mean, second.n, round(second.noise, 4)
    (0.5, 4, 0.1768)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = ["EVIDENCE_NAMES", "MAX_KEPT_EXAMPLES", "ExampleEval", "WorldFeedback", "evidence_keys", "is_per_example",
           "paired_noise", "per_example", "summarize"]

#: The most per-example scores one eval may return: they are kept until the next eval (about
#: 100 bytes each), so the training side's memory stays bounded. Report a sample or the mean beyond.
MAX_KEPT_EXAMPLES = 100_000
_MAX_KEY = 256  # characters of an example id


class ExampleEval(NamedTuple):
    """One per-example eval: the mean score, the number of examples, the paired noise level (None
    without a previous eval sharing two examples) and the scores by example (kept for the next)."""

    mean: float
    n: int
    noise: float | None
    scores: Mapping[Hashable, float]


@dataclass(frozen=True)
class WorldFeedback:
    """What a world-feedback function may return instead of its score alone: the ``score`` (a number,
    or per-example scores) and ``proxy``, the proxy reward model's mean score of the *same*
    completions. A report then carries that proxy instead of the trainer's logged training reward.
    Measured on the eval's own completions, the proxy shares the eval's sampling noise, which is what
    ``gate="proxy_diverges"`` needs (docs/results.md: a training batch's reward keeps rising through
    a hack and a healthy run alike)::

        def world_feedback(model, tokenizer):
            completions = sample(model, tokenizer, EVAL_PROMPTS)
            return WorldFeedback([judge(c) for c in completions], proxy=mean(reward_model(c) for c in completions))

    Raises:
        ValueError: ``proxy`` is neither None nor a finite number.
    """

    score: Any
    proxy: float | None = None

    def __post_init__(self) -> None:
        proxy = self.proxy
        if hasattr(proxy, "item") and not isinstance(proxy, (int, float)):
            proxy = proxy.item()  # a numpy or torch scalar
        if proxy is not None and (isinstance(proxy, bool) or not isinstance(proxy, (int, float))
                                  or not math.isfinite(proxy)):
            raise ValueError(f"WorldFeedback's proxy must be a finite number (the proxy reward model's mean score "
                             f"of the eval's completions) or None, but got {proxy!r:.80}.")
        object.__setattr__(self, "proxy", None if proxy is None else float(proxy))


def is_per_example(value: Any) -> bool:
    """Whether a world-feedback result is per-example scores (a sequence, an array or a mapping)
    rather than one number."""
    if isinstance(value, (str, bytes)):
        return False
    return isinstance(value, (Sequence, Mapping)) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) >= 1)


def _score(key: Hashable, value: Any) -> float:
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # a numpy or torch scalar
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the per-example score of example {key!r} is {value!r}; each must be a finite number.")
    return float(value)


def per_example(value: Any) -> dict[Hashable, float]:
    """The scores by example: a mapping's keys (str or int ids), a sequence's or array's positions.

    Raises:
        ValueError: no examples, more than :data:`MAX_KEPT_EXAMPLES`, an id that is neither a
            short str nor an int, or a score that is not a finite number.
    """
    if hasattr(value, "tolist") and not isinstance(value, (Sequence, Mapping)):
        value = value.tolist()  # a numpy array or a torch tensor
    n = len(value)
    if not 1 <= n <= MAX_KEPT_EXAMPLES:
        raise ValueError(f"world feedback returned {n} per-example scores; give 1 to {MAX_KEPT_EXAMPLES} "
                         "(beyond that, score a sample of the examples, or return their mean).")
    if not isinstance(value, Mapping):
        return {i: _score(i, v) for i, v in enumerate(value)}
    out: dict[Hashable, float] = {}
    for key, v in value.items():
        if isinstance(key, bool) or not isinstance(key, (str, int)) or (isinstance(key, str) and len(key) > _MAX_KEY):
            raise ValueError(f"per-example scores must be keyed by example ids (str of at most {_MAX_KEY} "
                             f"characters, or int), but got the key {key!r:.80}.")
        out[key] = _score(key, v)
    return out


#: the names an eval's per-example evidence is logged under beside its score: EvalStopCallback logs
#: ``evalstop/eval_n`` and ``evalstop/eval_noise`` beside ``evalstop/score`` (a TensorBoard log
#: prefixes the three alike); a recorder of its own (scripts/real_traces.py) writes ``eval_n`` and
#: ``eval_noise`` beside its score. ``evalstop replay`` and ``calibrate`` read them back.
EVIDENCE_NAMES = ("eval_n", "eval_noise")


def evidence_keys(metric: str) -> tuple[str, str] | None:
    """The (n, noise) keys of ``metric``'s logged evidence (see :data:`EVIDENCE_NAMES`); None for a
    transformers eval metric (``eval_*``, ``eval/*``), whose trainer would log a ``compute_metrics``
    result named ``n`` or ``noise`` under those very names."""
    head, sep, _ = metric.rpartition("evalstop/")
    if not sep and metric.startswith(("eval_", "eval/")):
        return None
    n_name, noise_name = EVIDENCE_NAMES
    return f"{head}{sep}{n_name}", f"{head}{sep}{noise_name}"


def paired_noise(previous: Mapping[Hashable, float], current: Mapping[Hashable, float]) -> float | None:
    """``sd(d) / sqrt(2 m)`` over the ``m`` examples both evals scored (``d``: current minus
    previous); None when they share fewer than two."""
    small, large = (previous, current) if len(previous) <= len(current) else (current, previous)
    diffs = [current[k] - previous[k] for k in small if k in large]
    m = len(diffs)
    if m < 2:
        return None
    mean = math.fsum(diffs) / m
    var = math.fsum((d - mean) ** 2 for d in diffs) / (m - 1)
    return math.sqrt(var / (2.0 * m))


def summarize(value: Any, previous: ExampleEval | None) -> ExampleEval:
    """This eval from its per-example scores, paired with ``previous`` (the job's last one, or None).

    Raises:
        ValueError: as :func:`per_example`.
    """
    scores = per_example(value)
    noise = paired_noise(previous.scores, scores) if previous is not None else None
    return ExampleEval(math.fsum(scores.values()) / len(scores), len(scores), noise, MappingProxyType(scores))
