"""Every Redis key name of a crawl, in one place.

All keys of one crawl share the hash tag ``{crawl_id}``, so on Redis Cluster they live
in one slot and every Lua script can touch them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

KEY_PREFIX = "leased"


class KeyName:
    """One key of a crawl, named once: ``leases = KeyName("ZSET: ...")`` in ``CrawlKeys``
    reads ``leased:{<crawl id>}:leases``; the attribute's name is the key's name and the
    text its documentation."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> KeyName: ...
    @overload
    def __get__(self, obj: CrawlKeys, objtype: type | None = None) -> str: ...

    def __get__(self, obj: CrawlKeys | None, objtype: type | None = None) -> KeyName | str:
        return self if obj is None else obj._key(self.name)


@dataclass(frozen=True)
class CrawlKeys:
    """The key names of one crawl: ``leased:{<crawl id>}:<name>``."""

    crawl_id: str

    def _key(self, name: str) -> str:
        return f"{KEY_PREFIX}:{{{self.crawl_id}}}:{name}"

    @property
    def prefix(self) -> str:
        """Every key of this crawl starts with this (used by ``reset``)."""
        return self._key("")

    queue = KeyName(
        """ZSET: the default lane's queue of priorities other than 0 (see ``lane_queue``).""")

    def lane_queue(self, lane: str) -> str:
        """ZSET: queued envelopes of one lane with a priority other than 0, score
        -priority, member ``<12 hex seq><envelope>``. The default lane ``""`` is
        ``queue``. Always used with ``lane_fifo`` (lua/lib_settle.lua)."""
        return self._key(f"queue:{lane}") if lane else self._key("queue")

    def lane_fifo(self, lane: str) -> str:
        """LIST: queued envelopes of one lane with priority 0 (Scrapy's default), in
        order. The default lane ``""`` is ``fifo``."""
        return self._key(f"fifo:{lane}") if lane else self._key("fifo")

    def rate(self, lane: str) -> str:
        """HASH: a lane's shared rate-budget state (lua/lib_rate.lua)."""
        return self._key(f"rate:{lane}")

    lanes = KeyName(
        """ZSET: lane -> time (ms of Redis TIME) from which it may be served; every lane
        with queued requests is here.""")

    todo = KeyName(
        """STRING: number of queued requests, all lanes together.""")

    seq = KeyName(
        """STRING: counter giving queue order (a requeue takes a new number).""")

    rids = KeyName(
        """STRING: request id counter (one per request ever queued, not per requeue).""")

    tokens = KeyName(
        """STRING: the last claim token issued. Tokens are also fencing tokens and are
        never issued twice, even after Redis went back in time: each new one is at least
        Redis TIME in microseconds (lua/lib_guard.lua).""")

    epoch = KeyName(
        """HASH: the crawl's epoch (lua/lib_guard.lua): ``e`` the first token of the
        current epoch, ``run`` the Redis run id it was started for. A new epoch starts
        when Redis restarted, failed over or went back in time.""")

    def call(self, caller: str, stream: str) -> str:
        """STRING: the reply of the last call of one caller's stream of calls (``claim``,
        ``commit``), kept for 10 minutes so a call resent after its reply was lost is
        answered from it instead of running twice (lua/lib_guard.lua)."""
        return self._key(f"call:{caller}:{stream}")

    leases = KeyName(
        """ZSET: claim token -> lease deadline in ms of Redis server time.""")

    inflight = KeyName(
        """HASH: claim token -> envelope being processed.""")

    owners = KeyName(
        """HASH: claim token -> id of the worker holding the claim, set by the claim and
        removed with the lease (never more entries than ``leases``). Release and renew
        act only on the caller's own tokens; ``status`` counts leases per worker here.""")

    done = KeyName(
        """BITMAP: bit rid is set once request rid was processed.""")

    dead = KeyName(
        """HASH: rid -> dead letter JSON {reason, attempts, envelope, t}.""")

    stats = KeyName(
        """HASH: crawl-wide counters (enqueued, claimed, acked, done, dead, ...).""")

    fleet_stats = KeyName(
        """HASH: the fleet's Scrapy stats (observe/flush.py, lua/stats_flush.lua): every
        worker's numeric stats added up, maxima kept as maxima, ``start_time`` the first
        and ``finish_time`` the last (epoch seconds).""")

    def stats_seq(self, worker: str) -> str:
        """STRING: the sequence number of a worker's last stats flush applied
        (lua/stats_flush.lua), so a flush sent again is not counted twice; expires."""
        return self._key(f"stats_seq:{worker}")

    workers = KeyName(
        """ZSET: worker id -> last heartbeat in ms of Redis server time.""")

    worker_info = KeyName(
        """HASH: worker id -> JSON {"inflight", "host", "pid", "started"}, set at each
        heartbeat.""")

    throughput = KeyName(
        """HASH: 10-second bucket (Redis time // 10 s) -> requests newly done in it.""")

    run = KeyName(
        """STRING: the current run of the crawl (lua/run_join.lua): the id of the worker
        seeding it (running start()), then ``seeded``; expires when no worker is alive.""")

    meta = KeyName(
        """HASH: the crawl's fixed parameters (``seen_bucket_bits``, the seen-set layout,
        checked at open) and ``rate_half_life_ms`` (LEASED_RATE_RECOVERY of the workers,
        read by ``scrapy leased status``).""")

    def seen_bucket(self, bucket: int) -> str:
        """SET of 64-bit integers: fingerprints whose top bits equal ``bucket``."""
        return self._key(f"seen:{bucket:x}")

    def records(self, item_type: str, prefix: str = "records") -> str:
        """HASH: items upserted by UpsertPipeline, one hash per item type (snake_case
        class name): key -> {"fence", "updated", "type", "item"} JSON (lua/upsert.lua)."""
        return self._key(f"{prefix}:{item_type}")


class ExtraKeys:
    """KEYS beyond a script's fixed ones, each named once, referred to by index."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self._index: dict[str, int] = {}

    def __call__(self, key: str) -> int:
        idx = self._index.get(key)
        if idx is None:
            self.keys.append(key)
            idx = self._index[key] = len(self.keys)
        return idx

    def queue(self, keys: CrawlKeys, lane: str) -> int:
        """The index of a lane's queue ZSET, its LIST right after it (lua/lib_settle.lua)."""
        zset = keys.lane_queue(lane)
        idx = self._index.get(zset)
        if idx is None:
            idx = self(zset)
            self.keys.append(keys.lane_fifo(lane))
        return idx
