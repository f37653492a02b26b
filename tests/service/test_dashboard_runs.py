"""The dashboard as a run browser (issue 19), in a real headless Chromium against a real `evalstop
serve` on loopback with two tenants: the list's search, filters, sort and columns; the compare view
(overlay, axis, smoothing, zoom, markers, shareable hash); CSV and JSON exports; and, for each, that
alice never sees bob's runs (nor bob alice's) — in the browser and through the API directly.
"""

from __future__ import annotations

import csv
import io
import json
import re
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import Server
from tests.service import test_dashboard as dashboard
from tests.service.test_dashboard import Api, row, sign_in

browser, page = dashboard.browser, dashboard.page  # the same fixtures: headless Chromium, a fresh context each

pytestmark = pytest.mark.slow

RISE_FALL = [0.40, 0.55, 0.66, 0.71, 0.69, 0.52, 0.45]  # the default decline k=2: stops at step 60 (beyond the noise), best 40
LONG_HPARAM = "per_device_train_batch_size_of_the_reference_policy"  # one word, wider than a column of facts
EPOCH = 1.8e9 + 0.5  # 2027-01-15: a time, shown as one (never 1.80e+9)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("runs") / "coord.db")
    tokens = {name: srv.add_tenant(name) for name in ("alice", "bob")}
    srv.start()
    alice, bob = Api(srv.url, tokens["alice"]), Api(srv.url, tokens["bob"])
    alice.job("sweep-lr-1", planned=100)
    alice.curve("sweep-lr-1", RISE_FALL)  # stopped at 60
    alice.job("sweep-lr-2", planned=200)
    alice.curve("sweep-lr-2", [0.3, 0.4, 0.5, 0.6])  # running
    alice.job("sweep-lr-3", planned=100)
    alice.curve("sweep-lr-3", [0.2, 0.35, 0.45, 0.5, 0.52])
    alice.http.post("/v1/jobs/sweep-lr-3/finish").raise_for_status()
    body = {"job_id": "crashed-run", "job_type": "sft", "planned_steps": 50, "policy": {"detector": "patience", "k": 3}}
    alice.http.post("/v1/jobs", json=body).raise_for_status()
    alice.report("crashed-run", 10, 0.3)
    alice.http.post("/v1/jobs/crashed-run/fail", json={"reason": "CUDA out of memory"}).raise_for_status()
    for i in (1, 2, 3):  # a re-registration adds tags and hyperparameters (audited)
        hparams = {"learning_rate": i * 1e-4, "beta": 0.04}  # 3e-4 is 0.00030000000000000003 as a float
        if i == 3:  # a long name, a full-length float and a time
            hparams |= {LONG_HPARAM: 8, "warmup_ratio": 0.123456789012345, "dataset_created_at": EPOCH}
        alice.http.post("/v1/jobs", json={"job_id": f"sweep-lr-{i}", "tags": {"sweep": "lr", "team": "rl"},
                                          "hparams": hparams}).raise_for_status()
    body = {"job_id": "shadow-run", "job_type": "grpo", "planned_steps": 100,
            "policy": {"detector": "decline", "k": 2, "mode": "shadow"}}
    alice.http.post("/v1/jobs", json=body).raise_for_status()
    alice.curve("shadow-run", RISE_FALL)  # would stop at 60, runs on
    bob.job("b-secret-sweep", planned=100)
    bob.http.post("/v1/jobs", json={"job_id": "b-secret-sweep", "tags": {"owner": "bob-only"}}).raise_for_status()
    bob.curve("b-secret-sweep", [0.5, 0.6, 0.7])
    yield SimpleNamespace(url=srv.url, tokens=tokens, alice=alice, bob=bob)
    for api in (alice, bob):
        api.http.close()
    srv.kill()


def ids_on_page(page) -> list[str]:
    return page.locator("#jobs-body tr").evaluate_all("rows => rows.map(r => r.dataset.jobId)")


