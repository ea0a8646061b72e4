"""The smaller holes of issue #11, each reproduced first (the docstrings say what the
code did before), against a real ``redis-server``:

- a crash suspect put back by claim.lua starved its lane while lanes with earlier names
  had work;
- the GCRA budget let a burst through when a lane's interval grew (Crawl-delay, 429);
- a queue member that is not UTF-8 raised UnicodeDecodeError out of the claim loop;
- growth without bound: the worker registry (workers killed leave their entry), old
  throughput buckets, the rate middleware's per-lane memory.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc

import pytest
import redis
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from scrapy_leased._redis.connection import make_client
from scrapy_leased.fleet import FleetAdmin
from scrapy_leased.frontier import NO_BUDGET, Budget, Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.meta import META_FREE_SINCE, META_NOT_BEFORE
from scrapy_leased.ratelimit import LeasedRateMiddleware
from scrapy_leased.runtime import attach
from scrapy_leased.worker.scheduler import LeasedScheduler
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_for


def frontier(url: str, crawl_id: str, lease_ms: int = 60_000, prune_ms: int = 0) -> Frontier:
    kw = {"prune_ms": prune_ms} if prune_ms else {}
    return Frontier(make_client(url), CrawlKeys(crawl_id), lease_ms=lease_ms, max_attempts=3,
                    **kw)


def run(srv, crawl_id: str, body, **kw):
    async def main():
        f = frontier(srv.url, crawl_id, **kw)
        try:
            return await body(f)
        finally:
            await f.client.aclose()

    return asyncio.run(main())


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- a suspect starving its lane ---------------------------------------------------------

def test_a_suspect_is_claimed_while_lanes_with_earlier_names_have_work(redis_server, crawl_id):
    """Before: a suspect (a request whose worker died holding it) met after other claims
    of a call was put back and its lane's time set to now, like every lane served: the
    next call served the lanes with earlier names first again and met it again after
    other claims, for as long as those lanes had work; the lane behind it waited too."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)

    async def body(f):
        await f.enqueue([NewRequest(f"{lane}{i}", lane=lane) for lane in "ab" for i in range(30)])
        await f.enqueue([NewRequest("z-after", lane="z")])
        r.lpush(keys.lane_fifo("z"), "999999|1|1|0|z|suspect")  # lease expired once
        r.incr(keys.todo)
        lanes: list[tuple[str, Budget]] = []
        for call in range(1, 30):
            res = await f.claim(3, "w", lanes)
            lanes = [(lane, NO_BUDGET) for lane in res.ready_lanes]
            payloads = [e.payload for _, e in res.claims]
            for token, env in res.claims:
                await f.ack(token, env.rid)
            if "suspect" in payloads:
                return call, payloads, int(r.get(keys.todo))
        return None, [], int(r.get(keys.todo))

    call, payloads, left = run(redis_server, crawl_id, body)
    print(f"\nthe suspect was claimed by call {call}, alone: {payloads}, {left} requests still "
          f"queued")
    assert call is not None and call <= 3
    assert payloads == ["suspect"]
    assert left > 40  # lanes a and b still had most of their work


# -- a burst when the interval grows -------------------------------------------------------

