"""Fleet-wide Scrapy stats (issue #14): each worker's stats deltas added to the crawl's
``fleet_stats`` in Redis (fleet/stats.py, lua/stats_flush.lua, observe/stats.py), shown
by ``scrapy leased status --json`` under ``stats``.

Real redis-server processes, real workers (tests/project) against the local site.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timezone

import pytest

from scrapy_leased._redis.connection import make_client
from scrapy_leased.fleet.stats import SCRIPTS, StatsFlusher, decode_fleet_stats
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.proxy import ProxyProcess
from tests.support.redis_server import RedisServer
from tests.test_commands import status_json
from tests.test_faults import wait_for


def flush_all(url: str, crawl: str, worker: str, batches: list[dict], seqs=None) -> StatsFlusher:
    async def main() -> StatsFlusher:
        client = make_client(url)
        try:
            f = StatsFlusher(client, CrawlKeys(crawl), worker)
            for stats in batches:
                await f.flush(stats)
            return f
        finally:
            await client.aclose()

    return asyncio.run(main())


def fleet(r, crawl: str) -> dict:
    return decode_fleet_stats(r.hgetall(CrawlKeys(crawl).fleet_stats).items())


# -- the script and the flusher --------------------------------------------------------

def test_deltas_added_maxima_kept_times_first_and_last(redis_server, crawl_id):
    t0 = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    t1 = datetime(2026, 12, 1, 10, 5, tzinfo=timezone.utc)
    t2 = datetime(2026, 12, 1, 10, 9, tzinfo=timezone.utc)
    # worker a: two flushes (the second only adds what changed)
    flush_all(redis_server.url, crawl_id, "a", [
        {"item_scraped_count": 3, "response_received_count": 4, "start_time": t1,
         "memusage/max": 100, "request_depth_max": 2, "finish_reason": "finished",
         "downloader/response_bytes": 10.5, "some_flag": True},
        {"item_scraped_count": 5, "response_received_count": 4, "start_time": t1,
         "memusage/max": 150, "request_depth_max": 2, "finish_time": t1,
         "elapsed_time_seconds": 300.0, "downloader/response_bytes": 11.0},
    ])
    # worker b started first, finished last, smaller maxima
    flush_all(redis_server.url, crawl_id, "b", [
        {"item_scraped_count": 7, "start_time": t0, "finish_time": t2, "memusage/max": 120,
         "request_depth_max": 4, "log_count/ERROR": 1},
    ])
    got = fleet(redis_server.client(), crawl_id)
    assert got == {
        "item_scraped_count": 12, "response_received_count": 4, "memusage/max": 150,
        "request_depth_max": 4, "downloader/response_bytes": 11.0, "log_count/ERROR": 1,
        "start_time": t0.timestamp(), "finish_time": t2.timestamp(),
        "elapsed_time_seconds": 540.0, "responses_per_minute": 4 / 9, "items_per_minute": 12 / 9,
    }


def test_a_flush_sent_again_is_applied_once(redis_server, crawl_id):
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    script = r.register_script(SCRIPTS.source("stats_flush"))
    args = [1, 60_000, "i", "item_scraped_count", 5, "f", "x", "0.5", "max", "m", 3]
    assert script(keys=[keys.fleet_stats, keys.stats_seq("w")], args=args) == 1
    assert script(keys=[keys.fleet_stats, keys.stats_seq("w")], args=args) == 0
    assert script(keys=[keys.fleet_stats, keys.stats_seq("w")],
                  args=[1, 60_000, "i", "item_scraped_count", 9]) == 0  # an older seq too
    assert fleet(r, crawl_id) == {"item_scraped_count": 5, "x": 0.5, "m": 3}
    # another worker's seq 1 is its own
    assert script(keys=[keys.fleet_stats, keys.stats_seq("v")], args=args) == 1
    assert fleet(r, crawl_id)["item_scraped_count"] == 10
    assert 0 < r.pttl(keys.stats_seq("w")) <= 60_000


def test_a_lost_reply_does_not_count_twice(tmp_path, crawl_id):
    """The proxy closes the connection instead of forwarding the flush's reply: redis-py
    sends the same call again (same seq), which Redis answers without adding again."""
    sha = hashlib.sha1(SCRIPTS.source("stats_flush").encode()).hexdigest()
    with RedisServer() as server, ProxyProcess(server.port, drops=2, every=1, shas=[sha],
                                               status_path=tmp_path / "proxy.json") as proxy:
        f = flush_all(proxy.url, crawl_id, "w", [{"item_scraped_count": 5},
                                                {"item_scraped_count": 8}])
        assert proxy.status()["dropped"] == 2
        assert f.resent >= 1 and f.flushes + f.resent == 2  # a drop may hit a NOSCRIPT reply
        assert fleet(server.client(), crawl_id) == {"item_scraped_count": 8}


# -- a real fleet ----------------------------------------------------------------------

FLEET = {"LEASED_LEASE_SECONDS": 2.0, "LEASED_SWEEP_INTERVAL": 0.5,
         "CONCURRENT_REQUESTS": 8, "LEASED_LOGSTATS_INTERVAL": 0}


def test_fleet_totals_after_a_kill9_and_a_restart(redis_server, crawl_id, make_site_process,
                                                  start_worker):
    """Done when (#14): 3 workers, a 2,000-page crawl, one killed with kill -9 and
    restarted: the fleet's response_received_count, item_scraped_count and
    downloader/response_status_count/200 are at least the pages crawled and at most that
    plus what was in flight at the kill."""
    n_pages = 2000
    site = make_site_process(pages=n_pages)
    r = redis_server.client(decode_responses=True)
    keys = CrawlKeys(crawl_id)
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=FLEET,
                            name=f"w{i}") for i in (1, 2, 3)]
    wait_for(lambda: int(r.hget(keys.stats, "done") or 0) >= 500, 120, "500 pages done")
    victim = workers[0]
    victim.kill9()
    in_flight = r.zcard(keys.leases)  # every live lease right after the kill, the victim's too
    recovered_before = int(r.hget(keys.stats, "recovered") or 0)
    workers.append(start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                                settings=FLEET, name="w1-again"))
    for w in workers[1:]:
        assert w.wait(180) == 0, w.log_tail()
        assert w.close_reason() == "finished"
    doc = status_json(redis_server.url, crawl_id)
    done, stats = doc["done"], doc["stats"]
    recovered = int(r.hget(keys.stats, "recovered") or 0) - recovered_before
    print(f"\ndone {done}, in flight at the kill {in_flight}, recovered {recovered}; fleet: "
          f"responses {stats['response_received_count']}, items "
          f"{stats['item_scraped_count']}, 200s {stats['downloader/response_status_count/200']}")
    assert done == n_pages and doc["todo"] == 0 and doc["processing"] == 0
    assert recovered <= in_flight
    for name in ("response_received_count", "item_scraped_count",
                 "downloader/response_status_count/200"):
        assert done <= stats[name] <= done + recovered, name
    # the survivors' own totals are in it exactly (they closed), the victim's up to its
    # last flush
    survivors = sum(w.stats()["item_scraped_count"] for w in workers[1:])
    assert survivors <= stats["item_scraped_count"]
    assert stats["finish_time"] >= stats["start_time"] > 0
    assert stats["elapsed_time_seconds"] > 0
    # a worker's own stats dump stays as in Scrapy: its share only
    assert all(w.stats()["item_scraped_count"] < n_pages for w in workers[1:])


def test_fleet_stats_setting():
    from scrapy.settings import Settings

    from scrapy_leased.addon import Addon
    from scrapy_leased.observe.stats import LeasedFleetStats
    from scrapy_leased.settings import LeasedConfigError

    on, off = Settings(), Settings({"LEASED_FLEET_STATS": False})
    for s in (on, off):
        Addon().update_settings(s)
    assert LeasedFleetStats in on.getdict("EXTENSIONS")
    assert LeasedFleetStats not in off.getdict("EXTENSIONS")
    with pytest.raises(LeasedConfigError, match=r"LEASED_FLEET_STATS \('maybe'\)"):
        Addon().update_settings(Settings({"LEASED_FLEET_STATS": "maybe"}))