# ------------------------------------------------------------------ the list
def test_search_filters_and_sort_are_done_by_the_server_and_kept_in_the_url(page, site):
    sign_in(page, site, "alice")
    assert ids_on_page(page) == ["shadow-run", "crashed-run", "sweep-lr-3", "sweep-lr-2", "sweep-lr-1"]  # newest first
    searched: list[str] = []
    page.on("request", lambda r: searched.extend(parse_qs(urlsplit(r.url).query).get("q", []))
            if "/v1/runs?" in r.url else None)
    page.get_by_label("Search").press_sequentially("SWEEP")  # the list follows the typing: no Apply, no Enter
    page.wait_for_url(re.compile(r"q=SWEEP"))
    expect(page.locator("#jobs-body tr")).to_have_count(3)
    assert set(searched) == {"SWEEP"}, searched  # after a pause: never a list per keystroke (S, SW, ...)
    expect(page.get_by_label("Search")).to_be_focused()
    page.get_by_label("Sort by").select_option("job_id")
    page.get_by_label("Order").select_option("asc")
    page.wait_for_url(re.compile(r"order=asc"))
    expect(page.locator("#jobs-body tr").first).to_have_attribute("data-job-id", "sweep-lr-1")
    assert ids_on_page(page) == ["sweep-lr-1", "sweep-lr-2", "sweep-lr-3"]
    page.get_by_label("Status").select_option("finished")
    expect(page.locator("#jobs-body tr")).to_have_count(1)
    assert ids_on_page(page) == ["sweep-lr-3"]
    page.get_by_label("Tag").fill("team=rl")  # Apply and Enter still filter at once
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(re.compile(r"tag=team%3Drl"))
    page.get_by_label("Detector").fill("patience")
    page.get_by_label("Detector").press("Enter")
    expect(page.locator("#jobs-empty")).to_be_visible()
    assert "detector=patience" in page.url
    assert "token" not in page.url and site.tokens["alice"] not in page.url

    page.goto(site.url + "/#/?job_type=sft&detector=patience")  # a shared link: the same list
    expect(page.locator("#jobs-body tr")).to_have_count(1)
    assert ids_on_page(page) == ["crashed-run"] and page.get_by_label("Type").input_value() == "sft"

    page.goto(site.url + "/#/?tag=team%3Drl")  # a tag filter
    expect(page.locator("#jobs-body tr")).to_have_count(3)
    assert row(page, "sweep-lr-2").locator(".tags").inner_text() == "sweep=lr, team=rl"

    for query in ("q=secret", "q=bob-only", "tag=owner"):  # bob's run, by id or by its tag: nothing
        page.goto(site.url + f"/#/?{query}")
        expect(page.locator("#jobs-empty")).to_be_visible()
        assert page.locator("#jobs-body tr").count() == 0 and "b-secret" not in page.locator("main").inner_text()


LIST_WIDTHS = """() => {
    const table = document.getElementById("jobs-table"), wrap = table.parentElement;
    const heads = [...table.querySelectorAll("thead th")].map((th) => th.getBoundingClientRect());
    return { table: table.getBoundingClientRect().width, wrap: wrap.clientWidth, wrapRight: wrap.getBoundingClientRect().right,
             lastRight: heads[heads.length - 1].right, page: document.documentElement.scrollWidth,
             scrolls: ["auto", "scroll"].includes(getComputedStyle(wrap).overflowX) };
}"""


def test_the_list_shows_start_duration_last_seen_and_the_stop_or_failure_reason(page, site):
    sign_in(page, site, "alice")
    stopped, failed = row(page, "sweep-lr-1"), row(page, "crashed-run")
    assert "consecutive declines" in stopped.locator(".reason").inner_text()
    expect(failed.locator(".reason")).to_have_text("CUDA out of memory")  # from the audit trail
    assert stopped.locator(".best-score").inner_text() == "0.71" and stopped.locator(".best-score").get_attribute("title") == "0.71"
    page.set_viewport_size({"width": 1400, "height": 900})  # every column in sight, the sparklines' too
    w = page.evaluate(LIST_WIDTHS)
    assert w["table"] <= w["wrap"] and w["lastRight"] <= w["wrapRight"] + 0.5 and w["page"] <= 1400, w
    page.set_viewport_size({"width": 1000, "height": 900})  # at worst the table scrolls in its box, never the page
    w = page.evaluate(LIST_WIDTHS)
    assert w["page"] <= 1000 and (w["table"] <= w["wrap"] or w["scrolls"]), w
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", stopped.locator(".started").inner_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", stopped.locator(".started").get_attribute("title"))
    assert re.fullmatch(r"\d+ s|\d+ min \d+ s", stopped.locator(".duration").inner_text())
    assert stopped.locator(".seen").inner_text().endswith("ago")
    assert failed.locator(".status").inner_text() == "failed"


