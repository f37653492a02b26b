"""platform_sim config: defaults from YAML, strict validation, inheritance, overrides, CLI exit 2."""

from __future__ import annotations

import pytest

from platform_sim.cli import main
from platform_sim.config import DEFAULT_CONFIG, ConfigError, load_config


def test_default_config_is_the_spec():
    cfg = load_config()
    assert cfg.cluster.total_gpus == 64 and cfg.workload.n_jobs == 200
    assert cfg.workload.load == 0.72 and cfg.workload.evals_per_job == 10
    assert cfg.curves.hack_fraction == 0.47 and cfg.noise.sigma == 0.04
    assert cfg.overlay.evalstop.k == 2 and cfg.scheduler.name == "srtf_est"
    assert sum(t.share for t in cfg.workload.types.values()) == pytest.approx(1.0)
    assert cfg.workload.types["rlhf_ppo"].gpus == {8: 0.6, 16: 0.3, 32: 0.1}


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("workload: {n_jobz: 3}", "unknown key workload.n_jobz"),
        ("workload: {n_jobs: many}", "workload.n_jobs must be an integer, but got 'many'"),
        ("workload: {n_jobs: 0}", "workload.n_jobs must be >= 1"),
        ("noise: {sigma: -0.1}", "noise.sigma must be >= 0"),
        ("noise: {kind: laplace}", "noise.kind must be one of gaussian, ar1, student_t"),
        ("curves: {hack_fraction: 1.5}", "curves.hack_fraction must be in [0, 1]"),
        ("curves: {hacked_p_peak: [0.5, 0.2]}", "curves.hacked_p_peak must have low <= high"),
        ("scheduler: {name: lottery}", "scheduler.name must be one of fifo, sjf_est, srtf_est, loss_aware"),
        ("overlay: {name: magic}", "overlay.name must be one of none, evalstop"),
        ("overlay: {evalstop: {k: 0}}", "overlay.evalstop.k must be >= 1"),
        ("workload: {types: {dpo: {share: 0.5}}}", "workload.types shares must sum to 1"),
        ("cluster: {pack_small_jobs: 3}", "cluster.pack_small_jobs must be true or false"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, capsys, yaml_text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(f"base: {DEFAULT_CONFIG}\n{yaml_text}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert message in str(exc.value)
    assert main(["run", "--config", str(p), "--seeds", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_file_and_bad_override(capsys):
    assert main(["run", "--config", "nope.yaml", "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["run", "--set", "noise.sigmaa=0.1", "--quiet"]) == 2
    assert "unknown key noise.sigmaa" in capsys.readouterr().err


def test_overrides_and_inheritance(tmp_path):
    cfg = load_config().replace(**{"noise.sigma": 0.08, "overlay.evalstop.k": 3})
    assert cfg.noise.sigma == 0.08 and cfg.overlay.evalstop.k == 3
    p = tmp_path / "child.yaml"
    p.write_text(f"base: {DEFAULT_CONFIG}\nname: child\nworkload: {{load: 1.2}}\n")
    child = load_config(p)
    assert child.name == "child" and child.workload.load == 1.2 and child.workload.n_jobs == 200


def test_shipped_configs_all_load():
    from pathlib import Path

    for p in sorted(Path(DEFAULT_CONFIG).parent.glob("*.yaml")):
        load_config(p)


def test_unwritable_output_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--seeds", "1", "--quiet", "--json", str(tmp_path / "no" / "such" / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "Traceback" not in err
