"""Hand-made workloads for simulator tests."""

from __future__ import annotations

from platform_sim.config import load_config
from platform_sim.curves import CurveKind
from platform_sim.workload import JobSpec, JobTruth, Workload


def small_config(**overrides):
    base = {"cluster.nodes": 1, "cluster.gpus_per_node": 8, "workload.checkpoint_s": 0.0,
            "workload.eval_overhead_frac": 0.0, "workload.restart_overhead_s": 0.0,
            "workload.evals_per_job": 4,
            "workload.types": {
                name: {"share": 0.5, "rlhf": rlhf, "gpus": {1: 1.0}, "median_h": 1.0, "sigma_ln": 0.0,
                       "clamp_h": [0.5, 2.0]}
                for name, rlhf in (("rlhf_grpo", True), ("lora_sft", False))
            }}
    base.update(overrides)
    return load_config().replace(**base)


def job(job_id, gpus, arrival_h, duration_h, est_h=None, scores=(0.1, 0.2, 0.3, 0.4), rlhf=True,
        kind=CurveKind.PLATEAU, hacked=False, peak=1.0):
    spec = JobSpec(job_id, "rlhf_grpo" if rlhf else "lora_sft", rlhf, gpus, arrival_h * 3600.0,
                   (est_h if est_h is not None else duration_h) * 3600.0)
    n = len(scores)
    truth = JobTruth(duration_h * 3600.0, kind, 1.0, peak if kind is not CurveKind.PLATEAU else 0.1, hacked,
                     peak, 0.5, tuple(scores), tuple(1.0 - 0.1 * i for i in range(n)), tuple(0.1 * i for i in range(n)))
    return spec, truth


def workload(*jobs, seed=0):
    specs, truths = zip(*jobs, strict=False)
    return Workload(tuple(specs), tuple(truths), len(truths[0].scores), seed)