def test_bob_sees_only_his_runs_in_the_list(page, site):
    sign_in(page, site, "bob")
    assert ids_on_page(page) == ["b-secret-sweep"]
    assert "sweep-lr" not in page.locator("main").inner_text()


def test_the_summary_counts_the_tenants_own_jobs_and_what_the_stops_saved(page, site):
    sign_in(page, site, "alice")
    summary = page.locator("#tenant-summary")

    def value(key: str):
        return summary.locator(f'[data-key="{key}"] dd')

    expect(value("jobs")).to_have_text("5")
    for key, want in (("stopped_by_detector", "1"), ("stopped_by_hand", "0"), ("failed", "1"), ("finished", "1"),
                      ("active", "2"), ("would_stop", "1"), ("steps_saved", "40")):  # stopped at 60 of 100
        expect(value(key)).to_have_text(want)
    assert summary.get_by_text("Job-hours saved (est.)").is_visible()
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, site, "bob")
    expect(value("jobs")).to_have_text("1")
    expect(value("steps_saved")).to_have_text("0")


# ------------------------------------------------------------------ compare
def test_compare_selected_runs_overlays_their_curves_with_markers(page, site):
    sign_in(page, site, "alice")
    for job_id in ("sweep-lr-1", "sweep-lr-2", "sweep-lr-3"):
        box = page.get_by_label(f"Select {job_id} to compare")
        box.focus()
        page.keyboard.press("Space")  # keyboard: a labelled checkbox
        expect(box).to_be_checked()
    page.get_by_role("button", name="Compare 3 selected").click()
    page.wait_for_selector("#view-compare[data-ready]")
    assert "ids=sweep-lr-1%2Csweep-lr-2%2Csweep-lr-3" in page.url and "token" not in page.url
    chart = page.locator("#compare-chart")
    expect(chart.locator('[data-role="run-curve"]')).to_have_count(3)
    assert chart.locator('g.run[data-job-id="sweep-lr-1"] [data-role="best-marker"]').get_attribute("data-step") == "40"
    assert chart.locator('g.run[data-job-id="sweep-lr-1"] [data-role="stop-marker"]').get_attribute("data-step") == "60"
    assert chart.locator('g.run[data-job-id="sweep-lr-2"] [data-role="stop-marker"]').count() == 0
    table = page.locator("#compare-body")
    expect(table.locator("tr")).to_have_count(3)
    assert table.locator('tr[data-job-id="sweep-lr-1"] .stop').inner_text() == "60"
    assert "0.71 @ 40" in table.locator('tr[data-job-id="sweep-lr-1"] .best').inner_text()
    assert table.locator('tr[data-job-id="sweep-lr-2"] .hparams').inner_text() == "beta=0.04, learning_rate=2.00e-4"
    assert table.locator('tr[data-job-id="sweep-lr-2"] .tags').inner_text() == "sweep=lr, team=rl"

    raw = chart.locator('g.run[data-job-id="sweep-lr-1"] path.series').get_attribute("d")
    page.get_by_label("Smoothing").fill("0.6")  # a range input: fill sets it and fires input
    page.wait_for_url(re.compile(r"smooth=0.6"))
    assert chart.locator('g.run[data-job-id="sweep-lr-1"] path.series').get_attribute("d") != raw

    page.get_by_label("X axis").select_option("plan")
    page.wait_for_url(re.compile(r"axis=plan"))
    expect(chart).to_have_attribute("data-axis", "plan")
    page.get_by_label("Zoom from").fill("0.1")
    page.get_by_label("Zoom to").fill("0.3")
    page.get_by_role("button", name="Zoom", exact=True).click()
    page.wait_for_url(re.compile(r"from=0.1&to=0.3"))
    expect(chart).to_have_attribute("aria-label", re.compile(r"zoomed to 0.1 to 0.3"))

    shared = page.url  # the link, opened again: the same view (the token is never in it)
    page.goto(site.url + "/")
    page.goto(shared)
    page.wait_for_selector("#view-compare[data-ready]")
    assert page.get_by_label("X axis").input_value() == "plan" and page.get_by_label("Zoom from").input_value() == "0.1"
    page.get_by_role("button", name="Reset zoom").click()
    page.wait_for_url(lambda url: "from=" not in url)
    page.get_by_label("X axis").select_option("time")
    expect(chart).to_have_attribute("data-axis", "time")
    expect(chart.locator('[data-role="run-curve"]')).to_have_count(3)


