"""What one snapshot costs Redis (issue #14): what the dashboard reads at each poll
(``FleetReader.read`` + ``dead_letters``) and what one metrics scrape reads, counted with
``INFO commandstats`` (the commands run inside Lua scripts included), for a crawl with 100
and one with 10,000 queued requests (and 10 or 1,000 dead letters, 12 or 200 hosts): the
same commands, the same number of times. No KEYS, no SCAN, no scan of a queue, of the
seen sets or of the dead letters.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from scrapy.settings import Settings

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.observe.metrics import render
from scrapy_leased.observe.reader import FleetReader
from scrapy_leased.settings import Budgets
from tests.support.redis_server import RedisServer


def commandstats(r) -> dict[str, int]:
    return {name: int(v["calls"]) for name, v in r.info("commandstats").items()}


async def build(url: str, crawl: str, queued: int, dead: int, hosts: int) -> None:
    client = make_client(url)
    f = Frontier(client, CrawlKeys(crawl), lease_ms=60_000, max_attempts=3)
    try:
        requests = [NewRequest(json.dumps({"u": f"http://h{i % hosts}.test/{i}"}),
                               bucket=i % 64, member=i, lane=f"h{i % hosts}.test")
                    for i in range(queued)]
        for i in range(0, queued, 500):
            await f.enqueue(requests[i:i + 500])
        for w in ("w1", "w2", "w3"):
            await f.renew(w, [], json.dumps({"inflight": 0, "capacity": 16}))
        await client.hset(f.keys.dead, mapping={
            f"{i}": json.dumps({"reason": "test", "attempts": 1, "t": 0, "envelope": ""})
            for i in range(dead)})
        await client.hset(f.keys.fleet_stats, mapping={"item_scraped_count": queued})
    finally:
        await client.aclose()


async def one_read(url: str, crawl: str) -> None:
    client = make_client(url)
    reader = FleetReader(client, url, Budgets.from_settings(Settings()), worker_ttl_ms=30_000,
                         lease_ms=30_000, max_attempts=4, default_capacity=16, only=[crawl])
    try:
        reading = await reader.read(crawl)  # the dashboard's poll ...
        await reader.dead_letters(crawl)
        render([reading])  # ... and a metrics scrape, from the same reading
        render([await reader.read(crawl)])
    finally:
        await client.aclose()


@pytest.mark.parametrize("sizes", [((100, 10, 12), (10_000, 1000, 200))])
def test_one_snapshot_costs_the_same_whatever_the_crawl_size(sizes, crawl_id):
    costs = []
    with RedisServer() as server:
        r = server.client()
        for queued, dead, hosts in sizes:
            crawl = f"{crawl_id}-{queued}"
            asyncio.run(build(server.url, crawl, queued, dead, hosts))
            asyncio.run(one_read(server.url, crawl))  # scripts loaded (SCRIPT LOAD once)
            before = commandstats(r)
            asyncio.run(one_read(server.url, crawl))
            after = commandstats(r)
            cost = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            cost["cmdstat_info"] -= 1  # the INFO commandstats of ``before``
            costs.append(cost)
    small, large = costs
    print(f"\nRedis commands for one dashboard poll + two metrics reads: {sum(small.values())} "
          f"(100 queued) and {sum(large.values())} (10,000 queued): {small}")
    assert small == large
    scans = {"cmdstat_keys", "cmdstat_scan", "cmdstat_hgetall_dead", "cmdstat_smembers",
             "cmdstat_lrange", "cmdstat_zrangebyscore"}
    assert not scans & set(small), small
    assert sum(small.values()) < 150
