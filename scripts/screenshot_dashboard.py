"""Screenshot the dashboard (job list, compare view, job page) with demo data, in headless Chromium.

Starts ``evalstop serve`` on a free loopback port with a fresh database, creates a tenant, registers
a few jobs and a GRPO learning-rate sweep (tags, hyperparameters; the faster runs reward-hack
sooner, so the ``decline`` detector stops them; one run in shadow mode) and reports their curves
through the HTTP API, signs in through the page and saves PNGs::

    python scripts/screenshot_dashboard.py    # docs/dashboard-jobs.png, docs/dashboard-compare.png, docs/dashboard-job.png
    python scripts/screenshot_dashboard.py --out-dir /tmp/shots --width 1280

Needs the Debian ``chromium`` package (``apt-get install -y chromium``) and ``pip install playwright``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalstop_trl.clients.local import LocalServer  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def chromium_path() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if not path:
        raise SystemExit("no chromium binary: apt-get install -y chromium")
    return path


def curve(kind: str, step: int, total: int, peak: float = 0.33) -> tuple[float, float, float]:
    """(world feedback, proxy reward, train loss) of a made-up but typical run at ``step``."""
    t = step / total
    loss = 0.35 + 1.6 * math.exp(-5.0 * t) + 0.02 * math.sin(step / 7)
    if kind == "hacked":  # proxy keeps rising, gold peaks at ``peak`` of the run and falls
        gold = 0.40 + 0.32 * math.sin(min(t / peak, 1.0) * math.pi / 2) - (1.2 * (t - peak) ** 1.3 if t > peak else 0)
        proxy = 0.2 + 2.4 * t + 0.05 * math.sin(step / 5)
    else:  # healthy: gold and proxy rise together and level off
        gold = 0.38 + 0.36 * (1 - math.exp(-4.0 * t))
        proxy = 0.1 + 1.4 * (1 - math.exp(-3.5 * t))
    return round(gold, 4), round(proxy, 4), round(loss, 4)


JOBS = [  # job_id, job_type, kind, planned steps, eval every, steps to report, finish?
    ("grpo-hacked-7b", "grpo", "hacked", 300, 10, 300, False),
    ("rloo-healthy-1b", "rloo", "healthy", 240, 10, 240, True),
    ("ppo-sweep-lr3e-5", "ppo", "healthy", 400, 20, 220, False),
    ("grpo-hacked-lr1e-4", "grpo", "hacked", 200, 10, 200, False),
    ("dpo-baseline", "dpo", "healthy", 150, 15, 60, False),
]


SWEEP = [  # job_id, learning rate, peak of the world feedback (share of the plan), mode
    ("grpo-sweep-lr1e-5", 1e-5, 2.0, "enforce"),
    ("grpo-sweep-lr3e-5", 3e-5, 0.7, "enforce"),
    ("grpo-sweep-lr1e-4", 1e-4, 0.45, "enforce"),
    ("grpo-sweep-lr3e-4", 3e-4, 0.3, "enforce"),
    ("grpo-sweep-lr3e-4-shadow", 3e-4, 0.32, "shadow"),
]


def load_sweep(http: httpx.Client, planned: int = 300, every: int = 10) -> None:
    """The sweep: tags and hyperparameters with each registration, curves until stopped or done."""
    for job_id, lr, peak, mode in SWEEP:
        http.post("/v1/jobs", json={
            "job_id": job_id, "job_type": "grpo", "planned_steps": planned,
            "policy": {"detector": "decline", "k": 2, "mode": mode},
            "tags": {"sweep": "grpo-lr", "team": "alignment"},
            "hparams": {"learning_rate": lr, "beta": 0.04, "per_device_train_batch_size": 8,
                        "num_generations": 8, "model_name": "Qwen/Qwen2.5-1.5B-Instruct"}}).raise_for_status()
        for step in range(every, planned + 1, every):
            gold, proxy, loss = curve("hacked", step, planned, peak)
            r = http.post(f"/v1/jobs/{job_id}/reports", json={"step": step, "eval_score": gold, "proxy_reward": proxy,
                                                            "train_loss": loss})
            r.raise_for_status()
            if r.json()["decision"]["action"] == "stop":
                break
        if http.get(f"/v1/jobs/{job_id}").json()["status"] == "running":
            http.post(f"/v1/jobs/{job_id}/finish").raise_for_status()


def load_demo(url: str, token: str) -> None:
    """Register the demo jobs and report their curves until each is stopped or done."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        load_sweep(http)
        http.post("/v1/jobs", json={"job_id": "sft-warmup", "job_type": "sft", "planned_steps": 500}).raise_for_status()
        http.post("/v1/jobs/sft-warmup/reports", json={"step": 10, "train_loss": 1.9}).raise_for_status()
        http.post("/v1/jobs/sft-warmup/fail", json={"reason": "CUDA out of memory at step 14"}).raise_for_status()
        for job_id, job_type, kind, planned, every, upto, finish in JOBS:
            http.post("/v1/jobs", json={"job_id": job_id, "job_type": job_type, "planned_steps": planned,
                                        "policy": {"detector": "decline", "k": 2}}).raise_for_status()
            for step in range(every, upto + 1, every):
                gold, proxy, loss = curve(kind, step, planned)
                r = http.post(f"/v1/jobs/{job_id}/reports", json={
                    "step": step, "eval_score": gold, "proxy_reward": proxy, "train_loss": loss,
                    "checkpoint": f"runs/{job_id}/checkpoint-{step}"})
                r.raise_for_status()
                if r.json()["decision"]["action"] == "stop":
                    http.post(f"/v1/jobs/{job_id}/ack", json={"checkpoint": f"runs/{job_id}/best"}).raise_for_status()
                    break
            if finish and http.get(f"/v1/jobs/{job_id}").json()["status"] == "running":
                http.post(f"/v1/jobs/{job_id}/finish").raise_for_status()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "docs"))
    ap.add_argument("--width", type=int, default=1280, help="the job page's width")
    ap.add_argument("--wide", type=int, default=1840, help="the list's and the compare view's width")
    ap.add_argument("--job", default="grpo-hacked-7b", help="the job whose page is shot")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with LocalServer(Path(tmp) / "coord.db", tenants=("acme",)) as server:
            url, token = server.url, server.tokens["acme"]
            load_demo(url, token)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": args.width, "height": 900}, device_scale_factor=1)
                page.goto(url + "/")
                page.fill("#token", token)
                page.click("#signin-form button[type=submit]")
                page.wait_for_selector("#view-jobs[data-ready] #jobs-body tr")
                page.locator("#jobs-body svg.spark path").nth(len(JOBS) + len(SWEEP) - 1).wait_for()
                page.locator('#tenant-summary [data-key="jobs"]').wait_for()
                page.locator("#jobs-body .reason .clip:text('CUDA')").wait_for()
                page.set_viewport_size({"width": args.wide, "height": 900})  # the list's every column
                for job_id, *_ in SWEEP:
                    page.get_by_label(f"Select {job_id} to compare").check()
                page.screenshot(path=str(out / "dashboard-jobs.png"), full_page=True)
                page.get_by_role("button", name=f"Compare {len(SWEEP)} selected").click()
                page.wait_for_selector("#view-compare[data-ready]")
                page.fill("#cmp-smooth", "0.3")
                page.wait_for_function("() => location.hash.includes('smooth=0.3')")
                page.screenshot(path=str(out / "dashboard-compare.png"), full_page=True)
                page.set_viewport_size({"width": args.width, "height": 900})
                page.goto(url + "/#/")
                page.wait_for_selector("#view-jobs[data-ready] #jobs-body tr")
                page.click(f"a.job-link:text-is('{args.job}')")
                page.wait_for_selector("#view-job[data-ready] [data-role=series-eval_score]")
                page.screenshot(path=str(out / "dashboard-job.png"), full_page=True)
                browser.close()
    print(f"wrote {out / 'dashboard-jobs.png'}, {out / 'dashboard-compare.png'} and {out / 'dashboard-job.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