def test_drag_across_the_compare_chart_to_zoom(page, site):
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/compare?ids=sweep-lr-1,sweep-lr-3")
    page.wait_for_selector("#view-compare[data-ready]")
    box = page.locator("#compare-chart").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.35, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.55, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.65, y, steps=5)
    page.mouse.up()
    page.wait_for_url(re.compile(r"from=[\d.]+&to=[\d.]+"))
    lo, hi = float(page.get_by_label("Zoom from").input_value()), float(page.get_by_label("Zoom to").input_value())
    assert 10 < lo < hi < 60, (lo, hi)  # steps 10-60 across the plot: a middle slice of it
    expect(page.locator("#compare-chart")).to_have_attribute("aria-label", re.compile("zoomed to"))


def test_shadow_runs_show_a_badge_and_where_they_would_have_stopped(page, site):
    sign_in(page, site, "alice")
    shadow = row(page, "shadow-run")
    assert shadow.locator(".shadow").inner_text() == "shadow" and shadow.locator(".status").inner_text() == "running"
    shadow.locator("svg.spark line.spark-would-stop").wait_for(state="attached")
    assert row(page, "sweep-lr-1").locator(".shadow").count() == 0
    page.goto(site.url + "/#/compare?ids=shadow-run,sweep-lr-1")
    page.wait_for_selector("#view-compare[data-ready]")
    run = page.locator('#compare-chart g.run[data-job-id="shadow-run"]')
    assert run.locator('[data-role="would-stop-marker"]').get_attribute("data-step") == "60"
    assert run.locator('[data-role="stop-marker"]').count() == 0  # it was never stopped
    assert page.locator('#compare-body tr[data-job-id="shadow-run"] .would-stop').inner_text() == "60"
    assert page.locator('#compare-body tr[data-job-id="shadow-run"] .badge.shadow').count() == 1
    page.goto(site.url + "/#/job/shadow-run")
    page.wait_for_selector("#view-job[data-ready]")
    expect(page.locator("#job-shadow")).to_have_text("shadow")
    facts = page.locator("#job-facts").text_content()
    assert "Would have stopped" in facts and "at step 60" in facts
    would = page.locator('#chart [data-role="would-stop-marker"]')  # the chart marks it: dashed, labelled
    assert would.get_attribute("data-step") == "60" and would.locator("text").text_content() == "would stop 60"
    dash = would.locator("line").get_attribute("stroke-dasharray")
    assert dash and dash != page.locator('#chart [data-role="best-marker"] line').get_attribute("stroke-dasharray")
    assert page.locator('#chart [data-role="stop-marker"]').count() == 0
    assert "Would stop (shadow mode)" in page.locator("#legend").inner_text()


TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"  # fmtTime


