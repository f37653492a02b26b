"""The README is a guide: short, no test counts or timings, its facts tied to their one home, its
links alive and its commands real (each ``evalstop`` / ``platform-sim`` line parses with today's CLI;
the cheap ones run).

The detector facts (the default, the recommendation, the table's names) live in
``evalstop_trl/core/detectors/``; every public ``detector=`` default is tied to the default here.
"""

from __future__ import annotations

import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_trl.core.detectors import DEFAULT_DETECTOR, DETECTORS, GATES, RECOMMENDED_POLICY

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_guide_of_at_most_300_lines_without_test_counts_or_timings():
    assert len(README.splitlines()) <= 300
    assert not re.search(r"\b\d[\d,]* tests\b|\d+ min(utes)? of tests|passed in", README)


def test_the_readme_says_the_default_and_the_recommendation_the_registry_holds():
    rule, gate = RECOMMENDED_POLICY["detector"], RECOMMENDED_POLICY["gate"]
    assert rule in DETECTORS and gate in GATES and set(RECOMMENDED_POLICY) == {"detector", "gate"}
    assert f"**Recommendation for new users: `{rule}` with `gate: {gate}`**" in README
    assert f"| `{DEFAULT_DETECTOR}` (the default" in README
    table = README[README.index("## Choose a detector"):README.index("## The service")]
    named = set(re.findall(r"`([a-z_]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()
                                                      if line.startswith("| `"))))
    assert named == set(DETECTORS)


def test_every_public_detector_default_is_the_registrys_default():
    from evalstop_trl.analysis.replay import replay_curve
    from evalstop_trl.core.records import Policy
    from evalstop_trl.integrations.optuna import EvalStopPruner
    from evalstop_trl.integrations.ray_tune import EvalStopStopper
    from evalstop_trl.train.callback import EvalStopCallback
    from evalstop_trl.train.session import SessionConfig

    assert Policy().detector == DEFAULT_DETECTOR
    for fn in (replay_curve, EvalStopPruner.__init__, EvalStopStopper.__init__, EvalStopCallback.__init__,
               SessionConfig.build):
        assert inspect.signature(fn).parameters["detector"].default == DEFAULT_DETECTOR, fn.__qualname__


def test_every_link_of_the_readme_exists():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def _commands() -> list[list[str]]:
    """Every ``evalstop`` / ``platform-sim`` command line of the README's shell blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            if line.startswith(("evalstop ", "platform-sim ")):
                out.append(shlex.split(line))
    return out


def test_the_readmes_commands_parse_with_todays_cli():
    from evalstop_trl.cli import build_parser as evalstop_parser
    from platform_sim.cli import build_parser as sim_parser

    commands = _commands()
    assert len(commands) >= 5
    for argv in commands:
        parser = evalstop_parser() if argv[0] == "evalstop" else sim_parser()
        parser.parse_args(argv[1:])  # an unknown flag or command exits 2 here


@pytest.mark.slow
def test_the_readmes_cheap_commands_run(tmp_path):
    ran = 0
    for argv in _commands():
        if argv[:3] == ["evalstop", "tenants", "add"] or argv == ["platform-sim", "run"]:
            module = "evalstop_trl" if argv[0] == "evalstop" else "platform_sim.cli"
            r = subprocess.run([sys.executable, "-m", module, *argv[1:]], cwd=tmp_path, capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, (argv, r.stderr[-2000:])
            ran += 1
    assert ran == 2


def _body_keys(body: str) -> set[str]:
    """The top-level keys of a docs body like ``{job_id, policy?: {detector, ...}, kind: a\\|b}``."""
    depth, key, keys = 0, "", []
    for ch in body.strip()[1:-1] + ",":
        if ch == "," and depth == 0:
            keys.append(key.split(":")[0].strip().rstrip("?"))
            key = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        key += ch
    return {k for k in keys if k}


def test_the_service_docs_list_each_routes_body_as_its_request_record_does():
    """docs/service.md's route table names every body field of the route's request record (one
    home: ``core/requests.py``), so a field added there without the docs fails here."""
    from evalstop_trl.core.api import ROUTES

    rows = re.findall(r"^\| `(GET|POST) (/\S+)` \| `(\{.*?\})`", (ROOT / "docs" / "service.md").read_text(), re.M)
    by_path = {(r.method, r.path): r for r in ROUTES.values()}
    checked = 0
    for method, path, body in rows:
        route = by_path.get((method, path.replace("{id}", "{job_id}")))
        if route is not None and route.request is not None:
            assert _body_keys(body) == set(route.body), (method, path)
            checked += 1
    assert checked >= 4, rows


def _install_lines() -> list[list[str]]:
    """The ``pip install`` lines of the README's install section, in order."""
    section = README[README.index("## Install into your own project"):README.index("## Quick start")]
    return [shlex.split(line.split("  #")[0]) for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for line in block.splitlines() if line.startswith("pip install ")]


def test_the_install_section_gives_the_cpu_torch_line_as_a_real_pip_command():
    from pip._internal.commands import create_command

    lines = _install_lines()
    cpu = [argv for argv in lines if "--index-url" in argv]
    assert len(cpu) == 1, lines
    options, args = create_command("install").parse_args(cpu[0][2:])  # pip's own parser: a real command
    assert args == ["torch"] and options.index_url == "https://download.pytorch.org/whl/cpu"
    train = next(i for i, argv in enumerate(lines) if any(a.startswith("evalstop[train]") for a in argv))
    assert lines.index(cpu[0]) < train  # beside the train extra's line, before it
