"""The crawl at one moment, as ``FleetAdmin.snapshot`` reads it from Redis."""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerState:
    """One worker of the registry (``workers`` + ``worker_info`` + ``worker_acked``)."""

    id: str
    heartbeat_ms: int
    heartbeat_age_s: float  # seconds since its last heartbeat (Redis time)
    alive: bool  # heartbeat younger than the worker TTL
    inflight: int | None = None  # claims held at its last heartbeat
    acked: int | None = None  # requests it acked with their lease held (worker_acked: now)
    capacity: int | None = None  # CONCURRENT_REQUESTS + LEASED_PREFETCH
    host: str | None = None
    pid: int | None = None
    started: float | None = None  # its own clock, epoch seconds
    control: str | None = None  # the control state it saw last (running, paused, stopping)
    #: Claims it held and had not started (claimed, or waiting in a download slot's
    #: queue), the longest any of them had waited (seconds), and the largest delay of
    #: their download slots (DOWNLOAD_DELAY, AutoThrottle), at its last heartbeat
    unstarted: int | None = None
    unstarted_s: float | None = None
    slot_delay: float | None = None

    def process_gone(self) -> bool:
        """True when the worker ran on this machine and its process no longer exists
        (killed: its registry entry stays until the worker TTL passes). Host and pid are
        what the worker recorded (worker_info, from its open on); unknown: False."""
        if self.pid is None or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


@dataclass(frozen=True)
class ControlState:
    """The fleet's control state (the ``control`` HASH: ``scrapy leased pause``, ``resume``,
    ``stop``, or a LEASED_CLOSE_* limit reached)."""

    state: str = "running"
    since_ms: int = 0  # when it was set (Redis time), 0: never
    by: str = ""
    reason: str = ""

    @classmethod
    def from_hash(cls, raw: dict[Any, Any]) -> ControlState:
        h = {(k.decode() if isinstance(k, bytes) else str(k)):
             (v.decode() if isinstance(v, bytes) else str(v)) for k, v in raw.items()}
        try:
            since = int(h.get("since") or 0)
        except ValueError:
            since = 0
        return cls(h.get("state") or "running", since, h.get("by", ""), h.get("reason", ""))

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "since": self.since_ms / 1000 if self.since_ms else None,
                "by": self.by or None, "reason": self.reason or None}


@dataclass
class LaneState:
    """One lane (host) as its rate-budget state shows it (lua/lib_rate.lua)."""

    lane: str
    queued: int
    ready_in_s: float  # 0 when it may be served now
    ahead_s: float  # how far its GCRA arrival time runs ahead of now: budget in use
    blocked_s: float  # left of a block set by a 429/503 (Retry-After)
    slowdown: float  # factor on its interval after 429/503 answers (1 = none)
    crawl_delay_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Snapshot:
    """The crawl at one moment (``now_ms``, Redis time)."""

    crawl: str
    now_ms: int
    todo: int
    processing: int
    done: int
    dead: int
    workers_alive: int
    totals: dict[str, int]  # the crawl-wide counters of the ``stats`` HASH
    done_last_minute: int  # requests newly done in the throughput window
    window_s: float  # that window's length (50-60 s; less for a crawl younger than that)
    workers: list[WorkerState] = field(default_factory=list)  # empty unless asked for
    used_memory: int | None = None
    used_memory_human: str | None = None
    maxmemory: int | None = None
    lanes: list[LaneState] = field(default_factory=list)  # the busiest, when asked for
    lanes_total: int = 0
    #: The fleet's Scrapy stats (fleet/stats.py): every worker's, added up
    stats: dict[str, int | float] = field(default_factory=dict)
    #: Live leases per worker id, from the ``owners`` HASH (who holds each claim), read
    #: with the workers: also the workers no longer alive, whose leases wait to expire
    leases_by_worker: dict[str, int] = field(default_factory=dict)
    #: The fleet's control state (paused, stopping, running)
    control: ControlState = field(default_factory=ControlState)
    #: Entries in the crawl's feed (docs/feed.md), and batches taken off it by workers,
    #: not queued yet
    feed: int = 0
    feed_batches: int = 0

    def leases_of_gone_workers(self) -> dict[str, int]:
        """``leases_by_worker`` of the workers not alive (no heartbeat for longer than the
        worker TTL, or not in the registry any more): leases waiting to expire."""
        alive = {w.id for w in self.workers if w.alive}
        return {w: n for w, n in self.leases_by_worker.items() if w not in alive}

    @property
    def state(self) -> str:
        """What the crawl is doing, for a reader: the control state while paused or
        stopping; without a live worker ``finished`` when nothing is left to do (queued,
        in flight, in the feed) and ``idle`` when work waits for a worker; else
        ``running``."""
        if self.control.state != "running":
            return self.control.state
        if self.workers_alive:
            return "running"
        left = self.todo + self.processing + self.feed + self.feed_batches
        return "idle" if left else "finished"

    @property
    def pages_per_min(self) -> float:
        return self.done_last_minute * 60 / self.window_s if self.window_s > 0 else 0.0

    @property
    def dead_total(self) -> int:
        """Dead-lettered ever (``stats.dead``): grows even when letters are requeued."""
        return self.totals.get("dead", self.dead)

    def capacity(self, default_per_worker: int | None = None) -> int | None:
        """Sum of the live workers' capacity; None when unknown."""
        total = 0
        for w in self.workers:
            if w.alive:
                cap = w.capacity if w.capacity is not None else default_per_worker
                if cap is None:
                    return None
                total += cap
        return total if self.workers else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "crawl": self.crawl,
            "time": self.now_ms / 1000,
            "state": self.state,
            "control": self.control.to_dict(),
            "todo": self.todo,
            "feed": self.feed,
            "feed_batches": self.feed_batches,
            "processing": self.processing,
            "done": self.done,
            "dead": self.dead,
            "workers_alive": self.workers_alive,
            "workers": [asdict(w) for w in self.workers],
            "leases_by_worker": dict(self.leases_by_worker),
            "throughput": {"pages_per_min": round(self.pages_per_min, 1),
                           "done_last_minute": self.done_last_minute,
                           "window_s": round(self.window_s, 3)},
            "redis_used_memory": self.used_memory,
            "redis_used_memory_human": self.used_memory_human,
            "redis_maxmemory": self.maxmemory,
            "totals": dict(self.totals),
            "stats": dict(self.stats),
        }