def test_the_job_page_shows_tags_and_hyperparameters(page, site):
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/job/sweep-lr-3")
    page.wait_for_selector("#view-job[data-ready]")
    facts = page.locator("#job-facts").text_content()
    assert "sweep=lr, team=rl" in facts
    hparams = page.locator("#job-facts div").filter(has_text="Hyperparameters").locator("dd")
    assert re.fullmatch(rf"beta=0\.04, dataset_created_at={TIME}, learning_rate=3\.00e-4, {LONG_HPARAM}=8, "
                        r"warmup_ratio=0\.1235", hparams.inner_text()), hparams.inner_text()
    assert "0.123456789012345" in hparams.get_attribute("title") and "1800000000.5" in hparams.get_attribute("title")
    overflow = page.locator("#job-facts dd").evaluate_all("dds => dds.filter(d => d.scrollWidth > d.clientWidth + 1)"
                                                         ".map(d => d.previousSibling.textContent)")
    assert overflow == []  # a long name wraps in its column, never over the Detector beside it
    evidence = page.locator('#audit-body tr[data-kind="amended"] .ev').inner_text()  # the audit's evidence too
    assert re.search(rf"dataset_created_at={TIME}", evidence) and "warmup_ratio=0.1235" in evidence, evidence
    assert "e+9" not in evidence + facts and "1800000000" not in evidence + facts
    cell = page.locator("#data-body tr").filter(has=page.locator("td", has_text=re.compile(r"^20$"))).locator("td").nth(3)
    assert cell.text_content() == "0.6667" and cell.get_attribute("title") == "0.6666666666666666"  # train loss 2/3


def test_compare_never_shows_another_tenants_run(page, site):
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/compare?ids=sweep-lr-1,b-secret-sweep")
    page.wait_for_selector("#view-compare[data-ready]")
    expect(page.locator("#compare-missing")).to_have_text("No run b-secret-sweep for this tenant.")
    assert page.locator('#compare-chart g.run').count() == 1
    assert page.locator('#compare-body tr[data-job-id="b-secret-sweep"]').count() == 0


# ------------------------------------------------------------------ exports
def _saved(download) -> str:
    return open(download.path(), encoding="utf-8").read()


def test_exports_of_the_filtered_list_and_of_a_run_download_through_the_api(page, site):
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/?q=sweep&sort=job_id&order=asc")
    expect(page.locator("#jobs-body tr")).to_have_count(3)
    with page.expect_download() as d:
        page.get_by_role("button", name="Export CSV").click()
    assert d.value.suggested_filename == "runs.csv"
    rows = list(csv.DictReader(io.StringIO(_saved(d.value))))
    assert [r["job_id"] for r in rows] == ["sweep-lr-1", "sweep-lr-2", "sweep-lr-3"]
    assert rows[0]["status"] == "stopped" and rows[0]["best_step"] == "40" and "declines" in rows[0]["reason"]
    with page.expect_download() as d:
        page.get_by_role("button", name="Export JSON").click()
    assert [j["job_id"] for j in json.loads(_saved(d.value))] == ["sweep-lr-1", "sweep-lr-2", "sweep-lr-3"]
    expect(page.locator("#export-status")).to_have_text(re.compile(r"Exported JSON"))

    page.goto(site.url + "/#/job/sweep-lr-1")
    page.wait_for_selector("#view-job[data-ready]")
    with page.expect_download() as d:
        page.get_by_role("button", name="Export reports CSV").click()
    assert d.value.suggested_filename == "sweep-lr-1-reports.csv"
    rows = list(csv.DictReader(io.StringIO(_saved(d.value))))
    assert [int(r["step"]) for r in rows] == [10, 20, 30, 40, 50, 60]
    assert float(rows[3]["eval_score"]) == 0.71
    with page.expect_download() as d:
        page.get_by_role("button", name="Export reports JSON").click()
    assert [r["step"] for r in json.loads(_saved(d.value))] == [10, 20, 30, 40, 50, 60]
    assert "blob:" not in page.url and "token" not in page.url


def test_bob_cannot_export_alices_runs(site):
    with httpx.Client(base_url=site.url, timeout=10) as http:
        bob = {"Authorization": f"Bearer {site.tokens['bob']}"}
        assert http.get("/v1/jobs/sweep-lr-1/export", headers=bob).status_code == 404
        assert http.get("/v1/jobs/sweep-lr-1/export?format=json", headers=bob).status_code == 404
        listed = http.get("/v1/runs/export?format=json", headers=bob)
        assert [j["job_id"] for j in listed.json()] == ["b-secret-sweep"]
        assert "sweep-lr" not in http.get("/v1/runs/export", headers=bob).text
        assert [j["job_id"] for j in http.get("/v1/runs", headers=bob).json()["jobs"]] == ["b-secret-sweep"]
        assert http.get("/v1/runs/export").status_code == 401  # the same auth as every /v1 call
        assert http.get("/v1/jobs/sweep-lr-1/export").status_code == 401
        assert http.get(f"/v1/runs/export?token={site.tokens['alice']}").status_code == 401  # never in a URL


