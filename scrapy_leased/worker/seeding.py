"""Spider middleware: one worker per run of the crawl runs the spider's ``start()``.

On the seeding worker (see run.py) ``start()`` runs as under Scrapy, its requests keep
their ``dont_filter``, and while the worker has room for more claims each start request
is written to Redis and given a chance to be claimed before the next one is read (as
Scrapy sends the first ``CONCURRENT_REQUESTS`` start requests before reading on); a
worker that is full reads on, at most ``START_BUFFER`` requests ahead of Redis. On the
other workers ``start()`` is never called: they take their work from Redis, and wait
(``start()`` pending, so the engine does not take the crawl for finished) until the
seeder is done with it, or seed the run themselves when the seeder died first. The
middleware sits next to the engine (order 0), so none of the other middlewares'
``process_start`` runs on a worker that does not seed. With another scheduler it
passes ``start()`` through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from scrapy import Request

from ..runtime import worker_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class LeasedStartMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        scheduler = worker_of(self.crawler)
        if scheduler is None or scheduler.frontier is None:
            async for item_or_request in start:
                yield item_or_request
            return
        if scheduler.stopping:
            logger.info("Crawl %(crawl)s is stopping: start() not run on this worker",
                        {"crawl": scheduler.frontier.keys.crawl_id})
            return
        if not scheduler.seeds:
            logger.info("Another worker seeds this run of crawl %(crawl)s: waiting until it "
                        "is seeded", {"crawl": scheduler.frontier.keys.crawl_id})
            if await scheduler.wait_for_seeding():
                self.crawler.stats.set_value("leased/start_skipped", 1)
                logger.info("Another worker seeded this run of crawl %(crawl)s: start() "
                            "skipped on this worker", {"crawl": scheduler.frontier.keys.crawl_id})
                return
            logger.warning("The worker seeding this run of crawl %(crawl)s died before it "
                           "was done: this worker runs start() again",
                           {"crawl": scheduler.frontier.keys.crawl_id})
        self.crawler.stats.set_value("leased/seeded", 1)
        logger.info("This worker seeds the run of crawl %(crawl)s (runs start())",
                    {"crawl": scheduler.frontier.keys.crawl_id})
        async for item_or_request in start:
            yield item_or_request
            if isinstance(item_or_request, Request):
                await scheduler.start_request_sent()
        await scheduler.start_exhausted()
