"""Which requests are acked and which fail: one real crawl through every completion
scenario (the engine's own finish time decides; the failure middleware and Scrapy's
signals decide ack or fail). With LEASED_MAX_ATTEMPTS=1 a failure is a dead letter; a
final download error without errback is one at once (Scrapy would not download it
again), one that an errback handled is done."""

from __future__ import annotations

import json

from scrapy_leased.frontier import Envelope
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.redis_server import free_port

ACKED = ["/p/1", "/p/4", "/p/5", "/status/404", "/status/410", "/p/6", "/flaky/a?fail=2",
         "/redirect/7", "/flaky/b?fail=99", "/y"]
FAILED = {"/p/2": "callback error: RuntimeError: boom", "/p/3": "item pipeline error: ValueError",
          "/x": "download error: DownloadConnectionRefusedError"}


def _dead_by_path(client, keys: CrawlKeys) -> dict[str, dict]:
    out = {}
    for raw in client.hvals(keys.dead):
        entry = json.loads(raw)
        payload = json.loads(Envelope.parse(entry["envelope"]).payload)
        path = "/" + payload["u"].split("/", 3)[3]
        out[path] = entry
    return out


def test_every_completion_scenario_is_acked_or_failed_as_documented(
        redis_server, crawl_id, site, start_worker):
    dead_url = f"http://127.0.0.1:{free_port()}"
    w = start_worker(redis_server.url, crawl_id, None, spider="outcomes",
                     settings={"LEASED_MAX_ATTEMPTS": 1},
                     args={"base": site.url, "dead_url": dead_url})
    assert w.wait(120) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    client = redis_server.client()
    keys = CrawlKeys(crawl_id)
    stats = {k.decode(): int(v) for k, v in client.hgetall(keys.stats).items()}
    dead = _dead_by_path(client, keys)
    assert set(dead) == set(FAILED), dead
    for path, reason in FAILED.items():
        assert dead[path]["reason"].startswith(reason), (path, dead[path])
        assert dead[path]["attempts"] == 1
    # the redirect's target (/p/7) is a new request, deduplicated like any other (as
    # Scrapy's dupefilter sees it); retries continued their claims in the worker
    assert stats["done"] == len(ACKED) + 1
    assert stats["acked"] == len(ACKED) + 1
    assert stats["claimed"] == len(ACKED) + len(FAILED) + 1
    assert client.zcard(keys.leases) == 0 and client.zcard(keys.lanes) == 0
    assert int(client.get(keys.todo)) == 0
    assert stats["enqueued"] == len(ACKED) + len(FAILED) + 1
    fetched = site.count_by_path()
    assert fetched["/flaky/a?fail=2"] == 3 and fetched["/p/7"] == 1
    urls = {i["url"] for i in w.items()}
    assert f"{site.url}/p/7" in urls and f"{site.url}/flaky/a?fail=2" in urls
    refused = [i["url"] for i in w.items() if i["url"].startswith(dead_url)]
    assert refused == [f"{dead_url}/y"]  # the errback ran once
