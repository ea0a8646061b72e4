"""A ``Frontier`` on a real Redis for the tests that drive it directly, as a worker
builds it (its client closed after)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Frontier
from scrapy_leased.frontier.keys import CrawlKeys


def new_frontier(url: str, crawl_id: str, **options: Any) -> Frontier:
    """A Frontier of this crawl; ``options`` are Frontier's keyword arguments (a 60 s
    lease and 3 attempts unless given)."""
    options = {"lease_ms": 60_000, "max_attempts": 3, **options}
    return Frontier(make_client(url), CrawlKeys(crawl_id), **options)


def run_frontier(url: str, crawl_id: str, body: Callable[[Frontier], Awaitable[Any]],
                 **options: Any) -> Any:
    """``asyncio.run(body(frontier))`` on ``new_frontier(url, crawl_id, **options)``."""

    async def main() -> Any:
        f = new_frontier(url, crawl_id, **options)
        try:
            return await body(f)
        finally:
            await f.client.aclose()

    return asyncio.run(main())
