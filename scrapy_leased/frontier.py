"""The crawl's Redis state machine: enqueue, claim, ack, fail, recover, renew, release.

Every mutation is one Lua script (see ``lua/``), every key comes from ``CrawlKeys``,
and every time is Redis server time. This module knows nothing about Scrapy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .keys import CrawlKeys
from .scripts import register


REASON_CHARS = 500  # a failure's reason is kept to its first 500 characters


@dataclass(frozen=True)
class Envelope:
    """A request as stored: ``<rid>|<attempts>|<expiries>|<priority>|<payload>``
    (see lua/lib_settle.lua)."""

    rid: int
    attempts: int
    expiries: int
    priority: int
    payload: str

    @classmethod
    def parse(cls, raw: str) -> Envelope:
        rid, attempts, expiries, priority, payload = raw.split("|", 4)
        return cls(int(rid), int(attempts), int(expiries), int(priority), payload)


@dataclass(frozen=True)
class NewRequest:
    """A request to enqueue; ``bucket`` None means no dedupe (``dont_filter``)."""

    payload: str
    priority: int = 0
    bucket: int | None = None
    member: int = 0


@dataclass(frozen=True)
class Failure:
    token: int
    reason: str
    permanent: bool = False


@dataclass
class ClaimResult:
    now_ms: int
    queued: int
    leases: int
    claims: list[tuple[int, Envelope]] = field(default_factory=list)


@dataclass
class CommitResult:
    queued: list[bool]
    acks: list[int]  # bit 1: lease was held; bit 2: newly counted done
    fails: list[int]  # 0: lease no longer held, 1: requeued, 2: dead-lettered


class Frontier:
    def __init__(self, client: Any, keys: CrawlKeys, *, lease_ms: int, max_attempts: int,
                 recover_batch: int = 500) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = lease_ms
        self.max_attempts = max_attempts
        self.recover_batch = recover_batch
        self._s = register(client, "claim", "commit", "recover", "renew", "release")

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

    async def commit(self, enqueue: Sequence[NewRequest] = (), acks: Sequence[tuple[int, int]] = (),
                     fails: Sequence[Failure] = ()) -> CommitResult:
        k = self.keys
        keys = [k.queue, k.seq, k.stats, k.leases, k.inflight, k.done, k.dead, k.rids,
                k.throughput]
        index: dict[int, int] = {}
        args: list[Any] = [len(enqueue), len(acks), len(fails), self.max_attempts]
        for r in enqueue:
            if r.bucket is None:
                idx = 0
            else:
                idx = index.get(r.bucket, 0)
                if not idx:
                    keys.append(k.seen_bucket(r.bucket))
                    idx = index[r.bucket] = len(keys)
            args += [idx, r.member, r.priority, r.payload]
        for token, rid in acks:
            args += [token, rid]
        for f in fails:
            args += [f.token, f.reason[:REASON_CHARS], int(f.permanent)]
        out = await self._s["commit"](keys=keys, args=args)
        n, m = len(enqueue), len(acks)
        return CommitResult([bool(x) for x in out[:n]], list(out[n:n + m]), list(out[n + m:]))

    async def enqueue(self, requests: Sequence[NewRequest]) -> list[bool]:
        return (await self.commit(enqueue=requests)).queued

    async def ack(self, token: int, rid: int) -> int:
        return (await self.commit(acks=[(token, rid)])).acks[0]

    async def fail(self, token: int, reason: str, permanent: bool = False) -> int:
        return (await self.commit(fails=[Failure(token, reason, permanent)])).fails[0]

    async def claim(self, count: int, worker_id: str) -> ClaimResult:
        k = self.keys
        out = await self._s["claim"](
            keys=[k.queue, k.leases, k.inflight, k.tokens, k.done, k.stats, k.dead, k.seq,
                  k.workers],
            args=[count, self.lease_ms, worker_id])
        result = ClaimResult(int(out[0]), int(out[1]), int(out[2]))
        for i in range(3, len(out), 2):
            raw = out[i + 1]
            result.claims.append((int(out[i]), Envelope.parse(
                raw.decode() if isinstance(raw, bytes) else raw)))
        return result

    async def recover(self) -> tuple[int, int, int]:
        """Requeue up to recover_batch expired leases: (requeued, dead, expired left)."""
        k = self.keys
        out = await self._s["recover"](
            keys=[k.queue, k.seq, k.stats, k.leases, k.inflight, k.dead],
            args=[self.recover_batch, self.max_attempts])
        return int(out[0]), int(out[1]), int(out[2])

    async def renew(self, worker_id: str, tokens: Sequence[int], info: str = "") -> list[int]:
        """Heartbeat + lease extension; returns the tokens whose lease was lost.
        ``info`` (JSON) replaces the worker's entry in ``worker_info`` when given."""
        k = self.keys
        out = await self._s["renew"](keys=[k.leases, k.workers, k.worker_info],
                                     args=[self.lease_ms, worker_id, info, *tokens])
        return [int(t) for t in out[1:]]

    async def release(self, worker_id: str, tokens: Sequence[int]) -> int:
        k = self.keys
        return int(await self._s["release"](
            keys=[k.queue, k.seq, k.stats, k.leases, k.inflight, k.workers, k.worker_info],
            args=[worker_id, *tokens]))

    async def counts(self, worker_ttl_ms: int = 30_000) -> dict[str, int]:
        """A snapshot of the crawl's counters (several reads, not one atomic view)."""
        k = self.keys
        async with self.client.pipeline(transaction=True) as p:
            p.time().zcard(k.queue).zcard(k.leases).hlen(k.dead).hgetall(k.stats)
            p.zrangebyscore(k.workers, "-inf", "+inf", withscores=True)
            now, queued, leases, dead, stats, workers = await p.execute()
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        stats = {(a.decode() if isinstance(a, bytes) else a): int(b) for a, b in stats.items()}
        return {
            "todo": int(queued), "processing": int(leases), "dead": int(dead),
            "done": stats.get("done", 0),
            "workers_alive": sum(1 for _, ts in workers if now_ms - ts < worker_ttl_ms),
            **{f"total_{name}": v for name, v in stats.items()},
        }
