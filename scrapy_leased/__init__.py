"""scrapy_leased: one Scrapy crawl on many workers, with every request leased from Redis.

The public names are loaded on first use (PEP 562), so importing a subpackage that
knows nothing of Scrapy (``scrapy_leased.frontier``) does not import Scrapy.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .addon import Addon
    from .feed import AsyncCrawl, Crawl
    from .meta import claim_token
    from .observe.spidermon import FleetSpidermon
    from .worker.dupefilter import LeasedDupeFilter
    from .worker.middleware import LeasedFailureMiddleware
    from .worker.scheduler import LeasedScheduler

_EXPORTS = {
    "Addon": "addon",
    "AsyncCrawl": "feed",
    "Crawl": "feed",
    "FleetSpidermon": "observe.spidermon",  # needs spidermon installed
    "LeasedDupeFilter": "worker.dupefilter",
    "LeasedFailureMiddleware": "worker.middleware",
    "LeasedScheduler": "worker.scheduler",
    "claim_token": "meta",
}
__all__ = ["Addon", "AsyncCrawl", "Crawl", "FleetSpidermon", "LeasedDupeFilter",
           "LeasedFailureMiddleware", "LeasedScheduler", "claim_token", "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value
