"""The one way to reach a crawl's Redis: ``LEASED_REDIS_URL``, else the project's
embedded Redis (embedded.py), for the scheduler, the upsert pipeline and the commands.

Every client is built by ``connection.make_client`` (``connect`` checks it first).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ._redis.connection import connect
from .settings import LeasedConfig

logger = logging.getLogger(__name__)

#: What the error messages name as the source of the URL.
URL_SETTING = "LEASED_REDIS_URL"
EMBEDDED_SETTING = "embedded Redis (LEASED_REDIS_URL not set)"
#: A worker's one warning on the embedded Redis: its crawl is local to this machine.
LOCAL_CRAWL_WARNING = (
    "No LEASED_REDIS_URL: using the embedded Redis at %(url)s. This crawl is local to "
    "this machine: workers on other machines or in other containers run separate crawls "
    "of their own. To run one crawl on several machines, set LEASED_REDIS_URL to a Redis "
    "they all reach.")
_warned_local = False  # LOCAL_CRAWL_WARNING logged in this process


def crawl_redis_url(config: LeasedConfig, *, start: bool = True) -> tuple[str | None, str]:
    """Blocking (embedded Redis may be started): the URL of the crawl's Redis and the
    name of where it comes from. Without LEASED_REDIS_URL, the project's embedded Redis:
    started when ``start``, else only when it runs already or its data directory holds a
    crawl's data (restarted from its AOF: it stops by itself after the workers), else
    None. On the embedded Redis, this process uses the server until it exits (it stops
    once its last user is gone). Raises EmbeddedRedisError."""
    if config.redis_url is not None:
        return config.redis_url, URL_SETTING
    from ._redis.embedded import ensure_embedded_redis, reopen_embedded_redis

    if start:
        url: str | None = ensure_embedded_redis(config.embedded_dir, config.embedded_server)
    else:
        url = reopen_embedded_redis(config.embedded_dir, config.embedded_server)
    return url, EMBEDDED_SETTING


async def crawl_redis_url_async(config: LeasedConfig) -> tuple[str, str]:
    """``crawl_redis_url`` off the event loop (a thread), starting embedded Redis: what a
    worker's scheduler and upsert pipeline call. On the embedded Redis, the first call of
    the process logs LOCAL_CRAWL_WARNING (the commands call ``crawl_redis_url``: they
    name the Redis they read in their own output)."""
    global _warned_local
    if config.redis_url is not None:
        return config.redis_url, URL_SETTING
    url, setting = await asyncio.to_thread(crawl_redis_url, config)
    assert url is not None
    if not _warned_local:  # on the event loop's thread: no race between two callers
        _warned_local = True
        logger.warning(LOCAL_CRAWL_WARNING, {"url": url})
    return url, setting


async def connect_crawl(config: LeasedConfig) -> tuple[Any, str]:
    """(a checked asyncio client of the crawl's Redis, its URL); raises LeasedRedisError
    naming the setting."""
    url, setting = await crawl_redis_url_async(config)
    return await connect(url, setting, config.connect_timeout), url
