"""The proxy gate (issue 44): a rule's stop stands only while the proxy reward is above its value at the
best eval. Runs are written from completions (each scored by world feedback and by the proxy, so both
means share the eval's sampling noise), not from the gate."""

from __future__ import annotations

import random

import pytest

from evalstop_trl.core.detectors import GATES, Action, Observation, ProxyGate, create_detector
from evalstop_trl.core.errors import InvalidInput
from evalstop_trl.core.records import Policy
from evalstop_trl.core.requests import ReportRequest
from tests.store_helpers import restart_decides_the_same


def _run(seed: int, hack_from: int | None, evals: int = 30, n: int = 256) -> list[tuple[float, float]]:
    """(world feedback, proxy) means of ``n`` fresh completions per eval: quality rises for 10 evals and
    then plateaus; from eval ``hack_from`` a growing share of completions exploit the proxy (+1 proxy,
    -1 world feedback). The proxy also carries noise of its own (a reward model is not the judge)."""
    rng = random.Random(seed)
    out = []
    for i in range(evals):
        quality = 0.1 * min(i, 10)
        share = 0.0 if hack_from is None or i < hack_from else min(0.06 * (i - hack_from + 1), 0.9)
        world = proxy = 0.0
        for _ in range(n):
            x, hacked = rng.gauss(quality, 1.0), rng.random() < share
            world += x - hacked
            proxy += x + hacked + rng.gauss(0.0, 0.5)
        out.append((world / n, proxy / n))
    return out


def _first_stop(detector, run):
    for step, (score, proxy) in enumerate(run):
        d = detector.observe(Observation("j", step, score, proxy_reward=proxy))
        if d.stop:
            return step, d
    return None, None


def test_noise_on_a_plateau_is_held_and_a_hack_is_stopped_with_the_proxys_rise():
    """40 healthy plateaus: the paper's exact rule (two falls in a row) stops most of them, gated by the
    proxy at most a few (a fall of world feedback comes with a fall of the proxy on the same completions).
    40 hacked runs: the gated rule stops every one, all but a few after the hack starts, saying how far
    the proxy rose."""
    bare = gated = 0
    for seed in range(40):
        run = _run(seed, None)
        bare += _first_stop(create_detector("decline", noise="none"), run)[0] is not None
        gated += _first_stop(ProxyGate(create_detector("decline", noise="none")), run)[0] is not None
    assert bare >= 30 and gated <= 6, (bare, gated)
    early = 0
    for seed in range(40):
        step, d = _first_stop(ProxyGate(create_detector("decline", noise="none")), _run(seed, hack_from=15))
        assert step is not None, seed
        assert d.evidence["proxy_since_best"] > 0 and "since the best eval" in d.reason, d
        early += step < 15  # a plateau's false stop before the hack began
    assert early <= 3, early


def test_a_run_without_a_proxy_is_judged_by_its_rule_alone():
    scores = [0.1, 0.3, 0.5, 0.45, 0.6, 0.55, 0.4]
    rule, gated = create_detector("decline", k=1), ProxyGate(create_detector("decline", k=1))
    assert [rule.observe(Observation("j", i, s)) for i, s in enumerate(scores)] == \
        [gated.observe(Observation("j", i, s)) for i, s in enumerate(scores)]


def test_the_proxy_at_the_best_is_the_latest_logged_by_then_and_lower_is_better_evals_work():
    # the best eval (step 1) has no proxy of its own: the one logged at step 0 stands for it
    gated = ProxyGate(create_detector("decline", k=1, noise="none", direction="min"))
    reports = [(0.5, 0.3), (0.4, None), (0.45, 0.2), (0.5, 0.35)]  # (loss-like eval, proxy)
    d = [gated.observe(Observation("j", i, s, proxy_reward=p)) for i, (s, p) in enumerate(reports)]
    assert d[2].action is Action.CONTINUE and d[2].evidence["proxy_since_best"] == pytest.approx(-0.1)
    assert d[3].stop and d[3].evidence["proxy_since_best"] == pytest.approx(0.05)


def test_proxies_a_float_apart_give_the_sign_without_evidence():
    gated = ProxyGate(create_detector("decline", k=1, noise="none"))
    d = [gated.observe(Observation("j", i, s, proxy_reward=p)) for i, (s, p) in
         enumerate([(0.5, -1e308), (0.4, 1e308)])]
    assert d[1].stop and "proxy above its value at the best eval" in d[1].reason
    assert "proxy_since_best" not in d[1].evidence


def test_a_policy_names_the_gate_and_a_stored_job_decides_the_same_after_a_restart(tmp_path):
    assert set(GATES) == {"kl_past_peak", "proxy_diverges"}
    assert Policy.from_dict({"detector": "sequential", "gate": "proxy_diverges"}).to_dict()["gate"] == "proxy_diverges"
    with pytest.raises(InvalidInput, match="gate must be one of kl_past_peak, proxy_diverges"):
        Policy.from_dict({"detector": "decline", "gate": "proxy"})
    requests = [ReportRequest(i, s, proxy_reward=p) for i, (s, p) in enumerate(_run(3, 12), start=1)]
    last = restart_decides_the_same(tmp_path / "gate.db", {"detector": "decline", "gate": "proxy_diverges"},
                                    requests, cut=14)
    assert last.action is Action.STOP and last.reason.count("since the best eval") == 1, last
