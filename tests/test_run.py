"""The crawl's run (run.py, lua/run_*.lua) against a real Redis: one seeder per run,
however many workers open at once; a dead seeder's run is seeded again; the run ends
with its last worker (or expires when they all died) and the next worker seeds anew."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.run import SEED, SEEDED, WAIT, RunMarker


@asynccontextmanager
async def markers(url: str, crawl_id: str, ids: list[str], ttl_ms: int = 30_000,
                  worker_ttl_ms: int = 30_000) -> AsyncIterator[list[RunMarker]]:
    """A RunMarker per worker id, each on its own client (closed on the way out)."""
    clients = [make_client(url) for _ in ids]
    try:
        yield [RunMarker(c, CrawlKeys(crawl_id), i, ttl_ms, worker_ttl_ms)
               for c, i in zip(clients, ids)]
    finally:
        for c in clients:
            await c.aclose()


def run(coro):
    return asyncio.run(coro)


def test_eight_workers_opening_at_once_one_seeds(redis_server, crawl_id):
    async def main():
        async with markers(redis_server.url, crawl_id, [f"w{i}" for i in range(8)]) as ms:
            return await asyncio.gather(*(m.join() for m in ms))

    for attempt in range(5):
        answers = run(main())
        if attempt == 0:
            seeder = answers.index(SEED)
            assert answers.count(SEED) == 1 and answers.count(WAIT) == 7
        else:  # the same run: the seeder is told again it seeds, the others wait
            assert answers == [SEED if i == seeder else WAIT for i in range(8)]


def test_a_seeded_run_is_never_seeded_again_while_it_lasts(redis_server, crawl_id):
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main():
        async with markers(redis_server.url, crawl_id, ["a", "b"]) as (a, b):
            assert await a.join() == SEED and await a.seeded()
            assert not await b.seeded()  # only the seeder marks its run seeded
            r.zrem(keys.workers, "a")  # the seeder is gone (it finished start() first)
            assert await b.join() == SEEDED
            assert await b.refresh()

    run(main())
    assert r.get(keys.run) == b"seeded"


def test_a_seeder_that_died_during_start_is_replaced_by_the_next_joiner(redis_server,
                                                                       crawl_id):
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main():
        async with markers(redis_server.url, crawl_id, ["a", "b", "c"],
                           worker_ttl_ms=60_000) as (a, b, c):
            assert await a.join() == SEED
            assert await b.join() == WAIT  # a is alive, seeding
            r.zadd(keys.workers, {"a": 1})  # a's last heartbeat: long ago (it died)
            assert await c.join() == SEED  # c seeds the run again
            assert await b.join() == WAIT  # c is alive, seeding
            assert r.get(keys.run) == b"c"
            assert not await a.seeded()  # a late seeder changes nothing

    run(main())


def test_the_run_ends_with_its_last_worker_and_the_next_one_seeds(redis_server, crawl_id):
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main():
        async with markers(redis_server.url, crawl_id, ["a", "b", "c"]) as (a, b, c):
            assert await a.join() == SEED and await a.seeded()
            assert await b.join() == SEEDED
            assert not await a.leave()  # b is still alive: the run goes on
            assert r.exists(keys.run)
            assert await b.leave()  # the last one: the run ended
            assert not r.exists(keys.run)
            assert await c.join() == SEED  # a new run

    run(main())


def test_a_run_whose_workers_all_died_expires(redis_server, crawl_id):
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)

    async def main():
        async with markers(redis_server.url, crawl_id, ["a", "b"], ttl_ms=300) as (a, b):
            assert await a.join() == SEED and await a.seeded()
            # nobody refreshes it (a was killed): wait for Redis to expire it
            deadline = time.monotonic() + 30
            while r.exists(keys.run):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert await b.join() == SEED

    run(main())
