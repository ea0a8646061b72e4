"""The crawl's Redis state machine: enqueue, claim, ack, fail, recover, renew, release.

Every mutation is one Lua script (see ``lua/``), every key comes from ``CrawlKeys``,
and every time is Redis server time. This module knows nothing about Scrapy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError, ResponseError

from .envelope import Envelope
from .keys import QUEUE_LAYOUT, CrawlKeys, ExtraKeys, tier_code, tier_rank
from .scripts import as_str, pairs, read_atomic, register
from .workerid import new_worker_id

#: The fleet's control states (the ``control`` HASH, keys.py): claims are made only while
#: running; a paused fleet holds what it has, a stopping one closes.
RUNNING, PAUSED, STOPPING = "running", "paused", "stopping"
CONTROL_STATES = (RUNNING, PAUSED, STOPPING)
REASON_CHARS = 500  # a failure's reason is kept to its first 500 characters
#: Field of the crawl's ``meta`` HASH: the slowdown half-life (ms) the workers use.
HALF_LIFE_FIELD = "rate_half_life_ms"
#: Field of the crawl's ``meta`` HASH: the expiry of seen entries (ms, 0: never).
SEEN_TTL_FIELD = "seen_ttl_ms"
#: The error a script that queues requests answers with when the seen set's generation
#: the caller built its keys for is not the current one (lua/lib_enqueue.lua).
SEEN_GEN_RE = re.compile(r"^SEEN_GENERATION (\d+)")
GEN_ATTEMPTS = 4
#: Claim calls ``Frontier.claim`` makes at most when a call claimed nothing because the
#: top tier of a lane was not the one it passed (lua/claim.lua: ``stale``; the reply
#: names the right one, so one more call normally does)
CLAIM_ATTEMPTS = 3
#: Lanes whose top tier a Frontier remembers (lua/claim.lua); past this many, the
#: oldest quarter is forgotten (a forgotten lane costs one call that learns it again)
TIER_CACHE_LANES = 65_536


@dataclass(frozen=True)
class NewRequest:
    """A request to enqueue; ``bucket`` None means no dedupe (``dont_filter``).
    ``order``: where it goes in its priority (lua/lib_settle.lua): ``L`` LIFO, ``F``
    FIFO, ``S``/``T`` a start request kept apart (FIFO/LIFO); see order.py."""

    payload: str
    priority: int = 0
    bucket: int | None = None
    member: int = 0
    lane: str = ""
    order: str = "F"


@dataclass(frozen=True)
class Failure:
    token: int
    reason: str
    permanent: bool = False
    lane: str = ""
    rid: int | None = None  # the request the claim holds (checked by commit.lua); None: any
    #: the claimed request's priority (its requeue goes to that tier's LIST; checked by
    #: commit.lua); None: read from Redis first, one more round trip
    priority: int | None = None


@dataclass(frozen=True)
class Budget:
    """A lane's rate budget: one request per ``interval_ms`` with bursts of ``burst``;
    ``interval_ms`` 0 means no budget."""

    interval_ms: int = 0
    burst: int = 1


NO_BUDGET = Budget()


@dataclass(frozen=True)
class CloseLimits:
    """The fleet-wide limits (LEASED_CLOSE_*; 0 = none), checked by every claim
    (lua/claim.lua) against the whole crawl's counts: requests done (``stats`` done),
    items scraped and spider errors (the fleet's Scrapy stats, ``fleet_stats``), and ms
    since the crawl's first claim. One reached, the claim sets the fleet's control state
    to stopping."""

    pages: int = 0
    items: int = 0
    errors: int = 0
    timeout_ms: int = 0

    def args(self) -> list[int]:
        return [self.pages, self.items, self.errors, self.timeout_ms]


NO_LIMITS = CloseLimits()


@dataclass
class ClaimResult:
    now_ms: int
    queued: int
    leases: int
    next_ms: int = -1  # earliest time a lane is ready (now when one is, -1: no lane)
    ready_lanes: list[str] = field(default_factory=list)
    claims: list[tuple[int, Envelope]] = field(default_factory=list)
    # lanes claimed from that had nothing to enforce then (no budget, Crawl-delay, block)
    free_lanes: frozenset[str] = frozenset()
    #: The fleet's control state (``RUNNING``, ``PAUSED``, ``STOPPING``): claims are made
    #: only while running
    control: str = "running"
    #: Entries in the crawl's feed and in batches taken off it, not queued yet (0 when
    #: not running)
    feed: int = 0
    #: Lanes not served because their top tier was not the one passed (lua/claim.lua):
    #: they have claimable requests; claim again at once
    stale: int = 0


@dataclass(frozen=True)
class Revisit:
    """An acked request to queue again ``after_ms`` after its ack (lua/commit.lua): its
    priority, lane and payload, as claimed."""

    after_ms: int
    priority: int
    lane: str
    payload: str


@dataclass
class FeedBatch:
    """Entries taken off the feed (lua/feed_take.lua): ``returned`` entries of other
    takers past their deadline went back to the feed first; ``left`` are still in it."""

    entries: list[bytes | str]
    returned: int = 0
    left: int = 0
    id: str = "0"  # the batch's id, for commit_feed ("0": nothing taken)


@dataclass
class CommitResult:
    queued: list[bool]
    acks: list[int]  # bit 1: lease was held; bit 2: newly counted done
    fails: list[int]  # 0: lease no longer held, 1: requeued, 2: dead-lettered


def _lane_and_token(item: int | tuple[int, str]) -> tuple[int, str]:
    return (item, "") if isinstance(item, int) else item


def _parse_claim(out: Sequence[Any]) -> tuple[ClaimResult, dict[str, str]]:
    """A claim's reply (lua/claim.lua), the guard's part taken off: the result, and the
    top tier of each lane the reply names ('': none but p0)."""
    n = int(out[7])
    m = int(out[8 + n])
    k = int(out[9 + n + m])
    tiers_at = 10 + n + m
    rest = out[tiers_at + 2 * k:]
    result = ClaimResult(
        int(out[0]), int(out[1]), int(out[2]), int(out[3]), [as_str(x) for x in out[8:8 + n]],
        [(int(rest[i]), Envelope.parse(rest[i + 1])) for i in range(0, len(rest), 2)],
        frozenset(as_str(x) for x in out[9 + n:9 + n + m]), as_str(out[4]), int(out[5]),
        int(out[6]))
    tiers = {as_str(out[i]): as_str(out[i + 1]) for i in range(tiers_at, tiers_at + 2 * k, 2)}
    return result, tiers


def _start(order: str) -> bool:
    """Whether a queue order code (lua/lib_settle.lua) is a start request's."""
    return order in ("S", "T")


class Frontier:
    """The crawl's state machine for one caller (a worker, or an admin command).

    Rollbacks and lost replies (lua/lib_guard.lua): every claim, commit, recovery and
    renewal passes the highest epoch, token and rid this caller has seen, so Redis
    notices when it came back older than that, and each reply gives the current ones
    back. ``epoch`` is the crawl's current epoch as last seen; ``on_epoch(old, new)`` is
    called when it changes (Redis restarted, failed over or went back in time). Claims and
    commits carry a call id, so a call whose reply was lost and that is sent again (by
    redis-py's retry, or by the caller) has its effect once: a claim that raised is sent
    again, the same, by the next ``claim`` call (``resolve_claim`` at the end), and a
    commit is sent again with its ``call_id``. Redis keeps the last reply of each stream
    (claims, commits) of a caller: a caller makes its claims one at a time, and its
    commits one at a time.
    """

    def __init__(self, client: Any, keys: CrawlKeys, *, lease_ms: int, max_attempts: int,
                 recover_batch: int = 500, half_life_ms: int = 30_000,
                 ready_lanes: int = 32, caller: str | None = None,
                 prune_ms: int = 0, limits: CloseLimits = NO_LIMITS) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.max_attempts = max_attempts
        self.recover_batch = recover_batch
        self.half_life_ms = half_life_ms
        self.ready_lanes = ready_lanes
        self.prune_ms = prune_ms  # renewals prune registry entries silent this long (0: never)
        self.limits = limits
        self.caller = caller or new_worker_id()
        self.epoch: int | None = None
        self.seen_token = 0
        self.seen_rid = 0
        self.on_epoch: Callable[[int, int], None] | None = None
        #: Called with the control state each claim and renewal reports (keys.py: control)
        self.on_control: Callable[[str], None] | None = None
        #: The expiry of seen entries (ms, 0: never; set by ``check_layout``) and the seen
        #: set's generation this caller last knew (lua/lib_enqueue.lua)
        self.seen_ttl_ms = 0
        self.seen_gen: int | None = None
        #: Called with (old, new) when the seen set's generation changed: entries a
        #: caller remembers as seen may have expired
        self.on_seen_gen: Callable[[int, int], None] | None = None
        self._calls = 0
        self._pending_claim: tuple[list[str], list[Any]] | None = None
        #: lane -> the code of its top tier other than p0, as last learnt (lua/claim.lua);
        #: a lane without an entry has none as far as this caller knows
        self._tiers: dict[str, str] = {}
        self._s = register(client, "claim", "commit", "expired", "recover", "renew", "release",
                           "acquire", "penalize", "read", "feed_take", "feed_commit", "layout",
                           "revisit", "key_aside")

    # -- the guard (lua/lib_guard.lua) ---------------------------------------------------

    def new_call_id(self) -> str:
        """A call id for a claim or commit (unique for this caller)."""
        self._calls += 1
        return str(self._calls)

    def _guard(self, stream: str | None = None, call_id: str = "") -> tuple[list[str], list[Any]]:
        """The guard's KEYS and ARGV, to append to a guarded script's own."""
        k = self.keys
        call = k.call(self.caller, stream) if stream else k.epoch
        return ([k.epoch, k.tokens, k.rids, call],
                [call_id, self.epoch or 0, self.seen_token, self.seen_rid])

    def _seen(self, out: Sequence[Any]) -> Sequence[Any]:
        """Take the guard's {epoch, tokens, rids} off a reply; returns the rest."""
        epoch, tokens, rids = int(out[0]), int(out[1]), int(out[2])
        self.seen_token = max(self.seen_token, tokens)
        self.seen_rid = max(self.seen_rid, rids)
        old, self.epoch = self.epoch, epoch
        if old is not None and old != epoch and self.on_epoch is not None:
            self.on_epoch(old, epoch)
        return out[3:]

    async def check_layout(self, seen_bucket_bits: int, seen_ttl_ms: int = 0, *,
                           queues: bool = True) -> None:
        """Record the seen-set layout (bucket bits, the expiry of seen entries) and the
        queues' (``QUEUE_LAYOUT``) on first use; refuse a different one later. Sets
        ``seen_ttl_ms``. ``queues`` False: the queues' layout is not checked (a worker
        that flushes the crawl's queues next checks it after the flush)."""
        recorded = await self._layout(seen_bucket_bits, seen_ttl_ms, "1" if queues else "0")
        bits, ttl = int(recorded[0]), int(recorded[1])
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
        self.seen_ttl_ms = seen_ttl_ms
        if queues and recorded[2] is None and not await self._old_queues():
            recorded = await self._layout(seen_bucket_bits, seen_ttl_ms, "2")
        if queues and (recorded[2] is None or int(recorded[2]) != QUEUE_LAYOUT):
            layout = 1 if recorded[2] is None else int(recorded[2])
            raise ValueError(
                f"Crawl {self.keys.crawl_id!r} was queued by a version of scrapy_leased with "
                f"another layout of its queues in Redis (layout {layout}; this version uses "
                f"{QUEUE_LAYOUT}: a LIST per lane and priority): its queued requests of "
                f"priorities other than 0 would not be found. Finish the crawl with the "
                f"version that started it, or start it afresh (`scrapy leased reset`, or "
                f"LEASED_FLUSH_ON_START = True), or use a new LEASED_CRAWL_ID.")

    async def _layout(self, bits: int, ttl: int, mode: str) -> list[Any]:
        return list(await self._s["layout"](keys=[self.keys.meta, self.keys.lanes],
                                            args=[bits, ttl, QUEUE_LAYOUT, mode]))

    async def _old_queues(self) -> bool:
        """Whether a lane of this crawl has a queue ZSET of layout 1 (members
        ``<12-char prefix><envelope>``, where layout 2 has tier codes: lua/lib_settle.lua),
        looked at once when a crawl started before the layout was recorded has lanes."""
        lanes: list[str] = []
        async for lane, _ in self.client.zscan_iter(self.keys.lanes, count=1000):
            lanes.append(as_str(lane))
        for i in range(0, len(lanes), 1000):
            async with self.client.pipeline(transaction=False) as p:
                for lane in lanes[i:i + 1000]:
                    p.zrange(self.keys.lane_queue(lane), 0, 0)
                heads = await p.execute()
            if any(head and not re.fullmatch(r"[ps]-?\d+", as_str(head[0])) for head in heads):
                return True
        return False

    async def record_half_life(self) -> None:
        """Record this caller's slowdown half-life (LEASED_RATE_RECOVERY) with the crawl,
        so that ``scrapy leased status``, run anywhere, computes slowdowns with it."""
        await self.client.hset(self.keys.meta, HALF_LIFE_FIELD, self.half_life_ms)

    async def commit(self, enqueue: Sequence[NewRequest] = (), acks: Sequence[tuple[int, int]] = (),
                     fails: Sequence[Failure] = (), call_id: str | None = None,
                     revisits: Mapping[int, Revisit] | None = None,
                     stats: Sequence[Any] = (),
                     drops: Sequence[tuple[str, str]] = ()) -> CommitResult:
        """Enqueue, ack and fail in one atomic step. ``call_id``: the id of this commit
        (``new_call_id``); send a commit whose outcome is unknown again with the same id
        and the same contents, and it is applied once. None: a new id. ``revisits``:
        claim token -> when and what to queue again after its ack (``revisit``).
        ``stats``: Scrapy stats deltas added to the fleet stats in the same step, flat
        triples {op, name, value} (observe/flush.py ``StatsFlusher.compose_ops``).
        ``drops``: requests that could not be stored, each (dead-letter field, letter JSON
        object) (dropped.py), dead letters in the same step."""
        k = self.keys
        revisits = revisits or {}
        call_id = call_id or self.new_call_id()
        priorities = await self._priorities([f.token for f in fails if f.priority is None])

        def build(gen: int | None) -> tuple[list[str], list[Any]]:
            keys = [k.lanes, k.todo, k.stats, k.leases, k.inflight, k.done, k.dead, k.rids,
                    k.throughput, k.owners, k.revisit, k.fleet_stats, k.worker_acked]
            extra = ExtraKeys(keys)
            args: list[Any] = [len(enqueue), len(acks), len(fails), self.max_attempts,
                               self.seen_ttl_ms, gen or 0, len(revisits), len(stats) // 3,
                               self.caller]
            args += self._enqueue_args(extra, enqueue, gen)
            for token, rid in acks:
                revisit = revisits.get(token)
                args += [token, rid, revisit.after_ms if revisit else 0]
            for f in fails:
                priority = priorities.get(f.token, 0) if f.priority is None else f.priority
                args += [f.token, f.reason[:REASON_CHARS], int(f.permanent),
                         extra.queue(k, f.lane, tier_code(priority)), f.lane,
                         "" if f.rid is None else f.rid, priority]
            for token, r in revisits.items():
                args += [token, r.priority, r.lane, r.payload]
            args += stats
            if drops:
                args.append(len(drops))
                for field, letter in drops:
                    args += [field, letter]
            gkeys, gargs = self._guard("commit", call_id)
            return keys + gkeys, args + gargs

        out = await self._enqueuing("commit", build)
        n, m = len(enqueue), len(acks)
        result = CommitResult([bool(x) for x in out[:n]], list(out[n:n + m]),
                              list(out[n + m:]))
        self._learn_pushes(enqueue, result.queued)
        return result

    async def _priorities(self, tokens: Sequence[int]) -> dict[int, int]:
        """The priority of each claim token's request, read from ``inflight`` (0 for a
        token without an envelope: nothing is requeued for it; one whose envelope cannot
        be read is left out, and its fail dead-letters it)."""
        if not tokens:
            return {}
        out = {}
        for token, raw in zip(tokens, await self.client.hmget(self.keys.inflight, tokens)):
            try:
                out[token] = Envelope.parse(raw).priority if raw is not None else 0
            except ValueError:
                pass
        return out

    def _learn_pushes(self, enqueue: Sequence[NewRequest], queued: Sequence[bool]) -> None:
        """A request this caller queued in a tier that outranks the top tier it knows of
        its lane (or in a lane it knows no tier of) is its lane's top tier now, unless
        another caller queued a higher one (lua/claim.lua then names it)."""
        for r, q in zip(enqueue, queued):
            if q and (r.priority or _start(r.order)):
                code = tier_code(r.priority, _start(r.order))
                known = self._tiers.get(r.lane)
                if known is None or tier_rank(code) < tier_rank(known):
                    self._learn_tier(r.lane, code)

    def _learn_tier(self, lane: str, code: str) -> None:
        if not code:
            self._tiers.pop(lane, None)
            return
        if lane not in self._tiers and len(self._tiers) >= TIER_CACHE_LANES:
            for old in list(self._tiers)[:TIER_CACHE_LANES // 4]:
                del self._tiers[old]
        self._tiers[lane] = code

    def _enqueue_args(self, extra: ExtraKeys, enqueue: Sequence[NewRequest],
                      gen: int | None) -> list[Any]:
        """The ARGV of new requests (lua/lib_enqueue.lua), their KEYS added to ``extra``
        (the seen buckets of generation ``gen``, None: no expiry): what requests share
        (lane, priority, order) once per group, then four fields a request."""
        k = self.keys
        groups: dict[tuple[str, int, str], int] = {}
        specs: list[Any] = []
        requests: list[Any] = []
        for r in enqueue:
            group = groups.get((r.lane, r.priority, r.order))
            if group is None:
                group = groups[(r.lane, r.priority, r.order)] = len(groups) + 1
                specs += [r.priority,
                          extra.queue(k, r.lane, tier_code(r.priority, _start(r.order))),
                          r.lane, r.order]
            bucket = 0 if r.bucket is None else extra.seen(k, r.bucket, gen)
            requests += [bucket, r.member, group, r.payload]
        return [len(groups), *specs, *requests]

    async def seen_generation(self) -> int | None:
        """The seen set's current generation as this caller knows it (None: seen entries
        never expire): first read from Redis TIME, then corrected by the scripts."""
        if not self.seen_ttl_ms:
            return None
        if self.seen_gen is None:
            sec, usec = await self.client.time()
            self._set_seen_gen((int(sec) * 1000 + int(usec) // 1000) // self.seen_ttl_ms)
        return self.seen_gen

    def _set_seen_gen(self, gen: int) -> None:
        old, self.seen_gen = self.seen_gen, gen
        if old is not None and old != gen and self.on_seen_gen is not None:
            self.on_seen_gen(old, gen)

    async def _enqueuing(self, script: str,
                         build: Callable[[int | None], tuple[list[str], list[Any]]]
                         ) -> Sequence[Any]:
        """Run a script that queues new requests (lua/lib_enqueue.lua) with the keys of
        the seen set's current generation; when the generation changed meanwhile, the
        script changes nothing and names the new one, and the call is sent again (the
        same call id) with its keys."""
        for attempt in range(GEN_ATTEMPTS):
            keys, args = build(await self.seen_generation())
            try:
                return self._seen(await self._s[script](keys=keys, args=args))
            except ResponseError as exc:
                found = SEEN_GEN_RE.match(str(exc))
                if found is None or attempt == GEN_ATTEMPTS - 1:
                    raise
                self._set_seen_gen(int(found.group(1)))
        raise AssertionError("unreachable")

    async def take_feed(self, count: int) -> FeedBatch:
        """Take up to ``count`` entries off the crawl's feed (lua/feed_take.lua), held
        for this caller for ``lease_ms`` until ``commit_feed``; the same batch again
        while an earlier one is held."""
        k = self.keys
        out = await self._s["feed_take"](keys=[k.feed, k.feed_taken, k.feed_deadlines],
                                         args=[self.caller, count, self.lease_ms])
        return FeedBatch(list(out[3:]), returned=int(out[0]), left=int(out[1]),
                         id=as_str(out[2]))

    async def set_aside(self, which: str) -> tuple[str, str] | None:
        """When the crawl's ``feed`` (a LIST when right) or ``control`` key (a HASH)
        holds another type (a producer's XADD or SET, a SET by hand), rename it to
        ``<which>_wrongtype(<Redis TIME in ms>)``, whole (lua/key_aside.lua), so that it
        works again. Returns (the type it held, the key it is now) when this call moved
        it; None when it holds the right type or is absent (fixed meanwhile, or moved by
        another worker)."""
        key, want, aside_of = {
            "feed": (self.keys.feed, "list", self.keys.feed_wrongtype),
            "control": (self.keys.control, "hash", self.keys.control_wrongtype)}[which]
        aside = ""
        for _ in range(5):
            seconds, micros = await self.client.time()
            aside = aside_of(int(seconds) * 1000 + int(micros) // 1000)
            kind, moved = await self._s["key_aside"](keys=[key, aside], args=[want])
            if int(moved) == 1:
                return as_str(kind), aside
            if int(moved) == 0:
                return None
        raise ResponseError(f"cannot move {key} aside: every name tried exists already "
                            f"({aside})")

    async def commit_feed(self, batch_id: str, enqueue: Sequence[NewRequest],
                          bad: Sequence[tuple[bytes | str, str]],
                          call_id: str | None = None) -> list[bool] | None:
        """Queue the requests made of this caller's feed batch ``batch_id`` (FeedBatch.id)
        and dead-letter its unreadable entries (``(entry, reason)``), dropping the batch,
        atomically (lua/feed_commit.lua). Returns what ``enqueue`` returns, or None when
        the batch was not this caller's any more (past its deadline: back in the feed;
        nothing done). ``call_id`` as for ``commit``."""
        k = self.keys
        call_id = call_id or self.new_call_id()

        def build(gen: int | None) -> tuple[list[str], list[Any]]:
            keys = [k.lanes, k.todo, k.stats, k.dead, k.feed_taken, k.feed_deadlines]
            extra = ExtraKeys(keys)
            args: list[Any] = [self.caller, len(enqueue), len(bad), self.seen_ttl_ms, gen or 0,
                               batch_id]
            args += self._enqueue_args(extra, enqueue, gen)
            for entry, reason in bad:
                args += [entry, reason[:REASON_CHARS]]
            gkeys, gargs = self._guard("feed", call_id)
            return keys + gkeys, args + gargs

        out = await self._enqueuing("feed_commit", build)
        if not int(out[0]):
            return None
        queued = [bool(x) for x in out[1:]]
        self._learn_pushes(enqueue, queued)
        return queued

    async def enqueue(self, requests: Sequence[NewRequest]) -> list[bool]:
        return (await self.commit(enqueue=requests)).queued

    async def ack(self, token: int, rid: int) -> int:
        return (await self.commit(acks=[(token, rid)])).acks[0]

    async def fail(self, token: int, reason: str, permanent: bool = False, lane: str = "",
                   priority: int | None = None) -> int:
        return (await self.commit(fails=[Failure(token, reason, permanent, lane,
                                                 priority=priority)])).fails[0]

    async def claim(self, count: int, worker_id: str,
                    lanes: Sequence[tuple[str, Budget]] = (("", NO_BUDGET),),
                    continues: bool = False) -> ClaimResult:
        """Claim up to ``count`` requests from the given candidate lanes (each with its
        budget); the result names the lanes ready now, to pass next time. A lane whose
        top tier this caller did not know is left by a call (lua/claim.lua: ``stale``;
        the reply names the tier): then the call is continued by another for what is
        left of ``count``, up to ``CLAIM_ATTEMPTS`` calls in all, the claims of all of
        them in the result. ``continues``: this claim continues one of the caller's
        that claimed requests, so no request whose lease expired before is taken (those
        go alone, lua/claim.lua ARGV[11])."""
        result = await self._claim_once(count, worker_id, lanes, continues=continues)
        for _ in range(CLAIM_ATTEMPTS - 1):
            if not result.stale or len(result.claims) >= count or result.control != RUNNING:
                break
            try:
                more = await self._claim_once(count - len(result.claims), worker_id, lanes,
                                              continues=continues or bool(result.claims))
            except (RedisError, OSError):
                if not result.claims:
                    raise
                break  # sent again by the next claim (_pending_claim); these are held
            more.claims = result.claims + more.claims
            more.free_lanes |= result.free_lanes
            result = more
        return result

    async def _claim_once(self, count: int, worker_id: str,
                          lanes: Sequence[tuple[str, Budget]], continues: bool) -> ClaimResult:
        if self._pending_claim is None:  # else: send the claim whose reply was lost again
            k = self.keys
            keys = [k.lanes, k.leases, k.inflight, k.tokens, k.done, k.stats, k.dead,
                    k.workers, k.todo, k.owners, k.control, k.fleet_stats, k.feed, k.feed_taken]
            args: list[Any] = [count, self.lease_ms, worker_id, len(lanes), self.half_life_ms,
                               self.ready_lanes, *self.limits.args(), int(continues)]
            for lane, budget in lanes:
                code = self._tiers.get(lane, "")
                fifo = k.lane_fifo(lane)  # also the placeholder when no tier is known
                keys += [k.lane_queue(lane), fifo, k.rate(lane),
                         k.lane_tier(lane, code) if code else fifo]
                args += [lane, budget.interval_ms, budget.burst, code]
            gkeys, gargs = self._guard("claim", self.new_call_id())
            self._pending_claim = (keys + gkeys, args + gargs)
        keys, args = self._pending_claim
        out = self._seen(await self._s["claim"](keys=keys, args=args))
        self._pending_claim = None
        result, tiers = _parse_claim(out)
        for lane, code in tiers.items():
            self._learn_tier(lane, code)
        self._control(result.control)
        return result

    def _control(self, state: str) -> None:
        if self.on_control is not None:
            self.on_control(state)

    async def resolve_claim(self) -> list[tuple[int, Envelope]]:
        """The claims of a claim call that raised (its reply lost) and was not sent again:
        Redis answers from the recorded reply, or changes nothing if the call never
        ran. For a caller about to close, so that it can release them."""
        if self._pending_claim is None:
            return []
        keys, args = self._pending_claim
        args = list(args)
        args[-4] = "?" + str(args[-4])
        out = self._seen(await self._s["claim"](keys=keys, args=args))
        self._pending_claim = None
        if not out:
            return []
        return _parse_claim(out)[0].claims

    async def revisit(self, batch: int = 500) -> int:
        """Queue again up to ``batch`` requests whose revisit is due (lua/revisit.lua);
        returns how many were queued."""
        k = self.keys
        now_ms, (due,) = await read_atomic(self._s["read"],
                                           ("ZRANGE", k.revisit, 0, batch - 1, "WITHSCORES"))
        keys = [k.lanes, k.todo, k.stats, k.revisit]
        extra = ExtraKeys(keys)
        args: list[Any] = []
        for member, score in pairs(due):
            if float(score) > now_ms:
                break  # in score order: the rest is not due either
            args += [member, self._requeue_to(extra, member)]
        if not args:
            return 0
        gkeys, gargs = self._guard()
        (queued,) = self._seen(await self._s["revisit"](keys=keys + gkeys, args=args + gargs))
        return int(queued)

    async def recover(self) -> tuple[int, int, int]:
        """Requeue up to recover_batch expired leases: (requeued, dead, expired left).
        Leases of claims issued before the current epoch are requeued without counting
        an attempt (stats ``recovered_epoch``) and are not in the figures returned."""
        k = self.keys
        out = await self._s["expired"](keys=[k.leases, k.inflight], args=[self.recover_batch])
        left = int(out[1])
        if len(out) == 2:
            return 0, 0, left
        keys = [k.lanes, k.todo, k.stats, k.leases, k.inflight, k.dead, k.owners]
        extra = ExtraKeys(keys)
        args: list[Any] = [self.max_attempts]
        for i in range(2, len(out), 2):
            args += [out[i], self._requeue_to(extra, out[i + 1])]
        gkeys, gargs = self._guard()
        requeued, dead, _forgiven = self._seen(
            await self._s["recover"](keys=keys + gkeys, args=args + gargs))
        return int(requeued), int(dead), left

    async def renew(self, worker_id: str, tokens: Sequence[int], info: str = "") -> list[int]:
        """Heartbeat + lease extension; returns the tokens whose lease was lost (or is
        not this worker's: only the leases ``worker_id`` owns are renewed).
        ``info`` (JSON) replaces the worker's entry in ``worker_info`` when given.
        Registry entries silent for ``prune_ms`` are removed on the way."""
        k = self.keys
        gkeys, gargs = self._guard()
        out = self._seen(await self._s["renew"](
            keys=[k.leases, k.workers, k.worker_info, k.owners, k.control,
                  k.worker_acked] + gkeys,
            args=[self.lease_ms, worker_id, info, self.prune_ms, *tokens] + gargs))
        self._control(as_str(out[1]))
        return [int(t) for t in out[2:]]

    async def release(self, worker_id: str, claims: Sequence[int | tuple[int, str]],
                      leave: bool = True) -> int:
        """Give back unstarted claims: tokens, or (token, lane) (the lane is not needed:
        each claim's lane and priority are read from Redis first). Only the claims
        ``worker_id`` owns are released (and counted). ``leave``: the worker leaves the
        registry (it is closing); else it stays (it gives back claims while running)."""
        k = self.keys
        keys = [k.lanes, k.todo, k.stats, k.leases, k.inflight, k.workers, k.worker_info,
                k.owners, k.worker_acked]
        extra = ExtraKeys(keys)
        args: list[Any] = [worker_id, 1 if leave else 0]
        tokens = [_lane_and_token(item)[0] for item in claims]
        envs = await self.client.hmget(k.inflight, tokens) if tokens and worker_id else []
        for token, raw in zip(tokens, envs):
            args += [token, self._requeue_to(extra, raw)]
        return int(await self._s["release"](keys=keys, args=args))

    def _requeue_to(self, extra: ExtraKeys, raw: Any) -> int:
        """The index in ``extra`` of the LIST an envelope (as stored; None: none) goes
        back to as a regular request (its lane's, its priority's tier: lib_settle.lua).
        Any queue for one that cannot be read: the scripts queue no such envelope."""
        try:
            env = Envelope.parse(raw) if raw is not None else None
        except ValueError:
            env = None
        if env is None:
            return extra.queue(self.keys, "")
        return extra.queue(self.keys, env.lane, tier_code(env.priority))

    async def acquire(self, lane: str, budget: Budget) -> int:
        """Take one request's worth of the lane's shared budget: 0 when the request may
        start now, else the milliseconds to wait."""
        k = self.keys
        wait, _now = await self._s["acquire"](
            keys=[k.rate(lane), k.lanes],
            args=[lane, budget.interval_ms, budget.burst, self.half_life_ms])
        return int(wait)

    async def penalize(self, lane: str, block_ms: int = 0, slow_down: bool = False,
                       crawl_delay_ms: int = -1) -> int:
        """The lane's host asked to slow down: block it for ``block_ms`` for the whole
        fleet, double its slowdown factor, and/or record its Crawl-delay; the lane is
        published on the crawl's penalty channel (``CrawlKeys.penalties``). Returns the
        time (ms of Redis TIME) until which the lane is blocked."""
        k = self.keys
        _now, blocked = await self._s["penalize"](
            keys=[k.rate(lane), k.lanes],
            args=[lane, block_ms, int(slow_down), crawl_delay_ms, self.half_life_ms,
                  k.penalties])
        return int(blocked)

    async def counts(self, worker_ttl_ms: int = 30_000) -> dict[str, int]:
        """A snapshot of the crawl's counters (one script run: a consistent view)."""
        k = self.keys
        now_ms, (todo, leases, dead, stats, workers) = await read_atomic(
            self._s["read"], ("GET", k.todo), ("ZCARD", k.leases), ("HLEN", k.dead),
            ("HGETALL", k.stats), ("ZRANGE", k.workers, 0, -1, "WITHSCORES"))
        stats = {as_str(a): int(b) for a, b in pairs(stats)}
        return {
            "todo": int(todo or 0), "processing": int(leases), "dead": int(dead),
            "done": stats.get("done", 0),
            "workers_alive": sum(1 for _, ts in pairs(workers)
                                 if now_ms - float(ts) < worker_ttl_ms),
            **{f"total_{name}": v for name, v in stats.items()},
        }
