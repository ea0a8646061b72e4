"""``UpsertPipeline``: every item becomes one record keyed by a stable key, written
idempotently and fenced by the claim token of the request that produced it.

process_item returns only once its record is durably stored (the frontier acks the
request after its items passed the pipelines) and raises when the store fails (the
request fails: attempts, dead letters). It never drops an item: one without a value for
its key, or anything that is not an item, passes on unstored (counted, warned once).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from itemadapter import is_item
from scrapy.exceptions import NotConfigured

from .._compat import pipeline_hook
from .._redis.connection import LeasedRedisError
from ..bootstrap import crawl_redis_url_async
from ..runtime import crawl_stopper
from ..settings import LeasedConfig, UpsertConfig, config_for
from .batcher import WriteBatcher
from .fence import FenceRegistry
from .records import MissingKey, RecordMaker
from .stores import Store, StoreError, make_store

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)

STATS_PREFIX = "leased/upsert/"


class UpsertPipeline:
    def __init__(self, crawler: Crawler, config: UpsertConfig, leased: LeasedConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.leased = leased
        self.stats = crawler.stats
        self.fences = FenceRegistry.for_crawler(crawler)
        self.records = RecordMaker(config.key_fields)
        self.store: Store | None = None
        self.batcher: WriteBatcher | None = None
        self._warned_stale = False
        self._warned_unfenced = False
        self._warned_unstored: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        leased = config_for(crawler)
        if not leased.upsert.enabled:
            raise NotConfigured("LEASED_UPSERT_ENABLED is False")
        return cls(crawler, leased.upsert, leased)

    def _inc(self, name: str, count: int = 1) -> None:
        self.stats.inc_value(STATS_PREFIX + name, count)

    def open_spider(self, spider: Any = None) -> Any:
        return pipeline_hook(self._open())

    def close_spider(self, spider: Any = None) -> Any:
        return pipeline_hook(self._close())

    async def _open(self) -> None:
        spider = self.crawler.spider
        assert spider is not None
        crawl_id = self.leased.crawl_id or spider.name
        redis_url = self.leased.redis_url
        if self.config.url is None:  # the records go to the crawl's Redis
            redis_url, _ = await crawl_redis_url_async(self.leased)
        self.store = make_store(self.config, crawl_id, redis_url, self.leased.connect_timeout)
        try:
            await self.store.open()
        except (StoreError, LeasedRedisError) as exc:
            logger.error("%(error)s", {"error": exc})
            raise
        self.batcher = WriteBatcher(self.store, self.config.batch_size, self._on_batch,
                                    on_bug=crawl_stopper(self.crawler))
        logger.info("Upserting items into %(store)s", {"store": self.store.description})

    async def _close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        if self.store is not None:
            await self.store.close()

    def _on_batch(self, size: int, ok: bool) -> None:
        self._inc("batches" if ok else "batches_failed")

    def _pass_unstored(self, stat: str, message: str) -> None:
        self._inc(stat)
        if stat not in self._warned_unstored:
            self._warned_unstored.add(stat)
            logger.warning("%(message)s It passes on to the next pipelines unstored; "
                           "counted in %(stat)s, logged once.",
                           {"message": message, "stat": STATS_PREFIX + stat})

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        token = self.fences.take(item)
        if not is_item(item):
            self._pass_unstored("not_an_item", f"UpsertPipeline got a {type(item).__name__}, "
                                "which is not an item (itemadapter).")
            return item
        try:
            record = self.records.make(item, token)
        except MissingKey as exc:
            self._pass_unstored("missing_key", str(exc))
            return item
        if self.batcher is None:
            raise StoreError("UpsertPipeline.process_item called before open_spider")
        if token is None:
            self._inc("unfenced")
            if not self._warned_unfenced:
                self._warned_unfenced = True
                logger.info("Writing items without a fencing token (from an errback, start() "
                            "or replaced by an earlier pipeline); counted in "
                            "leased/upsert/unfenced")
        try:
            written = await self.batcher.write(record)
        except StoreError:
            self._inc("errors")
            raise
        if written:
            self._inc("written")
        else:
            self._inc("stale")
            log = logger.warning if not self._warned_stale else logger.debug
            self._warned_stale = True
            log("Rejected a stale write of %(type)s %(key)r (fence token %(token)s): a claim "
                "with a newer token already stored it (this request processed again after "
                "this worker lost its lease, or a later request yielding the same key)",
                {"type": record.type_name, "key": record.key, "token": record.fence})
        return item
