"""pytest plugin (``-p leased_plugin``): Scrapy's own tests with scrapy_leased switched on.

No test is edited: the add-on goes into Scrapy's *default* settings, so every crawler a
test builds (``get_crawler``, ``CrawlerRunner``, ``AsyncCrawlerProcess``...) enables it
unless the test sets ``ADDONS`` itself. Each ``Crawler`` gets a fresh ``LEASED_CRAWL_ID``
(at default priority), so no two crawls of the run share a frontier. Redis:
``LEASED_COMPAT_REDIS_URL`` (run.py starts a private ``redis-server``).
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any

_ids = itertools.count(1)
_run = uuid.uuid4().hex[:8]


def pytest_configure(config: Any) -> None:
    from scrapy.crawler import Crawler
    from scrapy.settings import default_settings

    url = os.environ.get("LEASED_COMPAT_REDIS_URL")
    if not url:
        raise RuntimeError("leased_plugin needs LEASED_COMPAT_REDIS_URL (see run.py)")
    default_settings.ADDONS = {"scrapy_leased.Addon": 100}
    default_settings.LEASED_REDIS_URL = url

    original_init = Crawler.__init__

    def __init__(self: Crawler, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not self.settings.frozen:
            self.settings.set("LEASED_CRAWL_ID", f"compat-{_run}-{next(_ids)}", "default")

    Crawler.__init__ = __init__  # type: ignore[method-assign]
