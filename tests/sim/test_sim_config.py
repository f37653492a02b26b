"""platform_sim config: defaults from YAML, strict validation, policy blocks checked by signature,
inheritance, overrides, CLI exit 2, and an import graph without cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import platform_sim
from platform_sim.cli import main
from platform_sim.config import DEFAULT_CONFIG, ConfigError, load_config
from platform_sim.policies import build_scheduler, check_config


def test_default_config_is_the_spec():
    cfg = load_config()
    assert cfg.cluster.total_gpus == 64 and cfg.workload.n_jobs == 200
    assert cfg.workload.load == 0.72 and cfg.workload.evals_per_job == 10
    assert cfg.curves.hack_fraction == 0.47 and cfg.noise.sigma == 0.04
    assert cfg.overlay.block("evalstop")["k"] == 2 and cfg.scheduler.name == "srtf_est"
    assert cfg.scheduler.block("fifo") == {"backfill": True}
    assert cfg.scheduler.block("loss_aware") == {"round_s": 300, "promote_h": 4.0}
    assert cfg.to_dict()["overlay"]["stop_at"] == {"fraction": 0.65, "job_types": "rlhf"}
    # every overlay watches the RLHF jobs (the decision is justified in rlhf_heavy.yaml and the README)
    assert {cfg.overlay.block(o)["job_types"] for o in ("evalstop", "stop_at", "loss_plateau")} == {"rlhf"}
    assert cfg.curves.hacked_families.shares == {"gao": 1.0, "late_onset": 0.0, "shallow": 0.0,
                                                 "plateau_then_drop": 0.0, "oscillating": 0.0, "gao_kl": 0.0}
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
        ("scheduler: {name: 3}", "scheduler.name must be a string"),
        ("scheduler: {fifo: 3}", "scheduler.fifo must be a mapping of parameters"),
        ("scheduler: {lottery: {x: 1}}", "unknown key scheduler.lottery; valid keys here: name, fifo, sjf_est, srtf_est"),
        ("scheduler: {fifo: {backfil: true}}", "unknown key scheduler.fifo.backfil; valid keys here: backfill"),
        ("scheduler: {srtf_est: {k: 1}}", "unknown key scheduler.srtf_est.k; valid keys here: (none)"),
        ("scheduler: {fifo: {backfill: 3}}", "scheduler.fifo: backfill must be true or false, but got backfill=3"),
        ("scheduler: {loss_aware: {round_s: 0}}", "scheduler.loss_aware: round_s must be > 0"),
        ("scheduler: {loss_aware: {promote_h: -1}}", "scheduler.loss_aware: promote_h must be >= 0"),
        ("scheduler: {gavel: {round_s: 0}}", "scheduler.gavel: round_s must be > 0"),
        ("scheduler: {name: gavel, gavel: {round_s: 120}}",
         "scheduler.gavel: round_s (120 s) must be longer than workload.restart_overhead_s (180 s)"),
        ("overlay: {name: magic}", "overlay.name must be one of none, evalstop"),
        ("overlay: {evalstop: {k: 0}}", "overlay.evalstop: k must be"),  # the rest is the detector's message
        ("overlay: {evalstop: {kk: 2}}", "unknown key overlay.evalstop.kk; valid keys here: detector, job_types, k, min_delta"),
        ("overlay: {evalstop: {detector: nope}}", "overlay.evalstop.detector: Unknown detector 'nope'; valid detectors are"),
        ("overlay: {stop_at: {k: 2}}", "unknown key overlay.stop_at.k; valid keys here: fraction, job_types"),
        ("overlay: {stop_at: {job_types: some}}", "overlay.stop_at: job_types must be 'all' or 'rlhf'"),
        ("curves: {hacked_families: {shares: {gao: 0.5, wobbly: 0.5}}}",
         "curves.hacked_families.shares has an unknown family 'wobbly'; families: gao, late_onset, shallow"),
        ("curves: {hacked_families: {shares: {gao: 0.5}}}", "curves.hacked_families.shares must sum to 1"),
        ("curves: {hacked_families: {shares: {gao: 1.5, shallow: -0.5}}}",
         "curves.hacked_families.shares.shallow must be >= 0"),
        ("curves: {hacked_families: {late_p_peak: [0.6, 1.2]}}", "curves.hacked_families.late_p_peak must lie in (0, 1)"),
        ("curves: {hacked_families: {late_sharpness: [0.5, 2]}}", "curves.hacked_families.late_sharpness must be >= 1"),
        ("curves: {hacked_families: {shallow_depth: [0.1, 2]}}", "curves.hacked_families.shallow_depth must lie in [0, 1]"),
        ("curves: {hacked_families: {kl_p_peak: [0.0, 0.5]}}", "curves.hacked_families.kl_p_peak must lie in (0, 1)"),
        ("curves: {hacked_families: {kl_exponent: [0.5, 3]}}", "curves.hacked_families.kl_exponent must lie in (0, 2]"),
        ("curves: {hacked_families: {wobble: 1}}", "unknown key curves.hacked_families.wobble; valid keys here: shares"),
        ("overlay: {stop_at: {fraction: 1.5}}", "overlay.stop_at: fraction must be"),
        ("overlay: {loss_plateau: {job_types: some}}", "overlay.loss_plateau: job_types must be 'all' or 'rlhf'"),
        ("overlay: {oracle: {peak: 1}}", "unknown key overlay.oracle.peak; valid keys here: (none)"),
        ("workload: {types: {dpo: {share: 0.5}}}", "workload.types shares must sum to 1"),
        ("cluster: {pack_small_jobs: 3}", "cluster.pack_small_jobs must be true or false"),
        ("cluster: {pools: {mi300: {nodes: 1, gpus_per_node: 8}}}",
         "cluster.pools.mi300 is not a GPU model with a known speed (a100, v100, rtx, t4, a10, h100); give its "
         "speed relative to the reference GPU: cluster.speeds.mi300: S"),
        ("cluster: {pools: {t4: {nodes: 0, gpus_per_node: 4}}}", "cluster.pools.t4 needs nodes and gpus_per_node >= 1"),
        ("cluster: {pools: {t4: {nodes: 1}}}", "missing key cluster.pools.t4.gpus_per_node"),
        ("cluster: {speeds: {t4: 0}}", "cluster.speeds.t4 must be > 0, but got 0.0"),
        ("cluster: {pools: {t4: {nodes: 2, gpus_per_node: 4}}}",
         "workload.types.rlhf_ppo.gpus has 16 GPUs, more than the cluster's largest pool's 8 (a gang runs in one pool"),
        ("cluster: {pools: {t4: {nodes: 1, gpus_per_node: 4}}, type_speeds: {ppo: {t4: 0.2}}}",
         "cluster.type_speeds.ppo is not a job type; types: lora_sft, dpo, rlhf_ppo, rlhf_grpo"),
        ("cluster: {type_speeds: {dpo: {t4: 0.2}}}",
         "cluster.type_speeds.dpo.t4 is not a pool; pools: (none: the cluster is uniform)"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, capsys, yaml_text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(f"base: {DEFAULT_CONFIG}\n{yaml_text}\n")
    with pytest.raises(ConfigError) as exc:
        check_config(load_config(p))  # loading checks the data; policy blocks are checked by signature
    assert message in str(exc.value)
    assert main(["run", "--config", str(p), "--seeds", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_family_names_match_the_curves_module():
    from platform_sim.config import HACKED_FAMILIES
    from platform_sim.curves import FAMILIES

    assert HACKED_FAMILIES == FAMILIES


@pytest.mark.parametrize("argv", [["run", "--seed-start", "-1", "--quiet"], ["sweep", "--param", "noise.sigma",
                                  "--values", "0.04", "--seed-start", "-3", "--quiet"]])
def test_negative_seed_start_is_a_config_error(argv, capsys):
    assert main(argv) == 2
    assert "--seed-start must be >= 0" in capsys.readouterr().err


def test_missing_file_and_bad_override(capsys):
    assert main(["run", "--config", "nope.yaml", "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["run", "--set", "noise.sigmaa=0.1", "--quiet"]) == 2
    assert "unknown key noise.sigmaa; valid keys here: sigma, kind" in capsys.readouterr().err
    assert main(["run", "--set", "scheduler.fifo.nope=1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == "platform-sim run: error: unknown key scheduler.fifo.nope; valid keys here: backfill\n"
    assert main(["sweep", "--param", "overlay.evalstop.k", "--values", "1,0", "--seeds", "1", "--quiet"]) == 2
    assert "overlay.evalstop: k must be" in capsys.readouterr().err


def test_policy_parameters_not_in_the_yaml_are_checked_by_signature():
    cfg = load_config().replace(**{"overlay.evalstop.direction": "min", "scheduler.sjf_est.x": 1})
    assert cfg.overlay.block("evalstop")["direction"] == "min"
    with pytest.raises(ConfigError, match="unknown key scheduler.sjf_est.x; valid keys here: \\(none\\)"):
        check_config(cfg)
    strict = load_config().replace(**{"scheduler.fifo.backfill": False, "scheduler.loss_aware.round_s": 600})
    assert build_scheduler(strict, "fifo").backfill is False and build_scheduler(strict, "loss_aware").round_s == 600.0


def test_overrides_and_inheritance(tmp_path):
    cfg = load_config().replace(**{"noise.sigma": 0.08, "overlay.evalstop.k": 3})
    assert cfg.noise.sigma == 0.08 and cfg.overlay.block("evalstop")["k"] == 3
    p = tmp_path / "child.yaml"
    p.write_text(f"base: {DEFAULT_CONFIG}\nname: child\nworkload: {{load: 1.2}}\n")
    child = load_config(p)
    assert child.name == "child" and child.workload.load == 1.2 and child.workload.n_jobs == 200


def test_shipped_configs_all_load():
    for p in sorted(Path(DEFAULT_CONFIG).parent.glob("*.yaml")):
        check_config(load_config(p))


def _imports(path: Path, package: str, anywhere: bool = False) -> set[str]:
    """``package`` modules that ``path`` imports at module level (``anywhere``: inside functions too)."""
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(node.module.split(".")[0] if node.module else "")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{package}."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith(f"{package}.")}
    return out


def test_no_import_cycles_and_config_imports_no_policy():
    root = Path(platform_sim.__file__).parent
    graph = {p.stem: _imports(p, "platform_sim") - {""} for p in root.glob("*.py")}
    assert _imports(root / "config.py", "platform_sim", anywhere=True) - {""} == set()  # pure data and YAML
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_unwritable_output_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--seeds", "1", "--quiet", "--json", str(tmp_path / "no" / "such" / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "Traceback" not in err


def test_a_mixed_cluster_from_the_command_line(capsys):
    pools = "{h100: {nodes: 1, gpus_per_node: 8}, t4: {nodes: 14, gpus_per_node: 4}}"
    assert main(["describe", "--set", f"cluster.pools={pools}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster: 64 GPUs in 2 pools: h100 1x8 at speed 2, t4 14x4 at speed 0.25\n"
                          "capacity: 30.0 reference (A100) GPUs at the job types' shares")  # 8 x 2 + 56 x 0.25
    assert main(["run", "--seeds", "1", "--set", f"cluster.pools={pools}", "--set", "scheduler.name=gavel"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("GPU-hours (total)"))
    assert lines[at + 1].startswith("  of which on h100") and lines[at + 2].startswith("  of which on t4")
    assert lines[at + 3].startswith("  total in reference GPU-hours")
    total, h100, t4 = (float(lines[at + i][34:46]) for i in range(3))  # the base's column
    assert h100 + t4 == pytest.approx(total, abs=0.02)


def test_the_default_speeds_are_documented_with_their_sources():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    section = doc.split("### Heterogeneous clusters", 1)[1].split("\n### ", 1)[0]
    for name, speed in load_config().cluster.speeds.items():
        assert f"| `{name}` | {speed:g} |" in section, name


def test_set_adds_entries_to_mapping_fields_and_names_the_fields_of_a_new_one():
    from platform_sim.config import apply_overrides

    cfg = apply_overrides(load_config(), {"cluster.pools.mi300.nodes": 8, "cluster.pools.mi300.gpus_per_node": 8,
                                          "cluster.speeds.mi300": 1.5, "cluster.type_speeds.rlhf_ppo.mi300": 1.2,
                                          "workload.types.rlhf_ppo.gpus.32": 0.0, "workload.types.rlhf_ppo.gpus.16": 0.4})
    assert cfg.cluster.speeds["mi300"] == 1.5 and cfg.cluster.speeds["a100"] == 1.0  # added, not replaced
    assert cfg.cluster.speed("mi300", "rlhf_ppo") == 1.2 and cfg.cluster.speed("mi300", "dpo") == 1.5
    assert cfg.workload.types["rlhf_ppo"].gpus == {8: 0.6, 16: 0.4, 32: 0.0}
    with pytest.raises(ConfigError, match="unknown key cluster.pools.t4.cores; valid keys here: nodes, gpus_per_node"):
        apply_overrides(load_config(), {"cluster.pools.t4.cores": 3})
    with pytest.raises(ConfigError, match="missing key cluster.pools.t4.gpus_per_node"):
        apply_overrides(load_config(), {"cluster.pools.t4.nodes": 3})
    with pytest.raises(ConfigError, match="unknown key cluster.speedz.x; valid keys here: nodes"):
        apply_overrides(load_config(), {"cluster.speedz.x": 1})


def test_gavel_on_a_mixed_cluster_without_scipy_names_the_extra(monkeypatch, capsys):
    import sys

    for name in ("scipy", "scipy.optimize", "scipy.sparse"):
        monkeypatch.setitem(sys.modules, name, None)  # import of it now fails as if not installed
    pools = "{a100: {nodes: 2, gpus_per_node: 16}, t4: {nodes: 8, gpus_per_node: 4}}"
    assert main(["run", "--seeds", "1", "--quiet", "--set", f"cluster.pools={pools}", "--set", "scheduler.name=gavel"]) == 2
    err = capsys.readouterr().err
    assert "needs the 'gavel' extra (the module scipy is missing): pip install 'evalstop[gavel]'" in err
    assert "Traceback" not in err


def test_the_default_configs_name_lists_are_the_registries():
    from platform_sim.overlays import OVERLAYS
    from platform_sim.schedulers import SCHEDULERS

    text = DEFAULT_CONFIG.read_text()
    for key, registry in (("srtf_est", SCHEDULERS), ("evalstop", OVERLAYS)):
        listed = next(line for line in text.splitlines() if line.strip().startswith(f"name: {key}"))
        assert listed.split("#", 1)[1].split()[::2] == list(registry.names()), listed
