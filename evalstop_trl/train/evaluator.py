"""``evalstop evaluate``: external world-feedback evaluators.

A worker claims a job's snapshot (a lease: if the worker dies, the lease runs out and the snapshot
goes back to the queue), loads it (transformers, or a PEFT adapter over its base model), runs
``function(model, tokenizer) -> float`` and posts the score; an exception, NaN or None posts a failed
eval (a missing eval for the detector). The coordinator feeds the scores to the detector in step
order.

The function may return per-example scores instead (a list, an array, a dict example id -> score,
as the callback's ``world_feedback``): the evaluator posts their mean, their number and their
paired noise level against the last earlier snapshot of the same job that this evaluator scored
(the previous one when one evaluator keeps up with a job; none when another evaluator scored it).
It keeps those scores for the last :data:`KEPT_JOBS` jobs only.

Security model: tenants write the snapshots (and name their paths); the evaluator's operator
decides which folder it may read (``root``) and which code it runs (``--fn``). So:

* a snapshot is opened only if its path resolves inside ``root``; so must a PEFT adapter's base
  model (``base_model_name_or_path`` in ``adapter_config.json``: a relative name is taken under
  ``root``; a hub name or any path outside is refused, nothing is downloaded);
* every file and folder of a snapshot (and of the base model) is checked before it is loaded: a
  symlink whose target leaves ``root``, a FIFO, socket or device is refused;
* weights load from safetensors only (``pytorch_model.bin`` and other pickles are refused unless the
  operator passes ``allow_pickle``); no remote code (``trust_remote_code=False``), no download;
* the function is imported from the installed packages, or from the one folder the operator names
  (``fn_path``), never from ``root`` or the current folder (:func:`isolate_sys_path` takes both off
  ``sys.path``, so a ``transformers.py`` a tenant left there is never imported);
* tenant text (paths, error messages) is escaped in log lines.

A snapshot checked here could still be changed by its tenant between the check and the load; run
evaluators on a copy, or on storage tenants cannot write while a snapshot is evaluated, where that
matters.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import logging
import math
import os
import re
import stat
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..clients.api import EvalStopAPI
from ..core.examples import ExampleEval, WorldFeedback, is_per_example, summarize
from ..core.records import EvalTask

__all__ = ["KEPT_JOBS", "Evaluator", "SnapshotRefused", "check_tree", "inside", "isolate_sys_path", "load_function",
           "load_snapshot", "printable"]

log = logging.getLogger("evalstop.evaluate")

#: jobs whose last per-example scores an evaluator keeps (to pair with their next snapshot)
KEPT_JOBS = 16
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_ENTRIES = 100_000  # files and folders of one snapshot that are checked
_MAX_CONFIG = 1 << 20  # bytes of an adapter_config.json
#: weight files that are pickles (refused without allow_pickle); safetensors files are not
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "adapter_model.bin")


class SnapshotRefused(ValueError):
    """A snapshot this evaluator will not open (outside its root, a symlink out, pickled weights)."""


def printable(text: Any, limit: int = 500) -> str:
    """``text`` for a log line: control and other unprintable characters escaped (a tenant's path or
    error cannot forge a line), at most ``limit`` characters."""
    text = str(text)
    cut = len(text) > limit
    text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text + ("..." if cut else "")


def _clean_error(text: str) -> str:
    """An error message the service accepts (no NUL or control character but tabs and line breaks)."""
    text = text[:2000]
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
                   for c in text)[:2000]


def isolate_sys_path(*folders: str | os.PathLike) -> None:
    """Take the current folder (``""``, ``"."``) and ``folders`` off ``sys.path`` (for good), so that
    modules imported from now on (transformers, peft, the function's own imports) come from the
    installed packages, never from a folder tenants write (``python -m`` and the old ``evalstop
    evaluate`` put the current folder first). Modules imported before this call are not affected:
    run the ``evalstop`` command (or ``python -P -m evalstop_trl``), not ``python -m`` from a root."""
    unsafe = {Path.cwd().resolve(), *(Path(f).resolve() for f in folders)}

    def keep(entry: Any) -> bool:
        if not isinstance(entry, str):
            return True
        try:
            return Path(entry or ".").resolve() not in unsafe
        except (OSError, RuntimeError, ValueError):
            return False

    sys.path[:] = [e for e in sys.path if keep(e)]
    importlib.invalidate_caches()


def load_function(spec: str, path: str | os.PathLike | None = None) -> Callable[[Any, Any], float]:
    """``package.module:function`` -> the function (ValueError with the reason otherwise).

    Args:
        spec: ``package.module:function``.
        path: a folder to import ``package`` from (only that top-level name comes from there; its own
            imports and everything else come from the installed packages). None: the installed
            packages only.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or not _MODULE.fullmatch(module_name) or not attr.isidentifier():
        raise ValueError(f"--fn must look like package.module:function, but got {spec!r}.")
    top = module_name.partition(".")[0]
    try:
        if path is not None:
            _import_top_from(top, Path(path).resolve(), spec)
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        hint = ""
        if path is None and isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] == top:
            hint = f"; if {top!r} is not installed, pass --fn-path DIR, the folder that holds {top}"
        raise ValueError(f"cannot load --fn {spec!r}: {exc}{hint}") from None
    if not callable(fn):
        raise ValueError(f"--fn {spec!r} is not callable.")
    return fn


