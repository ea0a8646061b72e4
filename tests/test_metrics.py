"""``scrapy leased metrics`` (issue #14): scraped during a real crawl, parsed with
prometheus-client's own parser; every metric of docs/metrics.md present; done and queued
equal to ``status --json`` at the same moment (the workers frozen with SIGSTOP, so
nothing moves between the two reads).
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.observe import LeasedServer
from tests.test_commands import status_json
from tests.test_faults import wait_for

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
SETTINGS = {"LEASED_LEASE_SECONDS": 30.0, "CONCURRENT_REQUESTS": 4,
            "LEASED_LOGSTATS_INTERVAL": 0, "LEASED_RENEW_INTERVAL": 0.5,
            "LEASED_RATE": "40/s"}


def documented() -> dict[str, str]:
    """metric name -> type, from the table of docs/metrics.md."""
    return dict(re.findall(r"^\| `(leased_\w+)` \| (\w+) \|", DOC.read_text(), re.M))


def scrape(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "metrics", timeout=30) as r:
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, name: str, **labels: str) -> float:
    family = families[name.removesuffix("_total")]
    found = [s.value for s in family.samples if s.name == name
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


def test_metrics_during_a_crawl(redis_server, crawl_id, make_site_process, start_worker):
    site = make_site_process(pages=600)
    r = redis_server.client(decode_responses=True)
    keys = CrawlKeys(crawl_id)
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=SETTINGS,
                            name=f"w{i}") for i in (1, 2)]
    wait_for(lambda: int(r.hget(keys.stats, "done") or 0) >= 60
             and r.hget(keys.fleet_stats, "downloader/response_status_count/200"), 120,
             "a crawl under way with its stats flushed")
    with LeasedServer("metrics", crawl_id, "--redis-url", redis_server.url) as server:
        for w in workers:
            w.sigstop()
        try:
            # Frozen workers change nothing; a write already on its way lands before the
            # second status, so the first pair of equal statuses brackets a stable moment.
            for _ in range(20):
                before = status_json(redis_server.url, crawl_id, "--sample", "0")
                families = scrape(server.url)
                after = status_json(redis_server.url, crawl_id, "--sample", "0")
                if (before["done"], before["todo"]) == (after["done"], after["todo"]):
                    break
            else:
                raise AssertionError("the crawl kept moving with every worker frozen")
        finally:
            for w in workers:
                w.sigcont()
    assert 0 < before["done"] < 600 and before["todo"] > 0, "scraped during the crawl"
    names = documented()
    assert len(names) >= 20
    for name, kind in names.items():
        family = families.get(name.removesuffix("_total"))
        assert family is not None, f"{name} is documented but not exported"
        assert family.type == kind, name
        assert family.samples, f"{name} has no sample"
        assert all(s.labels["crawl"] == crawl_id for s in family.samples), name
    assert set(families) == {n.removesuffix("_total") for n in names}, "undocumented metrics"
    assert value(families, "leased_done_requests_total", crawl=crawl_id) == before["done"]
    assert value(families, "leased_queued_requests", crawl=crawl_id) == before["todo"]
    assert value(families, "leased_in_flight_requests", crawl=crawl_id) == before["processing"]
    assert value(families, "leased_workers_alive", crawl=crawl_id) == before["workers_alive"]
    stats = before["stats"]
    assert value(families, "leased_responses_total", crawl=crawl_id, status="200") == \
        stats["downloader/response_status_count/200"]
    assert value(families, "leased_items_scraped_total", crawl=crawl_id) == \
        stats["item_scraped_count"]
    hosts = {s.labels["host"] for s in families["leased_host_queued_requests"].samples}
    assert hosts == {lane["lane"] for lane in before["budget"]["lanes"]} == {"127.0.0.1"}
    for w in workers:
        assert w.wait(120) == 0, w.log_tail()
        assert w.close_reason() == "finished"


def test_metrics_of_every_crawl(redis_server, crawl_id, site, start_worker):
    """--all-crawls: one series per crawl (two crawls here, crawled one after the other)."""
    other = crawl_id + "-b"
    for crawl in (crawl_id, other):
        w = start_worker(redis_server.url, crawl, site.url + "/p/0",
                         settings={"LEASED_LOGSTATS_INTERVAL": 0}, name=crawl[-6:])
        assert w.wait(120) == 0, w.log_tail()
    with LeasedServer("metrics", "--all-crawls", "--redis-url", redis_server.url) as server:
        families = scrape(server.url)
    for crawl in (crawl_id, other):
        assert value(families, "leased_done_requests_total", crawl=crawl) == 200
        assert value(families, "leased_items_scraped_total", crawl=crawl) == 200
        assert value(families, "leased_queued_requests", crawl=crawl) == 0
    assert time.time() - value(families, "leased_snapshot_timestamp_seconds", crawl=crawl_id) < 60