# ------------------------------------------------------------------ what a caller sends is bounded
@pytest.mark.parametrize("query, detail", [
    ("limit=1001", None), ("limit=0", None), ("q=" + "x" * 129, None), ("q=a%00b", None),
    ("sort=nope", "Unknown sort"), ("order=sideways", "order must be"), ("status=zombie", "Unknown status"),
    ("job_type=pretrain", "Unknown job_type"), ("after=not-a-cursor", "after must be"),
    ("after=" + "A" * 600, None), ("tag==x", "tag must be"),
])
def test_bad_queries_are_refused_with_a_precise_422(site, query, detail):
    r = site.alice.http.get(f"/v1/runs?{query}")
    assert r.status_code == 422, (query, r.text)
    if detail:
        assert detail in r.text


def test_a_cursor_is_bound_to_its_sort_and_names_no_other_tenants_runs(site):
    first = site.alice.http.get("/v1/runs?limit=1&sort=job_id&order=asc").json()
    assert first["total"] == 5 and first["next"]
    assert site.alice.http.get(f"/v1/runs?limit=1&sort=started&after={first['next']}").status_code == 422
    # bob replaying alice's cursor reads his own runs after that position, never hers
    got = site.bob.http.get(f"/v1/runs?limit=10&sort=job_id&order=asc&after={first['next']}").json()
    assert {j["job_id"] for j in got["jobs"]} <= {"b-secret-sweep"} and got["total"] == 1
    seen, after = [], None
    for _ in range(10):  # keyset pages of one, in order, each job once
        r = site.alice.http.get("/v1/runs", params={"limit": 1, "sort": "job_id", "order": "asc",
                                                   **({"after": after} if after else {})}).json()
        seen += [j["job_id"] for j in r["jobs"]]
        after = r["next"]
        if after is None:
            break
    assert seen == ["crashed-run", "shadow-run", "sweep-lr-1", "sweep-lr-2", "sweep-lr-3"]


@pytest.mark.parametrize("forged", [["started", "x", "j", 1.0], ["job_id", 5, "j", 1.0], ["started", [1], "j", 1.0],
                                    ["started", {"a": 1}, "j", 1.0], ["started", 1, None, 1.0], "not a list",
                                    ["started", 1, "j"], ["started", 1, "j", "now"], ["started", 1, "j", True]])
def test_a_forged_cursor_is_a_422_never_a_500(site, forged):
    import base64

    cursor = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
    sort = forged[0] if isinstance(forged, list) else "started"
    r = site.alice.http.get("/v1/runs", params={"sort": sort, "after": cursor})
    assert r.status_code == 422 and "after must be" in r.text


def test_bad_export_formats_are_refused(site):
    assert site.alice.http.get("/v1/runs/export?format=xlsx").status_code == 422
    assert site.alice.http.get("/v1/jobs/sweep-lr-1/export?format=../../etc").status_code == 422


def test_csv_cells_are_never_formulas(site):
    """A spreadsheet would run a cell starting with = + - @: such text is exported with a leading '."""
    site.alice.http.post("/v1/jobs", json={"job_id": "formula-run", "job_type": "grpo"}).raise_for_status()
    site.alice.http.post("/v1/jobs/formula-run/reports", json={
        "step": 1, "eval_score": -0.5, "checkpoint": "=HYPERLINK(\"http://evil\")"}).raise_for_status()
    rows = list(csv.DictReader(io.StringIO(site.alice.http.get("/v1/jobs/formula-run/export").text)))
    assert rows[0]["checkpoint"] == "'=HYPERLINK(\"http://evil\")"
    assert rows[0]["eval_score"] == "-0.5"  # numbers stay numbers


