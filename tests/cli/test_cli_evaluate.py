"""``evalstop evaluate --db``: a real subprocess refuses a database that is not there (it created an
empty file and waited for snapshots forever). Scoring from an existing one: tests/train/test_evaluator.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

FN = "evalstop_trl.train.tiny:gold_hacked"


def _evaluate(tmp_path, db: str) -> subprocess.CompletedProcess:
    # a hang (the bug) ends the test with TimeoutExpired, far from a normal answer (about a second)
    return subprocess.run([sys.executable, "-m", "evalstop_trl", "evaluate", "--db", db, "--fn", FN,
                           "--root", str(tmp_path), "--max-evals", "1", "--wait-db", "1"], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("where", ["missing", "folder"])
def test_evaluate_refuses_a_database_that_is_not_there_and_creates_nothing(tmp_path, where):
    pytest.importorskip("torch")
    run = tmp_path / "run"
    run.mkdir()
    db = run / "evalstop.db"
    given = str(tmp_path / "evalstop.db") if where == "missing" else str(run)  # the folder above the run's
    out = _evaluate(tmp_path, given)
    assert out.returncode == 2, out.stderr
    if where == "missing":
        assert out.stderr.strip().splitlines()[-1] == (f"evalstop evaluate: error: no database at {given}: pass the file that "
                                      "exists (the callback writes <output_dir>/evalstop.db; `evalstop serve --db` "
                                      "the one it was given), or --url for a running coordinator")
        assert not (tmp_path / "evalstop.db").exists()
    else:
        assert f"--db {given} is a folder, not a database: pass the evalstop.db in it ({db})" in out.stderr
    assert not db.exists()



def test_a_database_in_a_folder_that_does_not_exist_is_refused_at_once(tmp_path):
    pytest.importorskip("torch")
    given = str(tmp_path / "no-such-root" / "no-such-run" / "evalstop.db")
    out = _evaluate(tmp_path, given)
    assert out.returncode == 2 and "no folder" in out.stderr and "waiting" not in out.stderr, out.stderr
    assert not (tmp_path / "no-such-root").exists()


def test_an_empty_file_is_not_taken_for_a_database(tmp_path):
    """A job's callback creates the file, then its schema: a reader must not write a schema into it first."""
    pytest.importorskip("torch")
    empty = tmp_path / "evalstop.db"
    empty.touch()
    out = _evaluate(tmp_path, str(empty))
    assert out.returncode == 2 and "not a SQLite database" in out.stderr and empty.stat().st_size == 0
    status = subprocess.run([sys.executable, "-m", "evalstop_trl", "status", "--db", str(empty)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 2 and "empty file" in status.stderr and empty.stat().st_size == 0
