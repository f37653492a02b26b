"""Trace-driven workloads: the cluster-trace readers on the shipped samples, the window, the load fit,
the dropped jobs, the type rule table, the CLI, and the information boundary on trace workloads."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from platform_sim.cli import main
from platform_sim.cluster_traces import TRACE_FORMATS, read_cluster_trace
from platform_sim.config import ConfigError, load_config
from platform_sim.engine import Simulation
from platform_sim.overlays import create_overlay
from platform_sim.schedulers import SCHEDULERS, create_scheduler
from platform_sim.workload import _offered, generate_workload
from tests.sim.test_sim_wall import OverlayRecorder, Recorder, attack

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "configs" / "traces" / "cluster"
# format -> its shipped sample; the expected values below are read from it with the csv module
FILES = {"philly_csv": "philly_sample.csv", "helios": "helios_sample.csv", "acme": "acme_sample.csv",
         "alibaba_spot": "alibaba_spot_sample.csv"}


def _rows(name: str) -> list[dict[str, str]]:
    with open(SAMPLES / name, newline="") as fh:
        return list(csv.DictReader(fh))


def _gpus(fmt: str, row: dict[str, str]) -> float:
    if fmt == "philly_csv":
        return float(row["num_gpus"])
    if fmt == "alibaba_spot":
        return float(row["gpu_request"]) * float(row["worker_num"])
    return float(row["gpu_num"])


def trace_cfg(fmt: str = "philly_csv", **over):
    return load_config().replace(**{"workload.source.kind": "trace", "workload.source.path": str(SAMPLES / FILES[fmt]),
                                    "workload.source.format": fmt, **over})


def _script():
    """scripts/make_trace_samples.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_trace_samples", ROOT / "scripts" / "make_trace_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_format_has_a_sample_and_the_samples_are_the_scripts():
    mod = _script()
    assert set(FILES) == set(TRACE_FORMATS.names())
    assert set(FILES.values()) == set(mod.SAMPLES)


def test_the_shipped_samples_are_what_the_script_writes(tmp_path):
    mod = _script()
    for path in mod.write_samples(tmp_path):
        assert path.read_bytes() == (SAMPLES / path.name).read_bytes(), path.name


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_each_reader_keeps_every_gpu_job_of_its_sample(fmt):
    rows = _rows(FILES[fmt])
    t = read_cluster_trace(fmt, SAMPLES / FILES[fmt])
    gpu_rows = [r for r in rows if _gpus(fmt, r) > 0]
    assert len(t) == len(gpu_rows) and len(t) > 300
    assert dict(t.skipped) == ({"no GPUs (a CPU job)": len(rows) - len(gpu_rows)} if len(gpu_rows) < len(rows) else {})
    assert Counter(t.gpus.tolist()) == Counter(math.ceil(_gpus(fmt, r)) for r in gpu_rows)
    assert sorted(t.duration_s.tolist()) == sorted(float(r["duration"]) for r in gpu_rows)
    assert t.submit_s[0] == 0.0 and bool(np.all(np.diff(t.submit_s) >= 0))  # sorted, from the first job
    if fmt in ("acme", "alibaba_spot"):
        col = "type" if fmt == "acme" else "job_type"
        assert Counter(t.types) == Counter(r[col] for r in gpu_rows)
    else:
        assert t.types is None


def test_timestamps_with_and_without_a_zone():
    """Acme writes +08:00; Philly and Helios naive times: a job's gap to the next is kept either way."""
    acme = read_cluster_trace("acme", SAMPLES / FILES["acme"])
    rows = [r for r in _rows(FILES["acme"]) if float(r["gpu_num"]) > 0]
    from datetime import datetime
    first, last = (datetime.fromisoformat(rows[i]["submit_time"]) for i in (0, -1))
    assert acme.submit_s[-1] == pytest.approx((last - first).total_seconds())


