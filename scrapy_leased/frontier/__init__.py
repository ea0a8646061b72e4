"""The crawl's frontier in Redis: key names, Lua scripts, the state machine, the writer.

Nothing here imports Scrapy: the frontier takes a Redis client and plain values, so it
can be driven (and tested) without a crawler.
"""

from .envelope import Envelope
from .keys import CrawlKeys
from .machine import (
    NO_BUDGET,
    Budget,
    ClaimResult,
    CommitResult,
    Failure,
    Frontier,
    NewRequest,
)
from .scripts import as_str

__all__ = ["NO_BUDGET", "Budget", "ClaimResult", "CommitResult", "CrawlKeys", "Envelope",
           "Failure", "Frontier", "NewRequest", "as_str"]
