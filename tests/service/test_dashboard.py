"""The dashboard in a real browser: headless Chromium (the Debian package) driven by Playwright,
against a real `evalstop serve` on loopback with two tenants.

These tests never skip: `make test` installs chromium when it is missing, and `playwright` is in the
`dev` extra. Playwright's own browser download is not used.
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from evalstop_trl.service.dashboard import STATIC_DIR
from tests.analysis.test_plots import STOP_CASES
from tests.conftest import Server

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# the default decline k=2 stops at the 6th eval (step 60): 0.71 -> 0.69 -> 0.52, beyond the run's noise; best step 40
HACKED = [0.40, 0.55, 0.66, 0.71, 0.69, 0.52, 0.45]
WAIT_MS = 10_000  # live updates poll every 2 s


def chromium_path() -> str:
    path = shutil.which("chromium") or next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser")
                                             if Path(p).exists()), None)
    if path is None:  # never a skip: these tests must run in CI
        pytest.fail("no chromium binary: run `make test` (it installs it) or `apt-get install -y chromium`")
    return path


class Api:
    """A tenant's side of the HTTP API, for setting the scene."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def job(self, job_id: str, planned: int | None = None, **policy) -> None:
        body = {"job_id": job_id, "job_type": "grpo", "planned_steps": planned,
                "policy": {"detector": "decline", "k": 2, **policy}}
        self.http.post("/v1/jobs", json=body).raise_for_status()

    def report(self, job_id: str, step: int, score: float | None) -> str:
        r = self.http.post(f"/v1/jobs/{job_id}/reports", json={
            "step": step, "eval_score": score, "proxy_reward": 0.1 * step / 10, "train_loss": 2.0 / (1 + step / 10),
            "checkpoint": f"runs/{job_id}/checkpoint-{step}"})
        r.raise_for_status()
        return r.json()["decision"]["action"]

    def curve(self, job_id: str, scores: list[float], every: int = 10) -> None:
        for i, s in enumerate(scores):
            if self.report(job_id, every * (i + 1), s) == "stop":
                return

    def stop(self, job_id: str, reason: str) -> None:
        self.http.post(f"/v1/jobs/{job_id}/stop", json={"reason": reason}).raise_for_status()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("dashboard") / "coord.db")
    tokens = {name: srv.add_tenant(name) for name in ("alice", "bob", "carol")}
    srv.start()
    alice, bob, carol = (Api(srv.url, tokens[n]) for n in ("alice", "bob", "carol"))
    alice.job("a-hacked", planned=200)
    alice.curve("a-hacked", HACKED)
    alice.http.post("/v1/jobs/a-hacked/ack", json={"checkpoint": "runs/a-hacked/best"}).raise_for_status()
    alice.job("a-finished", planned=50)
    alice.curve("a-finished", [0.3, 0.4, 0.5, 0.55, 0.6])
    alice.http.post("/v1/jobs/a-finished/finish").raise_for_status()
    for job_id in ("a-running", "a-live", "a-xss"):
        alice.job(job_id, planned=300)
        alice.curve(job_id, [0.2, 0.3, 0.35])
    bob.job("b-secret-7f3a", planned=100)
    bob.curve("b-secret-7f3a", [0.5, 0.6])
    for i in range(120):
        carol.job(f"c-{i:03d}")
    carol.report("c-000", 10, 0.5)
    yield SimpleNamespace(url=srv.url, tokens=tokens, alice=alice, bob=bob, carol=carol)
    for api in (alice, bob, carol):
        api.http.close()
    srv.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    problems: list[str] = []
    # a refused request (401 on a bad token, 404 on another tenant's job) is logged by Chromium as
    # "Failed to load resource"; anything else (a script error, a CSP violation) is a failure
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text
            else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    yield page
    context.close()
    assert not problems, problems


def sign_in(page, site, tenant: str = "alice") -> None:
    page.goto(site.url + "/")
    page.get_by_label("Tenant token").fill(site.tokens[tenant])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#view-jobs[data-ready] #jobs-body tr")


