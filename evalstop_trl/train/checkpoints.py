"""The best checkpoint: model (or PEFT adapter) and tokenizer saved atomically to one folder, with an
``evalstop.json`` beside them saying whose and how good it is."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.detectors import is_better
from .scores import finite

__all__ = ["BEST_DIR", "keep_best_copy", "read_best", "save_atomically"]

log = logging.getLogger("evalstop.callback")

BEST_DIR = "evalstop-best"
INFO = "evalstop.json"


def read_best(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The ``evalstop.json`` of ``<output_dir>/evalstop-best`` (job_id, step, score, saved_at), if any."""
    try:
        return json.loads((Path(output_dir) / BEST_DIR / INFO).read_text())
    except (OSError, ValueError):
        return None


def save_atomically(output_dir: str | os.PathLike, model: Any, tokenizer: Any,
                    info: dict[str, Any] | None = None) -> str:
    """Save model (or adapter), tokenizer and ``info`` (as evalstop.json) to ``<output_dir>/evalstop-best``:
    write aside, then swap folders, so a crash never leaves a half-written best checkpoint. Returns the
    folder's path."""
    final = Path(output_dir) / BEST_DIR
    tmp = final.with_name(f".{BEST_DIR}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    unwrapped = getattr(model, "module", model)
    unwrapped.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    if info is not None:
        (tmp / INFO).write_text(json.dumps(info))
    old = None
    if final.exists():
        old = final.with_name(f".{BEST_DIR}.old-{time.monotonic_ns()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return str(final)


def keep_best_copy(output_dir: str | os.PathLike, model: Any, tokenizer: Any, *, job_id: str | None, step: int,
                   score: float, direction: str) -> str:
    """Keep a new best model as ``<output_dir>/evalstop-best`` (see :func:`save_atomically`), unless the
    folder already holds this job's model with a score at least as good (a resumed run re-evaluating
    an older, better step never replaces it). Returns the folder's path."""
    kept = read_best(output_dir)
    if kept is not None and kept.get("job_id") == job_id and finite(kept.get("score")) \
            and not is_better(score, kept["score"], direction):
        log.info("EvalStop: %s already holds a model at least as good (step %s, score %.4g): not replaced",
                 BEST_DIR, kept.get("step"), kept["score"])
        return str(Path(output_dir) / BEST_DIR)
    return save_atomically(output_dir, model, tokenizer,
                           {"job_id": job_id, "step": step, "score": score, "saved_at": time.time()})
