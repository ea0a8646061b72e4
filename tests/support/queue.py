"""Read a lane's queue as the scripts see it (lua/lib_settle.lua): a ZSET for priorities
other than 0 (member ``<12-char prefix><envelope>``) and a LIST for priority 0."""

from __future__ import annotations

from typing import Any

from scrapy_leased.frontier import Envelope, as_str
from scrapy_leased.frontier.keys import CrawlKeys


def in_claim_order(zset: list[tuple[Any, float]], fifo: list[Any]) -> list[str]:
    """Envelopes of one lane in the order claims take them, from ``ZRANGE .. WITHSCORES``
    of its ZSET and ``LRANGE`` of its LIST: priorities above 0, then 0, then below."""
    high = [as_str(m)[12:] for m, score in zset if score < 0]
    low = [as_str(m)[12:] for m, score in zset if score >= 0]
    return high + [as_str(m) for m in fifo] + low


def queued(r: Any, keys: CrawlKeys, lane: str = "") -> list[str]:
    """A lane's queued envelopes (strings) in claim order, read in one MULTI."""
    p = r.pipeline(transaction=True)
    p.zrange(keys.lane_queue(lane), 0, -1, withscores=True).lrange(keys.lane_fifo(lane), 0, -1)
    zset, fifo = p.execute()
    return in_claim_order(zset, fifo)


def queued_envelopes(r: Any, keys: CrawlKeys, lane: str = "") -> list[Envelope]:
    return [Envelope.parse(e) for e in queued(r, keys, lane)]


def queue_len(r: Any, keys: CrawlKeys, lane: str = "") -> int:
    """How many requests a lane's queue holds."""
    return int(r.zcard(keys.lane_queue(lane))) + int(r.llen(keys.lane_fifo(lane)))
