"""``scrapy leased dashboard`` tested as a person would (issue #14): a real crawl, the
dashboard, and headless Chromium (Debian's ``chromium``, driven by Playwright through
``executable_path``). The numbers on the page equal ``status --json``; a dead letter is
requeued with a click (behind the confirmation) and shows up queued again; the crawl
picker switches crawls; a screenshot is saved (``<tmp>/dashboard.png``, and to
``$LEASED_DASHBOARD_SCREENSHOT`` when set: docs/dashboard.png comes from there).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request

import pytest

from tests.support.observe import LeasedServer
from tests.test_commands import leased, ok, status_json

POISON = "/p/137"  # its callback raises: one dead letter (Scrapy processes it once)


def chromium() -> str:
    path = os.environ.get("LEASED_TEST_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on PATH (.ci/run installs Debian's chromium package)")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    return path


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def shown(page, selector: str) -> str:
    return page.get_attribute(selector, "data-value")


def wait_shown(page, selector: str, expected: object, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        "([sel, want]) => { const e = document.querySelector(sel);"
        " return e !== null && e.dataset.value === want; }",
        arg=[selector, str(expected)], timeout=timeout_ms)


def test_dashboard_in_chromium(redis_server, crawl_id, make_site, start_worker, browser,
                               tmp_path):
    site = make_site(pages=300)
    other = crawl_id + "-other"
    ok(leased("seed", other, site.url + "/p/1", "--redis-url", redis_server.url))
    args = ("--redis-url", redis_server.url)
    with LeasedServer("dashboard", crawl_id, *args, "--allow-writes") as server:
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        settings = {"LEASED_LOGSTATS_INTERVAL": 0, "LEASED_RATE": "60/s",
                    "CONCURRENT_REQUESTS": 4, "LEASED_RENEW_INTERVAL": 0.5}
        workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                                settings=settings, args={"raise_path": POISON}, name=f"w{i}")
                   for i in (1, 2)]
        # opened before the crawl's first worker: the page shows it once it exists
        page.goto(f"{server.url}?crawl={crawl_id}&interval=0.5")
        page.wait_for_selector("#workers tr[data-worker]", timeout=60_000)  # live workers
        for w in workers:
            assert w.wait(120) == 0, w.log_tail()
            assert w.close_reason() == "finished"
        doc = status_json(redis_server.url, crawl_id, "--sample", "0")
        assert doc["done"] == 299 and doc["dead"] == 1 and doc["todo"] == 0
        # the page catches up with the finished crawl: then every number equals status's
        wait_shown(page, "[data-field=done]", doc["done"])
        wait_shown(page, "[data-stat=item_scraped_count]", doc["stats"]["item_scraped_count"])
        for field in ("todo", "processing", "done", "dead", "workers_alive"):
            assert shown(page, f"#counters [data-field={field}]") == str(doc[field]), field
        for name in ("response_received_count", "item_scraped_count"):
            assert shown(page, f"#counters [data-stat='{name}']") == str(doc["stats"][name])
        on_page = {e.get_attribute("data-stat"): e.query_selector("[data-value]")
                   .get_attribute("data-value") for e in page.query_selector_all("#stats [data-stat]")}
        assert on_page == {k: str(v) for k, v in doc["stats"].items()}
        assert float(on_page["downloader/response_status_count/200"]) >= 300
        assert page.query_selector_all("#plot-queue path[data-series=todo]")
        assert page.query_selector_all("#plot-throughput path[data-series=pages_per_min]")

        # the dead letter, its reason, and requeue behind a confirmation
        # (locators, not element handles: the page redraws the table at each poll)
        row = page.locator("#dead tr[data-rid]")
        assert POISON in row.inner_text() and "callback error: RuntimeError" in row.inner_text()
        row.locator("button.requeue").click()
        page.wait_for_selector("#confirm.open")
        page.click("#confirm-no")  # cancelled: nothing happens
        assert status_json(redis_server.url, crawl_id, "--sample", "0")["dead"] == 1
        row.locator("button.requeue").click()
        page.click("#confirm-yes")
        wait_shown(page, "[data-field=todo]", 1)
        wait_shown(page, "[data-field=dead]", 0)
        after = status_json(redis_server.url, crawl_id, "--sample", "0")
        assert (after["todo"], after["dead"], after["done"]) == (1, 0, 299)
        assert page.query_selector("#dead tr[data-rid]") is None
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        if os.environ.get("LEASED_DASHBOARD_SCREENSHOT"):
            shutil.copy(tmp_path / "dashboard.png", os.environ["LEASED_DASHBOARD_SCREENSHOT"])

        # another crawl of the same Redis, from the picker
        page.select_option("#crawl", other)
        wait_shown(page, "[data-field=done]", 0)
        wait_shown(page, "[data-field=todo]", 1)
        assert other in page.url
        assert errors == []
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_dashboard_read_only_unless_allowed(redis_server, crawl_id, site, start_worker,
                                            browser):
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_LOGSTATS_INTERVAL": 0}, args={"raise_path": "/p/137"})
    assert w.wait(120) == 0, w.log_tail()
    with LeasedServer("dashboard", crawl_id, "--redis-url", redis_server.url) as server:
        page = browser.new_page()
        page.goto(server.url)
        row = page.wait_for_selector("#dead tr[data-rid]")
        assert row.query_selector("button") is None
        assert page.inner_text("#mode") == "read-only"
        rid = row.get_attribute("data-rid")
        request = urllib.request.Request(
            server.url + "api/dead", method="POST",
            data=json.dumps({"crawl": crawl_id, "action": "purge", "rids": [rid]}).encode(),
            headers={"Content-Type": "application/json", "X-Leased-Dashboard": "1"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 403
    assert status_json(redis_server.url, crawl_id, "--sample", "0")["dead"] == 1
