"""The terminal table of `platform-sim run` (and `make demo`): every row has its base and overlay cells
(issue 20: the completed-jobs row printed empty cells)."""

from __future__ import annotations

import re

from platform_sim.config import load_config
from platform_sim.experiments import run_seeds
from platform_sim.report import run_table


def test_every_row_of_the_run_table_has_its_base_and_overlay_values():
    res = run_seeds(load_config().replace(**{"workload.n_jobs": 40}), 2, workers=1)
    rows = {line[:34].strip(): line[34:] for line in run_table(res).splitlines()[2:10]}
    completed = rows["mean JCT, completed jobs (h)"]
    base, overlay = (float(x) for x in re.findall(r"\d+\.\d\d", completed)[:2])
    assert (base, overlay) == (round(res.mean_jct_completed_base_h, 2), round(res.mean_jct_completed_h, 2))
    assert abs((overlay - base) / base - res.changes.jct_change.mean) < 0.05  # the change is about theirs
    assert all(len(re.findall(r"\d+\.\d\d", cells)) >= 2 for cells in rows.values()), rows
