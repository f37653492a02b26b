"""Packaging: ``pip install evalstop`` is the detectors, the clients, the embedded coordinator and the
CLI; the service, the trainer, the simulator, plots and calibrate are extras, and a command that
needs a missing extra says which one to install.

The table of optional modules (``evalstop_trl/core/extras.py``) is tied to ``pyproject.toml`` here,
and a real bare install into a fresh virtual environment (the wheel built from this tree; its one
dependency from the package index) runs the embedded coordinator and checks that nothing of an
extra is installed or imported.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from evalstop_trl.core.extras import EXTRA_OF, install_hint

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dist(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extra(name: str) -> set[str]:
    """The distributions an extra installs (its ``evalstop[...]`` references followed)."""
    out: set[str] = set()
    for req in PROJECT["optional-dependencies"][name]:
        nested = re.fullmatch(r"evalstop\[([a-z,]+)\]", req.replace(" ", ""))
        if nested:
            for other in nested.group(1).split(","):
                out |= _extra(other)
        else:
            out.add(_dist(req))
    return out


def test_the_bare_install_depends_on_the_http_client_only():
    assert [_dist(r) for r in PROJECT["dependencies"]] == ["httpx"]


def test_every_optional_module_is_in_the_extra_the_table_names():
    providers = importlib.metadata.packages_distributions()  # module -> distributions (in this venv)
    for module, extra in EXTRA_OF.items():
        assert extra in PROJECT["optional-dependencies"], (module, extra)
        dists = {d.lower().replace("_", "-") for d in providers.get(module, ())}
        assert dists & _extra(extra), f"{module}: none of {dists} is in the {extra!r} extra"


def test_a_missing_module_of_an_extra_is_an_install_hint_and_any_other_is_not():
    hint = install_hint(ModuleNotFoundError("No module named 'fastapi'", name="fastapi"), "service")
    assert hint == "needs the 'service' extra (the module fastapi is missing): pip install 'evalstop[service]'"
    assert install_hint(ModuleNotFoundError("No module named 'evalstop_trl.nope'", name="evalstop_trl.nope")) is None


_CHECK = textwrap.dedent("""
    import importlib.util, json, subprocess, sys, tempfile
    from pathlib import Path
    extras = ["fastapi", "pydantic", "uvicorn", "starlette", "numpy", "yaml", "matplotlib", "torch", "tqdm",
              "transformers", "prometheus_client"]
    installed = [m for m in extras if importlib.util.find_spec(m) is not None]
    from evalstop_trl import Coordinator, SQLiteStore
    from evalstop_trl.clients.embedded import EmbeddedClient
    db = Path(tempfile.mkdtemp()) / "evalstop.db"
    client = EmbeddedClient(Coordinator(SQLiteStore(db)))
    client.register_job("run-a", "grpo", planned_steps=100, policy={"detector": "decline", "k": 2})
    decisions = [client.report("run-a", s, eval_score=v).action.value for s, v in ((10, 0.5), (20, 0.7), (30, 0.6),
                                                                                   (40, 0.5))]
    client.close()
    bin_ = Path(sys.executable).parent
    status = subprocess.run([bin_ / "evalstop", "status", "--db", str(db)], capture_output=True, text=True)
    serve = subprocess.run([bin_ / "evalstop", "serve", "--db", str(db)], capture_output=True, text=True)
    sim = subprocess.run([bin_ / "platform-sim", "run"], capture_output=True, text=True)
    try:
        from evalstop_trl import EvalStopCallback
        callback = ["imported"]
    except ImportError as exc:
        callback = [type(exc).__name__, str(exc)]
    imported = [m for m in extras if m in sys.modules]
    print(json.dumps({"callback": callback, "installed": installed, "imported": imported, "decisions": decisions,
                      "status": [status.returncode, status.stdout], "serve": [serve.returncode, serve.stderr],
                      "sim": [sim.returncode, sim.stderr]}))
