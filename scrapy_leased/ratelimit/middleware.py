"""Downloader middleware enforcing each lane's shared rate budget at download time.

Every request about to be downloaded takes one request's worth of its lane's budget in
Redis (one Lua call, Redis time). A request that gets none never waits holding one of
``CONCURRENT_REQUESTS``: a claimed request goes back to the scheduler with a not-before
time (its claim and lease stay with this worker); a request that is not a claim (a
robots.txt fetch) waits without blocking the reactor. 429 and 503 answers block the
lane for the whole fleet (``Retry-After``, else ``LEASED_RATE_BACKOFF``) and slow it
down, recovering over time; a robots.txt ``Crawl-delay`` becomes the lane's minimum
interval.

A lane with nothing to enforce (no budget in this worker's settings, and no Crawl-delay
or block in Redis when its request was claimed: claim.lua reports it) needs no check at
download time: its claimed requests start at once if they start within
``LEASED_RATE_FREE_GRACE`` of their claim, and unless a penalty of the lane may have
come since the claim was sent: one by this worker, or one any worker set, which
penalize.lua publishes and this worker hears on the crawl's penalty channel (watch.py).
Whenever the worker was not listening from before the claim, the request is checked. So
a block set by another worker stops the lane's claims at once, and the requests this
worker already holds too (within the delivery of one pub/sub message), also those
claimed ahead of the downloader.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from ..meta import META_BUDGET_TAKEN, META_FREE_SINCE, META_NOT_BEFORE
from ..runtime import worker_of
from ..settings import Budgets, config_for
from .watch import PenaltyWatch

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

#: Its place in DOWNLOADER_MIDDLEWARES (the add-on sets it): next to the downloader
#: (after robots.txt, retries, redirects and the HTTP cache), so only requests really
#: about to be sent take rate budget, and it sees raw 429/503.
RATE_MIDDLEWARE_ORDER = 950

logger = logging.getLogger(__name__)

SLOW_DOWN_STATUSES = (429, 503)
MAX_RETRY_AFTER_S = 3600.0


def retry_after_seconds(value: bytes | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), between 0 and
    MAX_RETRY_AFTER_S; None if absent or unreadable (then LEASED_RATE_BACKOFF applies):
    not a number or a date, nan, a negative number. Never raises, whatever the bytes."""
    if not value:
        return None
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
            # the host's date vs. ours: best effort (a date past: retry now)
            seconds = when.timestamp() - time.time()
        except Exception:  # TypeError, ValueError, OverflowError, ...: not a date
            return None
    if math.isnan(seconds) or seconds < 0:  # "nan", "-1": not a delay
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


def block_ms_for(value: bytes | None, default_ms: int) -> int:
    """The block (ms) a 429/503 with this Retry-After header sets: the header's delay,
    else ``default_ms`` (LEASED_RATE_BACKOFF); always an int in [0, MAX_RETRY_AFTER_S]
    seconds."""
    seconds = retry_after_seconds(value)
    if seconds is None:
        return default_ms
    return int(seconds * 1000)


def crawl_delay_ms(delay: Any) -> int | None:
    """A robots.txt Crawl-delay (seconds, as Protego reads it) in ms, at most
    MAX_RETRY_AFTER_S; None when it is not a positive number of ms (nan, 0, garbage)."""
    try:
        seconds = float(delay)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(seconds) or seconds <= 0:
        return None
    return int(min(seconds, MAX_RETRY_AFTER_S) * 1000) or None  # below 1 ms: none


