"""Attacks on the run browser's surfaces of a real ``evalstop serve`` on 127.0.0.1: ``/v1/runs``
(search, filters, keyset cursor), the exports, ``/v1/summary``, the delete of a job, registration
``tags``/``hparams`` and the policy's ``mode``. Two tenants, a fresh SQLite file, real sockets.

The findings (each failed before its fix): a forged cursor whose key or time is an integer too big
for a float was a 500 (OverflowError), and a NaN key was taken as a position (a 200); a tag whose
value is an integer of a few hundred digits was a 500 (``math.isfinite`` of it overflows). The
table after them keeps what held holding: nothing of another tenant is found, exported or deleted."""

from __future__ import annotations

import base64
import csv
import io
import socket
import time

import httpx
import pytest

from tests.proc_helpers import bearer, rss_kib

pytestmark = pytest.mark.slow


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("sort, raw", [
    ("started", b'["started",' + b"9" * 330 + b',"x",1]'),  # key: float() of it overflows
    ("started", b'["started",1,"x",' + b"9" * 330 + b"]"),  # the time: math.isfinite() of it overflows
    ("started", b'["started",NaN,"x",1]'),  # not a position: was a 200 paging from nowhere
    ("ended", b'["ended",-Infinity,"x",1]'),
], ids=["key-overflow", "time-overflow", "key-nan", "key-minus-infinity"])
def test_a_forged_cursor_of_numbers_beyond_a_float_is_a_422(two, sort, raw):
    two.start()
    with httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=30) as c:
        assert c.post("/v1/jobs", json={"job_id": "a1"}).status_code == 201
        for path in ("/v1/runs", "/v1/runs/export"):
            r = c.get(path, params={"sort": sort, "after": _cursor(raw)})
            if path == "/v1/runs":
                assert r.status_code == 422, r.text
                assert "after must be the 'next' cursor" in r.json()["detail"]
            else:  # an export ignores the cursor: every run
                assert r.status_code == 200 and "a1" in r.text, r.text


def test_a_tag_of_a_huge_integer_is_a_422_naming_the_tag(two):
    two.start()
    with httpx.Client(base_url=two.url, headers={**bearer(two.alice), "content-type": "application/json"},
                      timeout=30) as c:
        for n in (400, 4000):  # 4000 digits: under the JSON parser's limit (4300)
            r = c.post("/v1/jobs", content=b'{"job_id":"t","tags":{"seed":' + b"9" * n + b"}}")
            assert r.status_code == 422, r.text
            assert "tags.seed must be a number of at most 256 digits" in r.json()["detail"]
            r = c.post("/v1/jobs", content=b'{"job_id":"t","hparams":{"seed":' + b"9" * n + b"}}")
            assert r.status_code == 422 and "hparams.seed" in r.json()["detail"], r.text
            assert len(r.text) < 300  # the message names the size, not the 4000 digits
        r = c.post("/v1/jobs", json={"job_id": "t", "tags": {"seed": 12345, "lr": 0.5, "x": -7}})
        assert r.status_code == 201 and r.json()["tags"] == {"lr": "0.5", "seed": "12345", "x": "-7"}, r.text


def test_a_404_does_not_echo_a_long_job_id_back_in_full(two):
    two.start()
    with httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=30) as c:
        for path in ("/v1/jobs/{}", "/v1/jobs/{}/reports", "/v1/jobs/{}/export"):
            r = c.get(path.format("x" * 5000))
            assert r.status_code in (404, 422), r.text
            assert len(r.text) < 600, (path, len(r.text))  # was 5,000+ characters: the id in full


def test_what_held_keeps_holding_nothing_of_another_tenant_and_every_bad_input_a_4xx(two):
    two.start()
    a = httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=30)
    b = httpx.Client(base_url=two.url, headers=bearer(two.bob), timeout=30)
    with a, b:
        assert b.post("/v1/jobs", json={"job_id": "bobjob", "tags": {"secret": "bobtag"}}).status_code == 201
        b.post("/v1/jobs/bobjob/reports", json={"step": 1, "eval_score": 0.5, "checkpoint": "=HYPERLINK(1)"})
        assert b.post("/v1/jobs/bobjob/fail", json={"reason": "@SUM(1)"}).status_code == 200
        assert a.post("/v1/jobs", json={"job_id": "alicejob"}).status_code == 201
        # alice: bob's job is never found, whatever the search, filter or forged cursor
        for params in ({"q": "bob"}, {"tag": "secret"}, {"tag": "secret=bobtag"}, {"status": "stopped"},
                       {"sort": "job_id", "order": "asc", "after": _cursor(b'["job_id","a","bobjob",1]')}):
            page = a.get("/v1/runs", params=params).json()
            assert "bobjob" not in str(page) and "bobtag" not in str(page), (params, page)
        assert "bobjob" not in a.get("/v1/runs/export", params={"q": "bob"}).text
        assert a.get("/v1/jobs/bobjob/export").status_code == 404
        assert a.post("/v1/jobs/bobjob/delete").status_code == 404
        assert a.get("/v1/summary").json()["jobs"] == 1
        assert b.get("/v1/jobs/bobjob").status_code == 200  # still there
        assert a.post("/v1/jobs/alicejob/delete").status_code == 409  # not over yet
        # CSV: no cell a spreadsheet would run as a formula (a number may start with -)
        assert "'=HYPERLINK(1)" in b.get("/v1/jobs/bobjob/export").text
        for path in ("/v1/jobs/bobjob/export", "/v1/runs/export"):
            for cell in (c for row in csv.reader(io.StringIO(b.get(path).text)) for c in row):
                assert cell[:1] not in ("=", "+", "@", "\t", "\r") and not (cell[:1] == "-" and not _number(cell)), cell
        # every bad input: a 4xx that says what is wrong
        for params in ({"limit": 0}, {"limit": 10**30}, {"sort": "__class__"}, {"order": "up"}, {"after": "!!"},
                       {"after": "A" * 600}, {"status": "x"}, {"tag": "=x"}, {"q": "\x00"}, {"q": "a" * 200},
                       {"after": _cursor(b'["started","s","x",1]')}, {"after": _cursor(b"[" * 100 + b"]" * 100)}):
            r = a.get("/v1/runs", params=params)
            assert r.status_code == 422 and r.json()["detail"], (params, r.text)
        for body in ({"job_id": "m", "policy": {"mode": m}} for m in (["shadow"], {"a": 1}, 1, None, True, "SHADOW")):
            r = a.post("/v1/jobs", json=body)
            assert r.status_code == 422 and "policy mode must be one of enforce, shadow" in r.text, (body, r.text)
        for body in ({"job_id": "t", "tags": {"a": {"b": 1}}}, {"job_id": "t", "tags": {f"k{i}": "v" for i in range(33)}},
                     {"job_id": "t", "tags": {"a": "x" * 257}}, {"job_id": "t", "tags": {"<script>": "x"}},
                     {"job_id": "t", "hparams": {"a": [1]}}, {"job_id": "t", "hparams": {"a": 2**60}}):
            assert a.post("/v1/jobs", json=body).status_code == 422, body
        assert a.get("/v1/runs/export", params={"format": "xml"}).status_code == 422


