"""Fleet-wide Scrapy stats: a worker's stats deltas added to the crawl's in Redis.

``StatsFlusher.flush(stats)`` sends what changed in a worker's stats since its last
flush to lua/stats_flush.lua, which adds it to the crawl's ``fleet_stats`` HASH: numbers
added up (HINCRBY / HINCRBYFLOAT), maxima (``*max``, ``memusage/startup``) kept as
maxima, ``start_time`` kept as the first and ``finish_time`` as the last (epoch
seconds). Other values (strings, booleans, other datetimes) are not sent;
``elapsed_time_seconds`` (last finish minus first start), ``responses_per_minute`` and
``items_per_minute`` are derived when reading.

The deltas also ride along with the worker's commits that settle claims
(``compose_ops``, frontier/writer.py; applied once per commit call by lua/commit.lua),
so most of them need no call of their own. Each flush carries the worker's next
sequence number, and a flush that failed is sent
again unchanged (same number, same deltas) before anything new: Redis applies it once
even when the first try ran and only its reply was lost.

``decode_fleet_stats`` turns the HASH back into a dict (used by admin.Snapshot). No
Scrapy here: the extension wiring it to a crawl is observe/stats.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from ..frontier.keys import CrawlKeys
from ..frontier.scripts import Scripts

#: fleet/lua/stats_flush.lua, with the frontier's lib_stats.lua
SCRIPTS = Scripts("scrapy_leased.fleet", {"stats_flush": ("lib_stats",)})
#: How long Redis keeps a worker's last flush number: far longer than a resend takes.
SEQ_TTL_MS = 3_600_000
FIRST = {"start_time"}  # datetimes kept as the first
LAST = {"finish_time"}  # datetimes kept as the last
#: Computed when reading, from the fleet's times and counts (as CoreStats and LogStats do)
DERIVED = {"elapsed_time_seconds", "responses_per_minute", "items_per_minute"}
MAX_NAMES = {"memusage/startup"}  # levels, not counts: the fleet's largest
#: The largest stat value (and delta) sent, either sign (lib_stats.lua STAT_LIMIT): a
#: stat beyond it, or not finite (nan, inf: a numpy mean of nothing), is not sent.
STAT_LIMIT = 2 ** 63

logger = logging.getLogger(__name__)


def stat_in_range(value: int | float) -> bool:
    """Whether a stat value (or delta) can be sent: finite, at most STAT_LIMIT."""
    if isinstance(value, int):
        return -STAT_LIMIT <= value <= STAT_LIMIT
    return math.isfinite(value) and -STAT_LIMIT <= value <= STAT_LIMIT


def stat_op(name: str, value: Any) -> tuple[str, Any] | None:
    """(op for stats_flush.lua, value as sent) for a stat, None when it is not sent."""
    if name in DERIVED or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        if name not in FIRST and name not in LAST:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return ("min" if name in FIRST else "max"), value.timestamp()
    if not isinstance(value, (int, float)):
        return None
    if name.endswith("max") or name in MAX_NAMES:
        return "max", value
    return ("i" if isinstance(value, int) else "f"), value


def _number_text(value: Any) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


class StatsFlusher:
    """One worker's flushes (one at a time: callers share a lock)."""

    def __init__(self, client: Any, keys: CrawlKeys, worker_id: str) -> None:
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self._script = SCRIPTS.register(client, "stats_flush")["stats_flush"]
        self._sent: dict[str, Any] = {}  # values as of the last flush composed
        self._refused: set[str] = set()  # stats warned of (stat_in_range)
        self._seq = 0
        self._pending: list[Any] | None = None  # composed, not yet acknowledged by Redis
        self._lock = asyncio.Lock()
        self.flushes = 0  # applied
        self.resent = 0  # answered "applied before" (a lost reply)

    def compose(self, stats: Mapping[str, Any]) -> list[Any] | None:
        """The next flush's ARGV for ``stats`` (None: nothing changed); the values are
        then counted as sent."""
        args = self.compose_ops(stats)
        if not args:
            return None
        self._seq += 1
        return [self._seq, SEQ_TTL_MS, *args]

    def compose_ops(self, stats: Mapping[str, Any]) -> list[Any]:
        """What changed in ``stats`` since the last values composed, as flat triples
        {op, name, value} (lib_stats.lua), then counted as sent: whoever sends them
        (a flush, or a commit they ride along with: frontier/writer.py) sends them
        again until Redis has applied them once."""
        args: list[Any] = []
        refused: list[tuple[str, Any]] = []
        # a copy: a warning logged meanwhile counts in the stats (log_count/WARNING)
        for name, value in list(stats.items()):
            op = stat_op(name, value)
            if op is None:
                continue
            kind, number = op
            before = self._sent.get(name)
            delta = number - (before or 0) if kind in ("i", "f") else number
            if not (stat_in_range(number) and stat_in_range(delta)):
                refused.append((name, number))
                continue  # the value is not sent; its next one in range is
            if kind in ("i", "f"):
                if delta:
                    args += [kind if isinstance(delta, int) else "f", name, _number_text(delta)]
            elif number != before:
                args += [kind, name, _number_text(number)]
            self._sent[name] = number
        for name, number in refused:
            self._refuse(name, number)
        return args

    def _refuse(self, name: str, value: Any) -> None:
        if name not in self._refused:
            self._refused.add(name)
            logger.warning("Stat %(name)r is %(value)r: not added to the fleet stats (a "
                           "stat sent must be a finite number within +-2**63; the next "
                           "value of it in range is)", {"name": name, "value": value})

    async def flush(self, stats: Mapping[str, Any]) -> None:
        """Send a failed flush again, then what changed since; raises RedisError/OSError
        (the deltas are kept and sent by the next call)."""
        async with self._lock:
            if self._pending is None:
                self._pending = self.compose(dict(stats))
            if self._pending is not None:
                await self._send(self._pending)
                self._pending = None
            more = self.compose(dict(stats))  # changed while the resend was in flight
            if more is not None:
                self._pending = more
                await self._send(more)
                self._pending = None

    async def _send(self, args: list[Any]) -> None:
        keys = [self.keys.fleet_stats, self.keys.stats_seq(self.worker_id)]
        if int(await self._script(keys=keys, args=args)):
            self.flushes += 1
        else:
            self.resent += 1


