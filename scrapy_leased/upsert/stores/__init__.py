"""Record stores, chosen by LEASED_UPSERT_URL."""

from __future__ import annotations

from ...frontier.keys import CrawlKeys
from ...settings import UpsertConfig
from .base import Store, StoreError


def make_store(config: UpsertConfig, crawl_id: str, crawl_redis_url: str | None = None,
               connect_timeout: float | None = None) -> Store:
    """The store of ``config``; ``crawl_redis_url`` is used when LEASED_UPSERT_URL is
    unset (the crawl's own Redis). ``connect_timeout``: how long a Redis store waits for
    its Redis at open (LEASED_CONNECT_TIMEOUT)."""
    backend = config.backend
    if backend == "sqlite":
        from .sqlite_store import SQLiteStore

        return SQLiteStore(config.sqlite_path, config.prefix, crawl_id)
    if backend == "postgresql":
        from .postgres_store import PostgresStore

        assert config.url is not None
        return PostgresStore(config.url, config.prefix, crawl_id)
    from .redis_store import RedisStore

    if config.url is not None:
        return RedisStore(config.url, CrawlKeys(crawl_id), config.prefix, "LEASED_UPSERT_URL",
                          connect_timeout)
    if crawl_redis_url is None:
        raise StoreError("no Redis URL for the records (LEASED_UPSERT_URL and "
                         "LEASED_REDIS_URL are unset)")
    return RedisStore(crawl_redis_url, CrawlKeys(crawl_id), config.prefix,
                      "LEASED_REDIS_URL (LEASED_UPSERT_URL is unset)", connect_timeout)


__all__ = ["Store", "StoreError", "make_store"]
