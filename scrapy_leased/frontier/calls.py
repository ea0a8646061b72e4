"""The calls that queue requests (lua/commit.lua, lua/feed_commit.lua): each owns its
KEYS, ARGV and reply layout. Their new requests' ARGV (lua/lib_enqueue.lua) and the
queue a claimed request goes back to (lua/lib_settle.lua) are built here too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .envelope import Envelope
from .guard import Guard
from .keys import CrawlKeys, ExtraKeys, tier_code
from .model import REASON_CHARS, CommitResult, Failure, NewRequest, Revisit, is_start
from .reply import Reader, fixed_keys


def enqueue_args(k: CrawlKeys, extra: ExtraKeys, enqueue: Sequence[NewRequest],
                 gen: int | None) -> list[Any]:
    """The ARGV of new requests (lua/lib_enqueue.lua), their KEYS added to ``extra``
    (the seen buckets of generation ``gen``, None: no expiry): what requests share
    (lane, priority, order) once per group, then four fields a request."""
    groups: dict[tuple[str, int, str], int] = {}
    specs: list[Any] = []
    requests: list[Any] = []
    for r in enqueue:
        group = groups.get((r.lane, r.priority, r.order))
        if group is None:
            group = groups[(r.lane, r.priority, r.order)] = len(groups) + 1
            specs += [r.priority,
                      extra.queue(k, r.lane, tier_code(r.priority, is_start(r.order))),
                      r.lane, r.order]
        bucket = 0 if r.bucket is None else extra.seen(k, r.bucket, gen)
        requests += [bucket, r.member, group, r.payload]
    return [len(groups), *specs, *requests]


def requeue_to(k: CrawlKeys, extra: ExtraKeys, raw: Any) -> int:
    """The index in ``extra`` of the LIST an envelope (as stored; None: none) goes
    back to as a regular request (its lane's, its priority's tier: lib_settle.lua).
    Any queue for one that cannot be read: the scripts queue no such envelope."""
    try:
        env = Envelope.parse(raw) if raw is not None else None
    except ValueError:
        env = None
    if env is None:
        return extra.queue(k, "")
    return extra.queue(k, env.lane, tier_code(env.priority))


async def failed_priorities(client: Any, keys: CrawlKeys,
                            fails: Sequence[Failure]) -> dict[int, int]:
    """The priority of the request of each failed claim whose Failure names none, read
    from ``inflight`` (0 for a token without an envelope: nothing is requeued for it;
    one whose envelope cannot be read is left out, and its fail dead-letters it)."""
    tokens = [f.token for f in fails if f.priority is None]
    if not tokens:
        return {}
    out = {}
    for token, raw in zip(tokens, await client.hmget(keys.inflight, tokens)):
        try:
            out[token] = Envelope.parse(raw).priority if raw is not None else 0
        except ValueError:
            pass
    return out


@dataclass
class CommitCall:
    """lua/commit.lua: enqueue, stats, acks, fails, revisits and drops in one step.
    ``priorities``: the priority of each failed claim whose Failure has none."""

    SCRIPT: ClassVar[str] = "commit"
    keys: CrawlKeys
    guard: Guard
    call_id: str
    max_attempts: int
    seen_ttl_ms: int
    enqueue: Sequence[NewRequest] = ()
    acks: Sequence[tuple[int, int]] = ()
    fails: Sequence[Failure] = ()
    priorities: Mapping[int, int] = field(default_factory=dict)
    revisits: Mapping[int, Revisit] = field(default_factory=dict)
    stats: Sequence[Any] = ()
    drops: Sequence[tuple[str, str]] = ()

    def build(self, gen: int | None) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV for seen-set generation ``gen`` (seengen.py)."""
        k = self.keys
        keys = fixed_keys(self.SCRIPT, k)
        extra = ExtraKeys(keys)
        args: list[Any] = [len(self.enqueue), len(self.acks), len(self.fails),
                           self.max_attempts, self.seen_ttl_ms, gen or 0, len(self.revisits),
                           len(self.stats) // 3, self.guard.caller]
        args += enqueue_args(k, extra, self.enqueue, gen)
        for token, rid in self.acks:
            revisit = self.revisits.get(token)
            args += [token, rid, revisit.after_ms if revisit else 0]
        for f in self.fails:
            priority = self.priorities.get(f.token, 0) if f.priority is None else f.priority
            args += [f.token, f.reason[:REASON_CHARS], int(f.permanent),
                     extra.queue(k, f.lane, tier_code(priority)), f.lane,
                     "" if f.rid is None else f.rid, priority]
        for token, r in self.revisits.items():
            args += [token, r.priority, r.lane, r.payload]
        args += self.stats
        if self.drops:
            args.append(len(self.drops))
            for name, letter in self.drops:
                args += [name, letter]
        return self.guard.wrap(keys, args, "commit", self.call_id)

    def parse(self, out: Sequence[Any]) -> CommitResult:
        """{enqueue results..., ack results..., fail results...}, the guard's taken off."""
        r = Reader(out)
        queued = [bool(x) for x in r.take(len(self.enqueue))]
        acks = r.take(len(self.acks))
        return CommitResult(queued, acks, r.rest())


@dataclass
class FeedCommitCall:
    """lua/feed_commit.lua: queue a feed batch's requests, dead-letter its unreadable
    entries (``bad``: (entry, reason)) and drop the batch."""

    SCRIPT: ClassVar[str] = "feed_commit"
    keys: CrawlKeys
    guard: Guard
    call_id: str
    seen_ttl_ms: int
    batch_id: str
    enqueue: Sequence[NewRequest]
    bad: Sequence[tuple[bytes | str, str]]

    def build(self, gen: int | None) -> tuple[list[str], list[Any]]:
        keys = fixed_keys(self.SCRIPT, self.keys)
        extra = ExtraKeys(keys)
        args: list[Any] = [self.guard.caller, len(self.enqueue), len(self.bad),
                           self.seen_ttl_ms, gen or 0, self.batch_id]
        args += enqueue_args(self.keys, extra, self.enqueue, gen)
        for entry, reason in self.bad:
            args += [entry, reason[:REASON_CHARS]]
        return self.guard.wrap(keys, args, "feed", self.call_id)

    @staticmethod
    def parse(out: Sequence[Any]) -> list[bool] | None:
        """{held, enqueue results...}: None when the batch was not held any more."""
        r = Reader(out)
        held = r.number()
        return [bool(x) for x in r.rest()] if held else None
