"""Build the configured scheduler and overlay, checking their config blocks by signature.

The bridge between :mod:`platform_sim.config` (pure data) and the policy registries
(:data:`~platform_sim.schedulers.SCHEDULERS`, :data:`~platform_sim.overlays.OVERLAYS`, and for
detector overlays ``evalstop_trl.core.detectors.DETECTORS``). Every problem is a
:class:`~platform_sim.config.ConfigError` naming the dotted key, which the CLI turns into exit 2.

Example::

    >>> from platform_sim.config import load_config
    >>> cfg = load_config()
    >>> check_config(cfg)  # the shipped default is valid
    >>> build_scheduler(cfg, "loss_aware").round_s
    300.0
    >>> check_config(cfg.replace(**{"scheduler.fifo.backfil": False}))
    Traceback (most recent call last):
    ...
    platform_sim.config.ConfigError: unknown key scheduler.fifo.backfil; valid keys here: backfill
"""

from __future__ import annotations

from typing import Any

from .config import ConfigError, PolicyConfig, SimConfig
from .overlays import OVERLAYS, Overlay, create_overlay, overlay_block_keys
from .schedulers import SCHEDULERS, Scheduler, check_rounds, create_scheduler
from .workload import Workload

__all__ = ["build_overlay", "build_scheduler", "check_config"]


def _entry(section: str, choice: PolicyConfig, registry: Any, name: str | None) -> str:
    if name is not None:
        registry.get(name)  # ValueError listing the valid names
        return name
    if choice.name not in registry:
        raise ConfigError(f"{section}.name must be one of {', '.join(registry.names())}, but got {choice.name!r}")
    return choice.name


def _valid_keys(section: str, entry: str, block: dict[str, Any]) -> tuple[str, ...]:
    if section == "scheduler":
        return tuple(SCHEDULERS.params(entry))
    try:
        return overlay_block_keys(entry, block)
    except ValueError as exc:  # an unknown detector
        raise ConfigError(f"overlay.{entry}.detector: {exc}") from None


def _checked_block(section: str, choice: PolicyConfig, entry: str) -> dict[str, Any]:
    block = choice.block(entry)
    valid = _valid_keys(section, entry, block)
    for key in block:
        if key not in valid:
            raise ConfigError(f"unknown key {section}.{entry}.{key}; valid keys here: {', '.join(valid) or '(none)'}")
    return block


def build_scheduler(cfg: SimConfig, name: str | None = None) -> Scheduler:
    """The scheduler ``name`` (default: the configured one) with its config block's parameters."""
    name = _entry("scheduler", cfg.scheduler, SCHEDULERS, name)
    block = _checked_block("scheduler", cfg.scheduler, name)
    try:
        scheduler = create_scheduler(name, **block)
        check_rounds(scheduler, cfg.workload.restart_overhead_s)
    except ValueError as exc:
        raise ConfigError(f"scheduler.{name}: {exc}") from None
    return scheduler


def build_overlay(cfg: SimConfig, workload: Workload, name: str | None = None) -> Overlay:
    """The overlay ``name`` (default: the configured one) for ``workload`` with its config block."""
    name = _entry("overlay", cfg.overlay, OVERLAYS, name)
    block = _checked_block("overlay", cfg.overlay, name)
    try:
        return create_overlay(name, workload, **block)
    except ValueError as exc:
        raise ConfigError(f"overlay.{name}: {exc}") from None


def check_config(cfg: SimConfig) -> None:
    """Raise ConfigError unless the chosen scheduler and overlay exist and every parameter block,
    chosen or not, names only parameters of its entry with valid values."""
    for section, choice, registry in (("scheduler", cfg.scheduler, SCHEDULERS), ("overlay", cfg.overlay, OVERLAYS)):
        _entry(section, choice, registry, None)
        for entry in choice.blocks:
            if entry not in registry:
                valid = ", ".join(("name", *registry.names()))
                raise ConfigError(f"unknown key {section}.{entry}; valid keys here: {valid}")
    empty = Workload((), (), cfg.workload.evals_per_job, 0)  # overlays are checked without a real workload
    for name in dict.fromkeys((cfg.scheduler.name, *cfg.scheduler.blocks)):
        build_scheduler(cfg, name)
    for name in dict.fromkeys((cfg.overlay.name, *cfg.overlay.blocks)):
        build_overlay(cfg, empty, name)
