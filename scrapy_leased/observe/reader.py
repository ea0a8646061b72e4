"""The crawls of one Redis as ``scrapy leased status --json`` shows them, for the
exporter (metrics.py) and the dashboard (dashboard/server.py): one source of truth.

``FleetReader.read(crawl)`` takes one ``FleetAdmin.snapshot`` and returns it with the
document ``status --json`` prints for it (``status_doc``), the warnings computed against
the sample about ``trend_s`` older (as ``status --watch`` does). Each crawl keeps a short
history of samples (what the dashboard plots). Reading one snapshot costs a bounded
number of Redis commands whatever the crawl's size (tests/test_observe_cost.py); the
list of crawls is a SCAN of the keyspace, so it is read at most once per
``CRAWL_LIST_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..fleet.admin import DeadLetter, FleetAdmin, parse_dead_letter
from ..fleet.report import status_doc, status_warnings
from ..fleet.snapshot import Snapshot
from ..frontier import as_str
from ..frontier.keys import CrawlKeys
from ..settings import Budgets

CRAWL_LIST_SECONDS = 30.0  # the crawl list (a SCAN of the keyspace) is kept this long
TREND_SECONDS = 10.0  # warnings compare with the sample at least this old (status --watch)
HISTORY_POINTS = 900  # samples kept per crawl for the plots ...
HISTORY_STEP_MS = 1000  # ... at most one per this many ms of Redis time
DEAD_SHOWN = 50  # dead letters read per snapshot (one HSCAN call: bounded)


@dataclass
class Reading:
    snapshot: Snapshot
    doc: dict[str, Any]  # what ``status --json`` prints


@dataclass
class FleetReader:
    """Reads the crawls of one Redis (``client``, shown as ``where``); ``only``: the crawls
    shown, else every crawl in the Redis. The other parameters are the workers' settings
    that status needs (worker TTL, lease, attempts, ``CONCURRENT_REQUESTS``)."""

    client: Any
    where: str
    budgets: Budgets
    _: KW_ONLY
    worker_ttl_ms: int
    lease_ms: int
    max_attempts: int
    default_capacity: int
    only: list[str] | None = None
    trend_s: float = TREND_SECONDS
    _admins: dict[str, FleetAdmin] = field(default_factory=dict, init=False)
    _history: dict[str, deque[Snapshot]] = field(default_factory=dict, init=False)
    _crawls: tuple[float, list[str]] | None = field(default=None, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    async def crawls(self) -> list[str]:
        """The crawls shown: the ones named, else those in this Redis (cached)."""
        if self.only is not None:
            return list(self.only)
        now = time.monotonic()
        if self._crawls is None or now - self._crawls[0] > CRAWL_LIST_SECONDS:
            self._crawls = (now, await FleetAdmin.list_crawls(self.client))
        return list(self._crawls[1])

    async def known(self, crawl: str) -> bool:
        """Whether the crawl is shown: in the list, or (younger than the cached list)
        with state in this Redis (one EXISTS)."""
        if crawl in await self.crawls():
            return True
        if self.only is not None or not await self.admin(crawl).exists():
            return False
        if self._crawls is not None:
            self._crawls = (self._crawls[0], sorted({*self._crawls[1], crawl}))
        return True

    def admin(self, crawl: str) -> FleetAdmin:
        if crawl not in self._admins:
            self._admins[crawl] = FleetAdmin(
                self.client, CrawlKeys(crawl), worker_ttl_ms=self.worker_ttl_ms,
                lease_ms=self.lease_ms, max_attempts=self.max_attempts)
        return self._admins[crawl]

    async def read(self, crawl: str) -> Reading:
        cur = await self.admin(crawl).snapshot()
        async with self._lock:
            history = self._history.setdefault(crawl, deque(maxlen=HISTORY_POINTS))
            if not history or cur.now_ms - history[-1].now_ms >= HISTORY_STEP_MS:
                history.append(cur)
            prev = next((s for s in reversed(history)
                         if (cur.now_ms - s.now_ms) / 1000 >= self.trend_s), None)
            if prev is None and history and history[0] is not cur:
                prev = history[0]  # younger than trend_s: the oldest sample there is
        warnings = status_warnings(cur, prev, self.default_capacity)
        return Reading(cur, status_doc(cur, prev, warnings, self.where, self.budgets))

    def history(self, crawl: str) -> list[dict[str, Any]]:
        """The crawl's samples, oldest first: time, todo, processing, done, dead,
        pages_per_min."""
        return [{"time": s.now_ms / 1000, "todo": s.todo, "processing": s.processing,
                 "done": s.done, "dead": s.dead, "pages_per_min": round(s.pages_per_min, 1)}
                for s in self._history.get(crawl, ())]

    async def dead_letters(self, crawl: str, limit: int = DEAD_SHOWN) -> list[DeadLetter]:
        """Up to about ``limit`` dead letters, newest first among those read: one HSCAN
        call, never a scan of them all."""
        _, flat = await self.client.hscan(self.admin(crawl).keys.dead, 0, count=limit)
        letters = [parse_dead_letter(as_str(rid), as_str(raw)) for rid, raw in flat.items()]
        letters.sort(key=lambda d: (-d.t_ms, d.rid))
        return letters[:limit]

    async def letters(self, crawl: str, rids: list[str]) -> list[DeadLetter]:
        """The dead letters of these rids still there (one HMGET)."""
        if not rids:
            return []
        raw = await self.client.hmget(self.admin(crawl).keys.dead, rids)
        return [parse_dead_letter(rid, as_str(v)) for rid, v in zip(rids, raw) if v is not None]
