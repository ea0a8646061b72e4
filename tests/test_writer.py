"""The commit writer's linger (scrapy_leased/frontier/writer.py): a batch waits for the
next claim (flush), until it holds LINGER_PAGES settles, or until drain; never longer
than its linger. Real redis-server, real Frontier."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy_leased.frontier import NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.writer import LINGER_PAGES, CommitWriter
from tests.test_frontier import run

LONG = 600.0  # a linger no test waits for: whatever is written was sent by a trigger


def run_writer(srv: Any, crawl_id: str, body: Any) -> Any:
    """body(frontier, writer, claims, acked, results): a CommitWriter with a long linger
    over 40 claims of a fresh crawl; acked() reads the crawl's acked counter, results
    are the commit results in order."""
    keys = CrawlKeys(crawl_id)

    async def setup(f: Any, r: Any) -> Any:
        results: list[Any] = []
        writer = CommitWriter(f, lambda batch, result: results.append(result), linger=LONG)
        await f.enqueue([NewRequest(f"p{i}") for i in range(40)])
        claims = (await f.claim(40, "w")).claims
        assert len(claims) == 40
        return await body(f, writer, claims, lambda: int(r.hget(keys.stats, "acked") or 0),
                          results)

    return run(srv, crawl_id, setup)


def test_a_batch_waits_for_the_next_claim_then_goes_before_it(redis_server, crawl_id):
    async def body(f, writer, claims, acked, results):
        for token, env in claims[:3]:
            writer.add_ack(token, env.rid)
        for _ in range(20):  # many loop turns and Redis round trips: nothing is sent
            await f.client.ping()
        assert writer.pending and acked() == 0 and results == []
        writer.flush()  # what the claim loop does right before it claims
        assert await writer.drain(timeout=30)
        assert acked() == 3 and len(results) == 1
        assert results[0].acks == [3, 3, 3]

    run_writer(redis_server, crawl_id, body)


def test_enough_settles_are_sent_without_waiting(redis_server, crawl_id):
    async def body(f, writer, claims, acked, results):
        for token, env in claims[:LINGER_PAGES - 1]:
            writer.add_ack(token, env.rid)
        for _ in range(20):
            await f.client.ping()
        assert acked() == 0
        token, env = claims[LINGER_PAGES - 1]
        writer.add_ack(token, env.rid)  # the LINGER_PAGES-th: sent at once
        for _ in range(600):
            if acked() == LINGER_PAGES:
                break
            await asyncio.sleep(0.05)
        assert acked() == LINGER_PAGES and len(results) == 1

    run_writer(redis_server, crawl_id, body)


def test_drain_sends_at_once_with_children_before_acks(redis_server, crawl_id):
    async def body(f, writer, claims, acked, results):
        token, env = claims[0]
        writer.add_request(NewRequest("child"), None)
        writer.add_ack(token, env.rid)
        assert await writer.drain(timeout=30)
        assert acked() == 1 and not writer.pending
        assert results[0].queued == [True] and results[0].acks == [3]

    run_writer(redis_server, crawl_id, body)
