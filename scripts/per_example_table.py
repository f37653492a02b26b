"""Every registered detector on the platform simulator, with and without per-example evidence.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/per_example_table.py --seeds 30 --seed-start 3000 --json out.json

Three settings of the same jobs (paired: the workloads share jobs, curves, labels and proxies;
``noise.per_example`` in ``docs/simulator.md``), each detector at its registry defaults:

* ``plain``: one noisy number per eval (the paper's model, sigma 0.04);
* ``gaussian n=250``: each eval the mean of 250 example scores (the same examples at every eval),
  the detector given the paired noise level;
* ``win rate n=250``: each eval a win rate over 250 prompts (binary scores, Gao-form gold through a
  logistic link), the detector given the paired noise level.

Seeds ``--seed-start`` onward (default 3000: never tuned on; tune below 1000). Per row: precision
and FPR by definition B (harmful stops) and recall, pooled over seeds with the simulator's own 95%
bootstrap intervals over seeds (``platform_sim.stats.Rates``), the share of label stops of healthy
runs, and the post-peak GPU-hours saved (W_post, with its interval over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from evalstop_trl.core.detectors import DETECTORS  # noqa: E402
from platform_sim.config import config_from_dict, load_config  # noqa: E402
from platform_sim.experiments import run_seeds  # noqa: E402

SETTINGS = {
    "plain": {},
    "gaussian n=250": {"noise.per_example.n": 250},
    "win rate n=250": {"noise.per_example.n": 250, "noise.per_example.scores": "binary"},
}


def _config(detector: str, overrides: dict):
    data = load_config().replace(**overrides).to_dict()
    data["overlay"]["evalstop"] = {"detector": detector, "job_types": "rlhf"}  # its registry defaults
    return config_from_dict(data)


def _pct(x: float, lo: float | None = None, hi: float | None = None) -> str:
    text = f"{100 * x:.1f}%"
    return text if lo is None else f"{text} [{100 * lo:.1f}, {100 * hi:.1f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--seed-start", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="write every row to this file")
    a = p.parse_args(argv)
    names = [n for n in DETECTORS.names() if n != "never"]
    rows = []
    jobs = [(name, setting, overrides) for setting, overrides in SETTINGS.items() for name in names]
    for name, setting, overrides in tqdm(jobs, desc="detector x setting"):
        res = run_seeds(_config(name, overrides), seeds=a.seeds, workers=a.workers, seed_start=a.seed_start).to_dict()
        d, w = res["detection"], res["changes"]["w_post_change"]
        rows.append({"detector": name, "setting": setting, "precision": d["precision"], "precision_ci": d["precision_ci"],
                     "recall": d["recall"], "recall_ci": d["recall_ci"], "fpr": d["fpr"], "fpr_ci": d["fpr_ci"],
                     "fpr_label": d["fpr_label"], "counts": d["counts"], "w_post_saved": -w["mean"],
                     "w_post_saved_ci": [-w["ci"][1], -w["ci"][0]]})
    print(f"seeds {a.seed_start}-{a.seed_start + a.seeds - 1}; precision, FPR: harmful stops (definition B)\n")
    print("| detector | evals | precision | recall | FPR | label stops of healthy | W_post saved |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['detector']} | {r['setting']} | {_pct(r['precision'], *r['precision_ci'])} | "
              f"{_pct(r['recall'], *r['recall_ci'])} | {_pct(r['fpr'], *r['fpr_ci'])} | {_pct(r['fpr_label'])} | "
              f"{_pct(r['w_post_saved'], *r['w_post_saved_ci'])} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"seeds": a.seeds, "seed_start": a.seed_start, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
