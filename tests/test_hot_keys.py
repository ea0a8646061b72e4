"""The crawl's busiest keys are kept hashtables and skiplists (lua/hot_keys.lua): the
same content, read and written as before, at a fraction of the instructions of a
listpack's linear search. Real redis-server, real claims and commits."""

from __future__ import annotations

import dataclasses

import pytest

from scrapy_leased.frontier import NO_BUDGET
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for
from tests.test_crawl import assert_exit
from tests.test_frontier import run, url_request

pytestmark = pytest.mark.integration

HOT = ("lanes", "leases", "inflight", "owners", "stats", "control", "throughput",
       "worker_acked", "workers")


def encodings(r, keys: CrawlKeys) -> dict[str, str | None]:
    return {name: r.object("encoding", getattr(keys, name)) for name in HOT}


def contents(r, keys: CrawlKeys) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in HOT:
        key = getattr(keys, name)
        kind = r.type(key)
        out[name] = (r.hgetall(key) if kind == "hash"
                     else r.zrange(key, 0, -1, withscores=True) if kind == "zset" else kind)
    return out


def test_the_busiest_keys_become_hashtables_with_the_same_content(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        lanes = [f"h{i}.example" for i in range(5)]
        await f.enqueue([dataclasses.replace(url_request(f"http://{lane}/{i}"), lane=lane)
                         for lane in lanes for i in range(4)])
        held = (await f.claim(6, "w1", [(lane, NO_BUDGET) for lane in lanes])).claims
        await f.commit(acks=[(t, e.rid) for t, e in held[:2]])
        r.hset(keys.control, "state", "running")
        before = contents(r, keys)
        assert set(encodings(r, keys).values()) == {"listpack"}
        assert await f.hash_hot_keys() == len(HOT)
        assert contents(r, keys) == before  # nothing added, nothing lost
        assert encodings(r, keys) == {name: ("skiplist" if r.type(getattr(keys, name)) == "zset"
                                             else "hashtable") for name in HOT}
        assert await f.hash_hot_keys() == 0  # they stay so
        # and the crawl goes on with them: the rest claimed, acked, counted
        rest = (await f.claim(20, "w1", [(lane, NO_BUDGET) for lane in lanes])).claims
        held = held[2:] + rest
        await f.commit(acks=[(t, e.rid) for t, e in held])
        assert len(held) == 18 and r.zcard(keys.leases) == 0
        assert int(r.hget(keys.stats, "done")) == 20
        assert encodings(r, keys)["stats"] == "hashtable"

    run(redis_server, crawl_id, body)


def test_keys_of_another_type_or_missing_are_left_alone(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        r.set(keys.stats, "set by hand")
        r.rpush(keys.lanes, "a list")
        assert await f.hash_hot_keys() == 0
        assert r.get(keys.stats) == "set by hand" and r.lrange(keys.lanes, 0, -1) == ["a list"]
        assert not r.exists(keys.leases, keys.owners, keys.inflight)

    run(redis_server, crawl_id, body)


def test_a_worker_s_sweep_hashes_them(redis_server, make_site, start_worker, crawl_id):
    """A real worker: its sweep (every LEASED_SWEEP_INTERVAL) turns the crawl's keys
    into hashtables and skiplists (kept alive after its crawl, so that the keys it
    crawled with are still there to look at)."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    site = make_site(pages=50)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_SWEEP_INTERVAL": 0.2, "LEASED_KEEP_ALIVE": True})
    wait_for(lambda: int(r.hget(keys.stats, "done") or 0) == 50, 60, "the 50 pages done", [w])
    wait_for(lambda: r.object("encoding", keys.stats) == "hashtable"
             and r.object("encoding", keys.workers) == "skiplist", 60,
             "the stats and workers keys hashed", [w])
    w.sigterm()
    assert_exit(w, "shutdown")
    assert int(r.hget(keys.stats, "done")) == 50
