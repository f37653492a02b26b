"""The wall that holds: sealed overlays (a separate process on the visible stream) and salted truth.

* Sealed runs decide exactly as in-process runs for every built-in overlay but Oracle-Stop (which
  refuses), and for an overlay whose decisions hang on every visible field of every snapshot.
* Each cheat of the audit (``tests/sim_cheats.py``: ``sys._getframe``, traceback frames,
  ``gc.get_objects``, ``gc.get_referrers``, the seed from ``sys.argv`` / ``os.environ`` /
  ``/proc/<ppid>/cmdline`` plus the public ``generate_workload``, the seed matched from the first 24
  job types, reading the engine's ``/proc/<ppid>/environ``, ``mem``, ``fd``) runs as a real overlay
  (a) in-process, the old behaviour: it reproduces the Oracle's decisions on every job (so the test
  can fail), and (b) sealed with a secret salt: it stops no more hacked jobs at their peak than a guess.
* Neither the salt nor any hidden value is ever in what the child is sent, its command line or its
  environment; a child that crashes, hangs, raises or breaks the protocol gives a clear error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from platform_sim import cli, sealed
from platform_sim.config import load_config
from platform_sim.engine import Simulation
from platform_sim.overlays import create_overlay
from platform_sim.schedulers import create_scheduler
from platform_sim.sealed import SealedOverlay, SealedOverlayError, child_command, child_env, sealed_spec
from platform_sim.sealed_run import run_salted
from platform_sim.workload import generate_workload
from tests.sim_cheats import CHEATS, MATCH, InheritedState, SnapshotDigest, oracle_step, proc_probe

ROOT = Path(__file__).resolve().parents[2]
SEED = 41  # in the cheats' candidate seeds (0-63)
BUILT_IN = {"evalstop": {"detector": "decline", "k": 2, "job_types": "rlhf"}, "stop_at": {"fraction": 0.65},
            "loss_plateau": {"window": 2, "tolerance": 0.03}, "none": {}}


def _pair(cfg, wl, scheduler, name, block):
    with SealedOverlay(name, block) as ov:
        a = Simulation(wl, cfg, create_scheduler(scheduler), ov).run()
    b = Simulation(wl, cfg, create_scheduler(scheduler), create_overlay(name, wl, **block)).run()
    return a, b, ov


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_sealed_decides_exactly_as_in_process(name):
    cfg = load_config()
    wl = generate_workload(cfg, 5, salt=12345)
    a, b, ov = _pair(cfg, wl, "srtf_est", name, BUILT_IN[name])
    assert a == b  # outcomes, makespan, events, overlay name
    assert ov.hardened == sys.platform.startswith("linux")
    if name != "none":
        assert sum(o.stopped for o in a.outcomes) > 10


def test_sealed_rebuilds_every_snapshot_exactly():
    """An overlay whose decisions hash every snapshot field and the clock, under a preemptive
    scheduler with rounds (waiting_since, GPU-hours and progress change between evals)."""
    cfg = load_config().replace(**{"workload.n_jobs": 120})
    wl = generate_workload(cfg, 2, salt=7)
    with SealedOverlay("tests.sim_cheats:SnapshotDigest") as ov:
        a = Simulation(wl, cfg, create_scheduler("loss_aware"), ov).run()
    b = Simulation(wl, cfg, create_scheduler("loss_aware"), SnapshotDigest()).run()
    assert a.outcomes == b.outcomes and a.overlay == "digest"
    assert 10 < sum(o.stopped for o in a.outcomes) < 110
    assert sum(o.restarts for o in a.outcomes) > 0  # preemptions happened: snapshots really varied


def test_oracle_refuses_to_run_sealed():
    with pytest.raises(ValueError, match="reads the ground truth by design"):
        sealed_spec("oracle", {})
    with pytest.raises(ValueError, match="module:Class"):
        sealed_spec("not a path:", {})
    with pytest.raises(ValueError, match="Unknown parameter"):
        sealed_spec("evalstop", {"kk": 2})


# ----------------------------------------------------------------------------- the salt
def test_the_salt_hides_the_truth_and_none_is_the_public_workload():
    cfg = load_config().replace(**{"workload.n_jobs": 80})
    public, salted = generate_workload(cfg, 3), generate_workload(cfg, 3, salt=2**100 + 1)
    assert generate_workload(cfg, 3, None) == public and public.salt is None and salted.salt == 2**100 + 1
    assert [(s.job_type, s.gpus) for s in public.jobs] == [(s.job_type, s.gpus) for s in salted.jobs]
    pairs = list(zip(public.truths, salted.truths, strict=True))
    assert all(a.height != b.height and a.scores != b.scores and a.losses != b.losses for a, b in pairs)
    assert not [a for a, b in pairs if a.peak_progress == b.peak_progress < 1.0]  # 1.0: no peak (healthy)
    assert sum(a.duration_s == b.duration_s for a, b in pairs) < 20  # equal only where both are clamped
    assert sum(a.hacked != b.hacked for a, b in pairs) > 10
    assert [s.arrival_s for s in public.jobs][1:] != [s.arrival_s for s in salted.jobs][1:]
    assert generate_workload(cfg, 3, salt=5) == generate_workload(cfg, 3, salt=5)
    assert generate_workload(cfg, 3, salt=5).truths != generate_workload(cfg, 3, salt=6).truths
    for bad in (-1, 1.5, True, "7"):
        with pytest.raises(ValueError, match="salt must be a non-negative integer"):
            generate_workload(cfg, 3, salt=bad)


def test_the_child_inherits_nothing_of_the_run():
    """No option on its command line, no variable beyond PATH and thread limits, an empty working
    folder, no open file but its standard streams and the protocol's (fds 0-3; 4: listdir's own)."""
    cfg = load_config().replace(**{"workload.n_jobs": 8})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("tests.sim_cheats:InheritedState") as ov:
        sealed_run = Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert not any(o.stopped for o in sealed_run.outcomes)
    control = InheritedState()  # in this process: pytest's arguments and environment
    assert all(o.stopped for o in Simulation(wl, cfg, create_scheduler("fifo"), control).run().outcomes)
    assert control.found


def test_neither_the_salt_nor_any_hidden_value_reaches_the_child(monkeypatch):
    salt = 0x5EC12E7_5A17_0DD5_BEEF
    cfg = load_config().replace(**{"workload.n_jobs": 60})
    wl = generate_workload(cfg, SEED, salt=salt)
    sent: list[bytes] = []
    real_send = sealed.send_frame
    monkeypatch.setattr(sealed, "send_frame", lambda fd, data, t: (sent.append(data), real_send(fd, data, t)))
    with SealedOverlay("evalstop", BUILT_IN["evalstop"]) as ov:
        Simulation(wl, cfg, create_scheduler("srtf_est"), ov).run()
    stream = b"".join(sent).decode("latin-1")  # the 4-byte headers are binary
    assert len(sent) > 100
    launch = " ".join(child_command()) + json.dumps(child_env())
    for secret in (str(salt), hex(salt), hex(salt)[2:], f"{salt:X}"):
        assert secret not in stream and secret not in launch
    hidden = [repr(x) for t in wl.truths for x in (t.duration_s, t.peak_progress, t.height, t.shape, t.gold_end)]
    hidden = [h for h in hidden if len(h) >= 10]  # full-precision values (not 1.0: no peak; not a clamp)
    assert len(hidden) > 200 and not [h for h in hidden if h in stream]
    assert set(child_env()) == {"PATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LC_ALL"}
    assert "--" not in " ".join(child_command()[1:])  # python -I -c CODE: no options of this run


# ----------------------------------------------------------------------------- the cheats
def _drive(cheat: str, mode: str) -> dict:
    """Run a cheat with the seed on the driver's own command line (as platform-sim run puts it)."""
    out = subprocess.run([sys.executable, "-m", "tests.sim_cheats", cheat, "--mode", mode, "--seed-start", str(SEED)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _judge(d: dict, truths: dict[int, tuple[bool, float]]) -> tuple[int, int, dict[int, int | None]]:
    """(hacked jobs stopped at their oracle eval, hacked jobs, every judged job's stop eval) over the
    RLHF jobs after the first 24 (a rebuilding cheat needs their types first)."""
    n, rlhf = d["n_evals"], {j for j, r, _, _ in d["truth"] if r}
    stops = {j: (evals if stopped else None) for j, stopped, evals in d["outcomes"] if j >= MATCH and j in rlhf}
    expected = {j: oracle_step(*truths[j], n) for j in stops}
    hacked = [j for j, s in expected.items() if s is not None]
    return sum(stops[j] == expected[j] for j in hacked), len(hacked), stops


@pytest.mark.parametrize("cheat", sorted(set(CHEATS) - {"ProcCheat"}))
def test_each_cheat_reaches_the_truth_in_process_and_nothing_sealed(cheat):
    inproc, sealed_run = _drive(cheat, "inproc"), _drive(cheat, "sealed")
    truth = {j: (h, p) for j, _, h, p in inproc["truth"]}
    hits, hacked, stops = _judge(inproc, truth)
    assert hacked > 30 and hits == hacked  # in-process: the Oracle's decision on every judged job...
    assert stops == {j: oracle_step(*truth[j], inproc["n_evals"]) for j in stops}  # ...and no other stop

    salted_truth = {j: (h, p) for j, _, h, p in sealed_run["truth"]}
    hits, hacked, stops = _judge(sealed_run, salted_truth)
    # a guess from the wrong curves hits a hacked job's peak eval ~12% of the time (47% hacked x
    # ~26% same eval); the Oracle hits all: the bound is 5 standard deviations above the guess
    assert hacked > 30 and hits <= 0.35 * hacked, (hits, hacked, sealed_run["salt"])
    assert stops != {j: oracle_step(*salted_truth[j], sealed_run["n_evals"]) for j in stops}
    if cheat in ("ArgvEnvCheat", "TypesMatchCheat"):
        # it did find the seed (from the parent's command line, or from the public job types) and
        # rebuilt the public workload exactly: the salt is what stops it
        wl = generate_workload(load_config(), SEED)
        public = {s.job_id: (t.hacked, t.peak_progress) for s, t in zip(wl.jobs, wl.truths, strict=True)}
        assert stops == {j: oracle_step(*public[j], sealed_run["n_evals"]) for j in stops}


def test_the_engine_process_cannot_be_read_from_the_sealed_child():
    if not sys.platform.startswith("linux"):
        pytest.skip("/proc, capabilities and dumpability are Linux's")
    # positive control: an ordinary child of this process reads its parent's /proc entries
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                            "import os; from tests.sim_cheats import proc_probe; print(proc_probe(os.getppid()))"],
                           capture_output=True, text=True, timeout=60)
    assert "environ" in probe.stdout, probe.stderr
    assert proc_probe(os.getpid())  # and this process reads its own
    inproc, sealed_run = _drive("ProcCheat", "inproc"), _drive("ProcCheat", "sealed")
    assert sum(s for _, s, _ in inproc["outcomes"]) > 50  # in the driver's process the probe reads /proc
    assert sum(s for _, s, _ in sealed_run["outcomes"]) == 0  # sealed: nothing readable, no stop


