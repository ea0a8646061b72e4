"""The crawl's frontier in Redis: key names, Lua scripts, the state machine, the writer.

Nothing here imports Scrapy: the frontier takes a Redis client and plain values, so it
can be driven (and tested) without a crawler.
"""

from .envelope import Envelope
from .keys import CrawlKeys
from .machine import (
    CONTROL_STATES,
    NO_BUDGET,
    NO_LIMITS,
    PAUSED,
    RUNNING,
    STOPPING,
    Budget,
    ClaimResult,
    CloseLimits,
    CommitResult,
    Failure,
    FeedBatch,
    Frontier,
    NewRequest,
    Revisit,
)
from .scripts import as_str

__all__ = ["CONTROL_STATES", "NO_BUDGET", "NO_LIMITS", "PAUSED", "RUNNING", "STOPPING",
           "Budget", "ClaimResult", "CloseLimits", "CommitResult", "CrawlKeys", "Envelope",
           "FeedBatch", "Failure", "Frontier", "NewRequest", "Revisit", "as_str"]
