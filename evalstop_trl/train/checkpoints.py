"""The best checkpoint: model (or PEFT adapter) and tokenizer saved atomically to one folder, with an
``evalstop.json`` beside them saying whose and how good it is; after a stop, what to keep on disk and
which weights to restore.

Bests never go backwards: ``<output_dir>/evalstop-best`` belongs to the job that first kept a model
there, and a resume of that job replaces it only with a better one. Another job writing to the same
folder (a rerun, ``NAME-2``) keeps its own best in ``<output_dir>/evalstop-best-NAME-2`` and says so at
WARNING, with both scores.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.detectors import is_better
from .scores import finite

__all__ = ["BEST_DIR", "FINAL_DIR", "best_folder", "keep_best_copy", "keep_best_snapshot", "keep_final_copy",
           "load_best_weights", "read_best", "remove_checkpoints_after", "save_atomically"]

log = logging.getLogger("evalstop.callback")

BEST_DIR = "evalstop-best"
#: where a job stopped before any scored eval keeps the model it had at the stop (see :func:`keep_final_copy`)
FINAL_DIR = "evalstop-final"
INFO = "evalstop.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def read_best(output_dir: str | os.PathLike, folder: str = BEST_DIR) -> dict[str, Any] | None:
    """The ``evalstop.json`` of ``<output_dir>/<folder>`` (job_id, step, score, direction, saved_at), if any."""
    try:
        info = json.loads((Path(output_dir) / folder / INFO).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def best_folder(output_dir: str | os.PathLike, job_id: str | None, base: str = BEST_DIR) -> Path:
    """Where ``job_id`` keeps its best model: ``<output_dir>/evalstop-best`` unless another job's best is
    there (then ``evalstop-best-<job_id>``); ``base``: another folder name kept the same way
    (:data:`FINAL_DIR`)."""
    main = Path(output_dir) / base
    if not main.exists() or (read_best(output_dir, base) or {}).get("job_id") == job_id:
        return main
    return main.with_name(f"{base}-{job_id or 'job'}")


def save_atomically(output_dir: str | os.PathLike, model: Any, tokenizer: Any,
                    info: dict[str, Any] | None = None, *, folder: str = BEST_DIR) -> str:
    """Save model (or adapter), tokenizer and ``info`` (as evalstop.json) to ``<output_dir>/<folder>``:
    write aside, then swap folders, so a crash never leaves a half-written best checkpoint. Returns the
    folder's path."""
    final = Path(output_dir) / folder
    tmp = final.with_name(f".{folder}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    unwrapped = getattr(model, "module", model)
    if hasattr(unwrapped, "save_pretrained"):
        unwrapped.save_pretrained(tmp, safe_serialization=True)
    else:  # a plain torch module (transformers' Trainer takes those too): its weights, as Trainer saves them
        from safetensors.torch import save_model

        tmp.mkdir(parents=True)
        save_model(unwrapped, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    if info is not None:
        (tmp / INFO).write_text(json.dumps(info))
    return _swap_into(tmp, final)


def _swap_into(src: Path, final: Path) -> str:
    """Move the folder ``src`` to ``final``, a folder already there set aside first and removed after,
    so ``final`` always holds a whole model. Returns ``final``'s path."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{time.monotonic_ns()}")
        os.replace(final, old)
    os.replace(src, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return str(final)


def keep_best_copy(output_dir: str | os.PathLike, model: Any, tokenizer: Any, *, job_id: str | None, step: int,
                   score: float, direction: str) -> str:
    """Keep a new best model of ``job_id`` in its :func:`best_folder` (see :func:`save_atomically`),
    unless the folder already holds this job's model with a score at least as good (a resumed run
    re-evaluating an older, better step never replaces it). Another job's best is never replaced: a
    rerun keeps its own folder, and the first time it does, a WARNING compares the two. Returns the
    folder's path."""
    folder = best_folder(output_dir, job_id)
    kept = read_best(output_dir, folder.name)
    if kept is not None and kept.get("job_id") == job_id and finite(kept.get("score")) \
            and not is_better(score, kept["score"], direction):
        log.info("EvalStop: %s already holds a model at least as good (step %s, score %.4g): not replaced",
                 folder.name, kept.get("step"), kept["score"])
        return str(folder)
    if folder.name != BEST_DIR and not folder.exists():
        _say_whose(output_dir, folder, job_id, step, score, direction)
    return save_atomically(output_dir, model, tokenizer, {"job_id": job_id, "step": step, "score": score,
                                                          "direction": direction, "saved_at": time.time()},
                           folder=folder.name)


def keep_final_copy(output_dir: str | os.PathLike, model: Any, tokenizer: Any, *, job_id: str | None, step: int,
                    reason: str) -> str:
    """A stop before any scored eval (a manual stop before the first eval): keep the model as it is at
    ``step`` in ``<output_dir>/evalstop-final`` (``evalstop-final-<job_id>`` when it holds another
    job's), saved atomically with an ``evalstop.json`` whose ``score`` is None and ``reason`` says why it
    was kept. It never goes to ``evalstop-best``: no eval scored it. Returns the folder's path."""
    folder = best_folder(output_dir, job_id, FINAL_DIR)
    return save_atomically(output_dir, model, tokenizer, {"job_id": job_id, "step": step, "score": None,
                                                          "reason": reason, "saved_at": time.time()},
                           folder=folder.name)


def keep_best_snapshot(output_dir: str | os.PathLike, snapshot: str | None, *, job_id: str | None,
                       step: int | None, score: float | None, direction: str) -> str | None:
    """External evals, at the stop: move the best snapshot (the trainer's ``checkpoint-<step>`` under
    ``output_dir``) to the job's :func:`best_folder` with ``evalstop.json``, as the in-loop modes keep
    theirs. A snapshot elsewhere, or gone, stays as it is. Returns the best's path now."""
    if snapshot is None or step is None:
        return snapshot
    src, out = Path(snapshot), Path(output_dir)
    if not src.is_dir() or src.resolve().parent != out.resolve() or not _CHECKPOINT.fullmatch(src.name):
        return snapshot
    folder = best_folder(out, job_id)
    if folder.name != BEST_DIR and not folder.exists() and finite(score):
        _say_whose(out, folder, job_id, step, score, direction)
    (src / INFO).write_text(json.dumps({"job_id": job_id, "step": step, "score": score, "direction": direction,
                                        "saved_at": time.time()}))
    return _swap_into(src, folder)  # over this job's own earlier best (a resumed run): the coordinator's best wins


def _say_whose(output_dir: str | os.PathLike, folder: Path, job_id: str | None, step: int, score: float,
               direction: str) -> None:
    other = read_best(output_dir) or {}
    theirs = other.get("score")
    if finite(theirs) and other.get("direction", direction) == direction:
        verdict = "better than" if is_better(score, theirs, direction) else "not better than"
        compared = f"this run's best so far (score {score:.4g} at step {step}) is {verdict} theirs"
    else:
        compared = f"this run's best so far: score {score:.4g} at step {step}"
    log.warning("EvalStop: %s holds job %r's best (step %s, score %s); job %r never replaces it and keeps its "
                "own best in %s (%s)", BEST_DIR, other.get("job_id"), other.get("step"),
                f"{theirs:.4g}" if finite(theirs) else theirs, job_id, folder, compared)


def remove_checkpoints_after(output_dir: str | os.PathLike, step: int | None) -> list[str]:
    """After a stop: delete the trainer's ``checkpoint-N`` folders newer than the best eval's ``step``
    (a model past the best is what EvalStop stopped). None (no best): nothing. Returns the names removed."""
    if step is None:
        return []
    removed = []
    root = Path(output_dir)
    for path in sorted(root.glob("checkpoint-*")) if root.is_dir() else []:
        match = _CHECKPOINT.fullmatch(path.name)
        if match and int(match.group(1)) > step and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    if removed:
        log.warning("EvalStop: removed %s, newer than the best (step %d); keep_checkpoints=True keeps them",
                    ", ".join(removed), step)
    return removed


def load_best_weights(model: Any, folder: str | os.PathLike) -> bool:
    """Load the weights kept in ``folder`` (a full model, sharded or not, or a PEFT adapter) into
    ``model`` in place, as transformers' ``load_best_model_at_end`` does. Returns whether it did
    (False, with a WARNING, when the folder holds no weights this model can take)."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    target = getattr(model, "module", model)
    adapter = folder / "adapter_model.safetensors"
    if adapter.exists() and hasattr(target, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(target, load_file(str(adapter)), adapter_name=getattr(target, "active_adapter",
                                                                                       "default"))
        return True
    single = folder / "model.safetensors"
    if single.exists():
        with torch.no_grad():
            result = target.load_state_dict(load_file(str(single)), strict=False)
    elif (folder / "model.safetensors.index.json").exists():
        from transformers.modeling_utils import load_sharded_checkpoint

        result = load_sharded_checkpoint(target, str(folder), strict=False)
    else:
        log.warning("EvalStop: load_best_at_end: no model weights in %s; the model keeps its last weights", folder)
        return False
    if result.unexpected_keys:
        log.warning("EvalStop: load_best_at_end: %d weights of %s are not in this model (e.g. %s)",
                    len(result.unexpected_keys), folder, result.unexpected_keys[0])
    return True
