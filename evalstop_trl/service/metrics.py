"""Prometheus metrics of the service, and the estimate of job-seconds a stop reclaimed."""

from __future__ import annotations

from ..core.coordinator import Coordinator
from ..core.records import JobRecord

__all__ = ["Metrics", "reclaimed_seconds"]


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.reports = Counter("evalstop_reports", "Reports accepted", registry=self.registry)
        self.stops = Counter("evalstop_stops", "Stops by kind", ["kind"], registry=self.registry)
        self.acks = Counter("evalstop_acks", "Stop acknowledgements", registry=self.registry)
        self.signals = Counter("evalstop_launcher_signals", "Signals launchers reported sending", ["signal"],
                               registry=self.registry)
        self.latency = Histogram("evalstop_report_latency_seconds", "Report handling time (incl. fsync)",
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                                 registry=self.registry)
        self.reclaimed = Counter("evalstop_gpu_seconds_reclaimed",
                                 "Estimated job-seconds reclaimed by stops: remaining planned steps x observed "
                                 "seconds per step (per GPU)", registry=self.registry)


def reclaimed_seconds(coord: Coordinator, job: JobRecord) -> float:
    if not job.planned_steps:
        return 0.0
    first, last = coord.report_span(job.tenant, job.job_id)
    if first is None or last is None or last.step <= first.step:
        return 0.0
    per_step = (last.received_at - first.received_at) / (last.step - first.step)
    return max(0, job.planned_steps - last.step) * max(per_step, 0.0)
