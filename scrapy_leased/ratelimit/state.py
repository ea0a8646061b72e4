"""A lane's rate-budget state as lua/lib_rate.lua keeps it (the lane's ``rate`` HASH),
decoded in Python: the one reader of that shape outside Lua (``scrapy leased status``
and the fleet snapshot use it). No Scrapy here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..settings.defaults import HALF_LIFE_MS as HALF_LIFE_MS  # LEASED_RATE_RECOVERY's

#: The fields read, in this order (see lua/lib_rate.lua): GCRA arrival time, blocked
#: until, slowdown factor and when it was set, Crawl-delay in ms.
RATE_FIELDS = ("tat", "blk", "pf", "pt", "cd")


@dataclass(frozen=True)
class RateState:
    """Times in ms of Redis TIME."""

    tat: float = 0.0  # theoretical arrival time of the next request (GCRA)
    blocked_until: float = 0.0  # no request before (Retry-After, 429/503)
    factor: float = 1.0  # slowdown factor set by the last 429/503
    factor_at: float = 0.0  # when it was set
    crawl_delay_ms: float = 0.0

    @classmethod
    def from_reply(cls, values: Sequence[Any]) -> RateState:
        """From an ``HMGET <rate key> *RATE_FIELDS`` reply (missing fields: defaults)."""
        tat, blk, pf, pt, cd = (float(v) if v not in (None, b"", "") else None
                                for v in values)
        return cls(tat or 0.0, blk or 0.0, pf or 1.0, pt or 0.0, cd or 0.0)

    def slowdown(self, now_ms: float, half_life_ms: float) -> float:
        """The factor on the lane's interval now (1: none), as lib_rate.lua's ``slowdown``."""
        if self.factor <= 1:
            return 1.0
        decayed: float = self.factor * 0.5 ** ((now_ms - self.factor_at) / half_life_ms)
        return max(1.0, decayed)
