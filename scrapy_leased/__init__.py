"""scrapy_leased: one Scrapy crawl on many workers, with every request leased from Redis."""

from ._version import __version__
from .addon import Addon
from .dupefilter import LeasedDupeFilter
from .middleware import LeasedFailureMiddleware
from .scheduler import LeasedScheduler, claim_token

__all__ = ["Addon", "LeasedDupeFilter", "LeasedFailureMiddleware", "LeasedScheduler",
           "claim_token"]
