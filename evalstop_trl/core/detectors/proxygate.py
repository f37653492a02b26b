"""The proxy gate: a rule's stop is carried out only while the proxy reward has risen since the best eval.

Reward hacking is the proxy reward rising while world feedback falls. A policy with ``gate:
proxy_diverges`` wraps its rule: when the rule decides a stop, the stop stands only if the proxy
reward of the latest report is above the proxy of the report where the best eval was (best: the
reward model's score of the eval's own completions, ``WorldFeedback.proxy``, which shares the eval's
sampling noise; else the training reward the trainer logs); if world feedback and the proxy fell together, the fall is the eval's
noise or a run getting worse on both, and the job continues, saying why. The comparison is of two
proxy values with each other: no threshold, so no constant in the proxy's units. The stop's evidence
carries ``proxy_since_best`` ("proxy +0.3 since the best eval"). A run that logs no proxy reward is
judged by its rule alone (evidence is never required).

    >>> from evalstop_trl.core.detectors import Observation, create_detector
    >>> gated = ProxyGate(create_detector("decline", k=1, noise="none"))  # the bare paper rule: any fall
    >>> reports = [(0.50, 0.40), (0.60, 0.50), (0.55, 0.45), (0.65, 0.60), (0.58, 0.72)]  # (eval, proxy)
    >>> d = [gated.observe(Observation("j", i, s, proxy_reward=p)) for i, (s, p) in enumerate(reports)]
    >>> d[2].action.value, d[2].reason.startswith("held by the proxy gate")  # both fell: held
    ('continue', True)
    >>> d[4].action.value, round(d[4].evidence["proxy_since_best"], 2)     # the proxy rose: stopped
    ('stop', 0.12)
"""

from __future__ import annotations

import math
from typing import Any

from .base import Gate, Observed

__all__ = ["ProxyGate", "describe_proxy"]


def describe_proxy(moved: float) -> str:
    """A stop's reason clause for the proxy's change since the best eval (the gate's and the coordinator's)."""
    return f"proxy {moved:+.3g} since the best eval"


class ProxyGate(Gate):
    """``rule``, its stops held unless the proxy reward rose since the best eval (see the module
    docstring). The gate's state: the proxy at the best eval, the latest proxy (each None until known)."""

    label = "proxy gate"

    def _start_gate(self) -> Any:
        return (None, None)

    def _see(self, own: Any, obs: Observed, best_step: int | None) -> Any:
        at_best, latest = own
        if obs.proxy_reward is not None:
            latest = obs.proxy_reward
        if best_step == obs.step and obs.eval_score is not None:  # this report's eval is the new best
            at_best = latest  # the proxy logged with it, else the latest before it
        return at_best, latest

    def _check(self, own: Any, obs: Observed) -> tuple[bool, str, dict[str, Any]] | None:
        at_best, latest = own
        if at_best is None or latest is None:
            return None
        moved = latest - at_best  # finite proxies 1e308 apart differ by an infinity: its sign is still right
        said = describe_proxy(moved) if math.isfinite(moved) else \
            f"proxy {'above' if moved > 0 else 'below'} its value at the best eval"
        evidence = {"proxy_since_best": moved} if math.isfinite(moved) else {}
        if moved > 0:
            return True, said, evidence
        return False, f"{said}: world feedback and the proxy fell together, not a hack", evidence
