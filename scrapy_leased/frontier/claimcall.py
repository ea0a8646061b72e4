"""The claim call (lua/claim.lua): its KEYS and ARGV, and its reply read by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .envelope import Envelope
from .guard import Guard
from .keys import CrawlKeys
from .model import Budget, ClaimResult, CloseLimits
from .reply import Reader, fixed_keys
from .scripts import as_str, pairs
from .tiers import TierCache

SCRIPT = "claim"
#: Claim calls ``Frontier.claim`` makes at most when a call claimed nothing because the
#: top tier of a lane was not the one it passed (lua/claim.lua: ``stale``; the reply
#: names the right one, so one more call normally does)
CLAIM_ATTEMPTS = 3
#: The guard's ARGV after the claim's own: call id, epoch, token, rid (lib_guard.lua)
CALL_ID_FROM_END = 4


class ClaimReply(NamedTuple):
    """lua/claim.lua's reply, the guard's part taken off, in its order."""

    now_ms: int
    todo: int
    leases: int
    next_ms: int
    state: str
    feed: int
    stale: int
    #: the control HASH's ``cookies`` field: changes with every write to a cookie jar
    cookies: str
    ready_lanes: list[str]
    free_lanes: frozenset[str]
    #: the top tier of each lane the reply names ('': none but p0)
    tiers: dict[str, str]
    claims: list[tuple[int, Envelope]]

    @classmethod
    def parse(cls, out: Sequence[Any]) -> ClaimReply:
        r = Reader(out)
        return cls(
            now_ms=r.number(), todo=r.number(), leases=r.number(), next_ms=r.number(),
            state=r.text(), feed=r.number(), stale=r.number(), cookies=r.text(),
            ready_lanes=[as_str(x) for x in r.counted()],
            free_lanes=frozenset(as_str(x) for x in r.counted()),
            tiers={as_str(lane): as_str(code) for lane, code in pairs(r.counted(2))},
            claims=[(int(token), Envelope.parse(env)) for token, env in pairs(r.rest())])

    def result(self) -> ClaimResult:
        return ClaimResult(
            self.now_ms, self.todo, self.leases, self.next_ms, self.ready_lanes, self.claims,
            self.free_lanes, control=self.state, feed=self.feed, stale=self.stale,
            cookies=self.cookies)


class ClaimCall:
    """One caller's claims: built, sent, and sent again when a reply was lost. A claim
    whose reply was lost (it raised) is kept as ``pending``: the next claim sends it
    again, the same (the guard answers from the recorded reply, or runs it if it never
    ran), and ``resolve`` sends it as a replay only."""

    def __init__(self, script: Any, keys: CrawlKeys, guard: Guard, tiers: TierCache) -> None:
        self.script = script
        self.keys = keys
        self.guard = guard
        self.tiers = tiers
        self.pending: tuple[list[str], list[Any]] | None = None

    def build(self, count: int, lease_ms: int, worker_id: str,
              lanes: Sequence[tuple[str, Budget]], half_life_ms: int, ready_lanes: int,
              limits: CloseLimits, continues: bool) -> tuple[list[str], list[Any]]:
        """KEYS: the fixed ones, then per candidate lane its queue index ZSET, p0 LIST,
        rate HASH and the LIST of the tier it passes; ARGV likewise (lua/claim.lua)."""
        k = self.keys
        keys = fixed_keys(SCRIPT, k)
        args: list[Any] = [count, lease_ms, worker_id, len(lanes), half_life_ms, ready_lanes,
                           *limits.args(), int(continues)]
        for lane, budget in lanes:
            code = self.tiers.get(lane)
            fifo = k.lane_fifo(lane)  # also the placeholder when no tier is known
            keys += [k.lane_queue(lane), fifo, k.rate(lane),
                     k.lane_tier(lane, code) if code else fifo]
            args += [lane, budget.interval_ms, budget.burst, code]
        return self.guard.wrap(keys, args, SCRIPT, self.guard.new_call_id())

    @staticmethod
    def replay_only(call: tuple[list[str], list[Any]]) -> tuple[list[str], list[Any]]:
        """A call sent again that only asks for its recorded reply: it runs nothing if
        it never ran (a call id starting with ``?``, lib_guard.lua)."""
        keys, args = call
        args = list(args)
        args[-CALL_ID_FROM_END] = "?" + str(args[-CALL_ID_FROM_END])
        return keys, args

    async def once(self, build: Callable[[], tuple[list[str], list[Any]]]) -> ClaimReply:
        """Send the pending claim again, or else the one ``build`` makes; learn the
        lanes' tiers the reply names."""
        if self.pending is None:
            self.pending = build()
        keys, args = self.pending
        out = self.guard.seen(await self.script(keys=keys, args=args))
        self.pending = None
        reply = ClaimReply.parse(out)
        self.tiers.learn_all(reply.tiers)
        return reply

    async def resolve(self) -> list[tuple[int, Envelope]]:
        """The claims of the pending claim (recorded reply), none if it never ran."""
        if self.pending is None:
            return []
        keys, args = self.replay_only(self.pending)
        out = self.guard.seen(await self.script(keys=keys, args=args))
        self.pending = None
        if not out:
            return []
        return ClaimReply.parse(out).claims
