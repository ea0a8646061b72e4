"""Extension: a worker's Scrapy stats added to the crawl's fleet-wide stats in Redis.

Each worker sends the deltas of its numeric stats (fleet/stats.py,
lua/stats_flush.lua): every LEASED_RENEW_INTERVAL (its heartbeat), with each commit
that acks or fails claims (in the same atomic step, lua/commit.lua: a request counted
done in Redis has its response, items and status codes counted in the fleet stats too,
even if its worker is killed right after), and at close, after Scrapy's CoreStats set
``finish_time``. A worker killed with
kill -9 leaves what it flushed. The worker's own end-of-crawl stats dump is Scrapy's,
unchanged. ``scrapy leased status`` shows the fleet stats (``stats`` in ``--json``).

The run's last worker, once every other worker of the run has flushed its last stats
(lua/fleet_open.lua, lua/fleet_close.lua), sends ``signals.fleet_closed`` with the
fleet's stats: close-time checks of the whole crawl (``FleetSpidermon``) run there, once
per run, instead of on each worker's ``spider_closed``.

LEASED_FLEET_STATS (default True) turns it off. With a scheduler other than the leased
one, it steps aside.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future

from .._cancel import cancel_and_wait
from .._redis.connection import make_client
from .._supervise import supervise
from ..fleet.stats import FIRST, LAST, StatsFlusher, decode_fleet_stats
from ..frontier.scripts import Scripts
from ..runtime import Worker, crawl_stopper, worker_of
from ..settings import LeasedConfig, config_for
from ..signals import fleet_closed

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: observe/lua/: a worker's final stats are to come (fleet_open), the run's last worker
#: (fleet_close, for fleet_closed)
SCRIPTS = Scripts("scrapy_leased.observe", {"fleet_open": ("lib_time",),
                                            "fleet_close": ("lib_time",)})
CLOSE_TRIES = 5  # the last flush at close is tried this many times, then given up
#: How long the run's last worker is remembered (lua/fleet_close.lua): a call sent
#: again after a lost reply comes within seconds.
CLOSED_BY_TTL_MS = 3_600_000


def scrapy_stats(flat: list[Any], reason: str) -> dict[str, Any]:
    """The fleet stats HASH (a flat HGETALL reply) as Scrapy's stats would have them for
    one process: ``start_time`` and ``finish_time`` as UTC datetimes (as CoreStats sets
    them), and ``finish_reason``."""
    out: dict[str, Any] = dict(decode_fleet_stats(zip(flat[::2], flat[1::2])))
    for name in FIRST | LAST:
        if name in out:
            out[name] = datetime.fromtimestamp(out[name], tz=timezone.utc)
    out["finish_reason"] = reason
    return out


class LeasedFleetStats:
    def __init__(self, crawler: Crawler, config: LeasedConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.flusher: StatsFlusher | None = None
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self._scripts: dict[str, Any] = {}
        self._worker_id = ""
        self._worker: Worker | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = config_for(crawler)
        if not config.fleet_stats:
            raise NotConfigured
        o = cls(crawler, config)
        crawler.signals.connect(o.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(o.spider_closed, signal=signals.spider_closed)
        return o

    def _redis_url(self) -> str | None:
        if self.config.redis_url is not None:
            return self.config.redis_url
        from .._redis.embedded import running_embedded_redis  # started by the scheduler

        return running_embedded_redis(self.config.embedded_dir)

    async def spider_opened(self, spider: Any) -> None:
        scheduler = worker_of(self.crawler)
        url = self._redis_url()
        if scheduler is None or scheduler.frontier is None or url is None:
            return  # another scheduler: step aside
        # A client of its own: the scheduler closes its client before spider_closed,
        # when the last flush (with finish_time) is still to come.
        self._client = make_client(url)
        self.flusher = StatsFlusher(self._client, scheduler.frontier.keys, scheduler.worker_id)
        self._worker_id = scheduler.worker_id
        self._worker = scheduler
        self._scripts = SCRIPTS.register(self._client, "fleet_open", "fleet_close")
        try:
            await self._open()
        except (RedisError, OSError) as exc:  # its heartbeat tries again
            logger.warning("Cannot register this worker's final stats as still to come in "
                           "Redis, retrying: %(exc)s", {"exc": exc})
        if scheduler.writer is not None:  # the deltas ride along with its commits
            scheduler.writer.stats_delta = self.stats_delta
        self._task = supervise("the fleet stats flush", self._loop(),
                               crawl_stopper(self.crawler))

    def stats_delta(self) -> list[Any]:
        """What changed in the stats since the last deltas taken (a commit carries it)."""
        assert self.flusher is not None
        self._pass_counts()
        return self.flusher.compose_ops(self.crawler.stats.get_stats())

    async def flush(self) -> None:
        """Send the stats deltas; raises RedisError/OSError (kept for the next call)."""
        if self.flusher is not None:
            self._pass_counts()
            await self.flusher.flush(self.crawler.stats.get_stats())

    def _pass_counts(self) -> None:
        """The worker's per-request counts into the stats first (worker/tally.py): a
        commit that acks a request carries the stats of its processing."""
        if self._worker is not None:
            self._worker.flush_counts()

    async def _open(self) -> None:
        """This worker's final stats are still to come (lua/fleet_open.lua)."""
        assert self.flusher is not None
        keys = self.flusher.keys
        await self._scripts["fleet_open"](keys=[keys.stats_open, keys.closed_by],
                                          args=[self._worker_id, self.config.prune_ms])

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.renew_interval)
            try:
                await self._open()
            except (RedisError, OSError):
                pass  # unreachable: the flush says so; else fleet_close will, at close
            try:
                await self.flush()
            except (RedisError, OSError) as exc:
                if not self._warned:
                    self._warned = True
                    logger.warning("Cannot add this worker's stats to the fleet stats in "
                                   "Redis, retrying: %(exc)s", {"exc": exc})
                continue
            self._warned = False

    async def spider_closed(self, spider: Any, reason: str) -> None:
        if self._task is not None:
            # cancelled again until it ends: a cancellation swallowed on the way (as
            # seen in redis-py, _cancel.py) must not keep the worker from closing
            if await cancel_and_wait([self._task]):
                logger.warning("The fleet stats loop did not end when cancelled; closing "
                               "without it")
            self._task = None
        if self.flusher is None:
            return
        try:
            for attempt in range(1, CLOSE_TRIES + 1):
                try:
                    await self.flush()
                    break
                except (RedisError, OSError) as exc:
                    if attempt == CLOSE_TRIES:
                        logger.error("Could not add this worker's last stats to the fleet "
                                     "stats in Redis: %(exc)s; this worker does not send "
                                     "fleet_closed", {"exc": exc})
                        return
                    await asyncio.sleep(0.1 * 2 ** attempt)
            flat = await self._last_worker()
            if flat is not None:
                stats = scrapy_stats(flat, reason)
                logger.info("Last worker of this run of the crawl: sending fleet_closed "
                            "with the fleet's stats (%(items)d items scraped)",
                            {"items": stats.get("item_scraped_count", 0)})
                signals_ = self.crawler.signals
                if hasattr(signals_, "send_catch_log_async"):  # Scrapy 2.14+
                    await signals_.send_catch_log_async(fleet_closed, stats=stats,
                                                        reason=reason, spider=spider)
                else:
                    await maybe_deferred_to_future(signals_.send_catch_log_deferred(
                        fleet_closed, stats=stats, reason=reason, spider=spider))
        finally:
            await self._client.aclose()

    async def _last_worker(self) -> list[Any] | None:
        """The fleet stats (flat HGETALL) when this is the run's last worker, every other
        one's final stats in (lua/fleet_close.lua); else None."""
        assert self.flusher is not None
        keys = self.flusher.keys
        for attempt in range(1, CLOSE_TRIES + 1):
            try:
                out = await self._scripts["fleet_close"](
                    keys=[keys.stats_open, keys.workers, keys.fleet_stats, keys.closed_by],
                    args=[self._worker_id, int(self.config.worker_ttl * 1000),
                          CLOSED_BY_TTL_MS])
            except (RedisError, OSError) as exc:
                # sent again after a lost reply: the script answers the same (closed_by)
                if attempt == CLOSE_TRIES:
                    logger.error("Could not learn whether this is the last worker of the "
                                 "run: %(exc)s; this worker does not send fleet_closed",
                                 {"exc": exc})
                    return None
                await asyncio.sleep(0.1 * 2 ** attempt)
                continue
            return list(out[1]) if int(out[0]) == 1 else None
        return None