# ------------------------------------------------------------------ operators (run last: they add and delete jobs)
def test_mark_failed_then_delete_a_dead_job_with_confirmations(page, site):
    body = {"job_id": "dead-run", "job_type": "grpo", "planned_steps": 100}
    site.alice.http.post("/v1/jobs", json=body).raise_for_status()
    site.alice.report("dead-run", 10, 0.4)
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/job/dead-run")
    page.wait_for_selector("#view-job[data-ready]")
    fail, delete = page.get_by_role("button", name="Mark failed"), page.get_by_role("button", name="Delete")
    expect(fail).to_be_enabled()
    expect(delete).to_be_disabled()  # a running job cannot be deleted
    fail.click()
    dialog = page.locator("#op-dialog")
    expect(dialog).to_be_visible()
    expect(page.get_by_label("Why? (written to the audit trail)")).to_be_focused()
    dialog.get_by_role("button", name="Cancel").click()  # a change of mind: nothing happens
    expect(dialog).to_be_hidden()
    assert site.alice.http.get("/v1/jobs/dead-run").json()["status"] == "running"
    fail.click()
    dialog.get_by_role("button", name="Mark failed").click()  # no reason: refused
    expect(dialog.locator("#op-error")).to_have_text(re.compile("give a reason"))
    dialog.locator("#op-reason").fill("node lost, process gone")
    dialog.get_by_role("button", name="Mark failed").click()
    expect(page.locator("#job-status")).to_have_text("failed")
    page.locator('#audit-body tr[data-kind="failed"]').wait_for()
    assert "node lost, process gone" in page.locator("#audit-body").inner_text()
    expect(delete).to_be_enabled()
    expect(fail).to_be_disabled()

    delete.click()
    expect(page.locator("#op-title")).to_have_text("Delete dead-run?")
    page.keyboard.press("Escape")  # keyboard: closes, nothing deleted
    expect(dialog).to_be_hidden()
    assert site.alice.http.get("/v1/jobs/dead-run").status_code == 200
    delete.click()
    dialog.locator("#op-reason").fill("clean-up after the outage")
    dialog.get_by_role("button", name="Delete job").click()
    page.wait_for_selector("#view-jobs[data-ready]")
    expect(page.locator("#flash")).to_have_text(re.compile(r"Deleted dead-run \(1 reports\)"))
    expect(page.locator("#flash")).to_be_focused()  # a screen reader hears what happened
    assert row(page, "dead-run").count() == 0
    assert site.alice.http.get("/v1/jobs/dead-run").status_code == 404
    assert site.alice.http.get("/v1/jobs/dead-run/export").status_code == 404
    audit = site.alice.http.get("/v1/audit", params={"job_id": "dead-run"}).json()
    assert [(a["kind"], a["reason"]) for a in audit][-2:] == [("failed", "node lost, process gone"),
                                                             ("deleted", "clean-up after the outage")]


def test_another_tenant_can_neither_fail_nor_delete_a_job_nor_see_the_buttons(page, site):
    for path, body in (("/v1/jobs/sweep-lr-3/delete", {"reason": "mine now"}),
                       ("/v1/jobs/sweep-lr-2/fail", {"reason": "mine now"})):
        assert site.bob.http.post(path, json=body).status_code == 404
    assert site.alice.http.get("/v1/jobs/sweep-lr-3").json()["status"] == "finished"
    assert site.alice.http.get("/v1/jobs/sweep-lr-2").json()["status"] == "running"
    assert site.alice.http.post("/v1/jobs/sweep-lr-2/delete", json={"reason": "x"}).status_code == 409  # running
    assert site.alice.http.post("/v1/jobs/sweep-lr-3/delete", json={"reason": "x" * 2001}).status_code == 422
    sign_in(page, site, "bob")
    page.goto(site.url + "/#/job/sweep-lr-3")
    page.get_by_text("No job sweep-lr-3 for this tenant").wait_for()
    expect(page.get_by_role("button", name="Delete")).to_be_hidden()
    expect(page.get_by_role("button", name="Mark failed")).to_be_hidden()


