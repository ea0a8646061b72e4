"""The calls that queue requests (lua/commit.lua, lua/feed_commit.lua): each owns its
KEYS, ARGV and reply layout. Their new requests' ARGV (lua/lib_enqueue.lua) and the
queue a claimed request goes back to (lua/lib_settle.lua) are built here too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .envelope import Envelope
from .guard import Guard
from .keys import P0, CrawlKeys, ExtraKeys, tier_code
from .model import REASON_CHARS, CommitResult, Failure, NewRequest, Revisit, is_start
from .reply import Reader, fixed_keys

#: A request group's queue order in its spec (lua/lib_enqueue.lua: count x 4 + this,
#: then a space and the priority when that is not 0)
GROUP_ORDERS = {"F": 0, "L": 1, "S": 2, "T": 3}


def enqueue_args(k: CrawlKeys, extra: ExtraKeys, enqueue: Sequence[NewRequest],
                 gen: int | None) -> tuple[list[Any], list[int]]:
    """The ARGV of new requests (lua/lib_enqueue.lua), their KEYS added to ``extra``
    (the seen buckets of generation ``gen``, None: no expiry), and the order they are
    sent in (indexes into ``enqueue``; the script's results come in that order): what
    requests share (lane, priority, order) once per group with their count (a lane and
    a spec, the priority after it when not 0), then two fields a request, group after
    group; in KEYS the groups' queues (a tier's LIST with the lane's tier index after
    it, priority 0's LIST alone), then the requests' seen buckets, in the same order.
    The new requests' rids follow the order they are sent in."""
    groups: dict[tuple[str, int, str], list[int]] = {}
    # a fingerprint named again goes with its first request, after it: that one is
    # queued or not, the later ones are duplicates (as the calls' order would have it)
    first_of: dict[tuple[int, int], tuple[str, int, str]] = {}
    for i, r in enumerate(enqueue):
        group = (r.lane, r.priority, r.order)
        if r.bucket is not None:
            group = first_of.setdefault((r.bucket, r.member), group)
        groups.setdefault(group, []).append(i)
    specs: list[Any] = []
    requests: list[Any] = []
    sent: list[int] = []
    queues: list[str] = []
    seen: list[str] = []
    for (lane, priority, order), members in groups.items():
        code = tier_code(priority, is_start(order))
        if code == P0:
            queues.append(k.lane_fifo(lane))
        else:
            queues += extra.queue_keys(k, lane, code)
        spec = len(members) * 4 + GROUP_ORDERS[order]
        specs += [lane, f"{spec} {priority}" if priority else spec]
        for i in members:
            r = enqueue[i]
            if r.bucket is None:
                requests += ["", r.payload]
            else:
                requests += [r.member, r.payload]
                seen += extra.seen_keys(k, r.bucket, gen)
        sent += members
    first_queue = extra.add(queues)
    first_seen = extra.add(seen)
    return [len(groups), first_queue, first_seen, *specs, *requests], sent


def in_given_order(results: Sequence[Any], sent: Sequence[int]) -> list[Any]:
    """The script's results per request (in the order ``sent``) in the caller's order."""
    out: list[Any] = [None] * len(sent)
    for i, result in zip(sent, results):
        out[i] = result
    return out


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
    #: the order the new requests are sent in (enqueue_args), set by build
    _sent: list[int] = field(default_factory=list, init=False, repr=False)

    def build(self, gen: int | None) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV for seen-set generation ``gen`` (seengen.py)."""
        k = self.keys
        keys = fixed_keys(self.SCRIPT, k)
        extra = ExtraKeys(keys)
        args: list[Any] = [len(self.enqueue), len(self.acks), len(self.fails),
                           self.max_attempts, self.seen_ttl_ms, gen or 0, len(self.revisits),
                           len(self.stats) // 3, self.guard.caller]
        enqueue, self._sent = enqueue_args(k, extra, self.enqueue, gen)
        args += enqueue
        for token, rid in self.acks:
            args += [token, rid]
        for f in self.fails:
            priority = self.priorities.get(f.token, 0) if f.priority is None else f.priority
            args += [f.token, f.reason[:REASON_CHARS], int(f.permanent),
                     extra.queue(k, f.lane, tier_code(priority)), f.lane,
                     "" if f.rid is None else f.rid, priority]
        for token, r in self.revisits.items():
            args += [token, r.after_ms, r.priority, r.lane, r.payload]
        args += self.stats
        if self.drops:
            args.append(len(self.drops))
            for name, letter in self.drops:
                args += [name, letter]
        return self.guard.wrap(keys, args, "commit", self.call_id)

    def parse(self, out: Sequence[Any]) -> CommitResult:
        """{enqueue results..., ack results..., fail results...}, the guard's taken off."""
        r = Reader(out)
        queued = [bool(x) for x in in_given_order(r.take(len(self.enqueue)), self._sent)]
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
    #: the order the new requests are sent in (enqueue_args), set by build
    _sent: list[int] = field(default_factory=list, init=False, repr=False)

    def build(self, gen: int | None) -> tuple[list[str], list[Any]]:
        keys = fixed_keys(self.SCRIPT, self.keys)
        extra = ExtraKeys(keys)
        args: list[Any] = [self.guard.caller, len(self.enqueue), len(self.bad),
                           self.seen_ttl_ms, gen or 0, self.batch_id]
        enqueue, self._sent = enqueue_args(self.keys, extra, self.enqueue, gen)
        args += enqueue
        for entry, reason in self.bad:
            args += [entry, reason[:REASON_CHARS]]
        return self.guard.wrap(keys, args, "feed", self.call_id)

    def parse(self, out: Sequence[Any]) -> list[bool] | None:
        """{held, enqueue results...}: None when the batch was not held any more."""
        r = Reader(out)
        held = r.number()
        return [bool(x) for x in in_given_order(r.rest(), self._sent)] if held else None
