"""The crawl's layouts in Redis, recorded on first use and checked by every caller after
(lua/layout.lua): the seen set's (bucket bits, expiry of seen entries) and the queues'
(``QUEUE_LAYOUT``). A crawl started before the queues' layout was recorded is of layout
1 (a ZSET per lane for every priority but 0) unless none of its queues is."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from .keys import QUEUE_LAYOUT, CrawlKeys
from .scripts import as_str

#: How many lanes the look for a queue of layout 1 reads at a time
SCAN_BATCH = 1000


class Recorded(NamedTuple):
    """lua/layout.lua's reply: the layouts as recorded (``queues`` None: none)."""

    bucket_bits: int
    seen_ttl_ms: int
    queues: int | None

    @classmethod
    def parse(cls, out: Any) -> Recorded:
        bits, ttl, queues = out
        return cls(int(bits), int(ttl), None if queues is None else int(queues))


class LayoutCheck:
    """Records and checks one crawl's layouts (``script``: lua/layout.lua registered)."""

    def __init__(self, client: Any, keys: CrawlKeys, script: Any) -> None:
        self.client = client
        self.keys = keys
        self.script = script

    async def check_seen(self, seen_bucket_bits: int, seen_ttl_ms: int,
                         queues: bool) -> Recorded:
        """Record the layouts on first use (``queues`` False: not the queues'); raise
        ValueError, naming the setting at fault, on a different seen-set layout.
        Returns the layouts as recorded, for ``check_queues``."""
        recorded = await self._record(seen_bucket_bits, seen_ttl_ms, "1" if queues else "0")
        self._check_seen(recorded, seen_bucket_bits, seen_ttl_ms)
        return recorded

    async def check_queues(self, recorded: Recorded, seen_bucket_bits: int,
                           seen_ttl_ms: int) -> None:
        """Raise ValueError when the queues' layout recorded is another than
        ``QUEUE_LAYOUT``; a crawl without one recorded gets it when none of its queues
        is of layout 1."""
        if recorded.queues is None and not await self.old_queues():
            recorded = await self._record(seen_bucket_bits, seen_ttl_ms, "2")
        if recorded.queues != QUEUE_LAYOUT:
            layout = 1 if recorded.queues is None else recorded.queues
            raise ValueError(
                f"Crawl {self.keys.crawl_id!r} was queued by a version of scrapy_leased with "
                f"another layout of its queues in Redis (layout {layout}; this version uses "
                f"{QUEUE_LAYOUT}: a LIST per lane and priority): its queued requests of "
                f"priorities other than 0 would not be found. Finish the crawl with the "
                f"version that started it, or start it afresh (`scrapy leased reset`, or "
                f"LEASED_FLUSH_ON_START = True), or use a new LEASED_CRAWL_ID.")

    @staticmethod
    def _check_seen(recorded: Recorded, seen_bucket_bits: int, seen_ttl_ms: int) -> None:
        bits, ttl = recorded.bucket_bits, recorded.seen_ttl_ms
        if bits != seen_bucket_bits:
            raise ValueError(
                f"LEASED_SEEN_BUCKET_BITS ({seen_bucket_bits}) differs from the value this "
                f"crawl was started with ({bits}); changing it would forget seen URLs. "
                f"Set it back to {bits}, or use a new LEASED_CRAWL_ID."
            )
        if ttl != seen_ttl_ms:
            raise ValueError(
                f"LEASED_SEEN_TTL ({seen_ttl_ms / 1000:g}) differs from the value this crawl "
                f"was started with ({ttl / 1000:g}; 0: seen entries never expire): the "
                f"seen set is kept another way for each. Set it back to {ttl / 1000:g}, or "
                f"use a new LEASED_CRAWL_ID.")

    async def _record(self, bits: int, ttl: int, mode: str) -> Recorded:
        return Recorded.parse(await self.script(keys=[self.keys.meta, self.keys.lanes],
                                                args=[bits, ttl, QUEUE_LAYOUT, mode]))

    async def old_queues(self) -> bool:
        """Whether a lane of this crawl has a queue ZSET of layout 1 (members
        ``<12-char prefix><envelope>``, where layout 2 has tier codes: lua/lib_settle.lua),
        looked at once when a crawl started before the layout was recorded has lanes."""
        lanes: list[str] = []
        async for lane, _ in self.client.zscan_iter(self.keys.lanes, count=SCAN_BATCH):
            lanes.append(as_str(lane))
        for i in range(0, len(lanes), SCAN_BATCH):
            async with self.client.pipeline(transaction=False) as p:
                for lane in lanes[i:i + SCAN_BATCH]:
                    p.zrange(self.keys.lane_queue(lane), 0, 0)
                heads = await p.execute()
            if any(head and not re.fullmatch(r"[ps]-?\d+", as_str(head[0])) for head in heads):
                return True
        return False