def test_bad_trace_files_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="valid trace formats are: acme, alibaba_spot, helios, philly_csv"):
        read_cluster_trace("sacct", SAMPLES / FILES["helios"])
    with pytest.raises(ValueError, match=r"does not exist \(format helios: S-Lab-System-Group/HeliosData"):
        read_cluster_trace("helios", tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="not a helios trace: it lacks the column.s. job_id, gpu_num, state, submit_time"):
        read_cluster_trace("helios", SAMPLES / FILES["philly_csv"])
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,duration,num_gpus\nyesterday,10,1\n2017-10-09 07:01:55,nan,1\n2017-10-09 07:01:55,5,0\n")
    with pytest.raises(ValueError, match="no usable job .*bad timestamp.: 1, .bad duration.: 1, .no GPUs"):
        read_cluster_trace("philly_csv", bad)


def test_scale_fits_the_window_to_the_target_load_and_none_keeps_the_record():
    cfg = trace_cfg()
    total = cfg.cluster.total_gpus
    for load in (0.5, 1.2):
        wl = generate_workload(cfg.replace(**{"workload.load": load}), 0)
        g = np.array([j.gpus for j in wl.jobs])
        d = np.array([t.duration_s for t in wl.truths])
        a = np.array([j.arrival_s for j in wl.jobs])
        assert len(wl.jobs) == 200 and _offered(g, d, a, total) == pytest.approx(load)
        assert wl.source.time_scale == pytest.approx(wl.source.recorded_load / load)
    none = generate_workload(cfg.replace(**{"workload.source.load_fit": "none"}), 0)
    t = read_cluster_trace("philly_csv", SAMPLES / FILES["philly_csv"])
    kept = t.submit_s[t.duration_s >= 60][:200]
    assert [j.arrival_s for j in none.jobs] == pytest.approx((kept - kept[0]).tolist())
    assert none.source.time_scale == 1.0


def test_thin_lowers_the_load_by_dropping_jobs_and_cannot_raise_it():
    cfg = trace_cfg(**{"workload.source.load_fit": "thin", "workload.n_jobs": 100, "workload.load": 0.2})
    wl = generate_workload(cfg, 0)
    dropped = dict(wl.source.dropped)
    assert dropped["thinned"] > 30 and len(wl.jobs) == 100
    assert generate_workload(cfg, 0).jobs == wl.jobs  # seeded
    assert generate_workload(cfg, 1).jobs != wl.jobs
    with pytest.raises(ValueError, match="thin can only lower the load"):
        generate_workload(cfg.replace(**{"workload.load": 5.0}), 0)


def test_jobs_larger_than_the_cluster_short_or_huge_are_dropped_and_counted():
    cfg = trace_cfg("acme", **{"workload.n_jobs": 300, "workload.source.max_gpu_hours": 200})
    wl = generate_workload(cfg, 0)
    t = read_cluster_trace("acme", SAMPLES / FILES["acme"])
    last = wl.source.start_s + wl.source.span_s
    span = t.submit_s <= last
    short = t.duration_s < 60
    huge = t.gpus * t.duration_s > 200 * 3600
    large = t.gpus > 64
    assert dict(wl.source.dropped) == {k: int(v) for k, v in {
        "shorter than min_duration_s": np.sum(span & short), "more than max_gpu_hours": np.sum(span & ~short & huge),
        "larger than the cluster": np.sum(span & ~short & ~huge & large)}.items() if v}
    assert dict(wl.source.dropped)["larger than the cluster"] > 0
    assert max(j.gpus for j in wl.jobs) <= 64 and min(t.duration_s for t in wl.truths) >= 60
    with pytest.raises(ValueError, match="holds .* usable jobs, fewer than workload.n_jobs=5000"):
        generate_workload(cfg.replace(**{"workload.n_jobs": 5000}), 0)


