"""Queue order: the frontier serves requests in the order Scrapy's own scheduler would,
for Scrapy's queue settings (order.py, lua/lib_settle.lua). The reference is Scrapy's
``ScrapyPriorityQueue`` itself, fed the same requests."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest
from scrapy import Request
from scrapy.pqueues import ScrapyPriorityQueue
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.order import FIFO, LIFO, START_FIFO, START_LIFO, QueueOrder

LIFO_Q = "scrapy.squeues.LifoMemoryQueue"
FIFO_Q = "scrapy.squeues.FifoMemoryQueue"


def order_of(**settings: Any) -> QueueOrder:
    return QueueOrder.from_settings(Settings(settings) if settings else Settings())


def test_scrapy_defaults_lifo_and_start_requests_fifo_apart():
    o = QueueOrder.from_settings(get_crawler().settings)
    assert (o.regular, o.start) == (LIFO, START_FIFO)
    assert o.of(Request("http://a/")) == LIFO
    assert o.of(Request("http://a/", meta={"is_start_request": True})) == START_FIFO


@pytest.mark.parametrize(("settings", "expected"), [
    ({"SCHEDULER_MEMORY_QUEUE": FIFO_Q, "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue"},
     (FIFO, START_FIFO)),
    ({"SCHEDULER_START_MEMORY_QUEUE": LIFO_Q}, (LIFO, START_LIFO)),
    ({"SCHEDULER_START_MEMORY_QUEUE": None}, (LIFO, None)),
    ({"SCHEDULER_START_MEMORY_QUEUE": ""}, (LIFO, None)),
    # with JOBDIR Scrapy uses the disk queues: so does the order
    ({"JOBDIR": "x", "SCHEDULER_DISK_QUEUE": "scrapy.squeues.MarshalFifoDiskQueue",
      "SCHEDULER_MEMORY_QUEUE": LIFO_Q}, (FIFO, START_FIFO)),
    ({"JOBDIR": "x", "SCHEDULER_START_DISK_QUEUE": None}, (LIFO, None)),
    ({"SCHEDULER_MEMORY_QUEUE": "queuelib.queue.FifoMemoryQueue"}, (FIFO, START_FIFO)),
])
def test_order_follows_scrapys_queue_settings(settings, expected):
    o = QueueOrder.from_settings(get_crawler(settings_dict=settings).settings)
    assert (o.regular, o.start) == expected


def test_an_unknown_queue_class_is_treated_as_scrapys_default_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        o = order_of(SCHEDULER_MEMORY_QUEUE="collections.deque",
                     SCHEDULER_START_MEMORY_QUEUE="no.such.Queue")
    assert (o.regular, o.start) == (LIFO, START_FIFO)
    text = caplog.text
    assert "SCHEDULER_MEMORY_QUEUE ('collections.deque') is neither a FIFO nor a LIFO" in text
    assert "SCHEDULER_START_MEMORY_QUEUE ('no.such.Queue') cannot be loaded" in text


# ------------------------------------------------------------- against Scrapy's queue


def scrapy_queue(settings: dict[str, Any]) -> tuple[ScrapyPriorityQueue, QueueOrder]:
    crawler = get_crawler(settings_dict=settings)
    s = crawler.settings
    start_cls = s.get("SCHEDULER_START_MEMORY_QUEUE")
    pq = ScrapyPriorityQueue(crawler, load_object(s["SCHEDULER_MEMORY_QUEUE"]), "",
                             start_queue_cls=load_object(start_cls) if start_cls else None)
    return pq, QueueOrder.from_settings(s)


@pytest.mark.parametrize("settings", [
    {},  # Scrapy's defaults: LIFO, start requests FIFO and after the others
    {"SCHEDULER_MEMORY_QUEUE": FIFO_Q},  # breadth-first
    {"SCHEDULER_START_MEMORY_QUEUE": LIFO_Q},
    {"SCHEDULER_START_MEMORY_QUEUE": None},  # start requests share the queues
    {"SCHEDULER_MEMORY_QUEUE": FIFO_Q, "SCHEDULER_START_MEMORY_QUEUE": None},
], ids=["default", "fifo", "lifo-start", "shared", "fifo-shared"])
def test_claims_come_in_scrapys_order(redis_server, crawl_id, settings):
    """Random priorities (-3..3, mostly 0), start and other requests, pushes and pops
    interleaved: the frontier's claims (one at a time) come in exactly the order
    Scrapy's own priority queue pops them."""
    rng = random.Random(hash(tuple(sorted(settings.items()))) & 0xFFFF)
    pq, order = scrapy_queue(settings)
    ops: list[tuple[str, Any]] = []
    n = 0
    for _ in range(400):
        if rng.random() < 0.62:
            n += 1
            priority = rng.choice([0, 0, 0, 0, 1, -1, 2, -2, 3, -3])
            ops.append(("push", (f"r{n}", priority, rng.random() < 0.3)))
        else:
            ops.append(("pop", None))
    ops += [("pop", None)] * n

    expected: list[str | None] = []
    for op, arg in ops:
        if op == "push":
            name, priority, start = arg
            pq.push(Request(f"http://x/{name}", priority=priority,
                            meta={"is_start_request": True} if start else {}))
        else:
            r = pq.pop()
            expected.append(r.url.rsplit("/", 1)[1] if r is not None else None)

    async def main() -> list[str | None]:
        f = Frontier(make_client(redis_server.url), CrawlKeys(crawl_id), lease_ms=60_000,
                     max_attempts=3)
        got: list[str | None] = []
        try:
            for op, arg in ops:
                if op == "push":
                    name, priority, start = arg
                    req = Request(f"http://x/{name}", priority=priority,
                                  meta={"is_start_request": True} if start else {})
                    await f.enqueue([NewRequest(name, priority, order=order.of(req))])
                else:
                    res = await f.claim(1, "w")
                    got.append(res.claims[0][1].payload if res.claims else None)
        finally:
            await f.client.aclose()
        return got

    got = asyncio.run(main())
    assert got == expected


def test_requeued_requests_go_back_by_their_priority(redis_server, crawl_id):
    """A failed request goes to the back of its priority (behind LIFO and FIFO requests
    alike), a released one to the front; start requests come back as regular ones."""

    async def main() -> list[str]:
        f = Frontier(make_client(redis_server.url), CrawlKeys(crawl_id), lease_ms=60_000,
                     max_attempts=3)
        try:
            await f.enqueue([NewRequest("fail-me", 0, order=START_FIFO),
                             NewRequest("release-me", 0, order=LIFO)])
            first = (await f.claim(2, "w")).claims
            tokens = {env.payload: token for token, env in first}
            await f.enqueue([NewRequest("a", 0, order=LIFO), NewRequest("b", 0, order=LIFO),
                             NewRequest("c", 0, order=FIFO), NewRequest("s", 0, order=START_FIFO)])
            await f.fail(tokens["fail-me"], "boom")
            await f.release("w", [tokens["release-me"]])
            got = []
            while claims := (await f.claim(1, "w")).claims:
                got.append(claims[0][1].payload)
            return got
        finally:
            await f.client.aclose()

    assert asyncio.run(main()) == ["release-me", "b", "a", "c", "fail-me", "s"]
