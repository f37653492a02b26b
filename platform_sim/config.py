"""Simulation configuration: typed frozen dataclasses loaded from YAML, strictly.

Every parameter lives in YAML (``platform_sim/configs/rlhf_heavy.yaml``, package data, is the default;
``configs/sim/`` in the repository links to that folder); the dataclasses
carry no defaults of their own. A config file may name a ``base:`` file (relative to itself) and
override only some keys. Unknown keys, wrong types and impossible values raise :class:`ConfigError`
with the dotted key that is wrong.

This module is data and YAML only: it imports no policy. The ``scheduler:`` and ``overlay:``
sections (:class:`PolicyConfig`) name a registry entry and hold one parameter block per entry;
those blocks are checked against the registered classes' signatures where policies are built
(:func:`platform_sim.policies.check_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["ClusterConfig", "ConfigError", "FamilyConfig", "PoolConfig", "PolicyConfig", "SimConfig", "CONFIGS", "DEFAULT_CONFIG", "load_config",
           "config_from_dict", "apply_overrides"]

#: the packaged configs' one home (package data; ``configs/sim`` in the repository is a link to it)
CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = CONFIGS / "rlhf_heavy.yaml"


class ConfigError(ValueError):
    """A bad configuration; the message names the key."""


Range = tuple[float, float]


@dataclass(frozen=True)
class PoolConfig:
    """One pool of identical GPUs: ``nodes`` nodes of ``gpus_per_node`` GPUs."""

    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ClusterConfig:
    """The GPUs: one uniform pool of reference GPUs (``nodes`` x ``gpus_per_node``, the paper's) or,
    when ``pools`` names any, one pool per GPU model (``{t4: {nodes: 6, gpus_per_node: 4}, ...}``;
    ``nodes`` and ``gpus_per_node`` are then unused). A gang runs in one pool. Work is measured on the
    reference GPU (speed 1.0) and runs at ``speeds[pool]`` there (``type_speeds[type][pool]`` where a
    job type has its own); docs/simulator.md, "Heterogeneous clusters", gives the defaults' sources."""

    nodes: int
    gpus_per_node: int
    pack_small_jobs: bool
    pools: dict[str, PoolConfig]
    speeds: dict[str, float]
    type_speeds: dict[str, dict[str, float]]

    def pool_list(self) -> tuple[tuple[str, PoolConfig], ...]:
        """``(name, pool)`` in order; the uniform cluster is one pool named ``""`` of speed 1."""
        if not self.pools:
            return (("", PoolConfig(self.nodes, self.gpus_per_node)),)
        return tuple(self.pools.items())

    @property
    def total_gpus(self) -> int:
        return sum(p.gpus for _, p in self.pool_list())

    @property
    def largest_pool(self) -> int:
        """The most GPUs one gang can get."""
        return max(p.gpus for _, p in self.pool_list())

    def reference_gpus(self, shares: Mapping[str, float]) -> float:
        """The cluster's capacity in reference GPUs, the unit ``workload.load`` is offered in: each
        pool's GPUs times its speed, averaged over job types by ``shares`` (type -> share of jobs);
        the uniform cluster's is ``total_gpus``."""
        if not self.pools:
            return self.total_gpus
        total = sum(shares.values())
        return sum(p.gpus * sum(share * self.speed(name, t) for t, share in shares.items()) / total
                   for name, p in self.pools.items())

    def speed(self, pool: str, job_type: str) -> float:
        """How fast ``job_type`` runs on ``pool``'s GPUs, in reference GPUs (1.0 on the uniform cluster)."""
        if not pool:
            return 1.0
        own = self.type_speeds.get(job_type)
        if own is not None and pool in own:
            return own[pool]
        return self.speeds[pool]


@dataclass(frozen=True)
class JobTypeConfig:
    share: float
    rlhf: bool
    gpus: dict[int, float]
    median_h: float
    sigma_ln: float
    clamp_h: Range


@dataclass(frozen=True)
class TypeRuleConfig:
    """One row of the rule table that gives trace jobs a simulator job type: a job of at most
    ``max_gpus`` GPUs and ``max_h`` hours draws its type from ``types`` (type -> probability)."""

    max_gpus: int
    max_h: float
    types: dict[str, float]


@dataclass(frozen=True)
class SourceConfig:
    """Where jobs come from: ``kind: synthetic`` (the type table, Poisson arrivals) or ``kind: trace``
    (arrivals, GPUs and durations from a cluster trace, :mod:`platform_sim.cluster_traces`).

    With a trace the window is the first ``workload.n_jobs`` usable jobs submitted ``start_h`` hours or
    more after the trace's first job. ``load_fit: scale`` stretches or compresses the window's arrival
    times so its offered load is ``workload.load``; ``thin`` keeps each job with a (seeded) probability
    that lowers the load to ``workload.load`` (it cannot raise it); ``none`` keeps the recorded times.
    Jobs shorter than ``min_duration_s``, of more than ``max_gpu_hours`` or larger than the cluster are
    dropped and counted. ``type_map`` maps the trace's own job types (where it has them) to simulator
    types; every other job draws one from ``type_rules``, the first rule that fits it (the last one
    if none does)."""

    kind: Literal["synthetic", "trace"]
    format: str
    path: str
    start_h: float
    load_fit: Literal["scale", "thin", "none"]
    min_duration_s: float
    max_gpu_hours: float
    type_map: dict[str, str]
    type_rules: dict[str, TypeRuleConfig]


@dataclass(frozen=True)
class WorkloadConfig:
    source: SourceConfig
    n_jobs: int
    load: float
    arrivals: Literal["poisson", "all_at_zero"]
    sigma_est: float
    evals_per_job: int
    eval_overhead_frac: float
    checkpoint_s: float
    restart_overhead_s: float
    types: dict[str, JobTypeConfig]


@dataclass(frozen=True)
class FamilyConfig:
    """Hacked-curve families (:mod:`platform_sim.curves`): each one's share of the hacked RLHF jobs
    and the ranges its parameters are drawn from (uniformly)."""

    shares: dict[str, float]
    late_p_peak: Range
    late_sharpness: Range
    shallow_depth: Range
    drop_at: Range
    drop_depth: Range
    osc_amplitude: Range
    osc_cycles: Range
    kl_p_peak: Range
    kl_exponent: Range


@dataclass(frozen=True)
class CurveConfig:
    """The RLHF jobs' curves. ``source: fitted`` draws them from the parametric forms below
    (:mod:`platform_sim.curves`); ``measured:PATH`` takes each RLHF job's curves from a run of the
    real-run corpus at ``PATH`` (:mod:`platform_sim.measured`; a relative ``PATH`` in a config file is
    relative to that file, one given by ``--set`` to the working directory), its status still drawn with
    ``hack_fraction`` and its label from the run's gold."""

    source: str
    hack_fraction: float
    hacked_p_peak: Range
    hacked_height: Range
    hacked_families: FamilyConfig
    rising_share: float
    rising_p_peak: Range
    rising_final_gain: Range
    plateau_tau: Range
    plateau_height: Range
    label_min_drop: float


@dataclass(frozen=True)
class PerExampleConfig:
    """Evals as means over examples (``n`` > 0; 0: one noisy number per eval, the paper's model).

    ``scores: gaussian``: example k's score is gold + its effect b_k + N(0, sigma * sqrt(n)), so the
    mean carries the configured ``noise.sigma``; ``binary``: a pass with probability
    sigmoid(``link_scale`` * (gold - ``link_mid``) + b_k), a win rate that rises and falls with gold
    (the same peak, the same labels). Effects b_k ~ N(0, ``example_sd``) are drawn once per job
    (``examples: fixed``, the same examples at every eval: the paired noise is reported) or for
    every eval (``fresh``: no shared examples, no paired noise)."""

    n: int
    scores: Literal["gaussian", "binary"]
    examples: Literal["fixed", "fresh"]
    example_sd: float
    link_mid: float
    link_scale: float


@dataclass(frozen=True)
class NoiseConfig:
    sigma: float
    kind: Literal["gaussian", "ar1", "student_t"]
    ar_rho: float
    t_df: float
    per_example: PerExampleConfig


@dataclass(frozen=True)
class ProxyConfig:
    kappa: Range
    sigma: float


@dataclass(frozen=True)
class LossConfig:
    tau: Range
    sigma: float


@dataclass(frozen=True)
class PolicyConfig:
    """A chosen registry entry and parameter blocks for any entries.

    YAML: ``{name: srtf_est, fifo: {backfill: true}, loss_aware: {round_s: 300, promote_h: 4.0}}``:
    every key but ``name`` is an entry's name and holds that entry's parameters (an entry without a
    block takes its defaults). Blocks for entries other than ``name`` are kept because experiments
    compare several entries from one config (``reproduce`` runs every scheduler).
    """

    name: str
    blocks: dict[str, dict[str, Any]]

    def block(self, entry: str | None = None) -> dict[str, Any]:
        """A copy of ``entry``'s parameter block (``name``'s when None; empty when there is none)."""
        return dict(self.blocks.get(self.name if entry is None else entry, {}))


@dataclass(frozen=True)
class MetricsConfig:
    harmful_margin: float


@dataclass(frozen=True)
class SimConfig:
    name: str
    seeds: int
    cluster: ClusterConfig
    workload: WorkloadConfig
    curves: CurveConfig
    noise: NoiseConfig
    proxy: ProxyConfig
    loss: LossConfig
    scheduler: PolicyConfig
    overlay: PolicyConfig
    metrics: MetricsConfig

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    @property
    def measured_path(self) -> str | None:
        """The corpus folder of ``curves.source: measured:PATH`` (None: fitted curves)."""
        return self.curves.source.removeprefix(MEASURED) if self.curves.source.startswith(MEASURED) else None

    def replace(self, **overrides: Any) -> SimConfig:
        """A copy with dotted-key overrides, e.g. ``cfg.replace(**{"noise.sigma": 0.08})``."""
        return apply_overrides(self, overrides)


# ----------------------------------------------------------------------------- conversion
def _to_plain(obj: Any) -> Any:
    if isinstance(obj, PolicyConfig):
        return {"name": obj.name, **_to_plain(obj.blocks)}
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


def _policy_config(value: Any, key: str) -> PolicyConfig:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, but got {value!r}")
    if "name" not in value:
        raise ConfigError(f"missing key {key}.name")
    name = _convert(str, value["name"], f"{key}.name")
    blocks = {}
    for entry, block in value.items():
        if entry == "name":
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{key}.{entry} must be a mapping of parameters, but got {block!r}")
        for param in block:
            if not isinstance(param, str):
                raise ConfigError(f"{key}.{entry} has a parameter name that is not a string: {param!r}")
        blocks[str(entry)] = copy.deepcopy(dict(block))
    return PolicyConfig(name, blocks)


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is PolicyConfig:
        return _policy_config(value, key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, but got {value!r}")
        return _build(tp, value, key)
    if origin is Literal:
        options = typing.get_args(tp)
        if value not in options:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, options))}, but got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ConfigError(f"{key} must be a [low, high] pair, but got {value!r}")
        lo, hi = (_convert(float, v, f"{key}[{i}]") for i, v in enumerate(value))
        if lo > hi:
            raise ConfigError(f"{key} must have low <= high, but got {value!r}")
        return (lo, hi)
    if origin is dict:
        ktp, vtp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping, but got {value!r}")
        return {_convert(ktp, k, f"{key}.{k}"): _convert(vtp, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, but got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, but got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, but got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, but got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - a programming error


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            raise ConfigError(f"unknown key {prefix + '.' if prefix else ''}{k}; valid keys here: {', '.join(names)}")
    kwargs = {}
    for name in names:
        key = f"{prefix}.{name}" if prefix else name
        if name not in data:
            raise ConfigError(f"missing key {key}")
        kwargs[name] = _convert(hints[name], data[name], key)
    return cls(**kwargs)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key} {msg}")


def _validate(c: SimConfig) -> None:
    _check(c.seeds >= 1, "seeds", f"must be >= 1, but got {c.seeds}")
    _validate_cluster(c)
    w = c.workload
    _check(w.n_jobs >= 1, "workload.n_jobs", f"must be >= 1, but got {w.n_jobs}")
    _check(w.load > 0, "workload.load", f"must be > 0, but got {w.load}")
    _check(w.sigma_est >= 0, "workload.sigma_est", f"must be >= 0, but got {w.sigma_est}")
    _check(w.evals_per_job >= 1, "workload.evals_per_job", f"must be >= 1, but got {w.evals_per_job}")
    _check(w.eval_overhead_frac >= 0, "workload.eval_overhead_frac", "must be >= 0")
    _check(w.checkpoint_s >= 0, "workload.checkpoint_s", "must be >= 0")
    _check(w.restart_overhead_s >= 0, "workload.restart_overhead_s", "must be >= 0")
    _check(len(w.types) >= 1, "workload.types", "must name at least one job type")
    total = sum(t.share for t in w.types.values())
    _check(abs(total - 1) < 1e-6, "workload.types", f"shares must sum to 1, but sum to {total:g}")
    for name, t in w.types.items():
        key = f"workload.types.{name}"
        _check(t.share >= 0, f"{key}.share", "must be >= 0")
        _check(t.median_h > 0 and t.sigma_ln >= 0, f"{key}.median_h", "must be > 0 (and sigma_ln >= 0)")
        _check(t.clamp_h[0] > 0, f"{key}.clamp_h", "must be positive")
        _check(abs(sum(t.gpus.values()) - 1) < 1e-6, f"{key}.gpus", "probabilities must sum to 1")
        for g, prob in t.gpus.items():
            _check(g >= 1, f"{key}.gpus", f"has {g} GPUs; a job needs at least 1")
            # a trace's jobs bring their own GPUs (the larger ones are dropped and counted), so the
            # table's sizes bind only synthetic workloads
            _check(prob == 0 or g <= c.cluster.largest_pool or w.source.kind == "trace", f"{key}.gpus", f"has {g} GPUs, more than the cluster's "
                   + (f"largest pool's {c.cluster.largest_pool} (a gang runs in one pool: give this size probability 0 or add a larger pool)" if c.cluster.pools
                      else f"{c.cluster.total_gpus}"))
    _validate_source(w.source, w)
    cv = c.curves
    _check(cv.source == "fitted" or (cv.source.startswith(MEASURED) and len(cv.source) > len(MEASURED)),
           "curves.source", f"must be fitted or {MEASURED}PATH (a folder of the real-run corpus, e.g. "
           f"{MEASURED}configs/corpus), but got {cv.source!r}")
    _check(cv.source == "fitted" or c.noise.per_example.n == 0, "noise.per_example.n",
           f"> 0 cannot be combined with curves.source={cv.source!r}: a measured run's world feedback is its own "
           "measurement (set noise.per_example.n: 0)")
    for key in ("hack_fraction", "rising_share"):
        v = getattr(cv, key)
        _check(0 <= v <= 1, f"curves.{key}", f"must be in [0, 1], but got {v}")
    _check(cv.hacked_p_peak[0] > 0, "curves.hacked_p_peak", "must be positive")
    _check(cv.rising_p_peak[0] > 0, "curves.rising_p_peak", "must be positive")
    _check(cv.plateau_tau[0] > 0, "curves.plateau_tau", "must be positive")
    _validate_families(cv.hacked_families)
    _check(c.noise.sigma >= 0, "noise.sigma", f"must be >= 0, but got {c.noise.sigma}")
    _check(-1 < c.noise.ar_rho < 1, "noise.ar_rho", "must be in (-1, 1)")
    _check(c.noise.t_df > 2, "noise.t_df", "must be > 2 (finite variance)")
    pe = c.noise.per_example
    _check(0 <= pe.n <= 100_000, "noise.per_example.n", f"must be in [0, 100000] examples (0: off), but got {pe.n}")
    _check(pe.n == 0 or c.noise.kind == "gaussian", "noise.per_example.n",
           f"> 0 draws each example's own noise; it cannot be combined with noise.kind={c.noise.kind!r} "
           "(set noise.kind: gaussian)")
    _check(pe.example_sd >= 0, "noise.per_example.example_sd", f"must be >= 0, but got {pe.example_sd}")
    _check(pe.link_scale > 0, "noise.per_example.link_scale", f"must be > 0, but got {pe.link_scale}")
    _check(c.loss.tau[0] > 0, "loss.tau", "must be positive")


def _validate_cluster(c: SimConfig) -> None:
    cl = c.cluster
    _check(cl.nodes >= 1 and cl.gpus_per_node >= 1, "cluster.nodes", "and gpus_per_node must be >= 1")
    for name, pool in cl.pools.items():
        _check(pool.nodes >= 1 and pool.gpus_per_node >= 1, f"cluster.pools.{name}", "needs nodes and gpus_per_node >= 1")
        _check(name in cl.speeds or (all(name in own for own in cl.type_speeds.values())
                                     and set(cl.type_speeds) >= set(c.workload.types)), f"cluster.pools.{name}",
               f"is not a GPU model with a known speed ({', '.join(cl.speeds)}); give its speed relative to the "
               f"reference GPU: cluster.speeds.{name}: S (or cluster.type_speeds.<type>.{name} for every job type)")
    for name, v in cl.speeds.items():
        _check(v > 0, f"cluster.speeds.{name}", f"must be > 0, but got {v}")
    for t, own in cl.type_speeds.items():
        _check(t in c.workload.types, f"cluster.type_speeds.{t}",
               f"is not a job type; types: {', '.join(c.workload.types)}")
        for name, v in own.items():
            _check(name in cl.pools, f"cluster.type_speeds.{t}.{name}",
                   f"is not a pool; pools: {', '.join(cl.pools) or '(none: the cluster is uniform)'}")
            _check(v > 0, f"cluster.type_speeds.{t}.{name}", f"must be > 0, but got {v}")


def _validate_source(src: SourceConfig, w: WorkloadConfig) -> None:
    key = "workload.source"
    _check(src.kind == "synthetic" or bool(src.path), f"{key}.path",
           "must name the trace file when kind is trace (e.g. --set workload.source.path=/data/philly.csv)")
    _check(src.kind == "synthetic" or w.arrivals == "poisson", "workload.arrivals",
           "must be poisson with a trace source: the trace's submissions are the arrivals")
    _check(src.start_h >= 0, f"{key}.start_h", f"must be >= 0, but got {src.start_h}")
    _check(src.min_duration_s >= 0, f"{key}.min_duration_s", f"must be >= 0, but got {src.min_duration_s}")
    _check(src.max_gpu_hours > 0, f"{key}.max_gpu_hours", f"must be > 0, but got {src.max_gpu_hours}")
    if src.kind == "synthetic":
        return  # the type map and rules name the types only a trace's jobs are given
    for name, to in src.type_map.items():
        _check(to in w.types, f"{key}.type_map.{name}", f"maps to {to!r}, not a job type; types: {', '.join(w.types)}")
    _check(len(src.type_rules) >= 1, f"{key}.type_rules", "must hold at least one rule")
    for rule_name, rule in src.type_rules.items():
        rk = f"{key}.type_rules.{rule_name}"
        _check(rule.max_gpus >= 1 and rule.max_h > 0, rk, "needs max_gpus >= 1 and max_h > 0")
        for t, share in rule.types.items():
            _check(t in w.types, f"{rk}.types", f"has {t!r}, not a job type; types: {', '.join(w.types)}")
            _check(share >= 0, f"{rk}.types.{t}", f"must be >= 0, but got {share}")
        total = sum(rule.types.values())
        _check(abs(total - 1) < 1e-6, f"{rk}.types", f"probabilities must sum to 1, but sum to {total:g}")


#: the prefix of ``curves.source`` that names a corpus folder
MEASURED = "measured:"

#: names of the hacked-curve families (``platform_sim.curves.Family``; this module imports nothing)
HACKED_FAMILIES = ("gao", "late_onset", "shallow", "plateau_then_drop", "oscillating", "gao_kl")


def _validate_families(f: FamilyConfig) -> None:
    key = "curves.hacked_families"
    for name, share in f.shares.items():
        _check(name in HACKED_FAMILIES, f"{key}.shares",
               f"has an unknown family {name!r}; families: {', '.join(HACKED_FAMILIES)}")
        _check(share >= 0, f"{key}.shares.{name}", f"must be >= 0, but got {share}")
    total = sum(f.shares.values())
    _check(abs(total - 1) < 1e-6, f"{key}.shares", f"must sum to 1, but sum to {total:g}")
    _check(0 < f.late_p_peak[0] and f.late_p_peak[1] < 1, f"{key}.late_p_peak", "must lie in (0, 1)")
    _check(f.late_sharpness[0] >= 1, f"{key}.late_sharpness", "must be >= 1 (1 is plain Gao)")
    _check(0 <= f.shallow_depth[0] and f.shallow_depth[1] <= 1, f"{key}.shallow_depth", "must lie in [0, 1]")
    _check(0 <= f.drop_at[0] and f.drop_at[1] < 1, f"{key}.drop_at", "must lie in [0, 1)")
    _check(f.drop_depth[0] >= 0, f"{key}.drop_depth", "must be >= 0")
    _check(f.osc_amplitude[0] >= 0, f"{key}.osc_amplitude", "must be >= 0")
    _check(f.osc_cycles[0] >= 0, f"{key}.osc_cycles", "must be >= 0")
    _check(0 < f.kl_p_peak[0] and f.kl_p_peak[1] < 1, f"{key}.kl_p_peak", "must lie in (0, 1)")
    _check(0 < f.kl_exponent[0] and f.kl_exponent[1] <= 2, f"{key}.kl_exponent",
           "must lie in (0, 2] (1: the KL grows linearly with progress)")


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys")
    base = data.pop("base", None)
    source = (data.get("workload") or {}).get("source") if isinstance(data.get("workload"), dict) else None
    if isinstance(source, dict) and isinstance(source.get("path"), str) and source["path"]:
        # a trace path in a config file is relative to that file (one given by --set: to the working directory)
        source["path"] = str((path.parent / Path(source["path"]).expanduser()).resolve())
    curves = data.get("curves")
    if isinstance(curves, dict) and isinstance(curves.get("source"), str) and curves["source"].startswith(MEASURED):
        # so is a corpus folder's (curves.source: measured:PATH)
        folder = curves["source"].removeprefix(MEASURED)
        if folder:
            curves["source"] = MEASURED + str((path.parent / Path(folder).expanduser()).resolve())
    if base is not None:
        data = _merge(_read_yaml((path.parent / base).resolve()), data)
    return data


def config_from_dict(data: Mapping[str, Any]) -> SimConfig:
    return _build(SimConfig, data)


def load_config(path: str | Path | None = None) -> SimConfig:
    """Load a YAML config (the default ``rlhf_heavy`` when ``path`` is None)."""
    return config_from_dict(_read_yaml(Path(path) if path else DEFAULT_CONFIG))


def parse_value(text: str) -> Any:
    """Parse a ``--set key=value`` value with YAML rules (numbers, booleans, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _unknown_key(dotted: str, node: Any, tp: Any = None) -> ConfigError:
    if dataclasses.is_dataclass(tp):
        return ConfigError(f"unknown key {dotted}; valid keys here: {', '.join(f.name for f in dataclasses.fields(tp))}")
    if isinstance(node, dict):
        return ConfigError(f"unknown key {dotted}; valid keys here: {', '.join(map(str, node))}")
    return ConfigError(f"unknown key {dotted}")


def apply_overrides(cfg: SimConfig, overrides: Mapping[str, Any]) -> SimConfig:
    """Return ``cfg`` with dotted keys replaced (``{"noise.sigma": 0.08}``); unknown keys raise.

    A policy parameter (``scheduler.<entry>.<param>``, ``overlay.<entry>.<param>``) may be set even
    if the YAML does not list it: the registered class's signature decides whether it exists
    (:func:`platform_sim.policies.check_config`), not this module. A key under a mapping field adds
    or replaces one entry (``cluster.speeds.mi300=1.5``, ``cluster.pools.t4.nodes=6``); a whole
    mapping as the value (``cluster.speeds={mi300: 1.5}``) replaces the mapping.
    """
    data = cfg.to_dict()
    hints = typing.get_type_hints(SimConfig)
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        if len(parents) == 2 and hints.get(parents[0]) is PolicyConfig and parents[1] != "name":
            data[parents[0]].setdefault(parents[1], {})[last] = value
            continue
        node, tp = data, SimConfig
        for part in parents:
            key = _key(tp, part)
            if isinstance(node, dict) and key not in node and _is_mapping(tp):
                node[key] = {}  # a new entry of a mapping field (a pool, a type's speeds)
            if not isinstance(node, dict) or key not in node:
                raise _unknown_key(dotted, node)
            node, tp = node[key], _child_type(tp, part)
        key = _key(tp, last)
        if not isinstance(node, dict) or (key not in node and not _is_mapping(tp) and not (
                dataclasses.is_dataclass(tp) and key in typing.get_type_hints(tp))):  # a field of a new entry
            raise _unknown_key(dotted, node, tp)
        node[key] = value
    return config_from_dict(data)


def _is_mapping(tp: Any) -> bool:
    """A ``dict[...]`` field: ``--set`` may add entries to it (``cluster.speeds.mi300=1.5``)."""
    return typing.get_origin(tp) is dict


def _child_type(tp: Any, part: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return typing.get_type_hints(tp).get(part)
    if _is_mapping(tp):
        return typing.get_args(tp)[1]
    return None


def _key(tp: Any, part: str) -> Any:
    """``part`` as a key of a mapping of ``int`` keys (``workload.types.dpo.gpus.16``), else itself."""
    if _is_mapping(tp) and typing.get_args(tp)[0] is int and part.lstrip("-").isdigit():
        return int(part)
    return part
