"""``platform-sim run | reproduce | sweep``. Bad configs exit with status 2 naming the key."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evalstop_trl.core.extras import EXTRA_OF, install_hint

try:
    from .config import MEASURED, ConfigError, apply_overrides, load_config, parse_value
    from .results import json_safe
except ModuleNotFoundError as _missing:  # installed without the simulator's extra: main() says so
    if install_hint(_missing) is None:
        raise
    _MISSING: ModuleNotFoundError | None = _missing
else:
    _MISSING = None


def write_json(obj: Any, path: str | Path) -> None:
    """``obj`` (plain data: a result's ``to_dict()``, a list of them) as JSON, NaN as null."""
    Path(path).write_text(json.dumps(json_safe(obj), indent=1, allow_nan=False))


def _load(args: argparse.Namespace):
    from .policies import check_config

    cfg = load_config(args.config)
    overrides = {}
    for item in args.set or []:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k.strip()] = parse_value(v)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    check_config(cfg)
    if cfg.measured_path is not None:  # --set's relative corpus folder: the working directory's, for every worker
        cfg = cfg.replace(**{"curves.source": MEASURED + str(Path(cfg.measured_path).expanduser().resolve())})
    if cfg.workload.source.kind == "trace" or cfg.measured_path is not None:
        # a bad trace, window or corpus fails here, not in a worker process (and the corpus is read once, here,
        # before the workers fork: every seed sees the same runs)
        from .workload import generate_workload

        try:
            generate_workload(cfg, 0)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"workload.source: {exc}") from None
    if getattr(args, "seeds", None) is not None and args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if getattr(args, "seed_start", 0) < 0:
        raise ConfigError(f"--seed-start must be >= 0, got {args.seed_start}")
    return cfg


def _salted(args: argparse.Namespace) -> bool:
    """A salted run (:mod:`platform_sim.sealed_run`): sealed, a salt or a user's overlay class."""
    if args.overlay_params is not None and args.overlay_class is None:
        raise ConfigError("--overlay-params needs --overlay-class (a registered overlay takes its config block)")
    if args.overlay_class is not None and ":" not in args.overlay_class:
        raise ConfigError(f"--overlay-class takes MODULE:CLASS (e.g. my_pkg.stops:MyOverlay, a subclass of "
                          f"platform_sim.overlays.Overlay), but got {args.overlay_class!r}")
    salted = args.sealed or args.salt is not None or args.overlay_class is not None
    if salted and args.trace:
        raise ConfigError("--trace cannot be salted or sealed: a trace file holds the ground truth, readable by any "
                          "process of this user")
    return salted


def _cmd_run_salted(args: argparse.Namespace) -> int:
    from .report import run_table
    from .sealed_protocol import SealedOverlayError
    from .sealed_run import parse_salt, run_salted
    from .workload import generate_workload, write_trace

    cfg = _load(args)
    params = None
    if args.overlay_params is not None:
        try:
            params = json.loads(args.overlay_params)
        except ValueError as exc:
            raise ConfigError(f"--overlay-params must be a JSON object: {exc}") from None
        if not isinstance(params, dict):
            raise ConfigError(f"--overlay-params must be a JSON object, but got {args.overlay_params!r}")
    salt = parse_salt(args.salt) if args.salt is not None else None
    t0 = time.perf_counter()
    try:
        res = run_salted(cfg, args.seeds, args.workers, progress=not args.quiet, seed_start=args.seed_start,
                         salt=salt, sealed=args.sealed, overlay_class=args.overlay_class, overlay_params=params)
    except SealedOverlayError as exc:
        print(f"\nplatform-sim run: the sealed overlay failed: {exc}", file=sys.stderr)  # after the progress bar
        return 1
    print(run_table(res.result))
    trace = _print_trace(cfg, args, None)
    _print_corpus(cfg)
    dropped = ("is walled in (no capabilities, writes only to its scratch folder, no new processes)" if res.hardened
               else "could not be walled in (no Landlock here: it may write files; see docs/simulator.md)")
    mode = f"sealed ({res.overlay} in its own process, which {dropped})" if res.sealed else "in-process"
    print(f"{mode}; salt {hex(res.salt)} (reproduce with --salt {hex(res.salt)})")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.write_trace:  # only now: a trace holds the truth
        write_trace(generate_workload(cfg, args.seed_start, res.salt), args.write_trace)
        print(f"wrote the workload of seed {args.seed_start} to {args.write_trace}", file=sys.stderr)
    _write_outputs(args, res.result, res.to_json(), trace)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .experiments import run_seeds
    from .report import run_table
    from .workload import generate_workload, read_trace, write_trace

    if _salted(args):
        return _cmd_run_salted(args)
    cfg = _load(args)
    workload = None
    if args.trace:
        try:
            workload = read_trace(args.trace)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.write_trace:
        write_trace(workload or generate_workload(cfg, args.seed_start), args.write_trace)
        print(f"wrote the workload of seed {args.seed_start} to {args.write_trace}", file=sys.stderr)
    t0 = time.perf_counter()
    res = run_seeds(cfg, args.seeds, args.workers, progress=not args.quiet, workload=workload,
                    seed_start=args.seed_start)
    print(run_table(res))
    trace = _print_trace(cfg, args, workload)
    if workload is None:
        _print_corpus(cfg)
    print(f"({time.perf_counter() - t0:.1f} s)")
    _write_outputs(args, res, res.to_json(), trace)
    return 0