def test_an_export_its_reader_stops_reading_holds_a_chunk_not_a_page_of_text(two):
    """A page of 400 jobs with full tags and hparams is 6 MB of text: the server wrote the whole page
    as one chunk (csv: 3 copies of it, json: 2) and held it for as long as the reader kept the
    connection open without reading (2 such exports per tenant: +25 MB). Now about 256 KiB each."""
    two.start()
    with httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=30) as c:
        _full_jobs(c, 400)
        for fmt in ("csv", "json"):  # warm up: every code path once, read to the end
            assert len(c.get("/v1/runs/export", params={"format": fmt}).content) > 6_000_000
        time.sleep(0.5)
        before = rss_kib(two.proc.pid)
        stalled = [_stall(two, f"/v1/runs/export?format={fmt}") for fmt in ("csv", "json")]
        try:
            time.sleep(2.0)
            grew = rss_kib(two.proc.pid) - before
            assert grew < 8 * 1024, f"two stalled exports hold {grew} KiB"
            assert c.get("/v1/runs", params={"limit": 1}).status_code == 429  # its own read slots: both held
            with httpx.Client(base_url=two.url, headers=bearer(two.bob), timeout=30) as b:
                assert b.get("/v1/runs").status_code == 200  # bob's are not
        finally:
            for s in stalled:
                s.close()
        deadline = time.monotonic() + 10  # the slots come back once the readers are gone
        while c.get("/v1/runs", params={"limit": 1}).status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.get("/v1/runs", params={"limit": 1}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/runs?limit=1000", "/v1/jobs?limit=1000"])
def test_a_page_of_runs_its_readers_stop_reading_holds_the_tenants_read_slots_not_a_page_per_connection(two, path):
    """A page of 400 jobs with full tags and hparams is 6.5 MB of JSON. Its handler let go of the
    tenant's read slot once the answer was built, so every connection that never read its answer
    left one in the server: 12 stalled connections, +80 MB (1000 connections: gigabytes). Now a
    large answer is sent a slice at a time holding the slot: the third stalled request is a 429."""
    two.start()
    with httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=30) as c:
        _full_jobs(c, 400)
        assert len(c.get(path).content) > 6_000_000  # warm up
        time.sleep(0.5)
        before = rss_kib(two.proc.pid)
        stalled = []
        try:
            for _ in range(12):
                stalled.append(_stall(two, path))
                time.sleep(0.2)
            time.sleep(1.5)
            grew = rss_kib(two.proc.pid) - before
            assert grew < 30 * 1024, f"12 stalled pages hold {grew} KiB"
            assert c.get("/v1/runs", params={"limit": 1}).status_code == 429  # alice's slots: both held
            with httpx.Client(base_url=two.url, headers=bearer(two.bob), timeout=30) as b:
                assert b.get(path).status_code == 200  # bob's are not
        finally:
            for s in stalled:
                s.close()
        deadline = time.monotonic() + 10
        while c.get("/v1/runs", params={"limit": 1}).status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.1)
        page = c.get(path)  # and a page read at once is whole
        assert page.status_code == 200 and len(page.json() if path.startswith("/v1/jobs") else page.json()["jobs"]) == 400


def _full_jobs(c: httpx.Client, n: int) -> None:
    """``n`` jobs with the most tags and hparams a job may carry (32 x 256 characters of each)."""
    tags = {f"k{i:02d}": f"{i:02d}" * 128 for i in range(32)}
    hparams = {f"h{i:02d}": f"{i:02d}" * 128 for i in range(32)}
    for i in range(n):
        r = c.post("/v1/jobs", json={"job_id": f"j{i:03d}", "tags": tags, "hparams": hparams})
        assert r.status_code == 201, r.text


def _stall(server, path: str) -> socket.socket:
    """A request of ``path`` by alice whose answer is never read (a tiny receive buffer)."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.alice}\r\n\r\n".encode())
    return s
