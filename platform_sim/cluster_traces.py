"""Readers for public GPU-cluster job traces: arrivals, GPU demand, durations (and a type where the
trace has one), in each trace's published column layout.

A trace gives the simulator *when* jobs arrive, *how many GPUs* each asks for and *how long* each
ran; curves, noise and hack labels stay the simulator's (:func:`platform_sim.workload.generate_workload`
with ``workload.source.kind: trace``). Each format is a :class:`TraceFormat` in :data:`TRACE_FORMATS`:

* ``philly_csv``: the Philly-derived job list of the Sia artifact (``siasosp23/artifacts``,
  ``sia-simulator/traces/philly.csv``; columns ``timestamp,duration,num_gpus,gpu_time,cluster``),
  from Microsoft's Philly trace (Jeon et al., ATC'19; ``msr-fiddle/philly-traces``);
* ``helios``: SenseTime's Helios ``cluster_log.csv`` (Hu et al., SC'21;
  ``S-Lab-System-Group/HeliosData``; ``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,
  start_time,end_time,duration,queue``; for academic use);
* ``acme``: Shanghai AI Lab's Acme ``trace_seren.csv`` / ``trace_kalos.csv`` (Hu et al., NSDI'24;
  ``InternLM/AcmeTrace``; ``job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,...,
  duration,queue,gpu_time``, with a job ``type``; for academic use);
* ``alibaba_spot``: Alibaba's spot-GPU job table ``job_info_df.csv`` (Duan et al., ASPLOS'26;
  ``alibaba/clusterdata``, ``cluster-trace-v2026-spot-gpu``; ``job_name,organization,gpu_model,
  cpu_request,gpu_request,worker_num,submit_time,duration,job_type``).

None of these files ships with this project (their licences or sizes do not allow it): users pass
the real file by path. ``configs/traces/cluster/`` holds small *generated* samples in each layout
(``scripts/make_trace_samples.py``), which the tests read.

Rows a reader cannot use are skipped and counted by reason (:attr:`ClusterTrace.skipped`): jobs
without GPUs (CPU jobs) and rows with a missing or malformed value. Everything else is kept as
recorded, failed and cancelled jobs included: they held their GPUs all the same.

Example::

    >>> from pathlib import Path
    >>> sample = Path(__file__).resolve().parent.parent / "configs/traces/cluster/philly_sample.csv"
    >>> t = read_cluster_trace("philly_csv", sample)
    >>> len(t), t.format, bool((t.gpus >= 1).all()), float(t.submit_s[0])
    (400, 'philly_csv', True, 0.0)
    >>> read_cluster_trace("slurm_sacct", sample)
    Traceback (most recent call last):
    ...
    ValueError: Unknown trace format 'slurm_sacct'; valid trace formats are: acme, alibaba_spot, helios, philly_csv.
"""

from __future__ import annotations

import csv
import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from evalstop_trl.core.registry import Registry

__all__ = ["TRACE_FORMATS", "ClusterTrace", "TraceFormat", "read_cluster_trace"]


class _Skip(Exception):
    """A row the reader cannot use; the message is the reason it is counted under."""


@dataclass(frozen=True, eq=False)
class ClusterTrace:
    """One trace's usable jobs, sorted by submission (ties keep the file's order).

    Attributes:
        submit_s: submission times in seconds after the trace's first usable submission.
        gpus: GPUs each job asked for (>= 1).
        duration_s: how long each ran, in seconds (end - start as recorded).
        types: the trace's own job type per job (``acme``'s ``type``, ``alibaba_spot``'s
            ``job_type``), or None where the format has none.
        skipped: rows not used, by reason.
    """

    format: str
    path: str
    submit_s: np.ndarray
    gpus: np.ndarray
    duration_s: np.ndarray
    types: tuple[str, ...] | None
    skipped: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __len__(self) -> int:
        return len(self.submit_s)


class TraceFormat:
    """A published job-table layout: the columns it must have and how one row becomes a job.

    Subclasses set :attr:`name`, :attr:`columns` (required header names), :attr:`source` (where the
    real file comes from, shown in errors) and implement :meth:`job`.
    """

    name: ClassVar[str] = ""
    columns: ClassVar[tuple[str, ...]] = ()
    source: ClassVar[str] = ""
    typed: ClassVar[bool] = False  # the layout records a job type

    def job(self, row: dict[str, str]) -> tuple[float, int, float, str | None]:
        """``(submission time in s, GPUs, duration in s, type or None)``; raises :class:`_Skip`."""
        raise NotImplementedError


TRACE_FORMATS: Registry[TraceFormat] = Registry("trace format")


