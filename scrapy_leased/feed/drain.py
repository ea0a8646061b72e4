"""A worker's side of the feed: entries pushed by producers become queued requests.

While the crawl runs, a worker whose claim reports entries in the feed (lua/claim.lua)
takes a batch of them (lua/feed_take.lua), reads each (format.py) and queues the
requests through the same dedupe and lanes as its own (packer.py), dead-lettering the
entries it cannot read with the reason, all in one atomic step (lua/feed_commit.lua).
A batch taken and not queued (the worker died, or stalled past its lease) goes back to
the head of the feed at the next take of any worker, so nothing is lost or queued
twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError
from scrapy import Spider

from ..codec import PayloadError
from ..frontier import Frontier, NewRequest
from ..frontier.scripts import WrongKeyType, safe_text
from .format import FeedEntryError, FeedRequest, parse_entry, parse_scrapy_redis_entry
from .packer import RequestPacker

logger = logging.getLogger(__name__)

#: Entries taken off the feed at a time.
FEED_BATCH = 100
RETRY_CAP_SECONDS = 2.0


class FeedDrainer:
    def __init__(self, frontier: Frontier, packer: RequestPacker, spider: Spider,
                 stats: Any, closing: Callable[[], bool], entry_format: str = "leased"
                 ) -> None:
        """``entry_format``: LEASED_FEED_FORMAT, "leased" (format.py parse_entry) or
        "scrapy-redis" (RedisSpider's start entries: parse_scrapy_redis_entry)."""
        self.frontier = frontier
        self.parse: Callable[[bytes | str], FeedRequest] = (
            parse_scrapy_redis_entry if entry_format == "scrapy-redis" else parse_entry)
        self.packer = packer
        self.spider = spider
        self.stats = stats
        self.closing = closing

    async def drain_once(self) -> int:
        """Take one batch off the feed and queue it; returns how many entries were
        taken (0: the feed is empty, or what it holds is another worker's batch).
        Raises RedisError when the batch cannot be taken; once taken, its commit is
        sent again until Redis answers (or the worker closes: the batch then returns
        to the feed after its lease)."""
        try:
            batch = await self.frontier.take_feed(FEED_BATCH)
        except WrongKeyType as exc:
            if exc.key != self.frontier.keys.feed:
                raise  # a key only the workers write (feed_taken, feed_deadlines)
            await self.set_aside()
            batch = await self.frontier.take_feed(FEED_BATCH)
        if batch.returned:
            self.stats.inc_value("leased/feed_returned", batch.returned)
            logger.info("%(n)d feed entries taken by a worker that did not queue them in "
                        "time went back to the feed", {"n": batch.returned})
        if not batch.entries:
            return 0
        enqueue: list[NewRequest] = []
        bad: list[tuple[bytes | str, str]] = []
        for raw in batch.entries:
            try:
                enqueue.append(self._pack(self.parse(raw)))
            except (FeedEntryError, PayloadError) as exc:
                bad.append((raw, f"feed entry: {exc}"))
            except RecursionError:  # meta nested too deeply to store
                bad.append((raw, "feed entry: nested too deeply"))
            except Exception as exc:  # whatever an entry makes the project's code raise
                bad.append((raw, safe_text(f"feed entry: {type(exc).__name__}: {exc}")))
        call_id = self.frontier.new_call_id()
        delay = 0.05
        while True:  # the same batch, the same call id: applied once (lib_guard.lua)
            try:
                queued = await self.frontier.commit_feed(batch.id, enqueue, bad, call_id)
                break
            except (RedisError, OSError) as exc:
                if self.closing():
                    raise
                if isinstance(exc, WrongKeyType) and delay == 0.05:  # said once a batch
                    logger.error("Cannot queue a batch of feed entries, retrying: %(exc)s",
                                 {"exc": exc})
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_SECONDS)
        if queued is None:
            logger.warning("A batch of %(n)d feed entries was held past its lease "
                           "(LEASED_LEASE_SECONDS) and went back to the feed; another "
                           "worker queues it", {"n": len(batch.entries)})
            return 0
        self.stats.inc_value("leased/feed_taken", len(batch.entries))
        self.stats.inc_value("leased/feed_queued", sum(queued))
        if bad:
            self.stats.inc_value("leased/feed_dead", len(bad))
            logger.warning("%(n)d unreadable feed entries went to the dead letters "
                           "(scrapy leased dead), the first: %(reason)s",
                           {"n": len(bad), "reason": bad[0][1]})
        return len(batch.entries)

    async def set_aside(self) -> None:
        """When a producer wrote the crawl's feed key with another command than RPUSH
        (XADD, SET, ...), no worker can take entries off it, and the crawl, whose feed
        may hold work, could never end: move the key aside whole (Frontier.set_aside;
        nothing deleted), say so once at ERROR with both keys and what to do, and count
        it (``leased/feed_set_aside``). Nothing to do when the feed is a LIST or absent.
        Raises RedisError like any call."""
        moved = await self.frontier.set_aside("feed")
        if moved is None:
            return
        kind, aside = moved
        self.stats.inc_value("leased/feed_set_aside")
        logger.error(
            "Redis key %(feed)s, the crawl's feed, was a %(kind)s, not a list: a producer "
            "wrote it with another command than RPUSH (docs/feed.md). It was moved, whole, "
            "to %(aside)s so that the feed works again; nothing was deleted. Read what the "
            "producer wrote there, push it again as JSON entries with RPUSH, then delete "
            "%(aside)s.", {"feed": self.frontier.keys.feed, "kind": kind, "aside": aside})

    def _pack(self, fed: FeedRequest) -> NewRequest:
        for what, name in zip(("callback", "errback"), fed.names):
            if name is not None and not callable(getattr(self.spider, name, None)):
                raise FeedEntryError(f"{what} {name!r} is not a method of spider "
                                     f"{self.spider.name!r}")
        return self.packer.pack(fed.request, fed.names)
