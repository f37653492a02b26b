"""The second real task (scripts/judge_traces.py, evalstop_trl/train/judge.py): the committed traces
in configs/traces/judge/ cover the design, world feedback and gold are different evals on disjoint
prompts, labels use a margin relative to each run's gold range, and the table of docs/results.md is what the
traces give today (recomputed here, so a stale table fails). One real 4-step run keeps the
generator honest."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_trl.core.detectors import DETECTORS
from tests.proc_helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


jt = load_script("judge_traces")
PATHS = jt.trace_paths(jt.TRACES)
MANIFEST = json.loads((jt.TRACES / jt.MANIFEST).read_text())


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, feedback, gold, step=10):
    rows = [{"step": step * (i + 1), "world_feedback": f, "gold": g, "proxy_reward": 0.1 * i, "train_loss": 0.0}
            for i, (f, g) in enumerate(zip(feedback, gold, strict=True))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- the committed data
def test_the_committed_traces_cover_the_design():
    assert len(PATHS) >= 48
    seeds = [int(p.stem.rsplit("-s", 1)[1]) for p in PATHS]
    assert len(set(seeds)) == len(PATHS) >= 24  # one run per independent seed
    assert {p.stem.split("-")[0] for p in PATHS} == {"grpo", "rloo"}
    runs = MANIFEST["runs"]
    assert {p.stem for p in PATHS} <= set(runs)
    assert len({(runs[p.stem]["w_vowel"], runs[p.stem]["lr"]) for p in PATHS}) == len(PATHS)  # no shared config
    steps = list(range(MANIFEST["eval_every"], MANIFEST["max_steps"] + 1, MANIFEST["eval_every"]))
    for p in PATHS:
        rows = rows_of(p)
        assert [r["step"] for r in rows] == steps, p.name
        for r in rows:
            assert set(r) == set(jt.rt.FIELDS), p.name
            assert 0 <= r["world_feedback"] <= 1 and 0 <= r["gold"] <= 1, p.name
            assert all(math.isfinite(r[k]) for k in ("proxy_reward", "train_loss")), p.name


def test_the_model_differs_from_the_first_set():
    assert (MANIFEST["model"]["hidden"], MANIFEST["model"]["layers"]) != (64, 2)  # tiny.run_tiny's CPU model


def test_world_feedback_and_gold_come_from_disjoint_prompts_recorded_in_the_manifest():
    from evalstop_trl.train import judge as J

    pools = MANIFEST["prompt_pools"]
    assert set(pools) == {"judge", "train", "feedback", "gold"}
    names = sorted(pools)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not set(pools[a]) & set(pools[b]), (a, b)
    assert len(pools["gold"]) >= 256 and len(pools["feedback"]) * 8 <= len(pools["gold"])
    # the manifest records what the code uses
    assert {k: list(v) for k, v in J.prompt_sets().__dict__.items()} == pools


def test_world_feedback_is_not_a_transform_of_gold():
    f = [r["world_feedback"] for p in PATHS for r in rows_of(p)]
    g = [r["gold"] for p in PATHS for r in rows_of(p)]

    def corr(x, y):
        mx, my = sum(x) / len(x), sum(y) / len(y)
        sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
        return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))

    def ranks(x):
        order = sorted(range(len(x)), key=x.__getitem__)
        out = [0] * len(x)
        for rank, i in enumerate(order):
            out[i] = rank
        return out

    assert corr(f, g) < 0.99  # not affine
    assert corr(ranks(f), ranks(g)) < 0.99  # not monotone
    assert corr(f, g) > 0  # but the judge does track the goal


def test_labels_use_a_margin_relative_to_each_runs_range():
    # the same shapes at any scale: a fall of 25% of the range is hacked, of 15% is not
    for a, b in [(1, 0), (0.01, 0), (100, -3)]:
        assert jt.label([b + a * x for x in (0.0, 1.0, 0.75)])
        assert not jt.label([b + a * x for x in (0.0, 1.0, 0.85)])
    for p in PATHS:
        gold = [r["gold"] for r in rows_of(p)]
        want = jt.label(gold)
        for a, b in [(0.1, 0.0), (10.0, -5.0), (1.0, 3.0)]:
            assert jt.label([a * x + b for x in gold]) == want, p.name
    res = jt.evaluate(PATHS, planned_steps=MANIFEST["max_steps"], detectors=["never"])
    assert 0 < sum(r["hacked"] for r in res["runs"]) < len(PATHS)  # both kinds occur


@pytest.mark.parametrize("bad, match", [(([],), "non-empty"), (([1.0], 1.0), r"rel_margin must be in \[0, 1\)")])
def test_label_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        jt.label(*bad)


# ----------------------------------------------------------------------------- the evaluation
def test_every_registered_detector_is_evaluated_against_gold_with_feedback_as_input(tmp_path):
    peak = [0.1, 0.3, 0.5, 0.6, 0.55, 0.4, 0.3, 0.2, 0.1, 0.05]
    rise = [0.1 * i for i in range(1, 11)]
    paths = [write(tmp_path / "grpo-judge-s00.jsonl", peak, peak),  # hacked, seen
             write(tmp_path / "rloo-judge-s01.jsonl", rise, peak),  # hacked, hidden from the feedback
             write(tmp_path / "grpo-judge-s02.jsonl", rise, rise),  # healthy
             write(tmp_path / "rloo-judge-s03.jsonl", peak, rise)]  # healthy: a stop here harms it
    res = jt.evaluate(paths, planned_steps=100)
    assert [t["detector"] for t in res["table"]] == list(DETECTORS.names())
    row = next(t for t in res["table"] if t["detector"] == "decline")
    if row["params"] == {"k": 2, "min_delta": 0.0, "noise_z": 1.0, "direction": "max"}:  # the paper's rule at its defaults
        assert row["stops"] == {"grpo-judge-s00": 60, "rloo-judge-s01": None, "grpo-judge-s02": None,
                                "rloo-judge-s03": 60}
        assert (row["tp"], row["fp_a"], row["fp_b"], row["lags"]) == (1, 1, 1, [2])  # peak at eval 4, stop at 6
        assert row["recall"]["rate"] == 0.5 and row["precision"]["rate"] == 0.5 and row["fpr"]["rate"] == 0.5
    for t in res["table"]:
        assert t["fp_b"] <= t["fp_a"] <= t["healthy"] == 2 and t["tp"] <= t["hacked"] == 2
        assert len(t["lags"]) == t["tp"]


@pytest.mark.parametrize("n, lo_rank, hi_rank", [(20, 6, 15), (50, 18, 33), (5, 1, 5), (1, 1, 1)])
def test_median_interval_uses_the_binomial_order_statistics(n, lo_rank, hi_rank):
    med, lo, hi = jt.median_interval([float(i) for i in range(1, n + 1)])
    assert (lo, hi) == (lo_rank, hi_rank) and med == (n + 1) / 2
    assert jt.median_interval([]) is None


def results_section(title: str = "## A second real task: a learned judge vs an exact rule") -> str:
    """The section of docs/results.md that starts with ``title``, up to the next ``## ``."""
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index(title)
    end = text.index("\n## ", start + 1)
    return text[start:end]


