"""The best checkpoint: model (or PEFT adapter) and tokenizer saved atomically to one folder, with an
``evalstop.json`` beside them saying whose and how good it is."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["BEST_DIR", "read_best", "save_atomically"]

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
