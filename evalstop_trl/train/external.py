"""The training side of external evals (``external_eval=True``): snapshots and the stop watcher.

The run publishes its ``checkpoint-<step>`` folders as snapshots and keeps training; ``evalstop
evaluate`` workers score them and the coordinator decides. A :class:`DecisionWatcher` thread
long-polls the job, so the step loop learns of a stop at its next step without waiting on the
network; :func:`prune_snapshots` deletes the snapshots no longer worth keeping.
"""

from __future__ import annotations

import shutil
import threading
import weakref
from pathlib import Path
from typing import Any

from ..core.errors import EvalStopError

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