def _import_top_from(top: str, folder: Path, spec: str) -> None:
    if not folder.is_dir():
        raise ValueError(f"--fn-path {folder} is not a folder.")
    found = importlib.machinery.PathFinder.find_spec(top, [str(folder)])
    if found is None or found.loader is None:
        raise ValueError(f"cannot load --fn {spec!r}: no module {top!r} in --fn-path {folder}.")
    loaded = sys.modules.get(top)
    if loaded is not None:
        if getattr(loaded.__spec__, "origin", None) == found.origin:
            return
        raise ValueError(f"cannot load --fn {spec!r} from --fn-path {folder}: a module {top!r} is already imported "
                         f"from {getattr(loaded, '__file__', None)}; rename the function's package.")
    module = importlib.util.module_from_spec(found)
    sys.modules[top] = module
    try:
        found.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(top, None)
        raise


def inside(root: Path, path: str | os.PathLike) -> Path:
    """``path`` resolved (symlinks followed) if that is ``root`` or under it; SnapshotRefused otherwise.
    ``root`` must be resolved already."""
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise SnapshotRefused(f"cannot open {printable(path, 300)} ({type(exc).__name__}: {exc})") from None
    if resolved != root and root not in resolved.parents:
        raise SnapshotRefused(f"{printable(path, 300)} is outside this evaluator's root {root}")
    return resolved


def check_tree(root: Path, folder: Path) -> None:
    """Refuse (SnapshotRefused) a folder holding a symlink whose target is outside ``root`` (or dangling),
    or anything that is not a regular file or a folder (a FIFO would hang the loader). A symlink to a
    folder under ``root`` is checked as well (once)."""
    count, seen, todo = 0, {folder}, [folder]
    while todo:
        for dirpath, dirnames, filenames in os.walk(todo.pop(), followlinks=False):
            for name in dirnames + filenames:
                count += 1
                if count > _MAX_ENTRIES:
                    raise SnapshotRefused(f"{printable(folder, 300)} holds more than {_MAX_ENTRIES} files")
                entry = Path(dirpath, name)
                target = inside(root, entry) if entry.is_symlink() else entry
                mode = os.stat(target, follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode) and target is not entry and target not in seen:
                    seen.add(target)
                    todo.append(target)
                elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise SnapshotRefused(f"{printable(entry, 300)} is not a regular file or a folder")


def _safetensors_only(folder: Path, weights: str, allow_pickle: bool) -> None:
    if allow_pickle:
        return
    if not any(folder.glob(f"{weights}*.safetensors")) and not (folder / f"{weights}.safetensors.index.json").is_file():
        found = [n for n in _PICKLE_WEIGHTS if (folder / n).exists()]
        raise SnapshotRefused(f"{printable(folder, 300)} has no safetensors weights ({weights}.safetensors)"
                              + (f"; {', '.join(found)} is a pickle" if found else "")
                              + "; this evaluator loads safetensors only (the operator may pass --allow-pickle)")


