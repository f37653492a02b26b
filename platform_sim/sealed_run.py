"""``platform-sim run --sealed`` / ``--salt`` / ``--overlay-class``: salted, optionally sealed runs.

Like :func:`platform_sim.experiments.run_seeds` (the configured scheduler alone vs with an overlay,
paired per seed), with two differences:

* every seed's workload is drawn with a **salt** (:func:`platform_sim.workload.generate_workload`):
  a fresh secret one (:func:`~platform_sim.workload.secret_salt`) unless given. The public generator
  cannot rebuild the truth without it. It is recorded in the result (:class:`SaltedRun`) once the
  run is over, so ``--salt`` reproduces the run exactly, sealed or in-process;
* with ``sealed`` the overlay runs in its own process (:class:`~platform_sim.sealed.SealedOverlay`),
  started before the seed's base run so that its start overlaps it. A user's overlay class
  (``module:Class``) always runs sealed.

Example::

    >>> from platform_sim.config import load_config
    >>> cfg = load_config().replace(**{"workload.n_jobs": 30})
    >>> sealed = run_salted(cfg, seeds=2, workers=1, salt=7, sealed=True)
    >>> plain = run_salted(cfg, seeds=2, workers=1, salt=7, sealed=False)
    >>> sealed.result.to_json() == plain.result.to_json(), sealed.to_dict()["sealed"]["salt"]
    (True, '0x7')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from .comparison import watched_types
from .config import ConfigError, SimConfig, config_from_dict
from .engine import Simulation
from .experiments import SeedPair, aggregate_pair, default_workers, map_seeds
from .metrics import compare, detection_by_type, summarize
from .overlays import Overlay
from .policies import build_overlay, build_scheduler, check_config
from .results import PairResult, json_safe
from .sealed import SealedOverlay, sealed_spec, undumpable
from .workload import generate_workload, secret_salt

__all__ = ["SaltedRun", "parse_salt", "run_salted"]


def parse_salt(text: str) -> int:
    """A salt from the command line: a non-negative integer, decimal or ``0x`` hex.

    Raises:
        ConfigError: anything else."""
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"--salt must be a non-negative integer (decimal or 0x hex), but got {text!r}")
    return value


@dataclass(frozen=True)
class SaltedRun:
    """A salted run's :class:`~platform_sim.results.PairResult` and how to reproduce it."""

    result: PairResult
    salt: int
    overlay: str  # a registered overlay's name or a user's module:Class
    params: dict[str, Any] = field(default_factory=dict)
    sealed: bool = True
    hardened: bool = False  # the child dropped its capabilities (sealed runs on Linux)

    def to_dict(self) -> dict[str, Any]:
        """The result's JSON object plus ``sealed``: the salt (hex), the overlay and the mode."""
        return {**self.result.to_dict(), "sealed": {
            "sealed": self.sealed, "salt": hex(self.salt), "overlay": self.overlay, "params": self.params,
            "child_dropped_privileges": self.hardened,
        }}

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=1, allow_nan=False)


def _run_seed(args: tuple[dict, int, int, str, dict, bool]) -> tuple[SeedPair, str, bool]:
    cfg_dict, seed, salt, spec, params, sealed = args
    cfg = config_from_dict(cfg_dict)
    wl = generate_workload(cfg, seed, salt)
    sealed_overlay = SealedOverlay(spec, params) if sealed else None  # starts now, during the base run
    try:
        base = Simulation(wl, cfg, build_scheduler(cfg), Overlay()).run()
        overlay = sealed_overlay if sealed_overlay is not None else build_overlay(cfg, wl, spec)
        run = Simulation(wl, cfg, build_scheduler(cfg), overlay).run()
    finally:
        if sealed_overlay is not None:
            sealed_overlay.close()
    watched = watched_types(cfg, spec) if ":" not in spec else None  # a user's class: the RLHF types
    s_base, s_run = summarize(base, wl, cfg), summarize(run, wl, cfg, watched)
    pair = SeedPair(
        changes=compare(base, run, wl, cfg, (s_base, s_run)), base=s_base, run=s_run,
        by_type=detection_by_type(run, wl, cfg.metrics.harmful_margin, watched),
        jct_base_h=tuple(o.jct_s / 3600 for o in base.outcomes), jct_run_h=tuple(o.jct_s / 3600 for o in run.outcomes),
        is_oracle=run.is_oracle,
    )
    return pair, run.overlay, bool(sealed_overlay is not None and sealed_overlay.hardened)


def run_salted(cfg: SimConfig, seeds: int | None = None, workers: int | None = None, progress: bool = False,
               seed_start: int = 0, salt: int | None = None, sealed: bool = True, overlay_class: str | None = None,
               overlay_params: Mapping[str, Any] | None = None) -> SaltedRun:
    """The configured scheduler alone vs with an overlay, every workload drawn with ``salt``.

    Args:
        salt: the hidden streams' salt (None: a fresh secret one, recorded in the result).
        sealed: run the overlay in its own process (forced by ``overlay_class``).
        overlay_class: a user's ``module:Class`` instead of the configured overlay.
        overlay_params: that class's keyword arguments (plain JSON values).

    Raises:
        ConfigError: a bad config, Oracle-Stop sealed, per-example evals sealed, a malformed class path
            or parameters.
        SealedOverlayError: the overlay's process failed or broke the protocol.
    """
    check_config(cfg)
    if overlay_params and overlay_class is None:
        raise ConfigError("--overlay-params needs --overlay-class (a registered overlay takes its config block)")
    spec = overlay_class or cfg.overlay.name
    params = dict(overlay_params or {}) if overlay_class else cfg.overlay.block(spec)
    sealed = sealed or overlay_class is not None
    if sealed and cfg.noise.per_example.n:  # the sealed protocol carries scores, not per-example evidence
        raise ConfigError("a sealed overlay sees each eval's score only, not its per-example evidence: run "
                          "noise.per_example.n > 0 in process (without --sealed or --overlay-class), or set it to 0")
    if sealed:
        try:
            sealed_spec(spec, params)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    salt = secret_salt() if salt is None else salt
    n = seeds or cfg.seeds
    items = [(cfg.to_dict(), seed_start + s, salt, spec, params, sealed) for s in range(n)]
    with undumpable() if sealed else nullcontext():  # the salt is in this process and its workers
        rows = map_seeds(_run_seed, items, workers or default_workers(), progress, f"{cfg.scheduler.name}+{spec}")
    result = replace(aggregate_pair([r[0] for r in rows], cfg, n, seed_start), overlay=rows[0][1])
    return SaltedRun(result, salt, spec, params, sealed, all(r[2] for r in rows) if sealed else False)
