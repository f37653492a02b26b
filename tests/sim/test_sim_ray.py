"""``platform-sim reproduce/sweep --ray``: seeds as Ray tasks give exactly the local processes' results.

A local Ray instance is started on loopback only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray
use 127.0.0.1 as the node address, so every Ray server listens there; usage stats are off): no
network, no cluster. Ray is imported lazily: importing the simulator never loads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from platform_sim import experiments
from platform_sim.cli import build_parser, main
from platform_sim.config import load_config
from platform_sim.experiments import sweep
from platform_sim.reproduction import reproduce
from platform_sim.results import json_safe
from tests.proc_helpers import local_ray

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config().replace(**{"workload.n_jobs": 20})
#: a mixed cluster of three GPU types (pools, per-pool speeds; Gavel solves its LP there)
MIXED = load_config(ROOT / "configs" / "sim" / "sia_3type.yaml").replace(**{"workload.n_jobs": 20})
SWEEP = ("noise.sigma", [0.02, 0.08])


def canonical(obj) -> str:
    """A result (or a list of sweep rows) as sorted JSON; a reproduction with its per-job JCTs."""
    if isinstance(obj, list):
        return json.dumps(json_safe([r.to_dict() for r in obj]), sort_keys=True)
    return json.dumps(json_safe(obj.to_dict()), sort_keys=True) + repr(getattr(obj, "jct_hours", None))


@pytest.fixture(scope="module")
def local():
    """The default backend: local worker processes (computed before Ray starts: no fork under Ray)."""
    return {"reproduce": canonical(reproduce(CFG, 2, workers=2, progress=False)),
            "mixed": canonical(reproduce(MIXED, 2, workers=2, progress=False)),
            "sweep": canonical(sweep(CFG, *SWEEP, seeds=2, workers=2))}


@pytest.fixture(scope="module")
def ray_instance(local):
    with local_ray() as ray:
        yield ray


def test_importing_the_simulator_does_not_import_ray():
    code = ("import sys, platform_sim.cli, platform_sim.experiments, platform_sim.reproduction, platform_sim.engine;"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("argv, expected", [
    (["reproduce"], None),
    (["reproduce", "--ray"], "local"),
    (["reproduce", "--ray", "--seeds", "2"], "local"),
    (["reproduce", "--ray", "ray://head:10001"], "ray://head:10001"),
    (["sweep", "--param", "noise.sigma", "--values", "0.1", "--ray", "auto"], "auto"),
])
def test_the_ray_flag(argv, expected):
    assert build_parser().parse_args(argv).ray == expected


@pytest.fixture
def ray_calls(monkeypatch):
    """The Ray backend's calls (to show the seeds really went through Ray)."""
    calls = []
    real = experiments._ray_map

    def spy(fn, items, address, progress, desc):
        calls.append((fn.__name__, len(items), address))
        return real(fn, items, address, progress, desc)

    monkeypatch.setattr(experiments, "_ray_map", spy)
    return calls


def test_reproduce_on_ray_equals_local_processes(local, ray_instance, ray_calls):
    assert ray_instance.is_initialized()
    assert canonical(reproduce(CFG, 2, progress=False, ray="local")) == local["reproduce"]
    assert canonical(reproduce(MIXED, 2, progress=False, ray="local")) == local["mixed"]  # pools and speeds too
    assert ray_calls == [("_reproduce_seed", 2, "local")] * 2


def test_sweep_cli_on_ray_equals_local_processes(local, ray_instance, ray_calls, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    argv = ["sweep", "--param", SWEEP[0], "--values", ",".join(map(str, SWEEP[1])), "--seeds", "2", "--ray",
            "--quiet", "--set", "workload.n_jobs=20", "--json", str(out)]
    assert main(argv) == 0
    assert "noise.sigma" in capsys.readouterr().out
    assert json.dumps(json.loads(out.read_text()), sort_keys=True) == local["sweep"]
    assert ray_calls == [("_run_seed", 2, "local")] * 2  # one map per swept value
