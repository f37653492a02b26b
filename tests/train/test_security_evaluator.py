"""Issue 17, item 8 (and the evaluator's part of item 9): `evalstop evaluate` reads and runs nothing
outside its `--root`. Each test plants the attack in a real snapshot of a tiny model built here (no
hub download) and runs a real evaluator (in process, or the `evalstop evaluate` command) against a
real `evalstop serve` on loopback."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evalstop_trl.clients.http import EvalStopClient  # noqa: E402
from evalstop_trl.train.evaluator import Evaluator  # noqa: E402
from evalstop_trl.train.tiny import build_model, build_tokenizer, save_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Llama and its tokenizer, saved once (safetensors)."""
    tok = build_tokenizer()
    return save_tiny(build_model(tok, hidden=16, layers=1, heads=2), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def lab(server):
    token = server.add_tenant("lab")
    server.start()
    with EvalStopClient(server.url, token) as client:
        client.register_job("ext", "grpo")
        yield server, token, client


def _evaluate(client: EvalStopClient, path: Path, root: Path, **kw) -> tuple[float | None, list]:
    """Publish ``path``, let an in-process evaluator (rooted at ``root``) score it; (score, calls)."""
    client.publish_snapshot("ext", 10, str(path))
    calls: list = []
    evaluator = Evaluator(client, lambda model, tok: calls.append(model) or 0.25, root=root, max_evals=1, idle_s=0.05,
                          **kw)
    task = client.claim_eval("w", 5)
    assert task is not None and task.path == str(path)
    score = evaluator.evaluate(task, "w")
    [done] = client.evals("ext")
    assert done.state.value == ("done" if score is not None else "missing")
    return score, calls


def _refused(caplog, words: str) -> bool:
    return any(words in r.getMessage() and "refused" in r.getMessage() for r in caplog.records
               if r.name == "evalstop.evaluate")


# ---------------------------------------------------------------- symlinks out of the root
@pytest.mark.parametrize("name, target", [("tokenizer.json", "outside"), ("config.json", "/etc/passwd"),
                                          ("model.safetensors", "outside")])
def test_17_8_a_symlink_out_of_the_root_is_refused(lab, tiny, tmp_path, caplog, name, target):
    _, _, client = lab
    root, outside = tmp_path / "root", tmp_path / "outside"
    snap = root / "run" / "checkpoint-10"
    shutil.copytree(tiny, snap)
    outside.mkdir()
    shutil.copy(snap / name, outside / name)  # the tenant's copy of a real file, outside the operator's root
    (snap / name).unlink()
    (snap / name).symlink_to(outside / name if target == "outside" else target)
    with caplog.at_level(logging.INFO, "evalstop.evaluate"):
        score, calls = _evaluate(client, snap, root)
    assert score is None and calls == []
    assert _refused(caplog, "outside this evaluator's root"), [r.getMessage() for r in caplog.records]


def test_17_8_a_symlinked_folder_inside_the_root_is_checked_too(lab, tiny, tmp_path, caplog):
    """A symlink to a folder under the root is fine, but what that folder links to is checked as well."""
    _, _, client = lab
    root = tmp_path / "root"
    shutil.copytree(tiny, root / "shared")
    (root / "shared" / "tokenizer.json").unlink()
    (root / "shared" / "tokenizer.json").symlink_to("/etc/passwd")
    snap = root / "checkpoint-10"
    snap.mkdir()
    for f in tiny.iterdir():
        shutil.copy(f, snap / f.name)
    (snap / "extra").symlink_to(root / "shared")
    with caplog.at_level(logging.INFO, "evalstop.evaluate"):
        score, calls = _evaluate(client, snap, root)
    assert score is None and calls == [] and _refused(caplog, "outside this evaluator's root")


def test_17_8_a_snapshot_symlinked_from_inside_the_root_to_outside_is_refused(lab, tiny, tmp_path, caplog):
    _, _, client = lab
    root = tmp_path / "root"
    root.mkdir()
    (root / "checkpoint-10").symlink_to(tiny)  # the folder itself lives outside
    with caplog.at_level(logging.INFO, "evalstop.evaluate"):
        score, calls = _evaluate(client, root / "checkpoint-10", root)
    assert score is None and calls == [] and _refused(caplog, "outside this evaluator's root")


# ---------------------------------------------------------------- a PEFT adapter's base model
def _adapter(base: Path, out: Path, name_in_config: str) -> Path:
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = name_in_config
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("where", ["outside", "inside", "relative"])
def test_17_8_an_adapters_base_model_must_be_under_the_root(lab, tiny, tmp_path, caplog, where):
    _, _, client = lab
    root = tmp_path / "root"
    root.mkdir()
    if where == "outside":
        base = tiny  # the tenant names a model the operator never put under the root
        name = str(tiny)
    else:
        base = shutil.copytree(tiny, root / "base")
        name = str(base) if where == "inside" else "base"
    snap = _adapter(base, root / "checkpoint-10", name)
    with caplog.at_level(logging.INFO, "evalstop.evaluate"):
        score, calls = _evaluate(client, snap, root)
    if where == "outside":
        assert score is None and calls == [] and _refused(caplog, "base model"), [r.getMessage() for r in caplog.records]
    else:
        assert score == 0.25 and len(calls) == 1 and type(calls[0]).__name__.startswith("Peft")


# ---------------------------------------------------------------- pickles
class _Bomb:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["state_dict", "bomb"])
def test_17_8_pickled_weights_are_refused_unless_the_operator_allows_them(lab, tiny, tmp_path, caplog, kind):
    _, _, client = lab
    root = tmp_path / "root"
    snap = shutil.copytree(tiny, root / "checkpoint-10")
    from safetensors.torch import load_file

    state = load_file(snap / "model.safetensors")
    (snap / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save(state if kind == "state_dict" else {"x": _Bomb(marker)}, snap / "pytorch_model.bin")
    with caplog.at_level(logging.INFO, "evalstop.evaluate"):
        score, calls = _evaluate(client, snap, root)
    assert score is None and calls == [] and not marker.exists()
    assert _refused(caplog, "safetensors only"), [r.getMessage() for r in caplog.records]
    if kind == "state_dict":  # the operator's choice: --allow-pickle loads it
        client.publish_snapshot("ext", 20, str(snap))
        evaluator = Evaluator(client, lambda m, t: 0.5, root=root, allow_pickle=True)
        assert evaluator.evaluate(client.claim_eval("w", 5), "w") == 0.5


# ---------------------------------------------------------------- the command: sys.path, logs, token
def _command(server, root: Path, token_file: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evalstop_trl", "evaluate", "--url", server.url, "--token-file", str(token_file),
         "--max-evals", "1", "--lease-s", "30", *extra], cwd=cwd, capture_output=True, text=True, timeout=240,
        env={k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1"}.items() if k != "EVALSTOP_TOKEN"})


def test_17_8_a_transformers_py_in_the_root_never_runs(lab, tiny, tmp_path):
    """`python -m` puts the current folder first on sys.path, and the old command added it again: with
    the default `--root .`, a tenant's transformers.py (or peft.py, or the --fn's module) ran."""
    server, token, client = lab
    root = tmp_path / "root"
    snap = shutil.copytree(tiny, root / "checkpoint-10")
    marker = tmp_path / "pwned"
    for name in ("transformers", "peft", "safetensors"):
        (root / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise ImportError('planted')\n")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    client.publish_snapshot("ext", 10, str(snap))
    done = _command(server, root, token_file, "--fn", "evalstop_trl.train.tiny:gold_hacked", cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    [task] = client.evals("ext")
    assert task.state.value == "done" and task.score is not None, done.stderr[-3000:]


def test_17_8_the_function_comes_from_fn_path_never_from_the_root(lab, tmp_path):
    server, token, _ = lab
    root, code = tmp_path / "root", tmp_path / "code"
    root.mkdir()
    code.mkdir()
    (root / "myeval.py").write_text("def score(m, t):\n    return 1.0\n")  # a tenant's module under the root
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    done = _command(server, root, token_file, "--fn", "myeval:score", "--root", str(root), cwd=root)
    assert done.returncode == 2 and "No module named 'myeval'" in done.stderr, done.stderr
    done = _command(server, root, token_file, "--fn", "myeval:score", "--fn-path", str(root), "--root", str(root),
                    cwd=tmp_path)
    assert done.returncode == 2 and "--fn-path" in done.stderr and "tenants write there" in done.stderr
    (code / "myeval.py").write_text("def score(m, t):\n    return 1.0\n")
    done = _command(server, root, token_file, "--fn", "myeval:score", "--fn-path", str(code), "--root", str(root),
                    "--max-evals", "0", cwd=tmp_path)
    assert done.returncode == 0 and "0 eval(s) done" in done.stdout, done.stderr


def test_17_9_evaluator_log_lines_are_escaped_and_httpx_is_quiet(lab, tiny, tmp_path):
    """A tenant's text in an error (here a config.json's model_type with a line break) cannot forge
    an evaluator log line; httpx's one INFO line per request (a claim a second) is gone."""
    server, token, client = lab
    root = tmp_path / "root"
    snap = shutil.copytree(tiny, root / "checkpoint-10")
    config = json.loads((snap / "config.json").read_text())
    config["model_type"] = "llama\n2030-01-01 00:00:00,000 INFO evalstop.evaluate: FORGED step 1 -> 0.99"
    (snap / "config.json").write_text(json.dumps(config))
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    client.register_job("idle", "grpo")
    t0 = time.monotonic()
    time.sleep(0.1)
    client.publish_snapshot("ext", 10, str(snap))
    done = _command(server, root, token_file, "--fn", "evalstop_trl.train.tiny:gold_hacked", "--root", str(root),
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert not any(line.startswith("2030-01-01") or "FORGED" in line and "failed" not in line for line in lines), lines
    assert any("FORGED" in line and "\\n2030" in line for line in lines), lines
    assert not any("HTTP Request" in line for line in lines), lines
    assert time.monotonic() - t0 < 240
