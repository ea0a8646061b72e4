"""The crawl's Redis state machine: enqueue, claim, ack, fail, recover, renew, release.

Every mutation is one Lua script (see ``lua/``), every key comes from ``CrawlKeys``,
and every time is Redis server time. This module knows nothing about Scrapy.
``Frontier`` is the one object callers use; its parts: the lost-reply guard
(guard.py), the layout check (layout.py), the lanes' top tiers (tiers.py), the seen
set's generations (seengen.py), and one call per script owning its KEYS, ARGV and
reply layout (claimcall.py, calls.py, upkeep.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any, Generic, TypeVar, overload

from redis.exceptions import RedisError

from . import upkeep
from .calls import CommitCall, FeedCommitCall, failed_priorities
from .claimcall import CLAIM_ATTEMPTS, ClaimCall
from .envelope import Envelope
from .guard import Guard
from .keys import CrawlKeys
from .layout import LayoutCheck
from .model import (
    HALF_LIFE_FIELD,
    NO_BUDGET,
    NO_LIMITS,
    RUNNING,
    Budget,
    ClaimResult,
    CloseLimits,
    CommitResult,
    Failure,
    FeedBatch,
    NewRequest,
    Revisit,
)
from .scripts import read_atomic, register
from .seengen import SeenGenerations
from .tiers import TierCache
from .workerid import new_worker_id

T = TypeVar("T")


class _Via(Generic[T]):
    """An attribute of the Frontier kept by one of its parts, read and set there."""

    def __init__(self, part: str, name: str) -> None:
        self.part, self.name = part, name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _Via[T]: ...
    @overload
    def __get__(self, obj: Frontier, objtype: type | None = None) -> T: ...
    def __get__(self, obj: Frontier | None, objtype: type | None = None) -> _Via[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self.part), self.name)
        return value

    def __set__(self, obj: Frontier, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)


def _lane_and_token(item: int | tuple[int, str]) -> tuple[int, str]:
    return (item, "") if isinstance(item, int) else item


@dataclass(eq=False)
class _Settings:
    """What a Frontier is made with, each kept as its attribute of that name but
    ``caller``, which its guard keeps. A base of its own: the Frontier's attributes kept
    by its parts (``caller``, ``epoch``, ...) are descriptors a dataclass would take for
    fields."""

    client: Any
    keys: CrawlKeys
    _: KW_ONLY
    lease_ms: int
    max_attempts: int
    recover_batch: int = 500
    half_life_ms: int = 30_000
    ready_lanes: int = 32
    caller: InitVar[str | None] = None
    prune_ms: int = 0  # renewals prune registry entries silent this long (0: never)
    limits: CloseLimits = NO_LIMITS

    def __post_init__(self, caller: str | None) -> None:
        """Called by the __init__ made here: the Frontier builds its parts."""
        raise NotImplementedError


class Frontier(_Settings):
    """The crawl's state machine for one caller (a worker, or an admin command).

    Rollbacks and lost replies (lua/lib_guard.lua, guard.py): every claim, commit,
    recovery and renewal passes the highest epoch, token and rid this caller has seen,
    so Redis notices when it came back older than that, and each reply gives the
    current ones back. ``epoch`` is the crawl's current epoch as last seen;
    ``on_epoch(old, new)`` is called when it changes (Redis restarted, failed over or
    went back in time). Claims and commits carry a call id, so a call whose reply was
    lost and that is sent again (by redis-py's retry, or by the caller) has its effect
    once: a claim that raised is sent again, the same, by the next ``claim`` call
    (``resolve_claim`` at the end), and a commit is sent again with its ``call_id``.
    Redis keeps the last reply of each stream (claims, commits) of a caller: a caller
    makes its claims one at a time, and its commits one at a time.
    """

    caller: _Via[str] = _Via("guard", "caller")
    epoch: _Via[int | None] = _Via("guard", "epoch")
    seen_token: _Via[int] = _Via("guard", "seen_token")
    seen_rid: _Via[int] = _Via("guard", "seen_rid")
    on_epoch: _Via[Callable[[int, int], None] | None] = _Via("guard", "on_epoch")
    #: The expiry of seen entries (ms, 0: never; set by ``check_layout``) and the seen
    #: set's generation this caller last knew (seengen.py); ``on_seen_gen(old, new)`` is
    #: called when it changed: entries a caller remembers as seen may have expired
    seen_ttl_ms: _Via[int] = _Via("generations", "ttl_ms")
    seen_gen: _Via[int | None] = _Via("generations", "gen")
    on_seen_gen: _Via[Callable[[int, int], None] | None] = _Via("generations", "on_change")

    def __post_init__(self, caller: str | None) -> None:
        #: Called with the control state each claim and renewal reports (keys.py: control)
        self.on_control: Callable[[str], None] | None = None
        #: The cookie jars' mark (control HASH ``cookies``) the last claim returned; None
        #: before the first claim (worker/cookies.py)
        self.cookies_mark: str | None = None
        self._s = register(self.client, "claim", "commit", "expired", "recover", "renew",
                           "release", "acquire", "penalize", "read", "feed_take",
                           "feed_commit", "layout", "revisit", "key_aside", "hot_keys")
        self.guard = Guard(self.keys, caller or new_worker_id())
        self.generations = SeenGenerations(self.client)
        self.tiers = TierCache()
        self.layout = LayoutCheck(self.client, self.keys, self._s["layout"])
        self.claims = ClaimCall(self._s["claim"], self.keys, self.guard, self.tiers)

    def new_call_id(self) -> str:
        """A call id for a claim or commit (unique for this caller)."""
        return self.guard.new_call_id()

    async def _guarded(self, script: str, keys: list[str], args: list[Any]) -> Sequence[Any]:
        """Run a guarded script; its reply with the guard's part taken off."""
        return self.guard.seen(await self._s[script](keys=keys, args=args))

    def _control(self, state: str) -> None:
        if self.on_control is not None:
            self.on_control(state)

    async def check_layout(self, seen_bucket_bits: int, seen_ttl_ms: int = 0, *,
                           queues: bool = True) -> None:
        """Record the seen-set layout (bucket bits, the expiry of seen entries) and the
        queues' (``QUEUE_LAYOUT``) on first use; refuse a different one later. Sets
        ``seen_ttl_ms``. ``queues`` False: the queues' layout is not checked (a worker
        that flushes the crawl's queues next checks it after the flush)."""
        recorded = await self.layout.check_seen(seen_bucket_bits, seen_ttl_ms, queues)
        self.generations.ttl_ms = seen_ttl_ms
        if queues:
            await self.layout.check_queues(recorded, seen_bucket_bits, seen_ttl_ms)

    async def record_half_life(self) -> None:
        """Record this caller's slowdown half-life (LEASED_RATE_RECOVERY) with the crawl,
        so that ``scrapy leased status``, run anywhere, computes slowdowns with it."""
        await self.client.hset(self.keys.meta, HALF_LIFE_FIELD, self.half_life_ms)

    async def seen_generation(self) -> int | None:
        """The seen set's current generation as this caller knows it (None: seen entries
        never expire): first read from Redis TIME, then corrected by the scripts."""
        return await self.generations.current()

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
        triples {op, name, value} (fleet/stats.py ``StatsFlusher.compose_ops``).
        ``drops``: requests that could not be stored, each (dead-letter field, letter JSON
        object) (dropped.py), dead letters in the same step."""
        call = CommitCall(
            self.keys, self.guard, call_id or self.new_call_id(), self.max_attempts,
            self.generations.ttl_ms, enqueue, acks, fails,
            await failed_priorities(self.client, self.keys, fails),
            revisits or {}, stats, drops)
        result = call.parse(await self.generations.run(call.build, self._sender(call.SCRIPT)))
        self.tiers.learn_pushes(enqueue, result.queued)
        return result

    def _sender(self, script: str) -> Callable[[list[str], list[Any]], Any]:
        return lambda keys, args: self._guarded(script, keys, args)

    async def take_feed(self, count: int) -> FeedBatch:
        """Take up to ``count`` entries off the crawl's feed (lua/feed_take.lua), held
        for this caller for ``lease_ms`` until ``commit_feed``; the same batch again
        while an earlier one is held."""
        keys, args = upkeep.feed_take(self.keys, self.caller, count, self.lease_ms)
        return upkeep.parse_feed_batch(await self._s["feed_take"](keys=keys, args=args))

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
        return await upkeep.set_aside(self.client, self._s["key_aside"], key, want, aside_of)

    async def commit_feed(self, batch_id: str, enqueue: Sequence[NewRequest],
                          bad: Sequence[tuple[bytes | str, str]],
                          call_id: str | None = None) -> list[bool] | None:
        """Queue the requests made of this caller's feed batch ``batch_id`` (FeedBatch.id)
        and dead-letter its unreadable entries (``(entry, reason)``), dropping the batch,
        atomically (lua/feed_commit.lua). Returns what ``enqueue`` returns, or None when
        the batch was not this caller's any more (past its deadline: back in the feed;
        nothing done). ``call_id`` as for ``commit``."""
        call = FeedCommitCall(self.keys, self.guard, call_id or self.new_call_id(),
                              self.generations.ttl_ms, batch_id, enqueue, bad)
        queued = call.parse(await self.generations.run(call.build, self._sender(call.SCRIPT)))
        if queued is not None:
            self.tiers.learn_pushes(enqueue, queued)
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
                break  # sent again by the next claim (ClaimCall.pending); these are held
            more.claims = result.claims + more.claims
            more.free_lanes |= result.free_lanes
            result = more
        return result

    async def _claim_once(self, count: int, worker_id: str,
                          lanes: Sequence[tuple[str, Budget]], continues: bool) -> ClaimResult:
        reply = await self.claims.once(lambda: self.claims.build(
            count, self.lease_ms, worker_id, lanes, self.half_life_ms, self.ready_lanes,
            self.limits, continues))
        self._control(reply.state)
        self.cookies_mark = reply.cookies
        return reply.result()

    async def resolve_claim(self) -> list[tuple[int, Envelope]]:
        """The claims of a claim call that raised (its reply lost) and was not sent again:
        Redis answers from the recorded reply, or changes nothing if the call never
        ran. For a caller about to close, so that it can release them."""
        return await self.claims.resolve()

    async def hash_hot_keys(self) -> int:
        """Turn the crawl's busiest keys that are listpacks into hashtables and skiplists
        (lua/hot_keys.lua); returns how many were turned."""
        keys, args = upkeep.hot_keys(self.keys)
        return int(await self._s["hot_keys"](keys=keys, args=args))

    async def revisit(self, batch: int = 500) -> int:
        """Queue again up to ``batch`` requests whose revisit is due (lua/revisit.lua);
        returns how many were queued."""
        now_ms, (due,) = await read_atomic(
            self._s["read"], ("ZRANGE", self.keys.revisit, 0, batch - 1, "WITHSCORES"))
        call = upkeep.revisit(self.keys, now_ms, due)
        if call is None:
            return 0
        (queued,) = await self._guarded("revisit", *self.guard.wrap(*call))
        return int(queued)

    async def recover(self) -> tuple[int, int, int]:
        """Requeue up to recover_batch expired leases: (requeued, dead, expired left).
        Leases of claims issued before the current epoch are requeued without counting
        an attempt (stats ``recovered_epoch``) and are not in the figures returned."""
        keys, args = upkeep.expired(self.keys, self.recover_batch)
        found = upkeep.Expired.parse(await self._s["expired"](keys=keys, args=args))
        if not found.leases:
            return 0, 0, found.left
        call = upkeep.recover(self.keys, self.max_attempts, found.leases)
        done = upkeep.Recovered.parse(
            await self._guarded("recover", *self.guard.wrap(*call)))
        return done.requeued, done.dead, found.left

    async def renew(self, worker_id: str, tokens: Sequence[int], info: str = "") -> list[int]:
        """Heartbeat + lease extension; returns the tokens whose lease was lost (or is
        not this worker's: only the leases ``worker_id`` owns are renewed).
        ``info`` (JSON) replaces the worker's entry in ``worker_info`` when given.
        Registry entries silent for ``prune_ms`` are removed on the way."""
        call = upkeep.renew(self.keys, self.lease_ms, worker_id, info, self.prune_ms, tokens)
        reply = upkeep.Renewed.parse(await self._guarded("renew", *self.guard.wrap(*call)))
        self._control(reply.control)
        return reply.lost

    async def release(self, worker_id: str, claims: Sequence[int | tuple[int, str]],
                      leave: bool = True) -> int:
        """Give back unstarted claims: tokens, or (token, lane) (the lane is not needed:
        each claim's lane and priority are read from Redis first). Only the claims
        ``worker_id`` owns are released (and counted). ``leave``: the worker leaves the
        registry (it is closing); else it stays (it gives back claims while running)."""
        tokens = [_lane_and_token(item)[0] for item in claims]
        envs = await self.client.hmget(self.keys.inflight, tokens) if tokens and worker_id else []
        keys, args = upkeep.release(self.keys, worker_id, leave, tokens, envs)
        return int(await self._s["release"](keys=keys, args=args))

    async def acquire(self, lane: str, budget: Budget) -> tuple[int, int]:
        """Take one request's worth of the lane's shared budget: (wait_ms, now_ms), wait
        0 when the request may start now (then taken at now_ms, Redis server time), else
        the milliseconds to wait."""
        keys, args = upkeep.acquire(self.keys, lane, budget, self.half_life_ms)
        wait, now = await self._s["acquire"](keys=keys, args=args)
        return int(wait), int(now)

    async def penalize(self, lane: str, block_ms: int = 0, slow_down: bool = False,
                       crawl_delay_ms: int = -1) -> int:
        """The lane's host asked to slow down: block it for ``block_ms`` for the whole
        fleet, double its slowdown factor, and/or record its Crawl-delay; the lane is
        published on the crawl's penalty channel (``CrawlKeys.penalties``). Returns the
        time (ms of Redis TIME) until which the lane is blocked."""
        keys, args = upkeep.penalize(self.keys, lane, block_ms, slow_down, crawl_delay_ms,
                                     self.half_life_ms)
        _now, blocked = await self._s["penalize"](keys=keys, args=args)
        return int(blocked)

    async def counts(self, worker_ttl_ms: int = 30_000) -> dict[str, int]:
        """A snapshot of the crawl's counters (one script run: a consistent view)."""
        return await upkeep.counts(self._s["read"], self.keys, worker_ttl_ms)