def test_types_come_from_the_type_map_or_the_first_rule_that_fits():
    rules = {"one": {"max_gpus": 1, "max_h": 1, "types": {"lora_sft": 1.0}},
             "eight": {"max_gpus": 8, "max_h": 1000, "types": {"rlhf_grpo": 1.0}},
             "rest": {"max_gpus": 8, "max_h": 1, "types": {"rlhf_ppo": 1.0}}}
    cfg = trace_cfg("acme", **{"workload.source.type_rules": rules, "workload.source.type_map": {"SFT": "dpo"},
                               "workload.n_jobs": 250, "workload.source.load_fit": "none"})
    wl = generate_workload(cfg, 0)
    t = read_cluster_trace("acme", SAMPLES / FILES["acme"])
    own = {(float(a), float(d)): ty for a, d, ty in zip(t.submit_s, t.duration_s, t.types, strict=True)}
    for spec, truth in zip(wl.jobs, wl.truths, strict=True):
        ty = own[(spec.arrival_s + wl.source.start_s, truth.duration_s)]
        if ty == "SFT":
            assert spec.job_type == "dpo"
        elif spec.gpus <= 1 and truth.duration_s <= 3600:
            assert spec.job_type == "lora_sft"
        elif spec.gpus <= 8:
            assert spec.job_type == "rlhf_grpo"
        else:  # fits no rule: the last one's
            assert spec.job_type == "rlhf_ppo"
        assert spec.rlhf == cfg.workload.types[spec.job_type].rlhf
    assert len({j.job_type for j in wl.jobs}) == 4


def test_the_seed_draws_types_and_curves_the_salt_hides_curves_not_arrivals():
    cfg = trace_cfg()
    a, b = generate_workload(cfg, 0), generate_workload(cfg, 1)
    assert [j.arrival_s for j in a.jobs] == [j.arrival_s for j in b.jobs]  # the trace's arrivals
    assert [j.job_type for j in a.jobs] != [j.job_type for j in b.jobs]
    salted = generate_workload(cfg, 0, salt=99)
    assert [(j.job_type, j.gpus, j.arrival_s) for j in salted.jobs] == [(j.job_type, j.gpus, j.arrival_s) for j in a.jobs]
    assert [t.peak_progress for t in salted.truths] != [t.peak_progress for t in a.truths]
    hacked = [t.hacked for j, t in zip(a.jobs, a.truths, strict=True) if j.rlhf]
    assert 0.3 < np.mean(hacked) < 0.65  # the simulator's labels on the trace's jobs


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="workload.source.path must name the trace file"):
        load_config().replace(**{"workload.source.kind": "trace"})
    with pytest.raises(ConfigError, match="type_map.SFT maps to 'sft', not a job type"):
        trace_cfg(**{"workload.source.type_map": {"SFT": "sft"}})
    with pytest.raises(ConfigError, match="type_rules.small.types probabilities must sum to 1"):
        trace_cfg(**{"workload.source.type_rules.small.types": {"lora_sft": 0.5}})
    with pytest.raises(ConfigError, match="workload.arrivals must be poisson with a trace source"):
        trace_cfg(**{"workload.arrivals": "all_at_zero"})


def test_a_config_file_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "p.csv").write_bytes((SAMPLES / FILES["philly_csv"]).read_bytes())
    (tmp_path / "mine.yaml").write_text(
        f"base: {ROOT / 'configs/sim/rlhf_heavy.yaml'}\nworkload:\n  source: {{kind: trace, path: traces/p.csv}}\n")
    cfg = load_config(tmp_path / "mine.yaml")
    assert cfg.workload.source.path == str(tmp_path / "traces" / "p.csv")
    assert len(generate_workload(cfg, 0).jobs) == 200


def test_the_information_boundary_holds_on_a_trace_workload():
    cfg = trace_cfg(**{"workload.n_jobs": 80, "workload.load": 2.0})
    wl = generate_workload(cfg, 0)
    sched, overlay = Recorder(), OverlayRecorder()
    Simulation(wl, cfg, sched, overlay).run()
    snaps = sched.seen + [x for x in overlay.received if type(x).__name__ == "JobSnapshot"]
    assert len(snaps) > 50 and sched.leaks == []
    assert attack(snaps[0]) == [] and attack(snaps[-1]) == []
    with pytest.raises(AttributeError, match="not visible"):
        snaps[0].duration_s  # noqa: B018 - the trace's true duration stays hidden


