"""The shared rate budget's edges, against a real ``redis-server``: a longer interval
(Crawl-delay, 429) lets no burst through; a worker penalizing many lanes keeps its memory
flat; a block set by another worker holds back a claim made before it. Each docstring
says what the code did before."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from scrapy_leased.frontier import Budget, Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.meta import META_FREE_SINCE, META_NOT_BEFORE
from scrapy_leased.ratelimit import LeasedRateMiddleware
from scrapy_leased.runtime import attach
from scrapy_leased.worker.scheduler import LeasedScheduler
from tests.support.frontier import new_frontier as frontier
from tests.support.frontier import run_frontier
from tests.support.redis_server import RedisServer


def run(srv, crawl_id: str, body, **options):
    return run_frontier(srv.url, crawl_id, body, **options)


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


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
        starts = [(await f.acquire("h", budget))[0] for _ in range(5)]
        await slower(f, "h")
        t0 = time.monotonic()
        more = 0
        while time.monotonic() - t0 < 0.05:
            if (await f.acquire("h", budget))[0] == 0:
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
        self.stats: Any = None  # the crawler's, set by worker() below

    def is_handed(self, request: Request) -> bool:
        return True

    def count(self, name: str, n: int = 1) -> None:  # at once: the test reads the stats
        self.stats.inc_value(name, n)


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
        scheduler.stats = crawler.stats
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
