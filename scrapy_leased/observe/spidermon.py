"""Spidermon on the whole fleet: ``scrapy_leased.FleetSpidermon``.

Spidermon's extension (``spidermon.contrib.scrapy.extensions.Spidermon``) runs the
SPIDERMON_SPIDER_CLOSE_MONITORS on each worker's ``spider_closed``, with that worker's
own stats: with N workers, N runs, each on a share of the crawl. ``FleetSpidermon`` is
that extension (a subclass: the same settings, suites, actions and periodic monitors)
with one change: the close monitors run on ``scrapy_leased.signals.fleet_closed``, sent
once per run of the crawl on its last worker, with the fleet's stats as
``data["stats"]`` (Spidermon's own field coverage computed on them), so that
``ItemCountMonitor`` and the others check the whole crawl, once. The monitors get the
data Spidermon builds (``_generate_data_for_spider``: crawler, spider, job, ...), only the
stats replaced, and are run by Spidermon's ``SpiderMonitorRunner`` as Spidermon runs
them.

Use it in place of Spidermon's extension::

    EXTENSIONS = {
        "spidermon.contrib.scrapy.extensions.Spidermon": None,
        "scrapy_leased.FleetSpidermon": 500,
    }

On a worker whose crawl is not leased (the add-on off, another scheduler) it runs the
close monitors on ``spider_closed``, as Spidermon does; so it does with
LEASED_FLEET_STATS off (with a warning: then each worker checks its own share). The
open, periodic and engine-stop monitors run on each worker, as with Spidermon.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object
from spidermon.contrib.scrapy.extensions import Spidermon  # type: ignore[import-untyped]
from spidermon.contrib.scrapy.runners import SpiderMonitorRunner  # type: ignore[import-untyped]
from spidermon.utils.field_coverage import (  # type: ignore[import-untyped]
    calculate_field_coverage,
)

from ..runtime import worker_of
from ..signals import fleet_closed
from .stats import LeasedFleetStats

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

SPIDERMON_EXTENSION = "spidermon.contrib.scrapy.extensions.Spidermon"


class FleetSpidermon(Spidermon):  # type: ignore[misc]
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSpidermon:
        ext: FleetSpidermon = super().from_crawler(crawler)
        crawler.signals.connect(ext.fleet_closed, signal=fleet_closed)
        if _enabled(crawler, SPIDERMON_EXTENSION):
            logger.warning(
                "Both %(theirs)s and scrapy_leased.FleetSpidermon are in EXTENSIONS: the "
                "close monitors run on each worker's own stats too. Disable Spidermon's "
                "(EXTENSIONS = {%(theirs)r: None, ...})", {"theirs": SPIDERMON_EXTENSION})
        return ext

    def _fleet_wide(self) -> bool:
        """Whether this worker's fleet stats extension is at work (its crawl is leased
        and LEASED_FLEET_STATS on): then fleet_closed comes."""
        for ext in getattr(self.crawler.extensions, "middlewares", ()):
            if isinstance(ext, LeasedFleetStats) and ext.flusher is not None:
                return True
        return False

    def spider_closed(self, spider: Any) -> None:
        if not self._fleet_wide():
            if worker_of(self.crawler) is not None:
                logger.warning("The fleet stats are off (LEASED_FLEET_STATS = False, or "
                               "their extension removed from EXTENSIONS): FleetSpidermon "
                               "runs the close monitors on this worker's own stats, on "
                               "every worker")
            super().spider_closed(spider)
            return
        for task in self.periodic_tasks.get(spider, []):
            if task.running:
                task.stop()

    def fleet_closed(self, stats: dict[str, Any], reason: str, spider: Any) -> None:
        """The run's last worker: the close monitors on the fleet's stats."""
        fleet = dict(stats)
        fleet.update(calculate_field_coverage(fleet))
        data = self._generate_data_for_spider(spider)
        data["stats"] = fleet
        for suite in self.spider_closed_suites:
            SpiderMonitorRunner(spider=spider).run(suite, **data)


def _enabled(crawler: Crawler, path: str) -> bool:
    """Whether the extension class at ``path`` is enabled in EXTENSIONS (with its base)."""
    try:
        wanted = load_object(path)
    except (ImportError, NameError, ValueError):
        return False
    for name, order in crawler.settings.getwithbase("EXTENSIONS").items():
        if order is None:
            continue
        try:
            cls = load_object(name) if isinstance(name, str) else name
        except (ImportError, NameError, ValueError):
            continue
        if cls is wanted:
            return True
    return False