def test_a_run_with_worker_processes_keeps_them_and_its_main_process_unreadable():
    """platform-sim run --sealed --workers 2: the children's parents are forked workers, whose
    parent (this process) holds the salt: neither can be read from a sealed child."""
    cfg = load_config().replace(**{"workload.n_jobs": 40})
    res = run_salted(cfg, seeds=2, workers=2, overlay_class="tests.sim_cheats:ProcCheat", overlay_params={"depth": 2})
    assert res.sealed and res.result.changes.gpu_hours_change.mean == 0.0  # no job was stopped
    assert proc_probe(os.getpid())  # and this process is readable (to itself) again after the run


# ----------------------------------------------------------------------------- a misbehaving child
@pytest.mark.parametrize(("how", "message"), [
    ("crash", "closed its output"),
    ("hang", "did not answer within 1 s"),
    ("raise", "ZeroDivisionError: the overlay's own bug"),
    ("oversized", "announced a frame of 1073741824 bytes"),
    ("shape", "expected 0 cut"),
    ("truthy", "Broken.on_eval must return True .stop the job. or False, but returned 'no' of type str"),
])
def test_a_misbehaving_child_gives_a_clear_error(how, message):
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    wl = generate_workload(cfg, 0, salt=1)
    ov = SealedOverlay("tests.sim_cheats:Broken", {"how": how}, reply_timeout_s=1.0 if how == "hang" else 20.0)
    with pytest.raises(SealedOverlayError, match=message):
        Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert ov._proc is None  # killed and reaped


