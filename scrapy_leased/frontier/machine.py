"""The crawl's Redis state machine: enqueue, claim, ack, fail, recover, renew, release.

Every mutation is one Lua script (see ``lua/``), every key comes from ``CrawlKeys``,
and every time is Redis server time. This module knows nothing about Scrapy.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .envelope import Envelope
from .keys import CrawlKeys, ExtraKeys
from .scripts import as_str, pairs, read_atomic, register

REASON_CHARS = 500  # a failure's reason is kept to its first 500 characters
#: Field of the crawl's ``meta`` HASH: the slowdown half-life (ms) the workers use.
HALF_LIFE_FIELD = "rate_half_life_ms"


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


@dataclass(frozen=True)
class Budget:
    """A lane's rate budget: one request per ``interval_ms`` with bursts of ``burst``;
    ``interval_ms`` 0 means no budget."""

    interval_ms: int = 0
    burst: int = 1


NO_BUDGET = Budget()


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


@dataclass
class CommitResult:
    queued: list[bool]
    acks: list[int]  # bit 1: lease was held; bit 2: newly counted done
    fails: list[int]  # 0: lease no longer held, 1: requeued, 2: dead-lettered


def _lane_and_token(item: int | tuple[int, str]) -> tuple[int, str]:
    return (item, "") if isinstance(item, int) else item


def _parse_claims(rest: Sequence[Any]) -> list[tuple[int, Envelope]]:
    return [(int(rest[i]), Envelope.parse(rest[i + 1])) for i in range(0, len(rest), 2)]


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
                 prune_ms: int = 0) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.max_attempts = max_attempts
        self.recover_batch = recover_batch
        self.half_life_ms = half_life_ms
        self.ready_lanes = ready_lanes
        self.prune_ms = prune_ms  # renewals prune registry entries silent this long (0: never)
        self.caller = caller or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.epoch: int | None = None
        self.seen_token = 0
        self.seen_rid = 0
        self.on_epoch: Callable[[int, int], None] | None = None
        self._calls = 0
        self._pending_claim: tuple[list[str], list[Any]] | None = None
        self._s = register(client, "claim", "commit", "expired", "recover", "renew", "release",
                           "acquire", "penalize", "read")

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

    async def check_layout(self, seen_bucket_bits: int) -> None:
        """Record the seen-set layout on first use; refuse a different one later."""
        k = self.keys.meta
        await self.client.hsetnx(k, "seen_bucket_bits", seen_bucket_bits)
        stored = int(await self.client.hget(k, "seen_bucket_bits"))
        if stored != seen_bucket_bits:
            raise ValueError(
                f"LEASED_SEEN_BUCKET_BITS ({seen_bucket_bits}) differs from the value this "
                f"crawl was started with ({stored}); changing it would forget seen URLs. "
                f"Set it back to {stored}, or use a new LEASED_CRAWL_ID."
            )

    async def record_half_life(self) -> None:
        """Record this caller's slowdown half-life (LEASED_RATE_RECOVERY) with the crawl,
        so that ``scrapy leased status``, run anywhere, computes slowdowns with it."""
        await self.client.hset(self.keys.meta, HALF_LIFE_FIELD, self.half_life_ms)

    async def commit(self, enqueue: Sequence[NewRequest] = (), acks: Sequence[tuple[int, int]] = (),
                     fails: Sequence[Failure] = (), call_id: str | None = None) -> CommitResult:
        """Enqueue, ack and fail in one atomic step. ``call_id``: the id of this commit
        (``new_call_id``); send a commit whose outcome is unknown again with the same id
        and the same contents, and it is applied once. None: a new id."""
        k = self.keys
        keys = [k.seq, k.lanes, k.todo, k.stats, k.leases, k.inflight, k.done, k.dead, k.rids,
                k.throughput, k.owners]
        extra = ExtraKeys(keys)
        args: list[Any] = [len(enqueue), len(acks), len(fails), self.max_attempts]
        for r in enqueue:
            bucket = 0 if r.bucket is None else extra(k.seen_bucket(r.bucket))
            args += [bucket, r.member, r.priority, extra.queue(k, r.lane), r.lane, r.payload,
                     r.order]
        for token, rid in acks:
            args += [token, rid]
        for f in fails:
            args += [f.token, f.reason[:REASON_CHARS], int(f.permanent),
                     extra.queue(k, f.lane), f.lane, "" if f.rid is None else f.rid]
        gkeys, gargs = self._guard("commit", call_id or self.new_call_id())
        out = self._seen(await self._s["commit"](keys=keys + gkeys, args=args + gargs))
        n, m = len(enqueue), len(acks)
        return CommitResult([bool(x) for x in out[:n]], list(out[n:n + m]), list(out[n + m:]))

    async def enqueue(self, requests: Sequence[NewRequest]) -> list[bool]:
        return (await self.commit(enqueue=requests)).queued

    async def ack(self, token: int, rid: int) -> int:
        return (await self.commit(acks=[(token, rid)])).acks[0]

    async def fail(self, token: int, reason: str, permanent: bool = False, lane: str = "") -> int:
        return (await self.commit(fails=[Failure(token, reason, permanent, lane)])).fails[0]

    async def claim(self, count: int, worker_id: str,
                    lanes: Sequence[tuple[str, Budget]] = (("", NO_BUDGET),)) -> ClaimResult:
        """Claim up to ``count`` requests from the given candidate lanes (each with its
        budget); the result names the lanes ready now, to pass next time."""
        if self._pending_claim is None:  # else: send the claim whose reply was lost again
            k = self.keys
            keys = [k.lanes, k.leases, k.inflight, k.tokens, k.done, k.stats, k.dead, k.seq,
                    k.workers, k.todo, k.owners]
            args: list[Any] = [count, self.lease_ms, worker_id, len(lanes), self.half_life_ms,
                               self.ready_lanes]
            for lane, budget in lanes:
                keys += [k.lane_queue(lane), k.lane_fifo(lane), k.rate(lane)]
                args += [lane, budget.interval_ms, budget.burst]
            gkeys, gargs = self._guard("claim", self.new_call_id())
            self._pending_claim = (keys + gkeys, args + gargs)
        keys, args = self._pending_claim
        out = self._seen(await self._s["claim"](keys=keys, args=args))
        self._pending_claim = None
        n = int(out[4])
        ready = [as_str(x) for x in out[5:5 + n]]
        m = int(out[5 + n])
        free = frozenset(as_str(x) for x in out[6 + n:6 + n + m])
        result = ClaimResult(int(out[0]), int(out[1]), int(out[2]), int(out[3]), ready,
                             free_lanes=free)
        result.claims = _parse_claims(out[6 + n + m:])
        return result

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
        n = int(out[4])
        m = int(out[5 + n])
        return _parse_claims(out[6 + n + m:])

    async def recover(self) -> tuple[int, int, int]:
        """Requeue up to recover_batch expired leases: (requeued, dead, expired left).
        Leases of claims issued before the current epoch are requeued without counting
        an attempt (stats ``recovered_epoch``) and are not in the figures returned."""
        k = self.keys
        out = await self._s["expired"](keys=[k.leases, k.inflight], args=[self.recover_batch])
        left = int(out[1])
        if len(out) == 2:
            return 0, 0, left
        keys = [k.seq, k.lanes, k.todo, k.stats, k.leases, k.inflight, k.dead, k.owners]
        extra = ExtraKeys(keys)
        args: list[Any] = [self.max_attempts]
        for i in range(2, len(out), 2):
            raw = out[i + 1]
            try:
                lane = Envelope.parse(raw).lane if raw else ""
            except ValueError:
                lane = ""  # malformed: recover.lua dead-letters it whatever the queue
            args += [out[i], extra.queue(k, lane)]
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
            keys=[k.leases, k.workers, k.worker_info, k.owners] + gkeys,
            args=[self.lease_ms, worker_id, info, self.prune_ms, *tokens] + gargs))
        return [int(t) for t in out[1:]]

    async def release(self, worker_id: str, claims: Sequence[int | tuple[int, str]]) -> int:
        """Give back unstarted claims: tokens, or (token, lane) for claims not in the
        default lane. Only the claims ``worker_id`` owns are released (and counted)."""
        k = self.keys
        keys = [k.seq, k.lanes, k.todo, k.stats, k.leases, k.inflight, k.workers, k.worker_info,
                k.owners]
        extra = ExtraKeys(keys)
        args: list[Any] = [worker_id]
        for item in claims:
            token, lane = _lane_and_token(item)
            args += [token, extra.queue(k, lane)]
        return int(await self._s["release"](keys=keys, args=args))

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
        fleet, double its slowdown factor, and/or record its Crawl-delay. Returns the
        time (ms of Redis TIME) until which the lane is blocked."""
        k = self.keys
        _now, blocked = await self._s["penalize"](
            keys=[k.rate(lane), k.lanes],
            args=[lane, block_ms, int(slow_down), crawl_delay_ms, self.half_life_ms])
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
