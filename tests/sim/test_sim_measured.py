"""Measured curves (``curves.source: measured:PATH``): RLHF jobs on runs of a real-run corpus, built here in
tmp_path in the corpus's own JSONL format; labels from the gold only; no score-unit constant in any
decision; the fitted path unchanged; bad paths; the information boundary."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from evalstop_trl.analysis.corpus import harm_margin, label, load_preregistration, read_corpus, rule_of
from platform_sim.cli import main
from platform_sim.config import ConfigError, load_config
from platform_sim.curves import CurveKind
from platform_sim.engine import Simulation
from platform_sim.overlays import create_overlay
from platform_sim.schedulers import create_scheduler
from platform_sim.workload import generate_workload, read_trace, write_trace
from tests.sim.test_sim_wall import OverlayRecorder, Recorder, attack

PREREG = "label_rule:\n  rel: 0.2\n  se_mult: 2.0\n"

# name -> (world feedback, gold): two runs whose world feedback tells the opposite of their gold
RUNS = {
    (0, 0): ([0.21, 0.43, 0.58, 0.52, 0.33, 0.22], [0.2, 0.4, 0.6, 0.5, 0.3, 0.2]),  # hacked
    (1, 0): ([0.30, 0.40, 0.50, 0.60, 0.70, 0.80], [0.3, 0.5, 0.4, 0.3, 0.25, 0.2]),  # hacked; feedback rises
    (2, 0): ([0.12, 0.22, 0.29, 0.41, 0.52, 0.58], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),  # healthy
    (3, 0): ([0.80, 0.70, 0.60, 0.50, 0.40, 0.30], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),  # healthy; feedback falls
    (4, 1): ([0.10, 0.30, 0.35, 0.40, 0.38, 0.41], [0.1, 0.3, 0.4, 0.45, 0.47, 0.5]),  # healthy, a loss missing
}
LABELS = {"c000-s0": True, "c001-s0": True, "c002-s0": False, "c003-s0": False, "c004-s1": False}


def write_run(folder: Path, config_id: int, seed: int, wf, gold, scale: float = 1.0, offset: float = 0.0,
              max_steps: int = 240, evals: int | None = None) -> None:
    """One corpus run as ``scripts/real_corpus.py`` writes it: a header line, then one line per eval."""
    n = len(gold)
    config = {"config_id": config_id, "task": "letter", "trainer": "grpo", "lr": 3e-4, "kl_coef": 0.0,
              "hackability": 0.5, "eval_n": 64, "fixed_seed_eval": True, "evals": evals or n, "max_steps": max_steps}
    lines = [{"config": config, "seed": seed, "seconds": 1.0}]
    for i, (w, g) in enumerate(zip(wf, gold, strict=True)):
        lines.append({"step": (i + 1) * max_steps // n, "world_feedback": offset + scale * w,
                      "gold": offset + scale * g, "gold_se": scale * 0.01, "eval_n": 64,
                      "eval_noise": None if i == 0 else 0.01 * scale,
                      "train_loss": None if (config_id == 4 and i == 2) else 1.0 - 0.1 * i,
                      "proxy_reward": 0.1 * i, "kl": 0.01 * i, "length": 5.0, "examples": []})
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "runs" / f"c{config_id:03d}-s{seed}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def make_corpus(folder: Path, runs=RUNS, scale: float = 1.0, offset: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preregistration.yaml").write_text(PREREG)
    for (cid, seed), (wf, gold) in runs.items():
        write_run(folder, cid, seed, wf, gold, scale, offset)
    return folder


def measured(corpus: Path, **over):
    return load_config().replace(**{"curves.source": f"measured:{corpus}", "workload.n_jobs": 60, **over})


def test_measured_curves_come_from_the_corpus_with_labels_from_the_gold(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    cfg = measured(corpus)
    wl = generate_workload(cfg, 0)
    fitted = generate_workload(load_config().replace(**{"workload.n_jobs": 60}), 0)
    records = {r.name: r for r in read_corpus(corpus)}
    rule = rule_of(load_preregistration(corpus / "preregistration.yaml"))
    assert {name: label(r, rule) for name, r in records.items()} == LABELS  # the gold's labels, not the feedback's
    p = np.arange(1, wl.n_evals + 1) / wl.n_evals
    drawn = set()
    for spec, t, f_spec, f in zip(wl.jobs, wl.truths, fitted.jobs, fitted.truths, strict=True):
        assert spec == f_spec  # the jobs, arrivals and durations are the fitted workload's
        if not spec.rlhf:
            assert t == f  # LoRA and DPO jobs keep their fitted curves
            continue
        rec = records[t.run]
        drawn.add(t.run)
        progress = np.array(rec.steps) / rec.config.max_steps
        assert t.kind is CurveKind.MEASURED and t.hacked == LABELS[t.run] == label(rec, rule)
        assert t.hacked == f.hacked  # the status drawn as for fitted curves picks the run's label
        assert t.harm_margin == harm_margin(rec, rule)
        assert t.scores == pytest.approx(np.interp(p, progress, rec.world_feedback))  # the feedback, no noise added
        assert [t.gold_at(x) for x in p] == pytest.approx(np.interp(p, progress, rec.gold))
        assert t.gold_end == rec.gold[-1] and t.peak_progress == progress[int(np.argmax(rec.gold))]
        assert t.proxies == pytest.approx(np.interp(p, progress, rec.proxy_reward))
        if t.run == "c004-s1":  # its missing loss is interpolated from its neighbours
            assert t.losses == pytest.approx(np.interp(p, progress, [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]))
    assert drawn == set(LABELS)
    assert generate_workload(cfg, 0) == wl and generate_workload(cfg, 1) != wl  # seeded
    salted = generate_workload(cfg, 0, salt=99)
    assert [t.run for t in salted.truths] != [t.run for t in wl.truths]  # the draws are in the salted stream
    write_trace(wl, tmp_path / "wl.csv")
    assert read_trace(tmp_path / "wl.csv") == wl


def test_a_measured_config_runs_end_to_end(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    cfg = measured(corpus)
    wl = generate_workload(cfg, 3)
    for scheduler in ("fifo", "srtf_est", "loss_aware"):
        res = Simulation(wl, cfg, create_scheduler(scheduler), create_overlay("evalstop", wl)).run()
        assert len(res.outcomes) == 60 and all(o.departure_s >= o.arrival_s for o in res.outcomes)
        stopped = [o.stopped for o, t in zip(res.outcomes, wl.truths, strict=True) if t.run in ("c000-s0", "c003-s0")]
        assert stopped and all(stopped)  # the decline detector reads the feedback: it stops both of these
        assert not any(o.stopped for o, t in zip(res.outcomes, wl.truths, strict=True) if t.run == "c001-s0")
    assert main(["run", "--seeds", "2", "--workers", "1", "--quiet", "--set", f"curves.source=measured:{corpus}",
                 "--set", "workload.n_jobs=60", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "detection over watched jobs" in out
    assert f"measured curves: 2 hacked and 3 healthy runs (labels from their gold) at {corpus}; skipped: none" in out
    assert json.loads((tmp_path / "r.json").read_text())["config"]["curves"]["source"] == f"measured:{corpus}"
    assert main(["run", "--seeds", "1", "--workers", "1", "--quiet", "--sealed", "--set",
                 f"curves.source=measured:{corpus}", "--set", "workload.n_jobs=60"]) == 0
    assert "sealed" in capsys.readouterr().out
    # in a config file, a relative corpus folder is relative to that file
    (tmp_path / "mine.yaml").write_text(f"base: {Path(load_config.__globals__['DEFAULT_CONFIG'])}\n"
                                        "curves: {source: 'measured:corpus'}\nworkload: {n_jobs: 30}\n")
    assert load_config(tmp_path / "mine.yaml").curves.source == f"measured:{corpus}"


def test_no_score_unit_constant_decides_anything_for_measured_jobs(tmp_path):
    """The same corpus in other units (x 10, + 3: world feedback, gold and its standard errors) gives the
    same labels, stops, delivered checkpoints and harmful stops: decisions compare a run with itself."""
    from platform_sim.metrics import detection

    a = generate_workload(cfg_a := measured(make_corpus(tmp_path / "a")), 5)
    b = generate_workload(cfg_b := measured(make_corpus(tmp_path / "b", scale=10.0, offset=3.0)), 5)
    assert [t.hacked for t in a.truths] == [t.hacked for t in b.truths]
    for overlay in ("evalstop", "oracle", "loss_plateau"):
        ra = Simulation(a, cfg_a, create_scheduler("srtf_est"), create_overlay(overlay, a)).run()
        rb = Simulation(b, cfg_b, create_scheduler("srtf_est"), create_overlay(overlay, b)).run()
        assert ra.outcomes == rb.outcomes, overlay
        assert detection(ra, a, cfg_a.metrics.harmful_margin) == detection(rb, b, cfg_b.metrics.harmful_margin)


def test_a_bad_corpus_path_is_a_clear_value_error(tmp_path, capsys):
    fix = re.escape("--set curves.source=measured:configs/corpus")
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=re.escape(f"the folder {missing} does not exist") + ".*" + fix):
        generate_workload(measured(missing), 0)
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    with pytest.raises(ValueError, match=re.escape(f"{empty / 'runs'} holds no run") + ".*" + fix):
        generate_workload(measured(empty), 0)
    no_rule = tmp_path / "no_rule"
    write_run(no_rule, 2, 0, *RUNS[(2, 0)])
    with pytest.raises(ValueError, match=re.escape(f"{no_rule / 'preregistration.yaml'} does not exist")):
        generate_workload(measured(no_rule), 0)
    healthy_only = make_corpus(tmp_path / "healthy", runs={k: v for k, v in RUNS.items() if not LABELS[
        f"c{k[0]:03d}-s{k[1]}"]})
    with pytest.raises(ValueError, match="no hacked run by its gold .* lower curves.hack_fraction to 0"):
        generate_workload(measured(healthy_only), 0)
    assert all(not t.hacked for t in generate_workload(measured(healthy_only, **{"curves.hack_fraction": 0.0}), 0).truths)
    with pytest.raises(ConfigError, match="curves.source must be fitted or measured:PATH"):
        load_config().replace(**{"curves.source": "measured:"})
    assert main(["run", "--quiet", "--set", f"curves.source=measured:{missing}"]) == 2
    assert f"the folder {missing} does not exist" in capsys.readouterr().err


def _digest(wl) -> str:
    """The workload as it was before measured curves existed (its specs and the truths' fields of then)."""
    old = ("duration_s", "kind", "height", "shape", "hacked", "peak_progress", "gold_end", "scores", "losses",
           "proxies", "family", "extra", "eval_n", "eval_noise")
    h = hashlib.sha256()
    for s, t in zip(wl.jobs, wl.truths, strict=True):
        h.update(repr(s).encode())
        h.update(repr(tuple(getattr(t, f) for f in old)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("config", "seed", "digest"), [
    ("rlhf_heavy.yaml", 0, "5442c9dbf37bd33e"), ("rlhf_heavy.yaml", 7, "8c75cad078c9acea"),
    ("hack_families.yaml", 0, "3a87aa2a54784945"), ("sia_3type.yaml", 7, "21e48b5a11b7bef4"),
])
def test_fitted_curves_are_unchanged(config, seed, digest):
    """Digests of the workloads the code before ``curves.source`` generated (same configs and seeds)."""
    cfg = load_config(Path(load_config.__globals__["DEFAULT_CONFIG"]).parent / config)
    assert cfg.curves.source == "fitted" and cfg.measured_path is None
    wl = generate_workload(cfg, seed)
    assert _digest(wl) == digest
    assert all(t.kind is not CurveKind.MEASURED and not t.run and not t.curve_gold for t in wl.truths)


def test_the_information_boundary_holds_on_measured_curves(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    cfg = measured(corpus)
    wl = generate_workload(cfg, 0)
    sched, overlay = Recorder(), OverlayRecorder()
    Simulation(wl, cfg, sched, overlay).run()
    snaps = sched.seen + [x for x in overlay.received if type(x).__name__ == "JobSnapshot"]
    assert len(snaps) > 20 and sched.leaks == []
    assert attack(snaps[0]) == [] and attack(snaps[-1]) == []
    for attr in ("run", "curve_gold", "hacked"):
        with pytest.raises(AttributeError, match="not visible"):
            getattr(snaps[0], attr)


def test_the_platform_table_script_adds_measured_rows_beside_the_fitted_ones(tmp_path):
    import importlib.util

    from platform_sim.schedulers import SCHEDULERS

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("platform_table", root / "scripts" / "platform_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    corpus = make_corpus(tmp_path / "corpus")
    out = tmp_path / "t"
    assert mod.main(["--seeds", "2", "--seed-start", "6000", "--workers", "1", "--out", str(out), "--measured",
                     str(corpus), "--set", "workload.n_jobs=60"]) == 0
    rows = json.loads((out / "platform_table.json").read_text())
    assert [(r["source"], r["scheduler"], r["curves"]) for r in rows] == [
        (src, s, curves) for src, curves in (("synthetic", "fitted"),
                                             ("synthetic, measured curves (corpus)", f"measured:{corpus}"))
        for s in SCHEDULERS.names()]
    assert all(0 <= r["precision"] <= 1 for r in rows)
    assert (out / "platform_table.md").read_text().count("\n") == 2 + len(rows)