def _print_trace(cfg, args: argparse.Namespace, workload) -> dict | None:
    """The trace window a run's jobs came from (the same for every seed), after its table; returned
    as data for ``--json`` (its jobs, the rows skipped and the jobs dropped by reason), None without
    a trace source."""
    if workload is None and cfg.workload.source.kind == "trace":
        from .report import trace_lines
        from .workload import generate_workload

        wl = generate_workload(cfg, args.seed_start)
        print("\n".join(trace_lines(wl)))
        return {"jobs": len(wl.jobs), **wl.source.to_dict()}
    return None


def _print_corpus(cfg) -> None:
    """The corpus of ``curves.source: measured:PATH`` in one line (nothing with fitted curves)."""
    if cfg.measured_path is not None:
        from .measured import load_measured

        print(load_measured(cfg.measured_path).summary())


def _write_outputs(args: argparse.Namespace, result, json_text: str, trace: dict | None = None) -> None:
    """``--plot`` and ``--json`` of ``platform-sim run``, salted or not (``trace``: the window, as
    the JSON's ``trace``)."""
    if args.plot:
        from .plots import plot_run

        print(f"wrote {plot_run(result, args.plot)}")
    if args.json:
        if trace is not None:
            import json

            json_text = json.dumps({**json.loads(json_text), "trace": trace}, indent=1, allow_nan=False)
        Path(args.json).write_text(json_text)
        print(f"wrote {args.json}")


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .plots import plot_reproduce
    from .report import markdown_report
    from .reproduction import reproduce

    cfg = _load(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = reproduce(cfg, args.seeds, args.workers, progress=not args.quiet, ray=args.ray, seed_start=args.seed_start)
    elapsed = time.perf_counter() - t0
    figures = plot_reproduce(res, out)
    res = dataclasses.replace(res, wall_time_s=elapsed)
    (out / "results.json").write_text(res.to_json())
    report = markdown_report(res)
    (out / "report.md").write_text(report)
    print(report)
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {len(figures)} figures in {elapsed:.1f} s")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .experiments import sweep
    from .policies import check_config

    cfg = _load(args)
    values = [parse_value(v) for v in args.values.split(",")]
    for v in values:  # fail fast on an unknown key or a bad value
        check_config(apply_overrides(cfg, {args.param: v}))
    rows = sweep(cfg, args.param, values, args.seeds, args.workers, progress=not args.quiet, ray=args.ray,
                 seed_start=args.seed_start)
    print(f"{args.param:>28} {'precision':>10} {'recall':>8} {'FPR(B)':>8} {'JCT(compl)':>11} {'harmful':>8} "
          f"{'JCT(all)':>9} {'GPU-h':>8}")
    for r in rows:
        f = lambda x: "n/a" if x is None or x != x else f"{100 * x:.1f}%"  # noqa: E731
        ch, rates = r.changes, r.rates
        print(f"{str(r.value):>28} {f(rates.precision):>10} {f(rates.recall):>8} {f(rates.fpr):>8} "
              f"{f(ch.jct_change.mean):>11} {rates.harmful_stops:>8} {f(ch.jct_change_all.mean):>9} "
              f"{f(ch.gpu_hours_change.mean):>8}")
    if args.json:
        write_json([r.to_dict() for r in rows], args.json)
    if args.plot:
        from .plots import plot_sweep

        plot_sweep(rows, args.plot)
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    from .report import cluster_text, workload_table
    from .workload import generate_workload

    cfg = _load(args)
    cl = cfg.cluster
    print(f"cluster: {cluster_text(cl)}")
    if cl.pools:  # what workload.load is offered in, and the per-type speeds that differ
        ref = cl.reference_gpus({t: tc.share for t, tc in cfg.workload.types.items()})
        print(f"capacity: {ref:.1f} reference (A100) GPUs at the job types' shares: the unit of workload.load")
        for t, own in cl.type_speeds.items():
            print(f"speeds of {t}: " + ", ".join(f"{pool} {v:g}" for pool, v in own.items()))
    _print_corpus(cfg)
    print()
    wl = generate_workload(cfg, args.seed_start)
    synthetic = None
    if wl.source is not None:
        synthetic = generate_workload(cfg.replace(**{"workload.source.kind": "synthetic"}), args.seed_start)
    print(workload_table(wl, synthetic))
    return 0


def _ray_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    help="run the seeds as Ray tasks: alone, on a Ray instance started on this machine; with an "
                         "address (auto, ray://head:10001), on that cluster (needs: pip install 'evalstop[ray]', "
                         "and this package on the cluster's workers); default: local worker processes")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="platform-sim", description="Simulate a shared GPU platform with EvalStop.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp, seeds_help="seeds (default: the config's)"):
        sp.add_argument("--config", help="YAML config (default: the packaged rlhf_heavy.yaml, configs/sim/ in "
                        "the repository)")
        sp.add_argument("--seeds", type=int, help=seeds_help)
        sp.add_argument("--seed-start", dest="seed_start", type=int, default=0, metavar="N",
                        help="first seed (default 0): seeds N .. N+seeds-1 (tune below 1000; report on unseen seeds)")
        sp.add_argument("--workers", type=int, help="worker processes (default: all cores)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. noise.sigma=0.08")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("run", help="the configured scheduler alone vs with the configured overlay")
    common(r)
    r.add_argument("--json", help="write the result as JSON")
    r.add_argument("--plot", help="write a JCT CDF as PNG")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--write-trace", dest="write_trace", help="write the workload of seed 0 to this CSV")
    g.add_argument("--trace", help="replay this workload CSV instead of generating one")
    r.add_argument("--sealed", action="store_true",
                   help="run the overlay in a separate process that sees only the visible stream, on workloads "
                        "drawn with a secret salt (recorded in the output); not for Oracle-Stop")
    r.add_argument("--overlay-class", dest="overlay_class", metavar="MODULE:CLASS",
                   help="run your own Overlay subclass instead of the configured overlay (always sealed)")
    r.add_argument("--overlay-params", dest="overlay_params", metavar="JSON",
                   help="keyword arguments of --overlay-class, a JSON object")
    r.add_argument("--salt", help="the hidden streams' salt (decimal or 0x hex): reproduce a sealed run; default "
                                  "with --sealed: a fresh secret one")
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("reproduce", help="every table and figure of the paper")
    common(rp)
    rp.add_argument("--out", default="results", help="output folder (default: results)")
    _ray_flag(rp)
    rp.set_defaults(func=_cmd_reproduce)

    d = sub.add_parser("describe", help="the workload's jobs per type (a trace's beside the synthetic ones)")
    common(d)
    d.set_defaults(func=_cmd_describe)

    sw = sub.add_parser("sweep", help="sweep one config parameter")
    common(sw)
    sw.add_argument("--param", required=True, help="dotted key, e.g. noise.sigma")
    _ray_flag(sw)
    sw.add_argument("--values", required=True, help="comma-separated values")
    sw.add_argument("--json")
    sw.add_argument("--plot")
    sw.set_defaults(func=_cmd_sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    if _MISSING is not None:
        print(f"platform-sim: error: {install_hint(_MISSING, 'sim')}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"platform-sim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # the simulator's extra (or Gavel's, Ray's) is not installed: say so
        own = EXTRA_OF.get((exc.name or "").split(".")[0])
        hint = install_hint(exc, "ray" if getattr(args, "ray", None) is not None else "sim" if own in ("sim", "plots") else None)
        if hint is None:
            raise
        print(f"platform-sim {args.command}: error: {hint}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # an output path that cannot be written, a trace that cannot be read
        print(f"platform-sim {args.command}: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