@pytest.mark.parametrize("penalty", ["crawl_delay", "slow_down"])
def test_a_longer_interval_lets_no_burst_through(redis_server, crawl_id, penalty):
    """Before: GCRA's clock kept the time of the requests started at the old interval;
    with a longer one, the allowance (burst - 1) x interval grew past it at once: 5 starts
    at 100 ms, then a Crawl-delay of 1 s let 4 more start at once: 9 starts within a few
    ms against a burst of 5."""
    budget = Budget(100, 5)

    async def slower(f, lane: str) -> None:
        if penalty == "crawl_delay":
            await f.penalize(lane, crawl_delay_ms=1000)
        else:
            await f.penalize(lane, slow_down=True)  # the interval doubles

    r = redis.Redis.from_url(redis_server.url)

    async def body(f):
        # the budget taken at download time (what the guarantee rests on)
        t_first = redis_ms(r)
        starts = [await f.acquire("h", budget) for _ in range(5)]
        await slower(f, "h")
        t0 = time.monotonic()
        more = 0
        while time.monotonic() - t0 < 0.05:
            if await f.acquire("h", budget) == 0:
                more += 1
        # what the time since the first start earned at the old interval, at most
        earned = (redis_ms(r) - t_first) // budget.interval_ms
        # claims are paced on their own clock: 5 at once, then the interval grows; when
        # the lane is ready again (100 ms later), only what that time earned at the old
        # interval may be claimed: one request
        t_first = redis_ms(r)
        claims = len((await f.claim(5, "w", [("c", budget)])).claims)
        await slower(f, "c")
        ready = int(r.zscore(CrawlKeys(crawl_id).lanes, "c"))
        while redis_ms(r) < ready:
            await asyncio.sleep(0.005)
        more_claims = len((await f.claim(5, "w", [("c", budget)])).claims)
        earned_claims = (redis_ms(r) - t_first) // budget.interval_ms
        return starts, (more, earned), claims, (more_claims, earned_claims)

    async def fill(f):
        await f.enqueue([NewRequest(f"c{i}", lane="c") for i in range(20)])

    run(redis_server, crawl_id, fill)
    starts, (more, earned), claims, (more_claims, earned_claims) = run(redis_server, crawl_id,
                                                                       body)
    r.close()
    assert starts == [0] * 5 and claims == 5
    print(f"\n{penalty}: {5 + more} starts within 50 ms, {claims} + {more_claims} claims "
          f"within about 100 ms (burst 5; earned meanwhile: {earned} and {earned_claims})")
    assert more <= earned  # 0 unless the machine took 100 ms for these calls
    assert more_claims <= max(earned_claims, 1)


# -- a queue member that is not UTF-8 ------------------------------------------------------

def _claim_beside(redis_server, crawl_id, good: list[str], member: bytes):
    """Queue ``good`` (enqueue) and then ``member`` as it is (by hand, in the same lane),
    claim them all: (the payloads claimed, the dead letters' total, the letters)."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client()

    async def body(f):
        await f.enqueue([NewRequest(p) for p in good])
        r.rpush(keys.lane_fifo(""), member)
        r.incr(keys.todo)
        res = await f.claim(len(good) + 3, "w")
        total, letters = await FleetAdmin(f.client, keys).dead_letters()
        return [e.payload for _, e in res.claims], total, letters

    try:
        return run(redis_server, crawl_id, body)
    finally:
        r.close()


def test_a_queue_member_that_is_not_utf8_is_dead_lettered_and_readable(redis_server, crawl_id):
    """Before: claim.lua handed it out and Frontier.claim raised UnicodeDecodeError, which
    killed the worker's claim loop."""
    bad = b"999999|0|0|0||{\"u\": \"http://x/\xff\xfe\"}"
    claimed, total, letters = _claim_beside(redis_server, crawl_id, ["good1", "good2"], bad)
    assert claimed == ["good1", "good2"]
    assert total == 1
    (letter,) = letters
    assert letter.rid == "999999" and letter.reason == "queue member is not valid UTF-8"
    assert letter.url == "http://x/??"


def test_long_members_are_checked_whole_valid_utf8_or_not(redis_server, crawl_id):
    """claim.lua reads a member's bytes 4,000 at a time (lib_settle.lua utf8_valid): a
    byte that is not UTF-8 past the first 4,000 is found, and a long member of valid
    multi-byte UTF-8 (or of ASCII only, past 8,000 bytes) is handed out whole."""
    ascii_long = "a" * 9_000
    accented = "é" * 5_000  # 10,000 bytes, none of them ASCII
    bad = b"999998|0|0|0||{\"u\": \"http://x/" + b"b" * 6_000 + b"\xff\"}"
    claimed, total, letters = _claim_beside(redis_server, crawl_id, [ascii_long, accented],
                                            bad)
    assert claimed == [ascii_long, accented]
    assert total == 1
    (letter,) = letters
    assert letter.rid == "999998" and letter.reason == "queue member is not valid UTF-8"


def test_a_worker_dead_letters_a_member_that_is_not_utf8_and_finishes(
        redis_server, make_site, start_worker, crawl_id):
    keys = CrawlKeys(crawl_id)
    r = redis_server.client()
    site = make_site(pages=30)
    r.rpush(keys.lane_fifo("127.0.0.1"), b"999999|0|0|0|127.0.0.1|{\"u\": \"http://\xff/\"}")
    r.zadd(keys.lanes, {"127.0.0.1": 0})
    r.incr(keys.todo)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0")
    assert w.wait(60) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    assert int(r.hget(keys.stats, "done")) == 30 and r.hexists(keys.dead, "999999")
    assert "Traceback" not in w.log_text()