def _seconds(text: str) -> float:
    """A timestamp (``2017-10-09 07:01:55``, ``2023-03-01 00:18:22+08:00``; naive = UTC) in epoch seconds."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _Skip("bad timestamp") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def _number(text: str, what: str) -> float:
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise _Skip(f"bad {what}") from None
    if not math.isfinite(x) or x < 0:
        raise _Skip(f"bad {what}")
    return x


def _gpus(x: float) -> int:
    if x <= 0:
        raise _Skip("no GPUs (a CPU job)")
    return math.ceil(x - 1e-9)  # a fractional share of a GPU still takes a GPU here


@TRACE_FORMATS.register()
class PhillyCSV(TraceFormat):
    """The Philly-derived job list of the Sia artifact (one row per job; ``timestamp`` is the submission)."""

    name = "philly_csv"
    columns = ("timestamp", "duration", "num_gpus")
    source = "siasosp23/artifacts: sia-simulator/traces/philly.csv (from msr-fiddle/philly-traces)"

    def job(self, row):
        return (_seconds(row["timestamp"]), _gpus(_number(row["num_gpus"], "num_gpus")),
                _number(row["duration"], "duration"), None)


@TRACE_FORMATS.register()
class Helios(TraceFormat):
    """SenseTime Helios ``cluster_log.csv`` (one Slurm job per row)."""

    name = "helios"
    columns = ("job_id", "gpu_num", "state", "submit_time", "duration")
    source = "S-Lab-System-Group/HeliosData: data/<cluster>/cluster_log.csv"

    def job(self, row):
        return (_seconds(row["submit_time"]), _gpus(_number(row["gpu_num"], "gpu_num")),
                _number(row["duration"], "duration"), None)


@TRACE_FORMATS.register()
class Acme(TraceFormat):
    """Shanghai AI Lab Acme ``trace_seren.csv`` / ``trace_kalos.csv``, with the job's ``type``
    (Pretrain, SFT, Evaluation, MLLM, Debug, Other)."""

    name = "acme"
    columns = ("job_id", "gpu_num", "type", "state", "submit_time", "duration")
    source = "InternLM/AcmeTrace: data/job_trace/trace_seren.csv or trace_kalos.csv"
    typed = True

    def job(self, row):
        return (_seconds(row["submit_time"]), _gpus(_number(row["gpu_num"], "gpu_num")),
                _number(row["duration"], "duration"), row["type"].strip() or None)


@TRACE_FORMATS.register()
class AlibabaSpot(TraceFormat):
    """Alibaba's 2026 spot-GPU job table: ``gpu_request`` GPUs per worker times ``worker_num``
    workers, ``submit_time`` in seconds after the first job, ``job_type`` HP or Spot."""

    name = "alibaba_spot"
    columns = ("job_name", "gpu_request", "worker_num", "submit_time", "duration", "job_type")
    source = "alibaba/clusterdata: cluster-trace-v2026-spot-gpu/job_info_df.csv"
    typed = True

    def job(self, row):
        gpus = _number(row["gpu_request"], "gpu_request") * _number(row["worker_num"], "worker_num")
        return (_number(row["submit_time"], "submit_time"), _gpus(gpus), _number(row["duration"], "duration"),
                row["job_type"].strip() or None)


def read_cluster_trace(format: str, path: str | Path) -> ClusterTrace:
    """Read a cluster trace of a registered ``format`` from ``path`` (cached per file version).

    Raises:
        ValueError: an unknown format (the message lists them), a missing file, a header without
            the format's columns (named), or a file with no usable job.
    """
    reader = TRACE_FORMATS.create(format)
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError:
        raise ValueError(f"trace file {path} does not exist (format {format}: {reader.source})") from None
    return _read(format, str(p), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read(format: str, path: str, mtime_ns: int, size: int) -> ClusterTrace:  # noqa: ARG001 - the cache key
    reader = TRACE_FORMATS.create(format)
    submit, gpus, dur, types = [], [], [], []
    skipped: Counter[str] = Counter()
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = csv.DictReader(fh)
        missing = [c for c in reader.columns if c not in (rows.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path} is not a {format} trace: it lacks the column(s) {', '.join(missing)} "
                f"(a {format} file has {', '.join(reader.columns)}; from {reader.source}). "
                f"Its header: {', '.join(rows.fieldnames or ()) or '(empty)'}.")
        for row in rows:
            try:
                s, g, d, t = reader.job(row)
            except _Skip as why:
                skipped[str(why)] += 1
                continue
            except (KeyError, AttributeError):  # a short row: csv fills missing cells with None
                skipped["short row"] += 1
                continue
            submit.append(s)
            gpus.append(g)
            dur.append(d)
            types.append(t)
    if not submit:
        raise ValueError(f"{path}: no usable job in this {format} trace (skipped: {dict(skipped) or 'none'})")
    order = np.argsort(np.asarray(submit), kind="stable")
    s = np.asarray(submit)[order]
    return ClusterTrace(
        format=format, path=path, submit_s=s - s[0], gpus=np.asarray(gpus, dtype=np.int64)[order],
        duration_s=np.asarray(dur)[order],
        types=tuple(types[i] for i in order.tolist()) if reader.typed else None,
        skipped=MappingProxyType(dict(skipped)),
    )
