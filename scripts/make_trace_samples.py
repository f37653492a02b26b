"""Write the small *generated* cluster-trace samples in ``configs/traces/cluster/``.

The real job tables (Philly via the Sia artifact, Helios, Acme, Alibaba's spot-GPU trace) do not
ship with this project: their licences (academic use only, or none stated) and sizes do not allow
it. These samples have the same column layouts, so the readers in
:mod:`platform_sim.cluster_traces` are tested on files shaped like the real ones; their values are
drawn from seeded distributions roughly like the published summaries (the Philly sample's GPU
shares are those of the Sia file: 93% of jobs on 1 GPU, 2% on 8). They are not measurements.

    python scripts/make_trace_samples.py            # rewrites the four samples (seeded: same bytes)
"""

from __future__ import annotations

import argparse
import csv
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "configs" / "traces" / "cluster"
N = 400


def _pick(rng: np.random.Generator, shares: dict, n: int) -> list:
    keys = list(shares)
    p = np.array([shares[k] for k in keys], dtype=float)
    return [keys[i] for i in rng.choice(len(keys), size=n, p=p / p.sum())]


def _arrivals(rng: np.random.Generator, n: int, per_hour: float) -> np.ndarray:
    return np.cumsum(rng.exponential(3600.0 / per_hour, size=n)).round()


def _durations(rng: np.random.Generator, n: int, median_h: float, sigma: float) -> np.ndarray:
    return np.maximum(1.0, np.round(median_h * 3600.0 * np.exp(sigma * rng.standard_normal(n))))


def philly(rng: np.random.Generator) -> tuple[list[str], list[list]]:
    start = datetime(2017, 10, 9, 6, 0, 0)
    gpus = _pick(rng, {1: 0.9317, 2: 0.0221, 4: 0.0227, 8: 0.02, 16: 0.0024, 32: 0.0011}, N)
    t, d = _arrivals(rng, N, 31.0), _durations(rng, N, 0.32, 1.8)
    clusters = _pick(rng, {"6214e9": 0.5, "11cb48": 0.2, "6c71a0": 0.12, "b436b2": 0.09, "103959": 0.09}, N)
    rows = [[(start + timedelta(seconds=float(t[i]))).strftime("%Y-%m-%d %H:%M:%S"), f"{d[i]:.1f}", gpus[i],
             f"{d[i] * gpus[i]:.1f}", clusters[i]] for i in range(N)]
    rng.shuffle(rows)  # the Sia file is not in submission order either
    return ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"], rows


def helios(rng: np.random.Generator) -> tuple[list[str], list[list]]:
    start = datetime(2020, 6, 9, 18, 0, 0)
    gpus = _pick(rng, {0: 0.08, 1: 0.55, 2: 0.08, 4: 0.1, 8: 0.14, 16: 0.04, 32: 0.01}, N)
    states = _pick(rng, {"COMPLETED": 0.6, "FAILED": 0.2, "CANCELLED": 0.2}, N)
    t, d, q = _arrivals(rng, N, 40.0), _durations(rng, N, 0.25, 2.0), np.round(rng.exponential(120.0, N))
    rows = []
    for i in range(N):
        submit = start + timedelta(seconds=float(t[i]))
        begin = submit + timedelta(seconds=float(q[i]))
        rows.append([1425511 + i, f"u{i % 37:04d}", f"vc{i % 11:03d}", gpus[i], max(1, 4 * gpus[i]),
                     max(1, gpus[i] // 8), states[i], f"{submit:%Y-%m-%d %H:%M:%S}", f"{begin:%Y-%m-%d %H:%M:%S}",
                     f"{begin + timedelta(seconds=float(d[i])):%Y-%m-%d %H:%M:%S}", int(d[i]), int(q[i])])
    return ["job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time", "start_time",
            "end_time", "duration", "queue"], rows


def acme(rng: np.random.Generator) -> tuple[list[str], list[list]]:
    tz = timezone(timedelta(hours=8))
    start = datetime(2023, 3, 1, 0, 0, 0, tzinfo=tz)
    types = _pick(rng, {"Evaluation": 0.35, "SFT": 0.15, "Pretrain": 0.08, "MLLM": 0.07, "Debug": 0.2,
                        "Other": 0.15}, N)
    per_type = {"Pretrain": {64: 0.3, 128: 0.4, 256: 0.3}, "SFT": {8: 0.4, 16: 0.3, 32: 0.3},
                "Evaluation": {1: 0.5, 2: 0.2, 4: 0.3}, "MLLM": {8: 0.5, 16: 0.3, 32: 0.2},
                "Debug": {0: 0.2, 1: 0.3, 8: 0.5}, "Other": {0: 0.3, 1: 0.3, 8: 0.4}}
    median = {"Pretrain": 6.0, "SFT": 1.5, "Evaluation": 0.1, "MLLM": 2.0, "Debug": 0.05, "Other": 0.2}
    t, z, q = _arrivals(rng, N, 60.0), rng.standard_normal(N), np.round(rng.exponential(60.0, N))
    states = _pick(rng, {"COMPLETED": 0.55, "FAILED": 0.25, "CANCELLED": 0.2}, N)
    rows = []
    for i in range(N):
        g = _pick(rng, per_type[types[i]], 1)[0]
        d = max(1.0, round(median[types[i]] * 3600.0 * float(np.exp(1.5 * z[i]))))
        submit = start + timedelta(seconds=float(t[i]))
        begin = submit + timedelta(seconds=float(q[i]))
        rows.append([5778432 + i, f"u{i % 53:04d}", max(1, g // 8), g, max(1, 16 * g), types[i], states[i],
                     submit.isoformat(), begin.isoformat(), (begin + timedelta(seconds=d)).isoformat(), int(d),
                     int(q[i]), float(d * g)])
    return ["job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state", "submit_time", "start_time",
            "end_time", "duration", "queue", "gpu_time"], rows


def alibaba_spot(rng: np.random.Generator) -> tuple[list[str], list[list]]:
    models = _pick(rng, {"A10": 0.3, "A100-SXM4-80GB": 0.35, "H800": 0.2, "GPU-series-1": 0.15}, N)
    kind = _pick(rng, {"HP": 0.4, "Spot": 0.6}, N)
    per_worker = _pick(rng, {1: 0.6, 2: 0.1, 4: 0.1, 8: 0.2}, N)
    workers = _pick(rng, {1: 0.7, 2: 0.1, 4: 0.1, 16: 0.1}, N)
    t, d = _arrivals(rng, N, 50.0), _durations(rng, N, 1.0, 1.6)
    rows = [[239255 + i, int(rng.integers(1, 80)), models[i], int(rng.integers(4, 32)), per_worker[i], workers[i],
             int(t[i] - t[0]), int(d[i]), kind[i]] for i in range(N)]
    return ["job_name", "organization", "gpu_model", "cpu_request", "gpu_request", "worker_num", "submit_time",
            "duration", "job_type"], rows


SAMPLES = {"philly_sample.csv": philly, "helios_sample.csv": helios, "acme_sample.csv": acme,
           "alibaba_spot_sample.csv": alibaba_spot}


def write_samples(out: Path = OUT, seed: int = 20261202) -> list[Path]:
    """Write every sample to ``out`` (seeded) and return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (name, make) in enumerate(SAMPLES.items()):
        header, rows = make(np.random.default_rng([seed, i]))
        path = out / name
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="directory to write the samples to")
    args = ap.parse_args(argv)
    for p in write_samples(args.out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
