"""The best checkpoint: model (or PEFT adapter) and tokenizer saved atomically to one folder."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["BEST_DIR", "save_atomically"]

BEST_DIR = "evalstop-best"


def save_atomically(output_dir: str | os.PathLike, model: Any, tokenizer: Any) -> str:
    """Save model (or adapter) and tokenizer to ``<output_dir>/evalstop-best``: write aside, then swap
    folders, so a crash never leaves a half-written best checkpoint. Returns the folder's path."""
    final = Path(output_dir) / BEST_DIR
    tmp = final.with_name(f".{BEST_DIR}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    unwrapped = getattr(model, "module", model)
    unwrapped.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".{BEST_DIR}.old-{time.monotonic_ns()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return str(final)
