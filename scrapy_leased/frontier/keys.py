"""Every Redis key name of a crawl, in one place.

All keys of one crawl share the hash tag ``{crawl_id}``, so on Redis Cluster they live
in one slot and every Lua script can touch them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

KEY_PREFIX = "leased"
#: The version of the queues' layout, recorded in the crawl's ``meta`` (``queue_layout``;
#: lua/layout.lua): 2 is a LIST per lane and tier with a tier index (lua/lib_settle.lua);
#: 1, never recorded, was a ZSET per lane for every priority but 0.
QUEUE_LAYOUT = 2
P0 = "p0"  # the tier of regular requests of priority 0: the lane's ``fifo`` LIST


def tier_code(priority: int, start: bool = False) -> str:
    """The tier of a queued request (lua/lib_settle.lua): ``p<priority>`` for regular
    requests, ``s<priority>`` for start requests kept apart (Scrapy's
    SCHEDULER_START_*_QUEUE)."""
    return f"{'s' if start else 'p'}{priority}"


def tier_rank(code: str) -> float:
    """A tier's score in the tier index: claims serve the lowest first (priority 0's
    LIST ranks 0)."""
    return -int(code[1:]) + (0.5 if code[0] == "s" else 0.0)


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
        """ZSET: the default lane's tier index (see ``lane_queue``).""")

    def lane_queue(self, lane: str) -> str:
        """ZSET: the tier index of one lane: the tiers (``tier_code``) other than ``p0``
        that have queued requests, member the tier code, score its rank (``tier_rank``:
        -priority, + 0.5 for start requests kept apart). A tier is listed exactly while
        its LIST (``lane_tier``) holds requests. The default lane ``""`` is ``queue``.
        With ``lane_fifo`` and the ``lane_tier`` LISTs, a lane's queue
        (lua/lib_settle.lua)."""
        return self._key(f"queue:{lane}") if lane else self._key("queue")

    def lane_fifo(self, lane: str) -> str:
        """LIST: queued envelopes of one lane with priority 0 (Scrapy's default), in
        claim order: tier ``p0``, never in the lane's tier index. The default lane
        ``""`` is ``fifo``."""
        return self._key(f"fifo:{lane}") if lane else self._key("fifo")

    def lane_tier(self, lane: str, code: str) -> str:
        """LIST: queued envelopes of one lane and tier (``tier_code``: a priority, and
        whether start requests kept apart), in claim order: ``tier:<code>:<lane>``, the
        default lane's ``tier:<code>``. Tier ``p0`` is ``lane_fifo``."""
        if code == P0:
            return self.lane_fifo(lane)
        return self._key(f"tier:{code}:{lane}") if lane else self._key(f"tier:{code}")

    def rate(self, lane: str) -> str:
        """HASH: a lane's shared rate-budget state (lua/lib_rate.lua)."""
        return self._key(f"rate:{lane}")

    penalties = KeyName(
        """Pub/sub channel, not a key: lua/penalize.lua publishes there the lane it
        penalized (a 429/503 block, a slowdown, a Crawl-delay); every worker listens
        (ratelimit/watch.py) so that its requests of that lane claimed before are checked
        at download time.""")

    lanes = KeyName(
        """ZSET: lane -> time (ms of Redis TIME) from which it may be served; every lane
        with queued requests is here.""")

    todo = KeyName(
        """STRING: number of queued requests, all lanes together.""")

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
        ``commit``; of a claim, the control state and the tokens it issued, from which
        its reply is rebuilt), kept for 10 minutes so a call resent after its reply was
        lost is answered from it instead of running twice (lua/lib_guard.lua)."""
        return self._key(f"call:{caller}:{stream}")

    leases = KeyName(
        """ZSET: claim token -> lease deadline in ms of Redis server time.""")

    inflight = KeyName(
        """HASH: claim token -> envelope being processed.""")

    owners = KeyName(
        """HASH: claim token -> id of the worker holding the claim, set by the claim and
        removed with the lease (never more entries than ``leases``). Release and renew
        act only on the caller's own tokens; ``status`` counts leases per worker here.""")

    revisit = KeyName(
        """ZSET: envelope -> due time (ms of Redis TIME) of a request acked with a revisit
        interval (LEASED_REVISIT_AFTER, meta ``leased_revisit_after``): lua/revisit.lua
        queues it again, with a new rid, once due.""")

    done = KeyName(
        """BITMAP: bit rid is set once request rid was processed.""")

    dead = KeyName(
        """HASH: rid -> dead letter JSON {reason, attempts, envelope, t}; also
        ``feed:<sha1>`` (unreadable feed entries) and ``dropped:<sha1>`` (requests that
        could not be stored: {reason, url, method, callback, errback, request, removed,
        attempts 0, dropped true, t}, dropped.py).""")

    stats = KeyName(
        """HASH: crawl-wide counters (enqueued, claimed, acked, done, dead, ...).""")

    fleet_stats = KeyName(
        """HASH: the fleet's Scrapy stats (fleet/stats.py, lua/stats_flush.lua): every
        worker's numeric stats added up, maxima kept as maxima, ``start_time`` the first
        and ``finish_time`` the last (epoch seconds).""")

    def stats_seq(self, worker: str) -> str:
        """STRING: the sequence number of a worker's last stats flush applied
        (lua/stats_flush.lua), so a flush sent again is not counted twice; expires."""
        return self._key(f"stats_seq:{worker}")

    stats_open = KeyName(
        """ZSET: worker id -> when it was last seen (ms of Redis TIME), for the workers
        whose final stats flush is still to come (lua/fleet_open.lua at open and each
        stats heartbeat; removed by lua/fleet_close.lua after that flush): the last worker
        of a run sends ``fleet_closed`` once every other one has flushed its last stats.""")

    closed_by = KeyName(
        """STRING: the worker that sent ``fleet_closed`` for the run that ended last
        (lua/fleet_close.lua), so that its call sent again after a lost reply gets the
        same answer and no other worker sends it too; deleted when a worker opens (a new
        run), expires after an hour.""")

    workers = KeyName(
        """ZSET: worker id -> last heartbeat in ms of Redis server time.""")

    worker_info = KeyName(
        """HASH: worker id -> JSON {"inflight", "host", "pid", "started"}, set at each
        heartbeat.""")

    worker_acked = KeyName(
        """HASH: worker id -> the requests it acked while holding their lease, counted by
        the commit that acks them (lua/commit.lua: one HINCRBY per commit call), so
        ``status`` shows each worker's acks as they happen, not as of its last heartbeat.
        Kept and removed with the worker's registry entry (lua/renew.lua prunes it,
        lua/release.lua removes it when the worker leaves).""")

    throughput = KeyName(
        """HASH: 10-second bucket (Redis time // 10 s) -> requests newly done in it.""")

    run = KeyName(
        """STRING: the current run of the crawl (lua/run_join.lua): the id of the worker
        seeding it (running start()), then ``seeded``; expires when no worker is alive.""")

    control = KeyName(
        """HASH: the fleet's control state, shared by every worker of the crawl (``scrapy
        leased pause|resume|stop``, lua/control.lua; the LEASED_CLOSE_* limits, lua/claim.lua):
        ``state`` ``running`` (also when absent), ``paused`` or ``stopping``; ``since`` (ms of
        Redis TIME), ``by`` (who set it) and ``reason``. Read by every claim (lua/claim.lua)
        and heartbeat (lua/renew.lua), so a worker started later obeys it too. Also
        ``cookies``: a mark set anew by every write to a cookie jar (lua/cookies_set.lua)
        and returned by every claim (worker/cookies.py reads its jars again when it moved).""")

    feed = KeyName(
        """LIST: JSON requests pushed by any producer (docs/feed.md; ``RPUSH``), drained
        into the queues by the workers (lua/feed_take.lua, lua/feed_commit.lua).""")

    def feed_wrongtype(self, ms: int) -> str:
        """Any type: a feed key a producer wrote with another command than ``RPUSH``
        (XADD, SET, ...), moved aside whole by the first worker that met it
        (lua/key_aside.lua) so that the feed works again: ``feed:wrongtype:<ms>``, the
        Redis TIME of the move in ms. Never read or deleted by the workers (nor by a
        fresh run); read what the producer wrote there, push it again as JSON entries
        with ``RPUSH`` (docs/feed.md), then delete it. ``scrapy leased reset`` deletes
        it with the crawl's other keys."""
        return self._key(f"feed:wrongtype:{ms}")

    def control_wrongtype(self, ms: int) -> str:
        """Any type: a control key written by hand with another type than a HASH (``SET
        ...:control paused``), moved aside whole by the first worker that met it
        (lua/key_aside.lua): ``control:wrongtype:<ms>``, the Redis TIME of the move in
        ms; the fleet then runs as with no control state (``running``). Never read or
        deleted by the workers (nor by a fresh run): control the fleet with ``scrapy
        leased pause|resume|stop``, then delete it."""
        return self._key(f"control:wrongtype:{ms}")

    def is_wrongtype(self, key: str) -> bool:
        """Whether ``key`` is a feed or control key moved aside (``feed_wrongtype``,
        ``control_wrongtype``)."""
        return key.startswith((self._key("feed:wrongtype:"), self._key("control:wrongtype:")))

    feed_taken = KeyName(
        """HASH: worker id -> ``<batch id> <JSON array>``: the feed entries it took and has
        not queued yet (lua/feed_take.lua); back to the feed when its deadline passed.""")

    feed_deadlines = KeyName(
        """ZSET: worker id -> deadline (ms of Redis TIME) of its batch in ``feed_taken``.""")

    meta = KeyName(
        """HASH: the crawl's fixed parameters (``seen_bucket_bits`` and ``seen_ttl_ms``,
        the seen-set layout, and ``queue_layout``, the queues' (``QUEUE_LAYOUT``),
        checked at open: lua/layout.lua) and ``rate_half_life_ms``
        (LEASED_RATE_RECOVERY of the workers, read by ``scrapy leased status``).""")

    throttle = KeyName(
        """HASH: AutoThrottle's delays shared by the workers (LEASED_SHARED_AUTOTHROTTLE,
        _throttleshare.py, lua/throttle_share.lua): download slot key -> ``<delay in
        seconds> <ms of Redis TIME>``, the last delay any worker's AutoThrottle set for
        that slot and when; an entry older than a minute is not used and is deleted, and
        the hash expires a minute after its last write.""")

    def seen_bucket(self, bucket: int, gen: int | None = None) -> str:
        """SET of 64-bit integers: fingerprints whose top bits equal ``bucket``. With an
        expiry of seen entries (LEASED_SEEN_TTL), one per generation ``gen`` (Redis TIME
        in ms // the expiry): ``seen:<gen>:<bucket>``, expiring when no longer read
        (lua/lib_enqueue.lua)."""
        if gen is None:
            return self._key(f"seen:{bucket:x}")
        return self._key(f"seen:{gen}:{bucket:x}")

    def records(self, item_type: str, prefix: str = "records") -> str:
        """HASH: items upserted by UpsertPipeline, one hash per item type (snake_case
        class name): key -> {"fence", "updated", "type", "item"} JSON (lua/upsert.lua)."""
        return self._key(f"{prefix}:{item_type}")

    def cookie_jar(self, jar: str) -> str:
        """HASH: one cookie jar of the crawl, shared by its workers (worker/cookies.py,
        LeasedCookiesMiddleware; lua/cookies_set.lua): ``jar`` is the JSON of the
        request's ``meta['cookiejar']`` (``null``: the default jar); field
        ``<domain>\\n<path>\\n<name>`` -> the cookie as JSON (``domain``, ``path``,
        ``name``, ``value``, ``expires`` in epoch seconds or null, ``secure``, ...),
        field ``v`` -> the jar's version, raised by every write. Deleted by ``scrapy leased
        reset`` and by a fresh run (LEASED_FLUSH_ON_START), like the queue."""
        return self._key(f"cookies:{jar}")

    def kept_by_flush(self, key: str, records_prefix: str = "records") -> bool:
        """Whether a fresh run (LEASED_FLUSH_ON_START, lua/run_flush.lua) keeps ``key``:
        the run and the worker registry (who is starting, with each worker's acks), the
        crawl's fixed parameters, the fencing tokens and epoch (never issued twice), the
        control state, the feed (work pushed before the fleet started is the new run's;
        the batches taken off it and not queued go back to it: lua/run_flush.lua), the
        UpsertPipeline records, and the feed or control keys of the wrong type moved aside
        (``feed_wrongtype``, ``control_wrongtype``)."""
        return key in (self.run, self.workers, self.worker_info, self.worker_acked,
                       self.meta, self.tokens, self.epoch, self.control, self.feed) \
            or self.is_records(key, records_prefix) or self.is_wrongtype(key)

    def is_records(self, key: str, prefix: str = "records") -> bool:
        """Whether ``key`` is one of the ``records`` hashes (with this prefix): kept by
        ``scrapy leased reset`` without ``--records``."""
        return key.startswith(self._key(f"{prefix}:"))


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

    def pair(self, first: str, second: str) -> int:
        """The index of ``first``, with ``second`` right after it."""
        idx = self._index.get(first)
        if idx is None:
            idx = self(first)
            self.keys.append(second)
        return idx

    def add(self, names: list[str]) -> int:
        """Append ``names`` as they are (a script finds them by their place, not by
        name: none is looked up or named once); the index the first has, or would have."""
        idx = len(self.keys) + 1
        self.keys += names
        return idx

    @staticmethod
    def queue_keys(keys: CrawlKeys, lane: str, code: str = P0) -> list[str]:
        """The LIST of a lane's tier ``code``, then the lane's tier index
        (lua/lib_settle.lua: lane_queue)."""
        return [keys.lane_tier(lane, code), keys.lane_queue(lane)]

    @staticmethod
    def seen_keys(keys: CrawlKeys, bucket: int, gen: int | None) -> list[str]:
        """A seen bucket; with generations (``gen``), the current one's, then the
        previous one's (lua/lib_enqueue.lua)."""
        if gen is None:
            return [keys.seen_bucket(bucket)]
        return [keys.seen_bucket(bucket, gen), keys.seen_bucket(bucket, gen - 1)]

    def queue(self, keys: CrawlKeys, lane: str, code: str = P0) -> int:
        """The index of ``queue_keys``: the LIST, its tier index right after it."""
        return self.pair(*self.queue_keys(keys, lane, code))

    def seen(self, keys: CrawlKeys, bucket: int, gen: int | None) -> int:
        """The index of ``seen_keys``: the current generation's, the previous one's
        right after it."""
        names = self.seen_keys(keys, bucket, gen)
        return self(names[0]) if gen is None else self.pair(*names)
