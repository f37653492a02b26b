"""`make demo`: the main job on the embedded default, end to end, in a few minutes on 2 CPU cores.

1. `evalstop replay` on a shipped trainer_state.json of a hacked run;
2. a live multi-tenant platform: `evalstop serve` on a free loopback port with a fresh SQLite file,
   two tenants, four tiny *real* GRPO jobs (hacked and healthy, both tenants) as separate processes;
   the coordinator stops the hacked ones and the healthy ones finish. A fifth job is a loop that
   ignores the stop flag, run under `evalstop run`: its launcher stops it (SIGTERM, then SIGKILL).
   A table compares each job with its recorded no-stop reference (configs/traces/), a PNG shows the
   curves, and the dashboard's URL and a token are printed (in a terminal the platform stays up
   until you press Enter; `--no-wait` or no terminal: it does not wait);
3. the simulator's headline: SRTF-Est alone vs with EvalStop, 200 jobs on 64 virtual GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-out"
PY = sys.executable
JOBS = [("acme", "hacked", 0), ("acme", "healthy", 0), ("globex", "hacked", 1), ("globex", "healthy", 1),
        ("acme", "external", 0)]  # "external": the hacked preset, world feedback scored by an `evalstop evaluate` worker
MAX_STEPS, EVAL_EVERY = 300, 15
WAIT = True  # in a terminal, keep the platform up until Enter (--no-wait: never)


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def evalstop(*args: str) -> str:
    return subprocess.run([PY, "-m", "evalstop_trl", *args], check=True, capture_output=True, text=True).stdout


def reference(preset: str, seed: int) -> list[dict]:
    path = ROOT / "configs" / "traces" / f"grpo-{preset}-s{seed}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dashboard_command() -> str:
    """The command that serves the demo's coordinator file again, for its dashboard."""
    return f"{Path(PY).relative_to(ROOT) if Path(PY).is_relative_to(ROOT) else PY} -m evalstop_trl serve --db " \
           f"{(OUT / 'coordinator.db').relative_to(ROOT)}   (then open http://127.0.0.1:8765/)"


def live_platform() -> None:
    from evalstop_trl.clients.local import LocalServer

    db = OUT / "coordinator.db"
    server = LocalServer(db, tenants=("acme", "globex"), log=OUT / "server.log")
    try:
        server.start()
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None
    url, tokens = server.url, server.tokens
    try:
        print(f"coordinator on {url} (SQLite {db.relative_to(ROOT)}), tenants acme and globex; "
              f"starting {len(JOBS)} tiny GRPO jobs as separate processes ...", flush=True)
        t0 = time.time()
        procs = []
        evaluator = subprocess.Popen(  # one external evaluator for acme's snapshots
            [PY, "-m", "evalstop_trl", "evaluate", "--url", url, "--token", tokens["acme"], "--fn",
             "evalstop_trl.train.tiny:gold_hacked", "--root", str(OUT)],
            stdout=open(OUT / "evaluator.log", "w"), stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for tenant, preset, seed in JOBS:
            job_id = f"{tenant}-{preset}"
            external = preset == "external"
            cmd = [PY, str(ROOT / "scripts" / "tiny_rlhf.py"), "--trainer", "grpo", "--preset",
                   "hacked" if external else preset, "--seed", str(seed), "--coordinator", url, "--token",
                   tokens[tenant], "--job-id", job_id, "--max-steps", str(MAX_STEPS), "--eval-every", str(EVAL_EVERY),
                   "--output-dir", str(OUT / job_id), *(["--external-eval"] if external else [])]
            log = open(OUT / f"{job_id}.log", "w")
            procs.append((tenant, preset, seed, job_id, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})))
        stubborn = subprocess.Popen(
            [PY, "-m", "evalstop_trl", "run", "--url", url, "--token", tokens["globex"], "--job-id", "globex-stubborn",
             "--job-type", "grpo", "--grace-s", "2", "--", PY, str(ROOT / "scripts" / "stubborn_loop.py")],
            stdout=open(OUT / "globex-stubborn.log", "w"), stderr=subprocess.STDOUT)
        results = []
        for tenant, _preset, seed, job_id, p in procs:
            out, _ = p.communicate(timeout=600)
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                raise SystemExit(f"job {job_id} failed; see {OUT / (job_id + '.log')}")
            results.append({**json.loads(line[7:]), "tenant": tenant, "seed": seed})
        evaluator.terminate()
        evaluator.wait(timeout=60)
        print(f"all jobs done in {time.time() - t0:.0f} s", flush=True)
        ext = next(r for r in results if r["job_id"] == "acme-external")
        print(f"acme-external: world feedback scored by a separate `evalstop evaluate` worker from snapshots; "
              f"stopped at step {ext['stopped_at']}, stop lag {ext['stop_lag']} steps (trained after the eval "
              f"that decided the stop, while the evaluator caught up)")
        code = stubborn.wait(timeout=300)
        print(f"\nglobex-stubborn (a loop that ignores the stop flag, under `evalstop run --grace-s 2`): "
              f"launcher exit status {code} (0: stopped by EvalStop, so a retrying scheduler leaves it); "
              f"its audit trail:")
        from evalstop_trl.clients.http import EvalStopClient

        with EvalStopClient(url, tokens["globex"]) as c:
            for a in c.audit("globex-stubborn"):
                print(f"  {a.kind.value:<18} by {a.actor:<18} {a.reason}")
        # what the coordinator says, per tenant (each token sees only its own jobs)
        for tenant in tokens:
            print(f"\n$ evalstop status --token <{tenant}>")
            print(evalstop("status", "--url", url, "--token", tokens[tenant]).rstrip())
        if WAIT and sys.stdin.isatty():
            print(f"\ndashboard: {url}/  (sign in with acme's token: {tokens['acme']})", flush=True)
            input("the platform stays up for you to look; press Enter to tear it down ... ")
        else:  # the server stops with this script: a URL would be dead by the time anyone opens it
            print(f"\ndashboard: the platform stops now (no terminal, or --no-wait); to browse these jobs, run\n"
                  f"  {dashboard_command()}\nand sign in with acme's token: {tokens['acme']}", flush=True)
    finally:
        server.stop()
    table(results)
    plot(results, OUT / "tiny_jobs.png")


