"""The KL-clock gate (issue 44): a rule's stops held until the run is past the forecast peak of Gao's form."""

from __future__ import annotations

import math
import random

import pytest

from evalstop_trl.core.detectors import Action, Observation, create_detector
from evalstop_trl.core.detectors.klgate import KLGate
from evalstop_trl.core.errors import InvalidInput
from evalstop_trl.core.records import Policy
from evalstop_trl.core.requests import ReportRequest
from tests.store_helpers import restart_decides_the_same

PEAK_D = math.e  # gold(d) = 0.2 + d (1 - 0.5 ln d) peaks at d* = exp(1 / 0.5 - 1) = e, KL* = e^2


def _gao_run(seed: int, noise: float = 0.04, n: int = 24) -> list[tuple[float, float]]:
    """(KL, score) of a run whose world feedback follows Gao et al.'s formula, with eval noise."""
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        d = 0.25 * i  # d = sqrt(KL) grows linearly with training, past the peak at i ~ 11
        out.append((d * d, 0.2 + d * (1.0 - 0.5 * math.log(d)) + rng.gauss(0.0, noise)))
    return out


def test_falls_before_the_peak_are_held_and_a_stop_past_it_carries_the_clock():
    """Eight runs on Gao's formula with eval noise 0.04: the bare rule (one fall) stops half of them
    well before the peak; gated, every stop comes at a KL past its forecast peak and near or past the
    true one, never earlier than the bare rule's."""
    early = 0
    for seed in range(8):
        rule, gated = create_detector("decline", k=1, noise="none"), KLGate(create_detector("decline", k=1, noise="none"))
        bare_kl = stop = None
        for i, (kl, score) in enumerate(_gao_run(seed, noise=0.04)):
            obs = Observation("j", i, score, kl=kl)
            if bare_kl is None and rule.observe(obs).stop:
                bare_kl = kl
            d = gated.observe(obs)
            if d.stop:
                stop = d
                break
        assert stop is not None and bare_kl is not None, seed
        ev = stop.evidence
        assert ev["kl"] > ev["kl_peak"] and "past the forecast peak" in stop.reason, (seed, stop.reason)
        assert ev["kl"] >= max(bare_kl, 0.8 * PEAK_D**2), (seed, bare_kl, ev)
        early += bare_kl < 0.8 * PEAK_D**2
    assert early >= 4  # the gate had falls to hold


def test_a_run_without_kl_is_judged_by_its_rule_alone():
    scores = [0.1, 0.3, 0.5, 0.45, 0.6, 0.55, 0.4]
    rule, gated = create_detector("decline", k=1), KLGate(create_detector("decline", k=1))
    assert [rule.observe(Observation("j", i, s)) for i, s in enumerate(scores)] == \
        [gated.observe(Observation("j", i, s)) for i, s in enumerate(scores)]


def test_lower_is_better_scores_are_fitted_turned_over():
    gated = KLGate(create_detector("decline", k=1, direction="min"))
    decisions = [gated.observe(Observation("j", i, -s, kl=kl)) for i, (kl, s) in enumerate(_gao_run(0))]
    first = next(d for d in decisions if d.stop)
    assert first.evidence["kl"] > first.evidence["kl_peak"]


def test_a_policy_names_the_gate_and_a_stored_job_decides_the_same_after_a_restart(tmp_path):
    assert Policy.from_dict({"detector": "decline", "gate": "kl_past_peak"}).to_dict()["gate"] == "kl_past_peak"
    with pytest.raises(InvalidInput, match="gate must be one of kl_past_peak"):
        Policy.from_dict({"detector": "decline", "gate": "soon"})
    requests = [ReportRequest(i, s, kl=kl) for i, (kl, s) in enumerate(_gao_run(3), start=1)]
    last = restart_decides_the_same(tmp_path / "gate.db", {"detector": "decline", "k": 1, "gate": "kl_past_peak"},
                                    requests, cut=8)
    assert last.action is Action.STOP
