"""The calls that keep claims and workers going: recover (lua/expired.lua, then
lua/recover.lua), revisit, renew and release, and the rate and feed calls (acquire,
penalize, feed_take, key_aside). Each names its KEYS, ARGV and reply fields once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from .calls import requeue_to
from .keys import CrawlKeys, ExtraKeys
from .model import Budget, FeedBatch
from .reply import Reader, fixed_keys
from .scripts import as_str, pairs, read_atomic

Call = tuple[list[str], list[Any]]


class Expired(NamedTuple):
    """lua/expired.lua's reply: expired leases left after these, and these (token,
    envelope or None)."""

    now_ms: int
    left: int
    leases: list[tuple[Any, Any]]

    @classmethod
    def parse(cls, out: Sequence[Any]) -> Expired:
        r = Reader(out)
        return cls(r.number(), r.number(), pairs(r.rest()))


def hot_keys(k: CrawlKeys) -> Call:
    return fixed_keys("hot_keys", k), []


def expired(k: CrawlKeys, batch: int) -> Call:
    return fixed_keys("expired", k), [batch]


def recover(k: CrawlKeys, max_attempts: int, leases: Sequence[tuple[Any, Any]]) -> Call:
    """Requeue expired leases (token, envelope as stored) to their queues."""
    keys = fixed_keys("recover", k)
    extra = ExtraKeys(keys)
    args: list[Any] = [max_attempts]
    for token, raw in leases:
        args += [token, requeue_to(k, extra, raw)]
    return keys, args


class Recovered(NamedTuple):
    """lua/recover.lua's reply, the guard's part taken off."""

    requeued: int
    dead: int
    forgiven: int  # requeued without an attempt: issued before the current epoch

    @classmethod
    def parse(cls, out: Sequence[Any]) -> Recovered:
        r = Reader(out)
        return cls(r.number(), r.number(), r.number())


def revisit(k: CrawlKeys, now_ms: int, due: Sequence[Any]) -> Call | None:
    """Queue the due ones of ``due`` (a WITHSCORES reply of the revisit ZSET, in score
    order) again; None when none is due."""
    keys = fixed_keys("revisit", k)
    extra = ExtraKeys(keys)
    args: list[Any] = []
    for member, score in pairs(due):
        if float(score) > now_ms:
            break  # in score order: the rest is not due either
        args += [member, requeue_to(k, extra, member)]
    return (keys, args) if args else None


class Renewed(NamedTuple):
    """lua/renew.lua's reply, the guard's part taken off."""

    now_ms: int
    control: str
    lost: list[int]

    @classmethod
    def parse(cls, out: Sequence[Any]) -> Renewed:
        r = Reader(out)
        return cls(r.number(), r.text(), [int(t) for t in r.rest()])


def renew(k: CrawlKeys, lease_ms: int, worker_id: str, info: str, prune_ms: int,
          tokens: Sequence[int]) -> Call:
    return fixed_keys("renew", k), [lease_ms, worker_id, info, prune_ms, *tokens]


def release(k: CrawlKeys, worker_id: str, leave: bool, tokens: Sequence[int],
            envs: Sequence[Any]) -> Call:
    """Give back claims (``envs``: their envelopes as stored, read from ``inflight``);
    the reply is the number released."""
    keys = fixed_keys("release", k)
    extra = ExtraKeys(keys)
    args: list[Any] = [worker_id, 1 if leave else 0]
    for token, raw in zip(tokens, envs):
        args += [token, requeue_to(k, extra, raw)]
    return keys, args


def acquire(k: CrawlKeys, lane: str, budget: Budget, half_life_ms: int) -> Call:
    """lua/acquire.lua; replies {wait_ms, now_ms}."""
    return [k.rate(lane), k.lanes], [lane, budget.interval_ms, budget.burst, half_life_ms]


def penalize(k: CrawlKeys, lane: str, block_ms: int, slow_down: bool, crawl_delay_ms: int,
             half_life_ms: int) -> Call:
    """lua/penalize.lua; replies {now_ms, blocked_until_ms}."""
    return [k.rate(lane), k.lanes], [lane, block_ms, int(slow_down), crawl_delay_ms,
                                     half_life_ms, k.penalties]


def feed_take(k: CrawlKeys, caller: str, count: int, lease_ms: int) -> Call:
    return fixed_keys("feed_take", k), [caller, count, lease_ms]


def parse_feed_batch(out: Sequence[Any]) -> FeedBatch:
    """lua/feed_take.lua's reply: {returned, left, batch id, entry...}."""
    r = Reader(out)
    returned, left, batch_id = r.number(), r.number(), r.text()
    return FeedBatch(r.rest(), returned=returned, left=left, id=batch_id)


class Aside(NamedTuple):
    """lua/key_aside.lua's reply: the key's type before, and 1 moved, 0 nothing to do,
    -1 the name to move it to is taken."""

    kind: str
    moved: int

    @classmethod
    def parse(cls, out: Sequence[Any]) -> Aside:
        kind, moved = out
        return cls(as_str(kind), int(moved))


async def set_aside(client: Any, script: Any, key: str, want: str,
                    aside_of: Callable[[int], str]) -> tuple[str, str] | None:
    """Frontier.set_aside: move ``key`` to ``aside_of(Redis TIME in ms)`` unless it holds
    type ``want`` or is absent, a new name while the one tried exists already."""
    aside = ""
    for _ in range(5):
        seconds, micros = await client.time()
        aside = aside_of(int(seconds) * 1000 + int(micros) // 1000)
        reply = Aside.parse(await script(keys=[key, aside], args=[want]))
        if reply.moved == 1:
            return reply.kind, aside
        if reply.moved == 0:
            return None
    raise ResponseError(f"cannot move {key} aside: every name tried exists already "
                        f"({aside})")


async def counts(read: Any, k: CrawlKeys, worker_ttl_ms: int) -> dict[str, int]:
    """Frontier.counts: the crawl's counters, read in one run of lua/read.lua."""
    now_ms, (todo, leases, dead, stats, workers) = await read_atomic(
        read, ("GET", k.todo), ("ZCARD", k.leases), ("HLEN", k.dead),
        ("HGETALL", k.stats), ("ZRANGE", k.workers, 0, -1, "WITHSCORES"))
    stats = {as_str(a): int(b) for a, b in pairs(stats)}
    return {
        "todo": int(todo or 0), "processing": int(leases), "dead": int(dead),
        "done": stats.get("done", 0),
        "workers_alive": sum(1 for _, ts in pairs(workers)
                             if now_ms - float(ts) < worker_ttl_ms),
        **{f"total_{name}": v for name, v in stats.items()},
    }