def table(results: list[dict]) -> None:
    print(f"\n{'tenant':<8}{'job':<16}{'preset':<9}{'stopped at':>11}{'best step':>10}{'best gold':>10}"
          f"{'no-stop final gold':>19}{'compute saved':>14}")
    for r in results:
        ref = reference(r["preset"].replace("external", "hacked"), r["seed"])
        final = f"{ref[-1]['gold']:.3f}" if ref else "n/a"
        saved = 1 - r["steps_done"] / r["max_steps"]
        stopped = str(r["stopped_at"]) if r["stopped_at"] else "-"
        print(f"{r['tenant']:<8}{r['job_id']:<16}{r['preset']:<9}{stopped:>11}{str(r['best_step']):>10}"
              f"{r['best_score']:>10.3f}{final:>19}{saved:>13.0%}")
    print("best gold = world feedback of the kept checkpoint; no-stop final gold = where the same run (same seed) "
          "ends without EvalStop (configs/traces/); compute saved = share of planned steps not run")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), sharey=False)
    for ax, r in zip(axes, results, strict=True):
        ref = reference(r["preset"].replace("external", "hacked"), r["seed"])
        if ref:
            ax.plot([t["step"] for t in ref], [t["gold"] for t in ref], "--", c="grey", label="gold, no-stop reference")
        ax.plot([t["step"] for t in r["trace"]], [t["gold"] for t in r["trace"]], "o-", c="tab:green", label="gold (world feedback)")
        ax2 = ax.twinx()
        ax2.plot([t["step"] for t in r["trace"]], [t["proxy"] for t in r["trace"]], "s-", c="tab:orange", ms=3,
                 label="proxy reward")
        ax2.set_ylabel("proxy reward", color="tab:orange")
        if r["stopped_at"]:
            ax.axvline(r["stopped_at"], c="red", lw=1)
            ax.annotate("EvalStop", (r["stopped_at"], ax.get_ylim()[1]), color="red", fontsize=8, ha="right", va="top")
        ax.axvline(r["best_step"], c="tab:green", lw=0.8, ls=":")
        ax.set_title(f"{r['job_id']}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("gold")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}")


def main() -> int:
    global WAIT
    WAIT = "--no-wait" not in sys.argv[1:]
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    t0 = time.time()
    banner("1. evalstop replay on a recorded hacked run (configs/examples/hacked_trainer_state.json)")
    print(evalstop("replay", str(ROOT / "configs/examples/hacked_trainer_state.json")).rstrip())
    banner("2. a live multi-tenant platform: evalstop serve, 5 tiny real GRPO jobs from 2 tenants (one scored by an external evaluator) and a loop that ignores the stop flag under evalstop run")
    live_platform()
    banner("3. the platform simulator: SRTF-Est alone vs + EvalStop (default config, 5 seeds)")
    subprocess.run([PY, "-m", "platform_sim.cli", "run", "--seeds", "5", "--quiet"], check=True)
    print(f"\ndemo done in {time.time() - t0:.0f} s; outputs in {OUT.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