class LeasedRateMiddleware:
    def __init__(self, crawler: Crawler, budgets: Budgets) -> None:
        self.crawler = crawler
        self.budgets = budgets
        self.stats = crawler.stats
        # lane -> time.monotonic() of the last penalty of the lane, ours or one heard on
        # the penalty channel, oldest first; only those of the last
        # LEASED_RATE_FREE_GRACE matter (see process_request), older ones are dropped
        self._penalized: OrderedDict[str, float] = OrderedDict()
        # the fleet's penalties (started with the first request of a lane without a
        # budget; its task belongs to the scheduler); None: not started
        self._watch: PenaltyWatch | None = None
        self._watch_frontier: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, config_for(crawler).budgets)

    def _note_penalty(self, lane: str) -> None:
        """Remember that the lane was penalized now, by this worker or (heard on the
        penalty channel) any worker: its claims with nothing to enforce sent before are
        checked again; forget penalties older than the grace."""
        now = time.monotonic()
        self._penalized[lane] = now
        self._penalized.move_to_end(lane)
        horizon = now - self.budgets.free_grace_ms / 1000
        while self._penalized:
            oldest, at = next(iter(self._penalized.items()))
            if at >= horizon:
                break
            del self._penalized[oldest]

    def _watching(self, scheduler: Any) -> PenaltyWatch | None:
        """The watch of the fleet's penalties on the scheduler's Redis, started on first
        use (again for a new frontier: one crawler, one scheduler, but be safe)."""
        frontier = scheduler.frontier
        if self._watch is None or self._watch_frontier is not frontier:
            watch = PenaltyWatch(frontier.client, frontier.keys.penalties, self._note_penalty,
                                 lambda: self.stats.inc_value("leased/penalty_skipped"))
            if not scheduler.run_beside(watch.run(), "the penalty watch"):
                return None
            self._watch, self._watch_frontier = watch, frontier
        return self._watch

    def _frontier(self) -> Any:
        """The leased scheduler's frontier; None when the project replaced the
        scheduler (this middleware then passes every request and response through)."""
        scheduler = worker_of(self.crawler)
        return None if scheduler is None else scheduler.frontier

    async def process_request(self, request: Request,
                              spider: object = None) -> Request | None:
        scheduler = worker_of(self.crawler)
        if scheduler is None or scheduler.frontier is None:
            return None
        lane = self.budgets.lane_of(request)
        budget = self.budgets.for_lane(lane)
        free_since = request.meta.pop(META_FREE_SINCE, None)
        if free_since is not None and not budget.interval_ms \
                and time.monotonic() - free_since < self.budgets.free_grace_ms / 1000:
            watch = self._watching(scheduler)
            if watch is not None and watch.heard_all_since(free_since) \
                    and free_since > self._penalized.get(lane, float("-inf")):
                scheduler.count("leased/budget_free")
                return None
        frontier = scheduler.frontier
        while True:
            try:
                wait_ms, now_ms = await frontier.acquire(lane, budget)
            except (RedisError, OSError) as exc:
                logger.warning("Rate budget unavailable (%(exc)s): %(request)s waits",
                               {"exc": exc, "request": request})
                wait_ms = 1000
            if wait_ms <= 0:
                request.meta[META_BUDGET_TAKEN] = now_ms
                return None
            self.stats.inc_value("leased/budget_waits")
            if scheduler.is_handed(request):
                request.meta[META_NOT_BEFORE] = wait_ms / 1000
                return request  # back to the scheduler: frees the concurrency slot
            await asyncio.sleep(wait_ms / 1000)

    async def process_response(self, request: Request, response: Response,
                               spider: object = None) -> Response:
        if self._frontier() is None:
            return response
        if response.status in SLOW_DOWN_STATUSES:
            await self._slow_down(request, response)
        elif (self.budgets.obey_crawl_delay and response.status == 200
              and urlparse_cached(request).path == "/robots.txt"):
            await self._crawl_delay(request, response)
        return response

    async def _slow_down(self, request: Request, response: Response) -> None:
        block_ms = block_ms_for(response.headers.get(b"Retry-After"), self.budgets.backoff_ms)
        lane = self.budgets.lane_of(request)
        self._note_penalty(lane)
        try:
            await self._frontier().penalize(lane, block_ms=block_ms, slow_down=True)
        except (RedisError, OSError) as exc:
            logger.warning("Could not record the slow-down of %(lane)s: %(exc)s",
                           {"lane": lane, "exc": exc})
            return
        self.stats.inc_value("leased/budget_penalties")
        logger.info("%(lane)s answered %(status)d: no request to it for %(s).1f s from any "
                    "worker, then a slower rate", {"lane": lane, "status": response.status,
                                                    "s": block_ms / 1000})

    async def _crawl_delay(self, request: Request, response: Response) -> None:
        from protego import Protego

        try:
            robots = Protego.parse(response.text)
        except Exception:
            return
        agent = (request.headers.get(b"User-Agent") or b"").decode("latin-1") or "*"
        delay = robots.crawl_delay(agent)
        if delay:
            lane = self.budgets.lane_of(request)
            self._note_penalty(lane)
            delay_ms = crawl_delay_ms(delay)
            if delay_ms is None:
                return
            try:
                await self._frontier().penalize(lane, crawl_delay_ms=delay_ms)
            except (RedisError, OSError) as exc:
                logger.warning("Could not record the Crawl-delay of %(lane)s: %(exc)s",
                               {"lane": lane, "exc": exc})
                return
            logger.info("%(lane)s asks for Crawl-delay %(d)s s: the fleet follows it",
                        {"lane": lane, "d": delay})
