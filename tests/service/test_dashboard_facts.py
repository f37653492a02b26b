"""The job page's facts in a real headless Chromium against a real `evalstop serve` on loopback: the
last step of a job that ended (with no report at all, or trained past its deciding eval), tags and
hyperparameters that never break mid-word, and 24-hour times everywhere."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from tests.conftest import Server
from tests.service import test_dashboard as dashboard
from tests.service.test_dashboard import Api, sign_in

browser, page = dashboard.browser, dashboard.page  # the same fixtures: headless Chromium, a fresh context each

pytestmark = pytest.mark.slow

RISE_FALL = [0.40, 0.55, 0.66, 0.71, 0.69, 0.52, 0.45]  # the default decline k=2: stops at step 60 (beyond the noise)
HPARAMS = {"learning_rate": 3e-4, "beta": 0.04, "per_device_train_batch_size_of_the_reference_policy": 8,
           "warmup_ratio": 0.123456789012345, "dataset_created_at": 1.8e9 + 0.5, "gradient_accumulation_steps": 16,
           "max_completion_length": 256, "num_generations": 8, "lr_scheduler_type": "cosine_with_restarts"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("facts") / "coord.db")
    token = srv.add_tenant("alice")
    srv.start()
    alice = Api(srv.url, token)
    alice.job("stopped-early", planned=400)  # stopped by hand before its first eval: no report at all
    alice.stop("stopped-early", "wrong dataset")
    alice.http.post("/v1/jobs/stopped-early/ack", json={"checkpoint": "out/evalstop-final"}).raise_for_status()
    alice.job("lagged", planned=200)  # external evals: the trainer went on 7 steps past the deciding eval
    alice.curve("lagged", RISE_FALL)
    alice.http.post("/v1/jobs/lagged/ack", json={"checkpoint": "out/ckpt-40", "step": 67}).raise_for_status()
    alice.job("running", planned=300)
    alice.curve("running", [0.2, 0.3])
    alice.http.post("/v1/jobs", json={"job_id": "running", "hparams": HPARAMS,
                                      "tags": {"sweep": "learning_rate_and_beta_grid_search"}}).raise_for_status()
    yield SimpleNamespace(url=srv.url, tokens={"alice": token}, alice=alice)
    alice.http.close()
    srv.kill()


def fact(page, term: str) -> str:
    return page.locator("#job-facts div").filter(has=page.locator("dt", has_text=re.compile(f"^{term}$"))) \
        .locator("dd").inner_text()


def open_job(page, site, job_id: str) -> None:
    sign_in(page, site, "alice")
    page.goto(f"{site.url}/#/job/{job_id}")
    page.wait_for_selector("#view-job[data-ready]")


@pytest.mark.parametrize(("job_id", "shown"), [
    ("stopped-early", "none reported: it ended before its first report (400 planned)"),
    ("lagged", "67 of 200 planned"),  # the acknowledged step, not the deciding eval's 60
    ("running", "20 of 300 planned"),
])
def test_the_last_step_of_an_ended_job_is_what_it_trained_to_or_says_there_is_none(page, site, job_id, shown):
    open_job(page, site, job_id)
    assert fact(page, "Last step") == shown


# For each "key=value" of a mapping fact: the number of lines it spans (a Range over its characters,
# whatever the nodes that hold them).
_LINES_PER_ITEM = """(dd, items) => {
  const nodes = [], starts = [];
  let text = "";
  const walker = document.createTreeWalker(dd, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) { nodes.push(n); starts.push(text.length); text += n.data; }
  const at = (i) => { let k = nodes.length - 1; while (starts[k] > i) k--; return [nodes[k], i - starts[k]]; };
  return items.map((item) => {
    const i = text.indexOf(item);
    if (i < 0) return [item, -1];
    const range = document.createRange();
    range.setStart(...at(i));
    range.setEnd(...at(i + item.length - 1));
    range.setEnd(range.endContainer, range.endOffset + 1);
    const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
    return [item, tops.size];
  });
}"""


@pytest.mark.parametrize("width", [1280, 900])
def test_tags_and_hyperparameters_wrap_between_items_never_mid_word(browser, site, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        open_job(page, site, "running")
        dd = page.locator("#job-facts div").filter(has=page.locator("dt", has_text="Hyperparameters")).locator("dd")
        text = dd.inner_text()
        items = re.findall(r"[a-z_]+=(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|[^,]+)", text)
        assert len(items) == len(HPARAMS), text
        lines = dict(dd.evaluate(_LINES_PER_ITEM, items))
        assert lines == {item: 1 for item in items}, lines
        tags = page.locator("#job-facts div").filter(has=page.locator("dt", has_text="Tags")).locator("dd")
        assert dict(tags.evaluate(_LINES_PER_ITEM, ["sweep=learning_rate_and_beta_grid_search"])) == \
            {"sweep=learning_rate_and_beta_grid_search": 1}
        overflow = page.locator("#job-facts dd").evaluate_all(
            "dds => dds.filter(d => d.scrollWidth > d.clientWidth + 1).map(d => d.previousSibling.textContent)")
        assert overflow == []
    finally:
        context.close()


def test_every_time_on_the_page_is_24_hour(page, site):
    open_job(page, site, "lagged")
    page.wait_for_function("document.getElementById('live-text').textContent.startsWith('Live')")
    live = page.locator("#live-text").inner_text()
    assert re.fullmatch(r"Live · updated \d\d:\d\d:\d\d", live), live
    body = page.locator("body").inner_text()
    assert not re.search(r"\b(AM|PM|am|pm)\b", body), re.findall(r".{20}\b(?:AM|PM)\b", body)
    times = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.locator("#audit-body").inner_text())
    assert times  # the audit's times: fmtTime, 24-hour


def test_the_job_list_says_none_for_an_ended_job_without_a_report(page, site):
    """The list's last-step cell of a job stopped before its first report (it showed a bare dash)."""
    sign_in(page, site, "alice")
    page.goto(f"{site.url}/#/")
    page.wait_for_selector("#view-jobs[data-ready] #jobs-body tr[data-job-id='stopped-early']")
    cells = page.locator("#jobs-body tr[data-job-id='stopped-early'] > *")
    texts = [cells.nth(i).inner_text().strip() for i in range(cells.count())]
    assert texts[9] == "none / 400", "|".join(texts)
    assert page.locator("#jobs-body tr[data-job-id='running'] > *").nth(9).inner_text().strip() == "20 / 300"
