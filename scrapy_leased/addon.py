"""The add-on: ``ADDONS = {"scrapy_leased.Addon": 100}`` turns the plugin on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object

from ._command import exit_if_command_line, runs_plain
from ._redis.connection import LeasedRedisError, check_reachable
from .observe.logstats import LeasedLogStats
from .observe.stats import LeasedFleetStats
from .ratelimit.middleware import RATE_MIDDLEWARE_ORDER, LeasedRateMiddleware
from .settings import LeasedConfig, LeasedConfigError
from .upsert import UpsertFenceMiddleware, UpsertPipeline
from .worker.cookies import LeasedCookiesMiddleware
from .worker.dupefilter import LeasedDupeFilter
from .worker.feedexports import install as install_feed_exports
from .worker.middleware import LeasedFailureMiddleware
from .worker.scheduler import LeasedScheduler
from .worker.seeding import LeasedStartMiddleware

if TYPE_CHECKING:
    from scrapy.settings import Settings

#: Next to the engine, so it sees only final download outcomes (after retries).
FAILURE_MIDDLEWARE_ORDER = 10
#: Near the end of the item pipelines: items are stored once the project's own
#: pipelines have cleaned (or dropped) them.
UPSERT_PIPELINE_ORDER = 800
#: Next to the engine, so it sees the items every other spider middleware let through.
UPSERT_FENCE_MIDDLEWARE_ORDER = 10
#: The fleet log line (like Scrapy's LogStats, also at 0).
LOGSTATS_EXTENSION_ORDER = 0
#: After Scrapy's CoreStats (0), so its spider_closed handler has set finish_time
#: when the fleet stats take the worker's last stats.
FLEET_STATS_EXTENSION_ORDER = 1000
#: Next to the engine, so no other spider middleware's process_start runs on a worker
#: that does not seed the run.
START_MIDDLEWARE_ORDER = 0
#: Where Scrapy's CookiesMiddleware is (DOWNLOADER_MIDDLEWARES_BASE), which it replaces.
COOKIES_MIDDLEWARE_ORDER = 700
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"

logger = logging.getLogger(__name__)


def check_reactor(settings: Settings) -> None:
    """scrapy_leased runs on asyncio: Scrapy's default reactor, or no reactor at all
    (TWISTED_REACTOR_ENABLED = False). Any other reactor: one error naming the setting."""
    if not settings.getbool("TWISTED_REACTOR_ENABLED", True):
        return
    reactor = settings.get("TWISTED_REACTOR")
    if reactor is None:  # whatever is installed; the scheduler checks it when it opens
        return
    path = reactor if isinstance(reactor, str) else \
        f"{getattr(reactor, '__module__', '')}.{getattr(reactor, '__qualname__', reactor)}"
    if path != ASYNCIO_REACTOR:
        raise LeasedConfigError(
            f"TWISTED_REACTOR ({reactor!r}) must be {ASYNCIO_REACTOR!r} (Scrapy's default): "
            "scrapy_leased runs on asyncio. Remove the setting, or set "
            "TWISTED_REACTOR_ENABLED = False to run without a reactor.")


def install_cookies(settings: Settings) -> None:
    """LeasedCookiesMiddleware in place of Scrapy's CookiesMiddleware (at its order),
    unless cookies are off (COOKIES_ENABLED = False) or the project's
    DOWNLOADER_MIDDLEWARES names Scrapy's cookies middleware (or this one) itself: then
    the project decided. With LEASED_SHARED_COOKIES = False it is installed too, keeping
    the jars per worker (and warning at the first Set-Cookie)."""
    if not settings.getbool("COOKIES_ENABLED", True):
        return
    from scrapy.downloadermiddlewares.cookies import CookiesMiddleware

    middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
    for cls_or_path in middlewares:
        try:
            cls = load_object(cls_or_path) if isinstance(cls_or_path, str) else cls_or_path
        except (ImportError, NameError, ValueError):
            continue  # Scrapy names a bad path when it builds the middlewares
        if cls in (CookiesMiddleware, LeasedCookiesMiddleware):
            return
    order = COOKIES_MIDDLEWARE_ORDER
    for cls_or_path, value in settings.getdict("DOWNLOADER_MIDDLEWARES_BASE").items():
        try:
            cls = load_object(cls_or_path) if isinstance(cls_or_path, str) else cls_or_path
        except (ImportError, NameError, ValueError):
            continue
        if cls is CookiesMiddleware:
            if value is None:
                return  # taken out of the base: no cookies middleware
            order = value
    middlewares[CookiesMiddleware] = None
    middlewares[LeasedCookiesMiddleware] = order
    settings.set("DOWNLOADER_MIDDLEWARES", middlewares,
                 settings.getpriority("DOWNLOADER_MIDDLEWARES") or 0)


class Addon:
    """Sets the leased scheduler, dupefilter and middlewares at "addon" priority, so a
    project can still override each of them (the others then step aside). It checks
    the reactor, and the settings through the settings layer (settings/config.py), which
    names the first bad one."""

    def update_settings(self, settings: Settings) -> None:
        command = runs_plain()
        if command is not None:  # shell, fetch, parse...: one page, not a fleet's crawl
            logger.info("scrapy_leased: off for `scrapy %s` (it runs as plain Scrapy and "
                        "writes nothing to Redis)", command)
            return
        try:
            check_reactor(settings)
            config = LeasedConfig.from_settings(settings)  # every LEASED_* setting, or one error
            if config.redis_url is not None:
                # one clear error, before the engine exists; a Redis that does not answer yet
                # (restarting, failing over) is waited for, up to LEASED_CONNECT_TIMEOUT
                check_reachable(config.redis_url, timeout=config.connect_timeout)
        except (LeasedConfigError, LeasedRedisError) as exc:
            exit_if_command_line(exc)  # scrapy crawl: one line, exit status 1
            raise
        settings.set("SCHEDULER", LeasedScheduler, "addon")
        # feeds flushed before the acks of their pages; %(worker)s in feed URIs
        install_feed_exports(settings)
        settings.set("DUPEFILTER_CLASS", LeasedDupeFilter, "addon")
        settings.setdefault_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", LeasedFailureMiddleware, FAILURE_MIDDLEWARE_ORDER
        )
        settings.setdefault_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", LeasedStartMiddleware, START_MIDDLEWARE_ORDER
        )
        settings.setdefault_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", LeasedRateMiddleware, RATE_MIDDLEWARE_ORDER
        )
        install_cookies(settings)
        if config.logstats_interval:
            settings.setdefault_in_component_priority_dict(
                "EXTENSIONS", LeasedLogStats, LOGSTATS_EXTENSION_ORDER
            )
        if config.fleet_stats:
            settings.setdefault_in_component_priority_dict(
                "EXTENSIONS", LeasedFleetStats, FLEET_STATS_EXTENSION_ORDER
            )
        if config.upsert.enabled:
            settings.setdefault_in_component_priority_dict(
                "ITEM_PIPELINES", UpsertPipeline, UPSERT_PIPELINE_ORDER
            )
            settings.setdefault_in_component_priority_dict(
                "SPIDER_MIDDLEWARES", UpsertFenceMiddleware, UPSERT_FENCE_MIDDLEWARE_ORDER
            )
