"""The opt-in "converged" stop (issue 44 item 3): a plateau is stopped only when the policy says
``stop_on: [hacked, converged]``, with its own reason and evidence, and never by the default."""

from __future__ import annotations

import pytest

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.detectors import Observation
from evalstop_trl.core.detectors.converged import CONVERGED_SHARE
from evalstop_trl.core.errors import InvalidInput
from evalstop_trl.core.records import Policy, StopKind
from evalstop_trl.core.requests import JobRequest, ReportRequest
from tests.store_helpers import STORE_KINDS, open_store

#: rises, then a plateau whose wiggles stay within the paired noise (0.02: threshold 0.028)
PLATEAU = [0.30, 0.50, 0.60, 0.61, 0.60, 0.61, 0.60, 0.61, 0.60, 0.61]
HACKED = [0.30, 0.50, 0.60, 0.55, 0.45, 0.35, 0.30, 0.25, 0.20, 0.15]
CONVERGED = {"detector": "decline", "stop_on": ["hacked", "converged"]}


def run(policy: Policy, curve: list[float], planned: bool = True, noise: float | None = 0.02):
    det = policy.build()
    for i, score in enumerate(curve):
        d = det.observe(Observation("j", 10 * (i + 1), score, progress=(i + 1) / len(curve) if planned else None,
                                    eval_noise=noise, eval_n=64 if noise else None))
        if d.stop:
            return 10 * (i + 1), d
    return None, d


def test_a_plateau_is_stopped_as_converged_only_when_the_policy_opts_in():
    stop, d = run(Policy.from_dict(CONVERGED), PLATEAU)
    assert stop is not None and d.reason.startswith("converged:") and d.evidence["stop_kind"] == "converged"
    assert d.evidence["flat_share"] >= CONVERGED_SHARE and d.best_step == 40
    assert run(Policy(), PLATEAU)[0] is None  # the default: a plateau within the noise is never a decline
    assert run(Policy.from_dict({"detector": "sequential"}), PLATEAU)[0] is None


def test_a_hacked_curve_is_still_the_rules_stop_with_its_own_reason():
    stop, d = run(Policy.from_dict(CONVERGED), HACKED)
    plain, p = run(Policy(), HACKED)
    assert stop == plain and d.reason == p.reason and "stop_kind" not in d.evidence


def test_no_planned_steps_no_converged_stop_and_a_plain_score_counts_any_new_best():
    assert run(Policy.from_dict(CONVERGED), PLATEAU, planned=False)[0] is None
    rising_slowly = [0.30 + 0.001 * i for i in range(10)]
    assert run(Policy.from_dict(CONVERGED), rising_slowly, noise=None)[0] is None  # every eval a new best
    assert run(Policy.from_dict(CONVERGED), rising_slowly, noise=0.02)[0] is not None  # all within the noise


@pytest.mark.parametrize("bad", [["converged"], "converged", [], ["hacked", "bored"], ["hacked"] * 5])
def test_bad_stop_on_is_refused_with_the_valid_values(bad):
    with pytest.raises(InvalidInput, match="stop_on"):
        Policy.from_dict({"stop_on": bad})


def test_the_policy_round_trips_and_the_default_says_nothing_of_it():
    p = Policy.from_dict(CONVERGED)
    assert p.stop_on == (StopKind.HACKED, StopKind.CONVERGED) and Policy.from_dict(p.to_dict()) == p
    assert "stop_on" not in Policy().to_dict() and Policy.from_dict({"stop_on": ["hacked"]}) == Policy()


@pytest.fixture(params=STORE_KINDS)
def coordinator(request, tmp_path):
    store = open_store(request.param, tmp_path / "c.db", request)
    c = Coordinator(store)
    yield c
    store.close()


def test_the_coordinator_stops_a_plateau_as_converged_and_says_so(coordinator):
    coordinator.register_job("acme", JobRequest("flat", "grpo", len(PLATEAU) * 10, policy=CONVERGED))
    coordinator.register_job("acme", JobRequest("plain", "grpo", len(PLATEAU) * 10))
    for i, score in enumerate(PLATEAU):
        for job in ("flat", "plain"):
            coordinator.report("acme", job, ReportRequest(10 * (i + 1), eval_score=score, eval_n=64, eval_noise=0.02))
    flat, plain = coordinator.status("acme", "flat"), coordinator.status("acme", "plain")
    assert flat.status == "stopped" and flat.decision.reason.startswith("converged:")
    assert flat.policy["stop_on"] == ["hacked", "converged"]
    assert plain.status == "running" and not plain.decision.stop