def stated_rows(section: str) -> dict[str, tuple[str, ...]]:
    """The table of a docs section: detector -> its cells (bold marks dropped)."""
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| detector")]
    return {cells[0].strip("* "): tuple(c.replace("**", "").strip() for c in cells[1:])
            for cells in ([c.strip() for c in line.strip().strip("|").split("|")] for line in table)}


def test_the_readme_states_what_the_committed_traces_give():
    res = jt.evaluate(PATHS, planned_steps=MANIFEST["max_steps"])
    section = results_section()
    assert stated_rows(section) == {r[0]: r[1:] for r in jt.rows(res)}
    hacked = sum(r["hacked"] for r in res["runs"])
    assert re.search(rf"\b{len(PATHS)} runs\b", section) and re.search(rf"\b{hacked} are hacked\b", section)
    assert MANIFEST["command"] in section and MANIFEST["command"] in jt.__doc__


# ----------------------------------------------------------------------------- per-example world feedback
PE_PATHS = jt.trace_paths(jt.TRACES_PER_EXAMPLE)
PE_MANIFEST = json.loads((jt.TRACES_PER_EXAMPLE / jt.MANIFEST).read_text())


def test_the_per_example_traces_record_n_and_the_paired_noise():
    """The same task and seeds with the judge's 64 per-example scores (16 prompts x 4 samples): each
    eval line has n = 64 and, after the first, the paired noise level (issue 28 item 3)."""
    assert len(PE_PATHS) == len(PATHS) and PE_MANIFEST["per_example"] is True
    assert PE_MANIFEST["command"] == jt.COMMAND_PER_EXAMPLE and PE_MANIFEST["runs"] == MANIFEST["runs"]
    for p in PE_PATHS:
        rows = rows_of(p)
        assert all(set(r) == set(jt.rt.FIELDS + jt.rt.EVIDENCE_FIELDS) for r in rows), p.name
        assert [r["eval_n"] for r in rows] == [64] * len(rows), p.name
        assert rows[0]["eval_noise"] is None and all(r["eval_noise"] > 0 for r in rows[1:]), p.name


