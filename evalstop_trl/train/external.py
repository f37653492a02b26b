"""The training side of external evals (``external_eval=True``): snapshots and the stop watcher.

The run publishes its ``checkpoint-<step>`` folders as snapshots and keeps training; ``evalstop
evaluate`` workers score them and the coordinator decides. A :class:`DecisionWatcher` thread
long-polls the job, so the step loop learns of a stop at its next step without waiting on the
network; :func:`prune_snapshots` deletes the snapshots no longer worth keeping.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import weakref
from pathlib import Path
from typing import Any

from ..core.errors import EvalStopError

log = logging.getLogger("evalstop.callback")

__all__ = ["DecisionWatcher", "prune_snapshots", "snapshot_path"]


def snapshot_path(output_dir: str | Path, step: int) -> Path:
    """Where the trainer saves the snapshot of ``step``: its own ``checkpoint-<step>``."""
    return Path(output_dir) / f"checkpoint-{step}"


def prune_snapshots(client: Any, job_id: str, output_dir: str | Path, steps: list[int], *, final: bool = False) -> None:
    """Delete the published snapshots of ``steps`` already scored, except the best; drop them from ``steps``.

    ``final`` (the job is stopped): every snapshot but the best goes, scored or not. A stopped job's
    decision and best no longer change, so a score that arrives later (an evaluator that was behind)
    would only leave its snapshot on disk; an evaluator still holding one reports it missing. A
    coordinator that cannot be read leaves everything in place.
    """
    if not steps:
        return
    try:
        view = client.status(job_id)
    except EvalStopError:
        return
    scored_to = view.last_step if view.last_step is not None else -1
    for step in list(steps):
        if (final or step <= scored_to) and step != view.best_step:
            shutil.rmtree(snapshot_path(output_dir, step), ignore_errors=True)
            steps.remove(step)


class DecisionWatcher:
    """A daemon thread long-polling ``client.wait_decision`` until the job is stopped.

    :attr:`stopped` is the stopped job's view once the coordinator stopped it (None until then).
    :meth:`close` ends the thread at its next poll; so does the watcher being garbage collected.
    """

    def __init__(self, client: Any, job_id: str, poll_s: float = 10.0) -> None:
        self.stopped: Any = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=_watch, args=(weakref.ref(self), self._done, client, job_id, poll_s),
                                        name="evalstop-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the thread ends after its current poll)."""
        self._done.set()


def _watch(ref: weakref.ref[DecisionWatcher], done: threading.Event, client: Any, job_id: str, poll_s: float) -> None:
    while not done.is_set():
        try:
            view = client.wait_decision(job_id, poll_s, stopped=True)
        except Exception:  # noqa: BLE001 - unreachable: keep training, try again
            done.wait(1.0)
            continue
        watcher = ref()
        if watcher is None:
            return
        if view.status == "stopped":
            watcher.stopped = view
            return
        del watcher


def keep_earlier_bests(client: Any, base: str, current: str, output_dir: str | os.PathLike) -> list[str]:
    """A rerun into the same folder saves its snapshots as ``checkpoint-<step>`` too, over (and then
    pruning) the one an earlier run (``base``, ``base-2``, ... before ``current``) kept as its best:
    move each such kept snapshot to ``evalstop-best-<job>`` first and point its job there (an ack,
    in its audit log). Returns the jobs moved; fail-open (a coordinator error only logs)."""
    out = Path(output_dir).resolve()
    moved = []
    for k in range(1, 1000):
        name = base if k == 1 else f"{base}-{k}"
        if name == current:
            break
        try:
            path = client.status(name).best_checkpoint
        except Exception:  # noqa: BLE001 - no such job, or the coordinator is away: nothing to keep
            continue
        kept = Path(path) if path else None
        if kept is None or not kept.name.startswith("checkpoint-") or not kept.is_dir() or kept.resolve().parent != out:
            continue
        target = out / f"evalstop-best-{name}"
        if target.exists():
            continue
        kept.rename(target)
        try:
            client.ack(name, str(target))
        except Exception as exc:  # noqa: BLE001 - fail-open: the move stands, the record says the old path
            log.warning("EvalStop: moved job %s's kept best to %s but could not record it: %s", name, target, exc)
        log.warning("EvalStop: this rerun (%s) saves into the same folder: job %s's kept best %s moved to %s",
                    current, name, kept.name, target)
        moved.append(name)
    return moved
