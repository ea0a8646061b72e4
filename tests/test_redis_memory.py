"""A Redis whose memory is full (``maxmemory`` reached, ``noeviction``), caused for real
with ``CONFIG SET maxmemory`` on a private ``redis-server``, and scripts that find a
state they did not expect.

What must hold: every write script either runs completely or changes nothing (Redis 7
script flags: a ``#!lua`` script without ``allow-oom`` is refused up front when Redis is
out of memory, instead of failing at its first write); renewals run under OOM
(``allow-oom``) while recovery, which needs memory, is refused: no live worker is
charged a crash; once memory is freed the crawl goes on. (An evicting policy is refused
at start: tests/test_redis_startup.py.)
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Failure, Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_for


def frontier(url: str, crawl_id: str, lease_ms: int = 60_000) -> Frontier:
    return Frontier(make_client(url), CrawlKeys(crawl_id), lease_ms=lease_ms, max_attempts=3)


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def dump_state(r: redis.Redis, keys: CrawlKeys) -> dict[bytes, bytes]:
    """Every key of the crawl, serialized (DUMP): for 'nothing changed' checks."""
    out = {}
    for key in sorted(r.scan_iter(match=f"leased:{{{keys.crawl_id}}}:*", count=1000)):
        if b":call:" not in key:
            out[key] = r.dump(key)
    return out


@pytest.fixture
def server():
    with RedisServer() as srv:
        yield srv


def test_under_oom_a_live_worker_keeps_its_lease_and_nothing_is_half_done(server, crawl_id):
    """Before: renew.lua was refused under OOM (its first write is deny-oom) while
    recover.lua ran (its first write, a ZREM, is not): the lease of a live worker
    expired and was requeued with an attempt and an expiry charged."""
    keys = CrawlKeys(crawl_id)
    r = server.client()

    async def main():
        live = frontier(server.url, crawl_id, lease_ms=400)
        other = frontier(server.url, crawl_id, lease_ms=400)
        try:
            await live.enqueue([NewRequest(f"r{i}") for i in range(3)])
            (token, env), = (await live.claim(1, "live")).claims
            (dead, _), = (await other.claim(1, "dead")).claims  # never renewed
            await other.recover()  # load the scripts while memory allows
            r.config_set("maxmemory", 1)  # full
            before = dump_state(r, keys)
            # claims and commits are refused whole, changing nothing
            for call in (lambda: other.claim(2, "other"),
                         lambda: other.commit(enqueue=[NewRequest("new")],
                                              acks=[(token, env.rid)])):
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    await call()
            assert dump_state(r, keys) == before
            # the live worker renews for 5 lease lengths; recovery is tried all along,
            # refused once the dead worker's lease has expired
            refused = 0
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                assert await live.renew("live", [token]) == []
                try:
                    await other.recover()
                except redis.exceptions.OutOfMemoryError:
                    refused += 1
                await asyncio.sleep(0.1)
            assert int(r.zscore(keys.leases, token)) > redis_ms(r)  # still its lease
            assert r.zscore(keys.leases, dead) is not None  # waits for memory
            r.config_set("maxmemory", 0)
            assert await other.recover() == (1, 0, 0)  # the dead worker's, charged
            assert await live.ack(token, env.rid) == 3
            return refused
        finally:
            await live.client.aclose()
            await other.client.aclose()

    refused = asyncio.run(main())
    assert refused > 0
    st = {k.decode(): int(v) for k, v in r.hgetall(keys.stats).items()}
    assert st["recovered"] == 1 and st["done"] == 1


def test_scripts_finish_whatever_state_they_find(server, crawl_id):
    """A lease whose envelope is gone (deleted by hand, or evicted by a Redis that
    evicts): release.lua and a failing commit used to raise after their first writes,
    leaving them half done. Now each settles what it can and changes nothing else."""
    keys = CrawlKeys(crawl_id)
    r = server.client(decode_responses=True)

    async def main():
        f = frontier(server.url, crawl_id)
        try:
            await f.enqueue([NewRequest(f"r{i}") for i in range(4)])
            claims = (await f.claim(4, "w")).claims
            (t1, e1), (t2, e2), (t3, e3), (t4, e4) = claims
            r.hdel(keys.inflight, t1, t2)  # two leases without their envelope
            released = await f.release("w", [t1, t3])  # t1: nothing to put back
            failed = await f.commit(fails=[Failure(t2, "boom", rid=e2.rid)],
                                    acks=[(t4, e4.rid)])
            return released, failed, (t3, e3)
        finally:
            await f.client.aclose()

    released, failed, (t3, e3) = asyncio.run(main())
    assert released == 1  # t3 went back to the queue, t1 had nothing to put back
    assert failed.fails == [0] and failed.acks == [3]
    assert r.zcard(keys.leases) == 0 and r.hlen(keys.inflight) == 0 == r.hlen(keys.owners)
    assert [e.split("|")[-1] for e in r.lrange(keys.lane_fifo(""), 0, -1)] == ["r2"]


def test_a_full_redis_charges_no_attempt_and_the_crawl_goes_on_once_memory_is_freed(
        server, make_site, start_worker, crawl_id):
    """2 workers; Redis is full (maxmemory 1 byte, noeviction) for 3 lease lengths in
    the middle of the crawl. Claims, commits, item writes (the crawl's Redis is the item
    store) and recovery wait; renewals go on. Once memory is freed the crawl finishes:
    no request was charged an attempt, none was recovered or failed, each page was
    fetched once."""
    pages, lease = 400, 2.0
    site = make_site(pages=pages, delay=0.05)
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_LEASE_SECONDS": lease,
                "LEASED_RENEW_INTERVAL": 0.5, "LEASED_SWEEP_INTERVAL": 0.5,
                "LEASED_LOGSTATS_INTERVAL": 0}
    keys = CrawlKeys(crawl_id)
    r = server.client(decode_responses=True)
    workers = [start_worker(server.url, crawl_id, site.url + "/p/0", settings=settings,
                            name=f"w{i}") for i in (1, 2)]
    wait_for(lambda: int(r.hget(keys.stats, "done") or 0) >= 100, 60, "100 pages done", workers)
    r.config_set("maxmemory", 1)
    full_at = time.monotonic()
    done_when_full = int(r.hget(keys.stats, "done") or 0)
    time.sleep(3 * lease)  # every lease held then would have expired without renewals
    rejected = int(r.info("commandstats")["cmdstat_evalsha"].get("rejected_calls", 0))
    done_still = int(r.hget(keys.stats, "done") or 0)
    registered = r.zcard(keys.workers)
    r.config_set("maxmemory", 0)
    full_for = time.monotonic() - full_at
    for w in workers:
        assert w.wait(120) == 0, w.log_tail()
    st = {k: int(v) for k, v in r.hgetall(keys.stats).items()}
    counts = site.count_by_path(include_query=False)
    print(f"\nRedis full for {full_for:.1f} s at {done_when_full} pages done: {rejected} script "
          f"calls refused (OOM), done {done_still} meanwhile; then done {st['done']}, "
          f"recovered {st.get('recovered', 0)}, failed {st.get('failed', 0)}, pages fetched "
          f"twice {sum(1 for c in counts.values() if c > 1)}")
    assert rejected > 0
    assert done_still - done_when_full <= 10  # (commits in flight when it filled up)
    assert registered == 2  # both still renewing
    assert st["done"] == pages and st["enqueued"] == pages
    assert "recovered" not in st and "failed" not in st and "dead" not in st
    assert set(counts) == site.all_page_paths() and set(counts.values()) == {1}
    for w in workers:
        ws = w.stats()
        assert w.close_reason() == "finished"
        assert "leased/claimed_retry" not in ws and "leased/lease_lost" not in ws
        assert "Traceback" not in w.log_text(), w.log_tail(80)
        assert "used memory > 'maxmemory'" in w.log_text()  # it really met a full Redis