def test_an_overlay_that_prints_does_not_break_the_protocol():
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("tests.sim_cheats:Broken", {"how": "noise"}) as ov:
        res = Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
    assert all(o.completed for o in res.outcomes)


def test_a_sealed_overlay_cannot_leave_a_process_behind(tmp_path):
    """A grandchild that calls setsid() escapes the child's process group; the child may start no
    process at all (RLIMIT_NPROC 0 once its capabilities are gone), so none outlives the run."""
    cfg = load_config().replace(**{"workload.n_jobs": 10})
    marker = tmp_path / "grandchild"
    with SealedOverlay("tests.sim_cheats:Forker", {"marker": str(marker)}) as ov:
        Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
    assert ov.hardened
    refused = (tmp_path / "grandchild.refused").read_text()
    assert not marker.exists() and "Resource temporarily unavailable" in refused and "a thread ran" in refused


def test_a_sealed_run_has_an_overall_time_bound():
    """Every answer within its 30 s, the run as a whole not: the child's time in all is bounded."""
    cfg = load_config().replace(**{"workload.n_jobs": 40})
    ov = SealedOverlay("tests.sim_cheats:Broken", {"how": "slow"}, total_timeout_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(SealedOverlayError, match=r"took more than 3 s in all over this run \(total_timeout_s\)"):
        Simulation(generate_workload(cfg, 0, salt=1), cfg, create_scheduler("fifo"), ov).run()
    assert time.monotonic() - t0 < 15


def test_one_sealed_overlay_serves_one_run():
    cfg = load_config().replace(**{"workload.n_jobs": 5})
    wl = generate_workload(cfg, 0, salt=1)
    with SealedOverlay("none") as ov:
        Simulation(wl, cfg, create_scheduler("fifo"), ov).run()
        with pytest.raises(ValueError, match="serves one run"):
            Simulation(wl, cfg, create_scheduler("fifo"), ov).run()


def test_a_class_that_is_not_an_overlay_or_does_not_exist():
    ov = SealedOverlay("tests.sim_cheats:oracle_step")
    with pytest.raises(SealedOverlayError, match="is not a subclass of platform_sim.overlays.Overlay"):
        ov.attach(lambda: 0.0, 10)
    ov = SealedOverlay("no_such_module_here:X")
    with pytest.raises(SealedOverlayError, match="No module named 'no_such_module_here'"):
        ov.attach(lambda: 0.0, 10)


# ----------------------------------------------------------------------------- the command line
def test_cli_sealed_run_records_its_salt_and_reproduces(tmp_path, capsys):
    common = ["run", "--seeds", "2", "--workers", "1", "--quiet", "--set", "workload.n_jobs=40"]
    assert cli.main([*common, "--sealed", "--json", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    salt = a["sealed"]["salt"]
    assert a["sealed"]["sealed"] is True and int(salt, 16) > 2**64 and salt in capsys.readouterr().out
    assert cli.main([*common, "--salt", salt, "--json", str(tmp_path / "b.json")]) == 0  # in-process, same salt
    b = json.loads((tmp_path / "b.json").read_text())
    assert b.pop("sealed")["sealed"] is False and (a.pop("sealed"), a)[1] == b
    assert cli.main([*common, "--overlay-class", "tests.sim_cheats:SnapshotDigest", "--overlay-params",
                     '{"modulus": 3}', "--salt", "9", "--json", str(tmp_path / "c.json")]) == 0
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["overlay"] == "digest" and c["sealed"]["overlay"] == "tests.sim_cheats:SnapshotDigest"


@pytest.mark.parametrize(("args", "message"), [
    (["--sealed", "--set", "overlay.name=oracle"], "reads the ground truth by design"),
    (["--overlay-params", "{}"], "--overlay-params needs --overlay-class"),
    (["--sealed", "--trace", "x.csv"], "--trace cannot be salted or sealed"),
    (["--salt", "-3"], "--salt must be a non-negative integer"),
    (["--overlay-class", "m:C", "--overlay-params", "[1]"], "must be a JSON object"),
    (["--overlay-class", "my_pkg.stops"], "--overlay-class takes MODULE:CLASS"),
])
def test_cli_refuses(args, message, capsys):
    assert cli.main(["run", "--seeds", "1", "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_sealed_rebuilds_snapshots_on_a_mixed_cluster_under_gavel():
    """The pool and speed fields cross the wall too: jobs move between pools at Gavel's rounds."""
    cfg = load_config(ROOT / "configs" / "sim" / "sia_3type.yaml").replace(**{"workload.n_jobs": 60})
    wl = generate_workload(cfg, 3, salt=7)
    with SealedOverlay("tests.sim_cheats:SnapshotDigest") as ov:
        a = Simulation(wl, cfg, create_scheduler("gavel"), ov).run()
    b = Simulation(wl, cfg, create_scheduler("gavel"), SnapshotDigest()).run()
    assert a.outcomes == b.outcomes and a.pool_gpu_seconds == b.pool_gpu_seconds
    assert len({name for name, s in a.pool_gpu_seconds if s > 0}) == 3
