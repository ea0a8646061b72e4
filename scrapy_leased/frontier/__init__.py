"""The crawl's frontier in Redis: key names, Lua scripts, the state machine, the writer.

Nothing here imports Scrapy: the frontier takes a Redis client and plain values, so it
can be driven (and tested) without a crawler.
"""

from . import model
from .envelope import Envelope
from .keys import CrawlKeys
from .machine import Frontier
from .model import *  # noqa: F403 (the values callers pass and get back: model.__all__)
from .scripts import as_str

__all__ = ["CrawlKeys", "Envelope", "Frontier", "as_str"]
__all__ += model.__all__
