"""``evalstop evaluate``: external world-feedback evaluators.

A worker claims a job's snapshot (a lease: if the worker dies, the lease runs out and the snapshot
goes back to the queue), loads it (transformers, or a PEFT adapter over its base model), runs
``function(model, tokenizer) -> float`` and posts the score; an exception, NaN or None posts a failed
eval (a missing eval for the detector). The coordinator feeds the scores to the detector in step
order. Only snapshots under ``root`` are ever opened: a path is a capability, and the evaluator's
operator decides which folders it may read.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.api import EvalStopAPI
from ..core.records import EvalTask

__all__ = ["Evaluator", "load_function", "load_snapshot"]

log = logging.getLogger("evalstop.evaluate")


def load_function(spec: str) -> Callable[[Any, Any], float]:
    """``package.module:function`` -> the function (ValueError with the reason otherwise)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--fn must look like package.module:function, but got {spec!r}.")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load --fn {spec!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"--fn {spec!r} is not callable.")
    return fn


def load_snapshot(path: str | os.PathLike, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) of a saved checkpoint folder: a full model, or a PEFT adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    if (folder / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(folder)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder) if (folder / "tokenizer_config.json").exists() else None
    return model.to(device).eval(), tokenizer


class Evaluator:
    """Workers that claim, evaluate and score snapshots of one tenant's jobs.

    Args:
        client: an :class:`~evalstop_trl.core.api.EvalStopAPI` (``claim_eval``, ``post_eval``).
        function: ``(model, tokenizer) -> float``, higher is better (the job's policy says the direction).
        root: only snapshots under this folder are opened.
        workers: threads; device: where models go; lease_s: how long a claim lasts.
        max_evals: stop after this many evals (None: run until stopped).
    """

    def __init__(self, client: EvalStopAPI, function: Callable[[Any, Any], float], root: str | os.PathLike,
                 workers: int = 1, device: str = "cpu", lease_s: float = 300.0, max_evals: int | None = None,
                 idle_s: float = 1.0, name: str | None = None) -> None:
        if not 1 <= workers <= 64:
            raise ValueError(f"workers must be in [1, 64], but got {workers}.")
        self.client, self.function, self.root = client, function, Path(root).resolve()
        self.workers, self.device, self.lease_s, self.max_evals, self.idle_s = workers, device, lease_s, max_evals, idle_s
        self.name = name or f"{os.uname().nodename}-{os.getpid()}"
        self.done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

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
                log.warning("evalstop evaluate: cannot claim (%s)", exc)
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
        score, error = None, None
        resolved = Path(path).resolve()
        if self.root != resolved and self.root not in resolved.parents:
            error = f"the snapshot {path} is outside this evaluator's root {self.root}"
        else:
            t0 = time.monotonic()
            try:
                model, tokenizer = load_snapshot(resolved, self.device)
                import torch

                with torch.no_grad():
                    value = self.function(model, tokenizer)
                value = value.item() if hasattr(value, "item") else value
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    error = f"the function returned {value!r}, not a finite number"
                else:
                    score = float(value)
            except Exception as exc:  # noqa: BLE001 - a failed eval is a missing eval, not a dead worker
                error = f"{type(exc).__name__}: {exc}"
            log.info("evalstop evaluate: %s step %d -> %s (%.1f s)", job, step, score if error is None else error,
                     time.monotonic() - t0)
        if error:
            log.warning("evalstop evaluate: %s step %d failed: %s", job, step, error)
        try:
            self.client.post_eval(job, step, score, worker, error)
        except Exception as exc:  # noqa: BLE001
            log.warning("evalstop evaluate: could not post %s step %d (%s); its lease will run out", job, step, exc)
        return score