@pytest.mark.parametrize("scheduler", ["fifo", "srtf_est", "loss_aware"])
def test_evalstop_on_trace_arrivals_stops_hacked_jobs(scheduler):
    cfg = trace_cfg(**{"workload.load": 1.0})
    wl = generate_workload(cfg, 2)
    res = Simulation(wl, cfg, create_scheduler(scheduler), create_overlay("evalstop", wl)).run()
    assert all(o.departure_s >= o.arrival_s for o in res.outcomes) and len(res.outcomes) == 200
    hacked = [o for o, t, j in zip(res.outcomes, wl.truths, wl.jobs, strict=True) if j.rlhf and t.hacked]
    assert hacked and np.mean([o.stopped for o in hacked]) > 0.9


def test_cli_run_describe_and_errors(capsys, tmp_path):
    path = str(SAMPLES / FILES["helios"])
    sets = ["--set", "workload.source.kind=trace", "--set", "workload.source.format=helios",
            "--set", f"workload.source.path={path}"]
    assert main(["describe", *sets]) == 0
    out = capsys.readouterr().out
    assert "trace helios" in out and "| trace | all | 200 (100%) |" in out and "| synthetic | all | 200 (100%) |" in out
    assert main(["run", "--seeds", "2", "--quiet", "--workers", "1", *sets, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "detection over watched jobs" in out and "trace helios" in out and "dropped in the window" in out
    trace = json.loads((tmp_path / "r.json").read_text())["trace"]  # the window's counts, as printed
    assert trace["format"] == "helios" and trace["path"] == path and trace["jobs"] == 200, trace
    assert set(trace) >= {"rows", "skipped", "dropped", "recorded_load", "time_scale"}
    printed = out.split("dropped in the window: ")[1].splitlines()[0]
    assert printed == (", ".join(f"{v} {k}" for k, v in trace["dropped"].items()) or "none"), (printed, trace)
    assert main(["run", "--seeds", "1", "--quiet", "--sealed", "--workers", "1", *sets,
                 "--json", str(tmp_path / "s.json")]) == 0
    assert "sealed" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["trace"]["dropped"] == trace["dropped"]
    assert main(["run", "--quiet", *sets[:-1], f"workload.source.path={tmp_path / 'x.csv'}"]) == 2
    assert "workload.source: trace file" in capsys.readouterr().err
    assert main(["run", "--quiet", *sets, "--set", "workload.n_jobs=100000"]) == 2
    assert "fewer than workload.n_jobs=100000" in capsys.readouterr().err


def test_the_platform_table_script_covers_every_scheduler_and_source(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("platform_table", ROOT / "scripts" / "platform_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "t"
    assert mod.main(["--seeds", "2", "--seed-start", "6000", "--workers", "1", "--out", str(out),
                     "--trace", f"helios:{SAMPLES / FILES['helios']}", "--set", "workload.n_jobs=60"]) == 0
    rows = json.loads((out / "platform_table.json").read_text())
    assert [(r["source"], r["scheduler"]) for r in rows] == [
        (src, s) for src in ("synthetic", "helios (helios_sample.csv)") for s in SCHEDULERS.names()]
    assert all(-1 < r["gpu_hours"] < 0 and 0 <= r["precision"] <= 1 for r in rows)  # EvalStop saves on each
    assert (out / "platform_table.png").stat().st_size > 1000
    assert (out / "platform_table.md").read_text().count("\n") == 2 + len(rows)


def test_gpu_speeds_from_sia_placement_files(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_speeds", ROOT / "scripts" / "gpu_speeds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = tmp_path / "bert"
    model.mkdir()
    # the artifact's two column orders; two batch sizes on every cluster, one more on some (ignored)
    times = {"dgx-ext": {4: 0.1, 8: 0.2, 16: 0.3}, "azure": {4: 0.2, 8: 0.8}, "rtx": {4: 0.2, 8: 0.4},
             "aws": {4: 0.4, 8: 0.8, 16: 9.0}}
    for cluster, by_bsz in times.items():
        lines = ["local_bsz,step_time,sync_time,placement"] + [f"{b},{t},0.01,1" for b, t in by_bsz.items()]
        lines += [f"{b},{t / 3},0.01,2" for b, t in by_bsz.items()]  # two GPUs: not a single-GPU speed
        (model / f"placements-{cluster}.csv").write_text("\n".join(lines) + "\n")
    assert mod.main([str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    got = json.loads((tmp_path / "s.json").read_text())["bert"]
    assert got == pytest.approx({"a100": 1.0, "v100": math.sqrt(0.5 * 0.25), "rtx": 0.5, "t4": 0.25})
    assert "| bert | 1.00 | 0.35 | 0.50 | 0.25 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no model directory"):
        mod.speeds(tmp_path / "bert")


def test_on_a_mixed_cluster_trace_jobs_larger_than_the_largest_pool_are_dropped_and_counted():
    # the synthetic table's 32-GPU rlhf_ppo does not fit a 16-GPU pool; a trace brings its own sizes
    pools = {"a100": {"nodes": 2, "gpus_per_node": 8}, "t4": {"nodes": 4, "gpus_per_node": 4}}
    cfg = trace_cfg("acme", **{"workload.n_jobs": 250, "cluster.pools": pools})
    wl = generate_workload(cfg, 0)
    t = read_cluster_trace("acme", SAMPLES / FILES["acme"])
    span = (t.submit_s <= wl.source.start_s + wl.source.span_s) & (t.duration_s >= 60)
    span &= t.gpus * t.duration_s <= cfg.workload.source.max_gpu_hours * 3600
    assert dict(wl.source.dropped)["larger than the largest pool (16 GPUs)"] == int(np.sum(span & (t.gpus > 16))) > 0
    assert max(j.gpus for j in wl.jobs) <= 16
    with pytest.raises(ConfigError, match="largest pool's 16"):
        load_config().replace(**{"cluster.pools": pools})  # synthetic: the table's sizes must fit


def test_a_trace_jobs_recorded_duration_is_its_whole_run(tmp_path):
    """A trace's duration already holds the job's evals and checkpoints: a 600 s job alone on the cluster
    runs 600 s, not 600 s plus ten 60 s checkpoints and 2% of evals (1,212 s), and is not stopped."""
    path = tmp_path / "philly.csv"
    rows = [f"2017-10-09 0{h}:00:00,600.0,{g},{600.0 * g},c1" for h, g in ((0, 1), (2, 8), (4, 4))]
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "\n".join(rows) + "\n")
    cfg = load_config().replace(**{"workload.source.kind": "trace", "workload.source.path": str(path),
                                   "workload.source.load_fit": "none", "workload.n_jobs": 3})
    wl = generate_workload(cfg, 0)
    assert [t.duration_s for t in wl.truths] == [600.0] * 3 and all(t.whole_run for t in wl.truths)
    for scheduler in ("fifo", "srtf_est"):
        res = Simulation(wl, cfg, create_scheduler(scheduler), create_overlay("none", wl)).run()
        for o in res.outcomes:
            assert o.completed and not o.stopped and o.evals_done == cfg.workload.evals_per_job
            assert o.departure_s - o.first_start_s == pytest.approx(600.0)
            assert o.gpu_seconds == pytest.approx(600.0 * wl.jobs[o.job_id].gpus)
    synthetic = load_config().replace(**{"workload.n_jobs": 5})  # a synthetic job's duration stays exclusive
    swl = generate_workload(synthetic, 0)
    res = Simulation(swl, synthetic, create_scheduler("fifo"), create_overlay("none", swl)).run()
    o, t = res.outcomes[0], swl.truths[0]
    assert not t.whole_run and o.departure_s - o.first_start_s == pytest.approx(
        t.duration_s * 1.02 + 10 * 60.0)
