"""Counts on their way to Scrapy's stats: the per-request ones (dequeued, enqueued,
acked) are added up here and passed on in one ``inc_value`` per stat and commit.

Each call to Scrapy's ``StatsCollector`` goes through its ``__getattribute__`` hook
and the wrapper that warns about a ``spider`` argument; with a handful of stats per
request, those calls were a measurable part of a worker's time per request (the
scheduler benchmark's dequeue rate rose 7 % when the commit's were batched). The
counts reach the stats when a commit is written (settle.py), before the fleet stats
take their deltas for a commit or a flush (observe/stats.py: a commit that acks a
request carries the stats of its processing), and when the worker closes, before
Scrapy dumps its stats."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector


class Tally:
    def __init__(self, stats: StatsCollector) -> None:
        self.stats = stats
        self.counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        counts = self.counts
        counts[name] = counts.get(name, 0) + n

    def flush(self) -> None:
        """Pass the counts on to the stats."""
        if self.counts:
            counts, self.counts = self.counts, {}
            inc = self.stats.inc_value
            for name, n in counts.items():
                inc(name, n)