def decode_fleet_stats(flat: Iterable[tuple[Any, Any]]) -> dict[str, int | float]:
    """The ``fleet_stats`` HASH as a dict: integral values as int, and
    ``elapsed_time_seconds`` (last finish_time - first start_time) when both are set."""
    out: dict[str, int | float] = {}
    for raw_name, raw_value in flat:
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        text = raw_value.decode() if isinstance(raw_value, bytes) else str(raw_value)
        try:
            number = float(text)
        except ValueError:
            continue
        out[name] = int(number) if number.is_integer() and name not in FIRST | LAST else number
    start, finish = out.get("start_time"), out.get("finish_time")
    if start is not None and finish is not None:
        elapsed = out["elapsed_time_seconds"] = round(finish - start, 6)
        if elapsed > 0:
            minutes = elapsed / 60
            out["responses_per_minute"] = out.get("response_received_count", 0) / minutes
            out["items_per_minute"] = out.get("item_scraped_count", 0) / minutes
    return dict(sorted(out.items()))


#: The fleet stats ``scrapy leased status`` lists (``--json`` gives them all).
HEADLINE = ("item_scraped_count", "item_dropped_count", "response_received_count",
            "downloader/request_count", "downloader/exception_count", "log_count/ERROR",
            "log_count/WARNING", "elapsed_time_seconds", "leased/dropped")
HEADLINE_PREFIXES = ("downloader/response_status_count/",)


def headline_stats(stats: Mapping[str, int | float]) -> list[tuple[str, int | float]]:
    """The fleet stats worth a line in ``status``, in a fixed order."""
    out = [(name, stats[name]) for name in HEADLINE if name in stats]
    out += sorted((n, v) for n, v in stats.items() if n.startswith(HEADLINE_PREFIXES))
    return out
