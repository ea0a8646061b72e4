"""The worker's side of seeding (LeasedStartMiddleware, seeding.py, asks it): the pace
of the seeding worker's start requests, the run marked seeded once start() is
exhausted, and the wait of the other workers for the seeder (run.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from ..frontier.run import SEED, SEEDED
from .claimloop import RETRY_CAP_SECONDS

if TYPE_CHECKING:
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)

#: A seeding worker with no room for more claims reads start() on, at most this many
#: start requests ahead of what is written to Redis.
START_BUFFER = 1000


class Seeder:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker

    async def start_request_sent(self) -> None:
        """Called by LeasedStartMiddleware after each start request, before the next
        one is read: while this worker has room for more claims, wait until the
        request is written to Redis and a claim that started afterwards is done (so
        the first start requests are claimed in the order they came, as Scrapy sends
        the first CONCURRENT_REQUESTS at once); a full worker reads on, at most
        START_BUFFER requests ahead of Redis."""
        assert self.w.writer is not None
        if self.w._closing:
            return
        if self.w.claims.capacity() > 0 and self.w.writer.pending:
            await self.w.writer.drain()
            if self.w.claims.capacity() > 0:
                await self.w.claims.next_round()
        elif self.w.unconfirmed >= START_BUFFER:
            await self.w.writer.drain()

    async def start_exhausted(self) -> None:
        """The seeding worker's start() is exhausted: once its requests are in Redis,
        the other workers of the run skip it."""
        assert self.w.run is not None and self.w.writer is not None
        if not await self.w.writer.drain():
            return  # stopped on a bug: not seeded (the next run sends start() again)
        try:
            await self.w.run.seeded()
        except (RedisError, OSError) as exc:
            logger.warning("Could not mark the run as seeded (%(exc)s): a worker started "
                           "after this one dies may run start() again", {"exc": exc})

    async def wait_for_seeding(self) -> bool:
        """On a worker that does not seed the run: wait until the seeder exhausted
        start() (True: skip it), or died before (False: this worker seeds it now). The
        worker claims and processes requests meanwhile; its start() is pending, so it
        does not take the crawl for finished."""
        assert self.w.run is not None
        delay = self.w.config.idle_poll
        while True:
            try:
                state = await self.w.run.join()
            except (RedisError, OSError) as exc:
                self.w.warn("run", "Cannot read the run of the crawl, retrying: %s", exc)
                state = None
            if state == SEEDED:
                # what the claim loop saw before is stale: the seeder's requests are in
                # Redis now; only a claim round started from now on may find the crawl
                # drained (not one in flight)
                self.w.claims.drained_seen_at = -1
                self.w.claims.fresh_round = self.w.claims.rounds_started + 1
                self.w.claims.starved = False
                if self.w.kick is not None:
                    self.w.kick.set()
                return True
            if state == SEED:
                self.w.seeds = True
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_SECONDS)