def _adapter_base(root: Path, folder: Path) -> Path:
    """The adapter's base model folder, resolved inside ``root`` (SnapshotRefused otherwise)."""
    config = folder / "adapter_config.json"
    if config.stat().st_size > _MAX_CONFIG:
        raise SnapshotRefused(f"{printable(config, 300)} is larger than {_MAX_CONFIG} bytes")
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (ValueError, AttributeError) as exc:
        raise SnapshotRefused(f"{printable(config, 300)} is not a JSON object ({exc})") from None
    if not isinstance(base, str) or not base:
        raise SnapshotRefused(f"{printable(config, 300)} names no base model (base_model_name_or_path)")
    base_path = Path(base) if Path(base).is_absolute() else root / base
    try:
        resolved = inside(root, base_path)
    except SnapshotRefused:
        raise SnapshotRefused(f"the adapter's base model {printable(base, 300)} is not a folder under this "
                              f"evaluator's root {root} (hub names are not downloaded)") from None
    if not resolved.is_dir():
        raise SnapshotRefused(f"the adapter's base model {printable(base, 300)} is not a folder")
    return resolved


def load_snapshot(path: str | os.PathLike, device: str = "cpu", root: str | os.PathLike | None = None,
                  allow_pickle: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) of a saved checkpoint folder: a full model, or a PEFT adapter over its base.

    Args:
        path: the snapshot folder.
        device: where the model goes.
        root: everything read must be under this folder (default: the snapshot folder itself).
        allow_pickle: also load pickled weights (``pytorch_model.bin``); off by default.

    Raises:
        SnapshotRefused: the snapshot (or its adapter's base) leaves ``root``, holds a symlink out of
            it or a special file, or has no safetensors weights without ``allow_pickle``.
    """
    root_path = Path(root if root is not None else path).resolve()
    folder = inside(root_path, path)
    if not folder.is_dir():
        raise SnapshotRefused(f"{printable(path, 300)} is not a folder")
    check_tree(root_path, folder)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = {"local_files_only": True, "trust_remote_code": False}
    if (folder / "adapter_config.json").is_file():
        from peft import PeftModel

        base = _adapter_base(root_path, folder)
        if base != folder:
            check_tree(root_path, base)
        _safetensors_only(folder, "adapter_model", allow_pickle)
        _safetensors_only(base, "model", allow_pickle)
        model = AutoModelForCausalLM.from_pretrained(base, use_safetensors=None if allow_pickle else True, **local)
        model = PeftModel.from_pretrained(model, folder, is_trainable=False, local_files_only=True)
    else:
        _safetensors_only(folder, "model", allow_pickle)
        model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=None if allow_pickle else True, **local)
    tokenizer = AutoTokenizer.from_pretrained(folder, **local) if (folder / "tokenizer_config.json").exists() else None
    return model.to(device).eval(), tokenizer


class _LastExamples:
    """Per job, the last per-example eval scored here (the latest step), for :data:`KEPT_JOBS` jobs:
    a new snapshot's scores are paired with an earlier step's. Thread-safe; the lock only guards the
    dict (scores are summarised outside it)."""

    def __init__(self, jobs: int = KEPT_JOBS) -> None:
        self.jobs = jobs
        self._last: OrderedDict[str, tuple[int, ExampleEval]] = OrderedDict()
        self._lock = threading.Lock()

    def summarize(self, job_id: str, step: int, value: Any) -> ExampleEval:
        with self._lock:
            kept = self._last.get(job_id)
        ev = summarize(value, kept[1] if kept is not None and kept[0] < step else None)
        with self._lock:
            kept = self._last.get(job_id)
            if kept is None or kept[0] < step:
                self._last[job_id] = (step, ev)
            self._last.move_to_end(job_id)
            while len(self._last) > self.jobs:
                self._last.popitem(last=False)
        return ev


class Evaluator:
    """Workers that claim, evaluate and score snapshots of one tenant's jobs.

    Args:
        client: an :class:`~evalstop_trl.clients.api.EvalStopAPI` (``claim_eval``, ``post_eval``).
        function: ``(model, tokenizer) -> float``, higher is better (the job's policy says the direction);
            or per-example scores (the module's docstring).
        root: only snapshots (and adapters' base models) under this folder are opened.
        workers: threads; device: where models go; lease_s: how long a claim lasts.
        max_evals: stop after this many evals (None: run until stopped).
        allow_pickle: also load pickled weights (``pytorch_model.bin``); safetensors only by default.
    """

    def __init__(self, client: EvalStopAPI, function: Callable[[Any, Any], float], root: str | os.PathLike,
                 workers: int = 1, device: str = "cpu", lease_s: float = 300.0, max_evals: int | None = None,
                 idle_s: float = 1.0, name: str | None = None, allow_pickle: bool = False) -> None:
        if not 1 <= workers <= 64:
            raise ValueError(f"workers must be in [1, 64], but got {workers}.")
        self.client, self.function, self.root = client, function, Path(root).resolve()
        self.workers, self.device, self.lease_s, self.max_evals, self.idle_s = workers, device, lease_s, max_evals, idle_s
        self.allow_pickle = allow_pickle
        self.name = name or f"{os.uname().nodename}-{os.getpid()}"
        self.done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._examples = _LastExamples()
        self._proxy_said = False  # the warning that an external eval does not carry a proxy, said once

    def stop(self) -> None:
        self._stop.set()

    def _budget(self) -> bool:
        with self._lock:
            if self.max_evals is not None and self.done >= self.max_evals:
                return False
            self.done += 1
            return True

    def run(self) -> int:
        """Run the workers until ``max_evals`` evals are done or :meth:`stop`; returns the evals done."""
        threads = [threading.Thread(target=self._work, args=(i,), name=f"evalstop-evaluate-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.done

    def _work(self, i: int) -> None:
        worker = f"{self.name}/{i}"
        while not self._stop.is_set():
            if self.max_evals is not None and self.done >= self.max_evals:
                return
            try:
                task = self.client.claim_eval(worker, self.lease_s)
            except Exception as exc:  # noqa: BLE001 - the coordinator may be away: wait and retry
                log.warning("evalstop evaluate: cannot claim (%s)", printable(exc))
                task = None
            if task is None:
                self._stop.wait(self.idle_s)
                continue
            if not self._budget():
                return  # the lease runs out and another worker takes it
            self.evaluate(task, worker)

    def evaluate(self, task: EvalTask, worker: str) -> float | None:
        """Score one claimed snapshot and post the result; returns the score (None: failed)."""
        job, step, path = task.job_id, task.step, task.path
        score, error, n, noise = None, None, None, None
        t0 = time.monotonic()
        try:
            model, tokenizer = load_snapshot(path, self.device, root=self.root, allow_pickle=self.allow_pickle)
            import torch

            with torch.no_grad():
                value = self.function(model, tokenizer)
            if isinstance(value, WorldFeedback):
                if value.proxy is not None and not self._proxy_said:
                    self._proxy_said = True
                    log.warning("evalstop evaluate: the function returns a proxy (WorldFeedback.proxy); an external "
                                "eval posts its score only, and the job's reports keep the trainer's logged reward "
                                "(a callable world_feedback in EvalStopCallback reports the proxy)")
                value = value.score
            if is_per_example(value):
                ev = self._examples.summarize(job, step, value)
                value, n, noise = ev.mean, ev.n, ev.noise
            value = value.item() if hasattr(value, "item") else value
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                error = f"the function returned {printable(repr(value), 200)}, not a finite number"
            else:
                score = float(value)
        except SnapshotRefused as exc:
            error = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - a failed eval is a missing eval, not a dead worker
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            log.info("evalstop evaluate: %s step %d -> %s (%.1f s)", printable(job), step, score,
                     time.monotonic() - t0)
        else:
            error = _clean_error(error)
            log.warning("evalstop evaluate: %s step %d failed: %s", printable(job), step, printable(error))
        try:
            evidence = {} if score is None or n is None else {"eval_n": n, "eval_noise": noise}
            self.client.post_eval(job, step, score, worker, error, **evidence)
        except Exception as exc:  # noqa: BLE001
            log.warning("evalstop evaluate: could not post %s step %d (%s); its lease will run out", printable(job),
                        step, printable(exc))
        return score