def test_the_docs_state_what_the_per_example_traces_give():
    res = jt.evaluate(PE_PATHS, planned_steps=PE_MANIFEST["max_steps"])
    assert [t["detector"] for t in res["table"]] == [f"{n}{e}" for n in DETECTORS.names() for e in ("", " + paired noise")]
    section = results_section("## The same task with per-example world feedback")
    assert stated_rows(section) == {r[0]: r[1:] for r in jt.rows(res)}
    assert PE_MANIFEST["command"] in section


def test_a_plain_float_trace_decides_as_before_and_the_noise_only_gates(tmp_path):
    """With the paired noise ``decline`` counts only falls beyond it: a wobble within the noise is no
    stop. Without the evidence the default measures the falls against the run's own eval-to-eval
    noise (no stop either); the paper's exact rule stops at the wobble."""
    wobble = [0.50, 0.52, 0.515, 0.51, 0.53, 0.525, 0.52, 0.55, 0.56, 0.57]
    path = write(tmp_path / "grpo-judge-s00.jsonl", wobble, [0.1 * i for i in range(1, 11)])
    rows = rows_of(path)
    path.write_text("".join(json.dumps({**r, "eval_n": 64, "eval_noise": None if i == 0 else 0.01}) + "\n"
                            for i, r in enumerate(rows)))
    res = jt.evaluate([path], planned_steps=100, detectors=["decline"])
    plain, paired = res["table"]
    assert (plain["detector"], paired["detector"]) == ("decline", "decline + paired noise")
    assert plain["stops"]["grpo-judge-s00"] is None and paired["stops"]["grpo-judge-s00"] is None
    from evalstop_trl.analysis.replay import Curve, replay_curve

    paper = replay_curve(Curve("world_feedback", tuple(r["step"] for r in rows), tuple(wobble), (None,) * 10), "decline",
                         noise="none")
    assert paper.stop_step == 40  # the paper's rule: two falls of 0.005


# ----------------------------------------------------------------------------- the generator
@pytest.mark.slow
@pytest.mark.parametrize("per_example", [False, True])
def test_the_generator_trains_a_real_run(tmp_path, per_example):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "judge_traces.py"), "--run", "--runs", "1",
                          "--max-steps", "4", "--eval-every", "2", "--traces", str(tmp_path),
                          *(["--per-example"] if per_example else [])],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = rows_of(tmp_path / "grpo-judge-s00.jsonl")
    fields = jt.rt.FIELDS + (jt.rt.EVIDENCE_FIELDS if per_example else ())
    assert [r["step"] for r in rows] == [2, 4] and all(set(r) == set(fields) for r in rows)
    if per_example:
        assert [r["eval_n"] for r in rows] == [64, 64] and rows[0]["eval_noise"] is None and rows[1]["eval_noise"] > 0
        assert "| decline + paired noise |" in out.stdout
    assert all(0 <= r["world_feedback"] <= 1 and 0 <= r["gold"] <= 1 for r in rows)
    made = json.loads((tmp_path / jt.MANIFEST).read_text())
    assert made["prompt_pools"] == MANIFEST["prompt_pools"]
    # the judge's settings exactly, its fit (torch kernels: last digits differ across CPUs) within a tolerance
    assert set(made["judge"]) == set(MANIFEST["judge"]) == {"train_strings", "label_noise", *jt.JUDGE_FIT}
    assert jt.same_manifest(made["judge"], MANIFEST["judge"]), (made["judge"], MANIFEST["judge"])
    assert not jt.same_manifest({**made["judge"], "correlation": made["judge"]["correlation"] * 0.9}, MANIFEST["judge"])
    assert "| decline |" in out.stdout


def test_the_scripts_doctests():
    import doctest

    res = doctest.testmod(jt)
    assert res.attempted > 0 and res.failed == 0
