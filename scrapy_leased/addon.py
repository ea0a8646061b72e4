"""The add-on: ``ADDONS = {"scrapy_leased.Addon": 100}`` turns the plugin on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import LeasedConfig
from .connection import check_reachable
from .dupefilter import LeasedDupeFilter
from .logstats import LeasedLogStats, logstats_interval
from .budget import Budgets
from .middleware import LeasedFailureMiddleware
from .ratelimit import LeasedRateMiddleware
from .scheduler import LeasedScheduler
from .upsert import UpsertConfig, UpsertFenceMiddleware, UpsertPipeline

if TYPE_CHECKING:
    from scrapy.settings import Settings

#: Next to the engine, so it sees only final download outcomes (after retries).
FAILURE_MIDDLEWARE_ORDER = 10
#: Next to the downloader (after robots.txt, retries, redirects and the HTTP cache), so
#: only requests really about to be sent take rate budget, and it sees raw 429/503.
RATE_MIDDLEWARE_ORDER = 950
#: Near the end of the item pipelines: items are stored once the project's own
#: pipelines have cleaned (or dropped) them.
UPSERT_PIPELINE_ORDER = 800
#: Next to the engine, so it sees the items every other spider middleware let through.
UPSERT_FENCE_MIDDLEWARE_ORDER = 10
#: The fleet log line (like Scrapy's LogStats, also at 0).
LOGSTATS_EXTENSION_ORDER = 0


class Addon:
    """Sets the leased scheduler, dupefilter and middleware at "addon" priority, so a
    project can still override each of them, and validates every LEASED_* setting."""

    def update_settings(self, settings: Settings) -> None:
        config = LeasedConfig.from_settings(settings)  # fail fast, naming the bad setting
        if config.redis_url is not None:
            # one clear error, before the engine exists; a Redis that does not answer yet
            # (restarting, failing over) is waited for, up to LEASED_CONNECT_TIMEOUT
            check_reachable(config.redis_url, timeout=config.connect_timeout)
        settings.set("SCHEDULER", LeasedScheduler, "addon")
        settings.set("DUPEFILTER_CLASS", LeasedDupeFilter, "addon")
        settings.setdefault_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", LeasedFailureMiddleware, FAILURE_MIDDLEWARE_ORDER
        )
        Budgets.from_settings(settings)  # validate the rate settings too
        settings.setdefault_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", LeasedRateMiddleware, RATE_MIDDLEWARE_ORDER
        )
        if logstats_interval(settings):  # validated here: a bad value stops the crawl
            settings.setdefault_in_component_priority_dict(
                "EXTENSIONS", LeasedLogStats, LOGSTATS_EXTENSION_ORDER
            )
        if UpsertConfig.from_settings(settings).enabled:
            settings.setdefault_in_component_priority_dict(
                "ITEM_PIPELINES", UpsertPipeline, UPSERT_PIPELINE_ORDER
            )
            settings.setdefault_in_component_priority_dict(
                "SPIDER_MIDDLEWARES", UpsertFenceMiddleware, UPSERT_FENCE_MIDDLEWARE_ORDER
            )