# -- the worker registry -----------------------------------------------------------------

def _dead_workers(r: redis.Redis, keys: CrawlKeys, n: int, age_ms: int) -> None:
    t = redis_ms(r) - age_ms
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.zadd(keys.workers, {f"dead:{i}": t})
        p.hset(keys.worker_info, f"dead:{i}", json.dumps({"inflight": 0, "pid": i}))
        p.hset(keys.worker_acked, f"dead:{i}", i)
    p.execute()


def test_renewals_prune_10000_dead_workers_and_keep_the_live_ones(redis_server, crawl_id):
    """Before: a worker killed without closing left its registry entry for good."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    prune_ms = 150_000  # 5 worker TTLs of 30 s
    _dead_workers(r, keys, 10_000, age_ms=prune_ms + 60_000)
    r.zadd(keys.workers, {"recent": redis_ms(r) - prune_ms // 2})  # silent, not for long

    async def body(f):
        for _ in range(12):
            await f.renew("live", [], info=json.dumps({"inflight": 0}))

    run(redis_server, crawl_id, body, prune_ms=prune_ms)
    assert set(r.zrange(keys.workers, 0, -1)) == {"live", "recent"}
    assert set(r.hkeys(keys.worker_info)) == {"live"}
    assert r.hlen(keys.worker_acked) == 0  # pruned with the registry entries


def test_a_crawl_leaves_no_registry_entry_of_10000_dead_workers(
        redis_server, make_site, start_worker, crawl_id):
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    _dead_workers(r, keys, 10_000, age_ms=10 * 60_000)  # dead for 20 worker TTLs
    site = make_site(pages=150, delay=0.05)
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_RENEW_INTERVAL": 0.2}
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                       name=f"w{i}") for i in (1, 2)]
    wait_for(lambda: r.zcard(keys.workers) == 2, 60, "only the 2 live workers registered", ws)
    assert r.hlen(keys.worker_info) == 2
    for w in ws:
        assert w.wait(60) == 0, w.log_tail()
        assert w.close_reason() == "finished"
    assert r.zcard(keys.workers) == 0 and r.hlen(keys.worker_info) == 0
    assert r.hlen(keys.worker_acked) == 0  # each worker's count left with it


# -- throughput buckets --------------------------------------------------------------------

def test_old_throughput_buckets_are_dropped(redis_server, crawl_id):
    """Before: each commit deleted the buckets 7 to 11 behind the current one only, so a
    crawl that paused for more than two minutes kept its older buckets for good."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    now_bucket = redis_ms(r) // 10_000
    r.hset(keys.throughput, mapping={str(now_bucket - 100 - i): 1 for i in range(50)})

    async def body(f):
        await f.enqueue([NewRequest("a")])
        (token, env), = (await f.claim(1, "w")).claims
        return await f.ack(token, env.rid)

    assert run(redis_server, crawl_id, body) == 3
    buckets = {int(b) for b in r.hkeys(keys.throughput)}
    assert buckets <= set(range(now_bucket - 6, now_bucket + 2)) and len(buckets) >= 1


# -- the rate middleware's memory ----------------------------------------------------------

@pytest.mark.integration
def test_a_worker_penalizing_30000_lanes_keeps_its_memory_flat(crawl_id):
    """Before: LeasedRateMiddleware remembered every lane it ever penalized (a dict
    entry per lane, for the life of the worker). Only the penalties of the last
    LEASED_RATE_FREE_GRACE matter; the older ones are dropped now. Measured with
    tracemalloc while 30,000 lanes answer 429 (each a real penalize.lua call): a dict
    entry per lane would keep ~2.5 MB of the last 25,000."""
    n, batch = 30_000, 50  # (the client's pool has 100 connections)
    crawler = get_crawler(settings_dict={"LEASED_RATE_BACKOFF": 1})
    mw = LeasedRateMiddleware.from_crawler(crawler)

    async def main(url: str):
        f = frontier(url, crawl_id)
        mw._frontier = lambda: f  # the scheduler's frontier, as in a worker
        sizes = {}
        try:
            async def penalize(i: int) -> None:
                request = Request(f"http://h{i}.example/p", meta={"leased_lane": f"lane{i}"})
                await mw.process_response(request, Response(request.url, status=429,
                                                            request=request))

            for start in range(0, n, batch):
                await asyncio.gather(*(penalize(i) for i in range(start, start + batch)))
                done = start + batch
                if done == 5_000:  # from here on, count what is allocated and kept
                    gc.collect()
                    tracemalloc.start()
                elif done == n:
                    gc.collect()
                    sizes["kept"] = tracemalloc.get_traced_memory()[0]
                    tracemalloc.stop()
        finally:
            await f.client.aclose()
        return sizes

    t0 = time.monotonic()
    with RedisServer() as srv:  # private: 100,000 rate keys (they expire after an hour)
        sizes = asyncio.run(main(srv.url))
    growth = sizes["kept"]
    print(f"\n{n:,} lanes penalized in {time.monotonic() - t0:.1f} s: memory allocated and "
          f"still held between the 5,000th and the {n:,}th: {growth / 1e3:.0f} kB (tracemalloc);"
          f" lanes remembered: {len(mw._penalized)}")
    assert crawler.stats.get_value("leased/budget_penalties") == n
    assert len(mw._penalized) < 20_000
    assert growth < 1_000_000  # a dict entry per lane would be ~2.5 MB


