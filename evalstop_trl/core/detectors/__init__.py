"""Stop detectors: pure decision logic over a job's observations.

A detector sees one observation at a time (:class:`Observed`, the information boundary: step,
progress, eval score, train loss, proxy reward and the eval's evidence; never hidden labels or true
durations) and returns a :class:`Decision` that says what to do and why. Callers build an
:class:`Observation`; the coordinator hands over the report it stores (checked once on arrival).

Missing and non-finite values (the documented policy):

* ``eval_score=None`` means "no world-feedback eval at this step" (a training-log only report). It
  neither counts as a decline nor resets the decline counter, and never becomes the best score.
* NaN or infinite numbers are rejected when an :class:`Observation` is built (``ValueError``) and
  when a report arrives (``records.check_report``), so they are refused at every API boundary (HTTP
  422, CLI exit 2) and never reach a detector.
* Once a detector says STOP, it keeps saying STOP (the same decision) for every later observation.

Per-example evidence (optional): ``eval_n`` is the number of examples the eval score is a mean of,
and ``eval_noise`` its noise level in score units, estimated from the per-example differences
with the previous eval on the same examples (:func:`evalstop_trl.core.examples.paired_noise`).
``decline`` (the default) stops a run of ``k`` consecutive declines only once it has fallen in all
by more than ``noise_z`` (2) times ``sqrt(2)`` noise levels: the larger of ``eval_noise`` and the
run's own eval-to-eval noise (``noise: run``; ``noise: none`` is the paper's exact rule). The
noise-robust rules use ``eval_noise`` as their noise level instead of their estimate; without it
they decide exactly as before.

Safe arithmetic: for every allowed parameter value and any finite scores, no detector raises
(ZeroDivisionError, OverflowError) and all evidence is finite. The noise-robust rules (``drop``,
``trend``, ``cusum``, ``sequential``) saturate their signed scores at ``±SATURATION`` (1e100: no eval
metric comes near, and the squares of their differences stay finite); an absolute ``noise_prior``
and ``prior_evals`` are bounded away from 0, and a relative noise level (the default) is a positive
fraction of the range of the job's evals so far (a job whose evals are all equal is never stopped by
these rules); ``loss_plateau``'s relative improvement saturates the same way.

Units: every rule that reads the eval score (all but ``stop_at``, ``loss_plateau`` and ``never``)
decides the same under any change of the score's units ``a * score + b`` (a > 0) with its default
parameters: ``decline`` and ``patience`` compare scores with each other (``min_delta`` is in score
units, default 0), and the noise-robust rules measure in units of a noise level estimated from the
job's own evals with a prior that is a fraction (``noise_rel``) of the range of those evals. An
absolute ``noise_prior`` (in score units, the pre-issue-18 behaviour) is still accepted and, when
set, replaces the relative prior exactly as before.

State: a detector is its parameters; what it remembers of a job is a :class:`DetectorState`, an
immutable value, and ``decide(state, obs) -> (state', decision)`` is pure, so a job's state can be
advanced and swapped in only once the report is stored, without copying anything.

Best checkpoint: the step with the best eval score seen so far (highest for ``direction="max"``,
lowest for ``"min"``); ties keep the earliest step.

Layout: one module per rule (``decline``, ``patience``, ``stop_at``, ``loss_plateau``, ``drop``,
``trend``, ``cusum``, ``sequential``, ``never``), the shared vocabulary in ``base`` and the noise and
statistics of the noise-robust rules in ``noise``; this package registers them (:data:`DETECTORS`).
A policy's gate wraps a rule: its stops stand only when the run's logged evidence agrees (``klgate``:
the KL clock past its forecast peak; ``proxygate``: the proxy reward above its value at the best
eval), registered in :data:`GATES`.

Example::

    >>> det = create_detector("decline", k=2)
    >>> for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.55), (50, 0.45)]:
    ...     decision = det.observe(Observation(job_id="j", step=step, eval_score=score))
    >>> decision.action, decision.best_step
    (<Action.STOP: 'stop'>, 20)
    >>> decision.reason.split(":")[0]
    '3 consecutive declines'
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..registry import Registry
from .base import (
    MAX_DELTA,
    MAX_EXAMPLES,
    MAX_K,
    MAX_STEP,
    MAX_WINDOW,
    SATURATION,
    Action,
    Decision,
    Detector,
    DetectorState,
    Gate,
    Observation,
    Observed,
    all_finite_floats,
    check_evidence,
    check_finite,
    is_better,
    is_decline,
)
from .cusum import CusumDetector
from .decline import DeclineDetector, DeclineNoise
from .drop import DropDetector
from .klgate import KLGate
from .loss_plateau import LossPlateauDetector, relative_improvement
from .never import NeverDetector
from .noise import (
    CUSUM_NOISE_REL,
    DROP_NOISE_REL,
    MAX_NOISE_PRIOR,
    MAX_NOISE_REL,
    MAX_PRIOR_EVALS,
    MAX_Z,
    MIN_NOISE_PRIOR,
    MIN_NOISE_REL,
    MIN_PRIOR_EVALS,
    TREND_NOISE_REL,
    NoiseLevel,
    RelativeNoiseLevel,
    exceeds,
    least_squares_slope,
    pooled_sigma,
    t_quantile,
    t_threshold,
    third_difference,
)
from .patience import PatienceDetector
from .proxygate import ProxyGate
from .sequential import SequentialDetector
from .stop_at import StopAtDetector
from .trend import TrendDetector

__all__ = [
    "Action",
    "CUSUM_NOISE_REL",
    "CusumDetector",
    "DEFAULT_DETECTOR",
    "DeclineNoise",
    "DETECTORS",
    "DROP_NOISE_REL",
    "Decision",
    "DeclineDetector",
    "Detector",
    "DetectorState",
    "DropDetector",
    "GATES",
    "Gate",
    "KLGate",
    "LossPlateauDetector",
    "MAX_DELTA",
    "MAX_EXAMPLES",
    "MAX_K",
    "MAX_NOISE_PRIOR",
    "MAX_NOISE_REL",
    "MAX_PRIOR_EVALS",
    "MAX_STEP",
    "MAX_WINDOW",
    "MAX_Z",
    "MIN_NOISE_PRIOR",
    "MIN_NOISE_REL",
    "MIN_PRIOR_EVALS",
    "NeverDetector",
    "NoiseLevel",
    "Observation",
    "Observed",
    "PatienceDetector",
    "ProxyGate",
    "RECOMMENDED_POLICY",
    "RelativeNoiseLevel",
    "SATURATION",
    "SequentialDetector",
    "StopAtDetector",
    "TREND_NOISE_REL",
    "TrendDetector",
    "all_finite_floats",
    "check_evidence",
    "check_finite",
    "create_detector",
    "detector_params",
    "exceeds",
    "is_better",
    "is_decline",
    "least_squares_slope",
    "pooled_sigma",
    "relative_improvement",
    "t_quantile",
    "t_threshold",
    "third_difference",
]

#: the detector of a policy that names none: the paper's rule, its declines counted beyond the run's noise
#: (``decline``'s ``noise: none`` is the paper's exact rule)
DEFAULT_DETECTOR = "decline"
#: the policy recommended to new users, given per-example scores and a logged proxy reward: chosen on the
#: real-run corpus's tuning half by precision counting any stop (docs/results.md; the README and
#: ``evalstop replay --help`` say so, tests/test_readme.py)
RECOMMENDED_POLICY: Mapping[str, str] = MappingProxyType({"detector": "decline", "gate": "proxy_diverges"})

DETECTORS: Registry[Detector] = Registry("detector")
for _cls in (DeclineDetector, PatienceDetector, StopAtDetector, LossPlateauDetector, DropDetector, TrendDetector,
             CusumDetector, SequentialDetector, NeverDetector):
    DETECTORS.add(_cls.name, _cls)


#: a policy's ``gate``: the name and the wrapper it puts around the rule (a stop stands only when the
#: run's logged evidence agrees; a run that logs none is judged by its rule alone)
GATES: dict[str, type[Gate]] = {"kl_past_peak": KLGate, "proxy_diverges": ProxyGate}


def detector_params(name: str) -> dict[str, Any]:
    """The parameters a registered detector takes, with their defaults."""
    return DETECTORS.params(name)


def create_detector(name: str, **params: Any) -> Detector:
    """Build a registered detector.

    Args:
        name: one of ``decline``, ``patience``, ``stop_at``, ``loss_plateau``, ``drop``, ``trend``,
            ``cusum``, ``sequential``, ``never`` (recommended for new users: :data:`RECOMMENDED_POLICY`,
            ``decline`` with ``gate="proxy_diverges"``).
        **params: the detector's parameters (see :func:`detector_params`).

    Raises:
        ValueError: unknown name, unknown parameter (the message lists the valid ones) or an
            invalid value.
    """
    return DETECTORS.create(name, **params)