def test_clients_that_go_away_mid_export_never_hold_the_tenants_read_slots(site):
    """An export holds one of the tenant's two read slots while it streams; a client that disconnects
    before or during the answer must not leave it held (else every later read is a 429)."""
    import socket
    import time
    from urllib.parse import urlsplit

    site.alice.http.post("/v1/jobs", json={"job_id": "big-export", "job_type": "grpo"}).raise_for_status()
    for step in range(1, 1501):
        r = site.alice.http.post("/v1/jobs/big-export/reports", json={"step": step, "eval_score": 0.5,
                                                                      "checkpoint": "c" * 200})
        assert r.status_code == 200, r.text
    host, port = urlsplit(site.url).hostname, urlsplit(site.url).port
    request = (f"GET /v1/jobs/big-export/export?format=json HTTP/1.1\r\nHost: {host}\r\n"
               f"Authorization: Bearer {site.tokens['alice']}\r\n\r\n").encode()
    for read in (0, 0, 0, 4096, 4096, 4096):  # gone before the answer, then mid-stream
        with socket.create_connection((host, port)) as s:
            s.sendall(request)
            if read:
                assert s.recv(read)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    deadline = time.monotonic() + 10
    while True:
        codes = [site.alice.http.get("/v1/runs", params={"limit": 1}).status_code for _ in range(3)]
        if codes == [200, 200, 200] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert codes == [200, 200, 200], codes
    full = site.alice.http.get("/v1/jobs/big-export/export?format=json")
    assert full.status_code == 200 and len(full.json()) == 1500


@pytest.mark.parametrize("sort", ["started", "job_id", "status", "type", "detector", "updated", "ended", "duration"])
@pytest.mark.parametrize("order", ["asc", "desc"])
def test_keyset_pages_give_every_job_once_in_order_for_every_sort(sort, order):
    """Ties (equal keys: one status, one start time) are broken by the job id, so pages of 3 walk
    the whole order once, whatever the sort; the clock moves on between pages (a duration sort keeps
    the time of its first page, carried by the cursor)."""
    from evalstop_trl import Coordinator, MemoryStore
    from evalstop_trl.clients.embedded import EmbeddedClient

    clock = iter(float(t) for t in [1.0] * 6 + list(range(2, 100)))
    c = EmbeddedClient(Coordinator(MemoryStore(), clock=lambda: next(clock)), "a")
    for i in range(10):
        c.register_job(f"j{i}", "grpo" if i % 2 else "sft", policy={"detector": "patience" if i % 3 else "decline"})
    c.stop("j3", "x")
    c.finish("j5")
    everything = [v.job_id for v in c.browse_jobs(sort=sort, order=order, limit=1000).jobs]
    seen, after = [], None
    while True:
        page = c.browse_jobs(sort=sort, order=order, limit=3, after=after)
        assert page.total == 10
        seen += [v.job_id for v in page.jobs]
        if page.next is None:
            break
        after = page.next
    assert sorted(seen) == sorted(f"j{i}" for i in range(10))  # each once: none skipped, none twice
    if sort != "duration":  # running jobs' durations grow with the clock; the cursor keeps the first page's
        assert seen == everything


def test_tags_and_hyperparameters_are_text_never_markup(page, site):
    payload = '<img src=x onerror="window.__xss=1">'
    site.alice.http.post("/v1/jobs", json={"job_id": "xss-tags", "tags": {"note": payload, "__proto__": "p"},
                                           "hparams": {"model_name": payload}}).raise_for_status()
    sign_in(page, site, "alice")
    page.goto(site.url + "/#/?q=xss-tags")
    expect(page.locator("#jobs-body tr")).to_have_count(1)
    assert payload in row(page, "xss-tags").locator(".tags").inner_text()
    page.goto(site.url + "/#/compare?ids=xss-tags")
    page.wait_for_selector("#view-compare[data-ready]")
    assert payload in page.locator('#compare-body tr[data-job-id="xss-tags"] .hparams').inner_text()
    page.goto(site.url + "/#/job/xss-tags")
    page.wait_for_selector("#view-job[data-ready]")
    assert payload in page.locator("#job-facts").text_content() and "__proto__=p" in page.locator("#job-facts").text_content()
    assert page.locator("img[src=x]").count() == 0 and page.evaluate("() => window.__xss") is None