# -- a block set after a claim reaches the claim's download ------------------------------

class _Worker(LeasedScheduler):
    """Just what LeasedRateMiddleware uses of a worker's scheduler: its frontier, its
    tasks, and which requests are its claims (every request here)."""

    def __init__(self, f: Frontier) -> None:  # no BaseScheduler set-up: a stand-in
        self.frontier = f
        self._closing = False
        self._tasks = []

    def is_handed(self, request: Request) -> bool:
        return True


def test_a_block_set_by_another_worker_holds_back_a_free_claim_made_before_it(
        redis_server, crawl_id):
    """Before: a request claimed from a lane with nothing to enforce started without a
    download-time check within LEASED_RATE_FREE_GRACE of its claim unless this worker had
    penalized the lane itself; a 429 another worker got meanwhile (its block in Redis)
    did not stop it. With claims made ahead of the downloader, such a request could reach
    the host during the block. Now penalize.lua publishes the lane and every worker
    listens: worker B's claim made before worker A's 429 is checked at download time and
    held back for the block; one of another lane still skips the check."""

    def worker(f: Frontier):
        crawler = get_crawler(settings_dict={"LEASED_RATE_FREE_GRACE": 5})
        mw = LeasedRateMiddleware.from_crawler(crawler)
        scheduler = _Worker(f)
        attach(crawler, scheduler)  # what the scheduler does when the engine opens it
        return crawler, mw, scheduler

    async def until(pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"no {what} within {timeout} s"
            await asyncio.sleep(0.01)

    def free_request(path: str, lane: str, claimed: float) -> Request:
        return Request(f"http://{lane}.example{path}",
                       meta={META_FREE_SINCE: claimed, "leased_lane": lane})

    async def main():
        fa, fb = frontier(redis_server.url, crawl_id), frontier(redis_server.url, crawl_id)
        (_, mw_a, sa), (crawler_b, mw_b, sb) = worker(fa), worker(fb)
        try:
            # B's first free request starts its watch (not listening yet: checked)
            assert await mw_b.process_request(free_request("/0", "h", time.monotonic())) is None
            assert crawler_b.stats.get_value("leased/budget_free") is None
            await until(lambda: mw_b._watch.listening_since is not None, 10, "subscription")
            claimed = time.monotonic()  # B claims two requests, lanes h and other
            blocked = free_request("/1", "h", claimed)
            other = free_request("/1", "other", claimed)
            got_429 = Request("http://h.example/2", meta={"leased_lane": "h"})
            await mw_a.process_response(got_429, Response(got_429.url, status=429, request=got_429,
                                                          headers={"Retry-After": "5"}))
            await until(lambda: "h" in mw_b._penalized, 5, "penalty heard by B")
            assert await mw_b.process_request(other) is None  # not checked: started
            assert crawler_b.stats.get_value("leased/budget_free") == 1
            assert await mw_b.process_request(blocked) is blocked  # held back
            assert 4 < blocked.meta[META_NOT_BEFORE] <= 5
        finally:
            for s in (sa, sb):
                for task in s._tasks:
                    task.cancel()
                await asyncio.gather(*s._tasks, return_exceptions=True)
            await fa.client.aclose()
            await fb.client.aclose()

    asyncio.run(main())