def row(page, job_id: str):
    return page.locator(f'#jobs-body tr[data-job-id="{job_id}"]')


# ------------------------------------------------------------------ static routes, no browser
def test_static_routes_need_no_auth_and_send_a_strict_csp(site):
    with httpx.Client(base_url=site.url, timeout=10) as http:
        index = http.get("/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        csp = index.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert index.headers["x-content-type-options"] == "nosniff"
        for name in ("app.js", "api.js", "chart.js", "util.js", "style.css", "favicon.svg"):
            r = http.get(f"/dashboard/{name}")
            assert r.status_code == 200 and r.headers["content-security-policy"] == csp, name
        assert http.get("/dashboard/app.js").headers["content-type"].startswith("text/javascript")
        assert http.get("/dashboard/nope.js").status_code == 404
        assert http.get("/dashboard/../pyproject.toml").status_code == 404
        assert http.get("/v1/jobs").status_code == 401  # the data stays behind the token
        assert "/dashboard" not in http.get("/openapi.json").text


def test_the_page_has_no_inline_script_and_the_code_never_writes_html():
    html = (STATIC_DIR / "index.html").read_text()
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", html)), "inline script"
    assert not re.search(r"\son[a-z]+=", html) and " style=" not in html
    assert not re.search(r"https?://", html.replace("http://www.w3.org", "")), "no CDN, no external URL"
    for js in STATIC_DIR.glob("*.js"):
        code = js.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in code, f"{js.name} uses {sink}"
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", code), f"{js.name} reaches outside"


# ------------------------------------------------------------------ in the browser
def _options(html: str, element: str, element_id: str) -> list[str]:
    block = re.search(rf'<{element} id="{element_id}">(.*?)</{element}>', html, re.S)
    assert block, f"no <{element} id={element_id!r}> in index.html"
    return [v for v in re.findall(r'<option value="([^"]*)"', block.group(1)) if v]


def test_the_pages_lists_are_the_registrys_and_the_enums():
    """The filter lists of the run list are copies of the registry and the records' enums (the page is
    static): each copy is tied to its source, in its order (the detector list once offered 5 of 9
    rules and not ``sequential``)."""
    from evalstop_trl.core.detectors import DETECTORS
    from evalstop_trl.core.records import JobStatus, JobType

    html = (Path(STATIC_DIR) / "index.html").read_text()
    assert _options(html, "datalist", "detectors") == list(DETECTORS.names())
    assert _options(html, "select", "f-job_type") == [t.value for t in JobType]
    assert _options(html, "select", "f-status") == [s.value for s in JobStatus]


def test_sign_in_rejects_a_bad_token(page, site):
    page.goto(site.url + "/")
    page.get_by_label("Tenant token").fill("es_not-a-token")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("That token was not accepted").wait_for()
    assert page.evaluate("() => sessionStorage.getItem('evalstop.token')") is None
    assert page.locator("#view-jobs").is_hidden()


def test_a_tenant_sees_only_its_own_jobs_and_filters_them(page, site):
    sign_in(page, site, "alice")
    ids = page.locator("#jobs-body tr").evaluate_all("rows => rows.map(r => r.dataset.jobId)")
    assert sorted(ids) == ["a-finished", "a-hacked", "a-live", "a-running", "a-xss"]
    assert "b-secret" not in page.content()
    assert site.tokens["alice"] not in page.url and "token" not in page.url
    assert page.evaluate("() => sessionStorage.getItem('evalstop.token')") == site.tokens["alice"]
    hacked = row(page, "a-hacked")
    assert hacked.locator(".status").inner_text() == "stopped"
    assert "consecutive declines" in hacked.locator(".reason").inner_text()
    assert hacked.locator(".best-step").inner_text() == "40"
    hacked.locator("svg.spark circle.spark-best").wait_for()  # the sparkline of world feedback

    page.get_by_label("Status").select_option("stopped")
    page.wait_for_url(re.compile(r"status=stopped"))
    expect(page.locator("#jobs-body tr")).to_have_count(1)
    assert row(page, "a-hacked").count() == 1
    expect(page.locator("#jobs-summary")).to_have_text("1\u20131 of 1 stopped job")
    page.get_by_label("Status").select_option("")
    expect(page.locator("#jobs-body tr")).to_have_count(5)

    page.goto(site.url + "/#/job/b-secret-7f3a")  # another tenant's job: a 404, like an unknown one
    page.get_by_text("No job b-secret-7f3a for this tenant").wait_for()
    assert page.locator("#chart path").count() == 0


def test_pages_of_thousands_of_jobs(page, site):
    """Keyset pages of 50, newest first; Previous walks back the same pages."""
    sign_in(page, site, "carol")
    summary = page.locator("#jobs-summary")
    expect(summary).to_have_text("1\u201350 of 120 jobs")
    assert page.locator("#jobs-body tr").count() == 50 and page.locator("#prev-page").is_disabled()
    assert row(page, "c-119").count() == 1 and row(page, "c-069").count() == 0
    page.get_by_role("button", name="Next").click()
    page.wait_for_url(re.compile(r"page=2"))
    expect(summary).to_have_text(re.compile(r"^51\u2013100 of 120"))
    assert row(page, "c-069").count() == 1 and row(page, "c-119").count() == 0
    page.get_by_role("button", name="Next").click()
    expect(summary).to_have_text(re.compile(r"^101\u2013120 of 120"))
    assert page.locator("#jobs-body tr").count() == 20 and page.locator("#next-page").is_disabled()
    assert row(page, "c-000").count() == 1
    page.get_by_role("button", name="Previous").click()
    expect(summary).to_have_text(re.compile(r"^51\u2013100 of 120"))
    assert row(page, "c-069").count() == 1


def test_job_page_shows_curves_markers_decision_audit_and_checkpoint(page, site, tmp_path):
    sign_in(page, site, "alice")
    link = page.get_by_role("link", name="a-hacked", exact=True)
    link.focus()
    page.keyboard.press("Enter")  # keyboard navigation
    page.wait_for_selector("#view-job[data-ready]")
    assert page.locator("#job-status").inner_text() == "stopped"
    assert len(page.locator('[data-role="series-eval_score"]').get_attribute("d")) > 20
    for key in ("proxy_reward", "train_loss"):
        assert page.locator(f'[data-role="series-{key}"]').count() == 1
    assert page.locator('[data-role="stop-marker"]').get_attribute("data-step") == "60"
    assert page.locator('[data-role="best-marker"]').get_attribute("data-step") == "40"
    assert page.locator('[data-role="stop-marker"] text').text_content() == "stop 60"
    assert page.locator('[data-role="would-stop-marker"]').count() == 0  # not a shadow-mode job
    assert "Would stop" not in page.locator("#legend").inner_text()
    assert "2 consecutive declines" in page.locator("#decision-reason").inner_text()
    assert page.locator("#decision-evidence").inner_text().count("\n") >= 3  # the numbers behind the stop
    assert page.locator('#audit-body tr[data-kind="stop"]').count() == 1
    assert page.locator('#audit-body tr[data-kind="ack"]').count() == 1
    assert page.locator("#job-checkpoint").inner_text() == "runs/a-hacked/best"
    assert page.locator("#stop-button").is_disabled()

    page.locator("#chart").focus()
    page.keyboard.press("End")
    assert page.locator("#chart-readout").inner_text().startswith("step 60: world feedback 0.52")
    page.keyboard.press("ArrowLeft")
    assert page.locator("#chart-readout").inner_text().startswith("step 50")

    shot = tmp_path / "job.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert w == 1280 and h >= 900


def test_live_reports_and_the_stop_button(page, site):
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/job/a-running")
    page.wait_for_selector("#view-job[data-ready]")
    assert page.locator("#job-status").inner_text() == "running"
    site.alice.report("a-running", 40, 0.41)  # a new report arrives: no reload
    page.get_by_text("40 of 300 planned").wait_for()
    expect(page.locator("#chart")).to_have_attribute("aria-label", re.compile("over 4 reports"))

    page.get_by_role("button", name="Stop this job").click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    page.keyboard.press("Escape")  # a change of mind: nothing happens
    expect(page.locator("#stop-dialog")).to_be_hidden()
    page.get_by_role("button", name="Stop this job").click()
    expect(page.get_by_label("Reason")).to_be_focused()
    dialog.get_by_role("button", name="Cancel").click()
    expect(page.locator("#stop-dialog")).to_be_hidden()
    page.get_by_role("button", name="Stop this job").click()
    dialog.get_by_role("button", name="Stop job").click()  # no reason yet: refused
    assert page.locator("#stop-dialog").is_visible() and page.locator("#job-status").inner_text() == "running"
    dialog.get_by_label("Reason").fill("gold eval looks off, stopping to inspect")
    dialog.get_by_role("button", name="Stop job").click()
    expect(page.locator("#job-status")).to_have_text("stopped")
    assert not page.locator("#stop-dialog").is_visible()
    page.locator('#audit-body tr[data-kind="manual_stop"]').wait_for()
    assert "gold eval looks off" in page.locator("#audit-body").inner_text()
    assert page.locator('[data-role="stop-marker"]').get_attribute("data-step") == "40"
    assert page.locator("#stop-button").is_disabled()
    assert site.alice.http.get("/v1/jobs/a-running").json()["status"] == "stopped"

    page.get_by_role("link", name="All jobs").click()
    page.wait_for_selector("#view-jobs[data-ready]")
    assert row(page, "a-live").locator(".status").inner_text() == "running"
    site.alice.stop("a-live", "stopped from a script")  # the list is live too
    expect(row(page, "a-live").locator(".status")).to_have_text("stopped")


def test_data_is_text_never_markup(page, site):
    payload = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    site.alice.stop("a-xss", payload)
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/job/a-xss")
    page.wait_for_selector("#view-job[data-ready]")
    page.locator('#audit-body tr[data-kind="manual_stop"]').wait_for()
    assert payload in page.locator("#audit-body").inner_text()
    assert payload in page.locator("#decision-reason").inner_text()
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("() => window.__xss") is None


def test_the_page_picks_the_same_stop_step_as_the_cli(page, site):
    page.goto(site.url + "/")
    got = page.evaluate("""async (cases) => {
        const util = await import("./dashboard/util.js");
        return cases.map(([job, reports, audit]) => util.stopStep(job, reports, audit));
    }""", [list(c[:3]) for c in STOP_CASES])
    assert got == [c[3] for c in STOP_CASES]


def test_times_are_shown_as_times_and_numbers_with_about_four_digits(page, site):
    """Evidence, hyperparameters and audit values: a time (``at``, ``*_at``, ``last_seen``) through
    fmtTime, any other number through fmtNum, nested ones too; the full value for a title."""
    page.goto(site.url + "/")
    got = page.evaluate("""async () => {
        const u = await import("./dashboard/util.js");
        return [u.fmtValue("at", 1.8e9), u.fmtValue("saved_at", 1800000000), u.fmtValue("received_at", 1.8e9 + 0.25),
                u.fmtValue("last_seen", 1.8e9), u.fmtValue("stop_lag", 0.123456789012345), u.fmtValue("decided_at", 120),
                u.fmtValue("scores", [0.123456789, 0.5]), u.fmtValue("hparams", {created_at: 1.8e9, lr: 3e-4, on: true}),
                u.fullValue("stop_lag", 0.123456789012345), u.fmtTime(1.8e9)];
    }""")
    when = got[-1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", when) and when.startswith("2027-01-1")
    assert got[:4] == [when] * 4
    assert got[4:9] == ["0.1235", "120", "[0.1235, 0.5]", f"created_at={when}, lr=3.00e-4, on=true", "0.123456789012345"]