""")


@pytest.mark.slow
def test_a_bare_install_runs_the_embedded_coordinator_and_the_cli_without_any_extra(tmp_path):
    import json

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
                    ROOT], check=True, cwd=tmp_path, timeout=300)
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    wheel = next(wheels.glob("evalstop-*.whl"))
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel], check=True,
                   timeout=300)
    out = subprocess.run([venv / "bin" / "python", "-c", _CHECK], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["installed"] == [] and got["imported"] == []
    assert got["decisions"] == ["continue", "continue", "continue", "stop"]
    assert got["status"][0] == 0 and "run-a" in got["status"][1]
    assert got["serve"][0] == 2 and "pip install 'evalstop[service]'" in got["serve"][1]
    assert got["sim"][0] == 2 and "pip install 'evalstop[sim]'" in got["sim"][1]
    assert got["callback"][0] == "MissingExtraError" and 'pip install "evalstop[train]"' in got["callback"][1]


_HIDDEN = textwrap.dedent("""
    import importlib.abc, sys
    class Hide(importlib.abc.MetaPathFinder):  # the train extra is not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "trl", "accelerate", "peft", "datasets"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    import evalstop_trl
    try:
        from evalstop_trl import EvalStopCallback
    except ImportError as exc:
        print(type(exc).__name__, isinstance(exc, ModuleNotFoundError), exc.extra, "|", exc)
""")


def test_the_callback_without_the_train_extra_is_an_import_error_naming_the_extra():
    out = subprocess.run([sys.executable, "-c", _HIDDEN], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    kind, message = out.stdout.strip().split(" | ")
    assert kind == "MissingExtraError False train"  # an ImportError, not a bare ModuleNotFoundError
    assert message == ("EvalStopCallback needs the 'train' extra (the module transformers is missing): "
                       'pip install "evalstop[train]"')


@pytest.mark.slow  # ~10-25 s: a wheel, a venv and four commands
def test_the_sim_extra_runs_platform_sim_from_an_installed_wheel_outside_the_repository(tmp_path):
    """``pip install "evalstop[sim]"`` then ``platform-sim run`` / ``describe`` / ``reproduce`` from any folder: the default
    config is package data. The sim extra's dependencies come from this project's venv (offline): the wheel
    goes in with ``--no-deps`` and a ``.pth`` line puts this venv's site-packages after the new one's."""
    import json
    import os

    import numpy

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
                    ROOT], check=True, cwd=tmp_path, timeout=300)
    wheel = next(wheels.glob("evalstop-*.whl"))
    venv = tmp_path / "sim"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", wheel],
                   check=True, timeout=300)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "evalstop-sim-deps.pth").write_text(str(Path(numpy.__file__).resolve().parents[1]) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "platform-sim", *args], capture_output=True, text=True, cwd=elsewhere,
                              env=env, timeout=300)

    where = subprocess.run([venv / "bin" / "python", "-c", "import platform_sim.config as c; print(c.DEFAULT_CONFIG)"],
                           capture_output=True, text=True, cwd=elsewhere, env=env, timeout=60)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(site) and Path(where.stdout.strip()).is_file()
    out = run("run", "--seeds", "1", "--workers", "1", "--quiet", "--set", "workload.n_jobs=30", "--json", "r.json")
    assert out.returncode == 0, out.stderr
    assert "detection over watched jobs" in out.stdout
    assert json.loads((elsewhere / "r.json").read_text())["config"]["name"] == "rlhf_heavy"
    described = run("describe", "--set", "workload.n_jobs=30")
    assert described.returncode == 0 and "rlhf_grpo" in described.stdout, described.stderr
    variant = run("run", "--config", str(site / "platform_sim" / "configs" / "high_load.yaml"), "--seeds", "1",
                  "--workers", "1", "--quiet", "--set", "workload.n_jobs=30")  # a packaged variant and its base
    assert variant.returncode == 0, variant.stderr
    repro = run("reproduce", "--seeds", "1", "--workers", "1", "--quiet", "--set", "workload.n_jobs=20", "--out", "repro")
    assert repro.returncode == 0 and (elsewhere / "repro" / "report.md").is_file(), repro.stderr
