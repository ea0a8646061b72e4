"""Extension: a periodic fleet line in each worker's log, like Scrapy's ``LogStats``.

    Fleet pages: 2,340 pages/min, todo 1,020, in flight 47, done 3,400, dead 0, workers 3

The numbers are the whole crawl's, read from Redis (``FleetAdmin.snapshot``) with the
scheduler's asynchronous client, so the line never blocks the reactor. The fleet's
warning signs (``admin.diagnose``, comparing with the previous line) are logged as
warnings. ``LEASED_LOGSTATS_INTERVAL`` (seconds, default 60; 0 turns it off).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from scrapy import Spider, signals
from scrapy.exceptions import NotConfigured

from .._supervise import supervise
from ..fleet import FleetAdmin, Snapshot, diagnose
from ..fleet.logline import FLEET_LINE, fleet_line_args
from ..runtime import crawl_stopper, worker_of
from ..settings import config_for

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

class LeasedLogStats:
    def __init__(self, crawler: Crawler, interval: float, worker_ttl: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self.worker_ttl_ms = int(worker_ttl * 1000)
        self.default_capacity = crawler.settings.getint("CONCURRENT_REQUESTS")
        self._task: asyncio.Task[None] | None = None
        self._prev: Snapshot | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = config_for(crawler)
        if not config.logstats_interval:
            raise NotConfigured
        o = cls(crawler, config.logstats_interval, config.worker_ttl)
        crawler.signals.connect(o.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(o.spider_closed, signal=signals.spider_closed)
        return o

    def spider_opened(self, spider: Spider) -> None:
        self._task = supervise("the fleet log line", self._loop(spider),
                               crawl_stopper(self.crawler))

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _closing(self) -> bool:
        scheduler = worker_of(self.crawler)
        return scheduler is not None and scheduler.closing

    def _admin(self) -> FleetAdmin | None:
        scheduler = worker_of(self.crawler)
        if scheduler is None or scheduler.frontier is None or scheduler.closing:
            return None  # not the leased scheduler, not open yet, or closing its client
        frontier = scheduler.frontier
        return FleetAdmin(frontier.client, frontier.keys, worker_ttl_ms=self.worker_ttl_ms)

    async def _loop(self, spider: Spider) -> None:
        admin: FleetAdmin | None = None
        while True:
            await asyncio.sleep(self.interval)
            admin = admin or self._admin()
            if admin is None or self._closing():
                continue  # the scheduler closes its Redis client: no more lines
            try:
                snap = await admin.snapshot(memory=False)
            except Exception as exc:  # Redis away: the scheduler warns about it already
                logger.debug("No fleet line: %(exc)r", {"exc": exc}, extra={"spider": spider})
                continue
            self.log(snap, spider)

    def log(self, snap: Snapshot, spider: Spider | None = None) -> None:
        logger.info(FLEET_LINE, fleet_line_args(snap), extra={"spider": spider})
        for d in diagnose(snap, self._prev, self.default_capacity):
            logger.warning("Fleet %(crawl)s: %(message)s",
                           {"crawl": snap.crawl, "message": d.message}, extra={"spider": spider})
        self._prev = snap
