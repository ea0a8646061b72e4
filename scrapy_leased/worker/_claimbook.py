"""The claim book: this worker's claims, and where each claimed request is.

A claim (one lease in Redis) is, at any moment, in one of these places: claimed and
not started (``ready``; ``suspects`` when its lease expired before: it runs alone),
continued in this worker (``local``: a retry; ``deferred``: waiting for a rate budget),
handed to the engine (``handed``), or settled and its ack or fail not yet written
(``settling``). The scheduler moves claims between them; the lease keeper renews
``held_tokens``.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from ..frontier import Revisit


class Claim:
    __slots__ = ("token", "rid", "lane", "priority", "outstanding", "failure", "permanent",
                 "lost", "current", "revisit", "since", "slot")

    def __init__(self, token: int, rid: int, lane: str, priority: int = 0,
                 since: float = 0.0, slot: str | None = None) -> None:
        self.token = token
        self.since = since  # time.monotonic() of its claim
        self.slot = slot  # the key of the Scrapy download slot its request goes to
        self.rid = rid
        self.lane = lane
        self.priority = priority  # the claimed request's (its tier, if it is requeued)
        self.revisit: Revisit | None = None  # queued again this long after its ack
        self.outstanding = 1  # request objects of this claim not yet finished by Scrapy
        self.failure: str | None = None
        self.permanent = False
        self.lost = False
        self.current: Request | None = None  # the request of it handed to the engine


class ClaimBook:
    def __init__(self) -> None:
        self.claims: dict[int, Claim] = {}
        self.ready: deque[tuple[Request, Claim]] = deque()  # claimed, not yet started
        self.local: deque[tuple[Request, Claim]] = deque()  # retries, redirects
        # Continuations that must wait (no rate budget yet): (loop time, n, request, claim)
        self.deferred: list[tuple[float, int, Request, Claim]] = []
        self._deferred_n = 0
        # Requests whose lease expired before (their worker died holding them) run
        # alone, so a request that crashes its worker is the only one charged for it.
        self.suspects: deque[tuple[Request, Claim]] = deque()
        self.isolated: Claim | None = None
        self.handed: dict[Request, Claim] = {}  # handed to the engine, not finished
        self.settling: set[int] = set()  # tokens settled, their ack or fail not written

    def busy(self) -> int:
        """Requests of claims this worker holds that are not settled."""
        return (len(self.handed) + len(self.ready) + len(self.local) + len(self.suspects)
                + len(self.deferred))

    def waiting(self) -> int:
        """Requests claimed (or continuing a claim) not yet handed to the engine; the
        suspects apart."""
        return len(self.ready) + len(self.local) + len(self.deferred)

    def has_waiting(self) -> bool:
        """Requests to hand to the engine now or later."""
        return bool(self.ready or self.local or self.suspects or self.deferred)

    def add(self, request: Request, claim: Claim, suspect: bool) -> None:
        """A new claim from Redis."""
        self.claims[claim.token] = claim
        (self.suspects if suspect else self.ready).append((request, claim))

    def defer(self, request: Request, claim: Claim, at: float) -> None:
        """Hand this continuation out at loop time ``at``, not before."""
        self._deferred_n += 1
        heapq.heappush(self.deferred, (at, self._deferred_n, request, claim))

    def next_due(self) -> float | None:
        """The loop time of the first deferred request, None when none waits."""
        return self.deferred[0][0] if self.deferred else None

    def take(self, now: float, fresh: bool = True,
             startable: Callable[[Claim], bool] | None = None
             ) -> tuple[Request, Claim, str] | None:
        """The next request to hand to the engine, and where it was ("memory",
        "redis"), or None: none now. Without ``fresh`` (the fleet is paused), only the
        continuations of claims already started: no claim is started. ``startable``:
        whether a claim's download slot has room for it now (_claimsize.py: throttled
        slots); the first ready claim that has is taken."""
        where = "memory"
        if self.deferred and self.deferred[0][0] <= now:
            _, _, request, claim = heapq.heappop(self.deferred)
        elif self.local:
            request, claim = self.local.popleft()
        elif self.isolated is not None or not fresh:
            return None
        elif self.ready:
            if startable is None or startable(self.ready[0][1]):
                request, claim = self.ready.popleft()
            else:
                at = _first_startable(self.ready, startable)
                if at is None:
                    return None  # every slot of the ready claims is full
                request, claim = self.ready[at]
                del self.ready[at]
            where = "redis"
        elif self.suspects:
            if self.handed:
                return None  # let the requests in flight finish first
            request, claim = self.suspects.popleft()
            self.isolated = claim
            where = "redis"
        else:
            return None
        self.handed[request] = claim
        claim.current = request
        return request, claim, where

    def started_busy(self) -> bool:
        """Claims started (handed to the engine) that are not settled yet, or their
        continuations (a retry, a request waiting for its rate budget)."""
        return bool(self.handed or self.local or self.deferred)

    def wants_more(self) -> bool:
        """Nothing to hand out and no suspect running alone: more claims are wanted."""
        return not (self.local or self.ready or self.suspects) and self.isolated is None

    def finished(self, request: Request) -> Claim | None:
        """Scrapy is done with a request; its claim when that was its last one."""
        claim = self.handed.pop(request, None)
        if claim is None:
            return None
        if claim.current is request:
            claim.current = None
        claim.outstanding -= 1
        return claim if claim.outstanding == 0 else None

    def settle(self, claim: Claim) -> bool:
        """The claim is done here (its ack or fail is written next); True when it was
        the suspect running alone."""
        self.claims.pop(claim.token, None)
        self.settling.add(claim.token)  # renewed until its ack or fail is written
        if claim is self.isolated:
            self.isolated = None
            return True
        return False

    def written(self, tokens: list[int]) -> None:
        """Their ack or fail is in Redis."""
        self.settling.difference_update(tokens)

    def held_tokens(self) -> list[int]:
        """Tokens whose lease must be renewed: claims in progress, and those settled
        whose ack (or fail) is not written yet (Redis refusing writes)."""
        return [*self.claims, *self.settling]

    def waiting_lanes(self) -> set[str]:
        """Lanes this worker holds deferred requests of (their budget is spoken for)."""
        return {claim.lane for _, _, _, claim in self.deferred}

    def mark_failed(self, token: int | None, reason: str, permanent: bool) -> None:
        claim = self.claims.get(token) if token is not None else None
        if claim is not None and claim.failure is None:
            claim.failure = reason
            claim.permanent = permanent

    def drop_unstarted(self, lost: set[int]) -> int:
        """Drop claims whose lease is gone and that were never handed to the engine;
        returns how many."""
        dropped = 0
        for queue in (self.ready, self.suspects):
            keep = [(r, c) for r, c in queue if c.token not in lost]
            for _, claim in queue:
                if claim.token in lost:
                    self.claims.pop(claim.token, None)
                    dropped += 1
            queue.clear()
            queue.extend(keep)
        return dropped

    def take_back(self, tokens: set[int]) -> list[tuple[Request, Claim]]:
        """Remove the ready claims of ``tokens`` (to give them back); returns them."""
        out = [(r, c) for r, c in self.ready if c.token in tokens]
        if out:
            keep = [(r, c) for r, c in self.ready if c.token not in tokens]
            self.ready.clear()
            self.ready.extend(keep)
            for _, claim in out:
                self.claims.pop(claim.token, None)
        return out

    def put_back(self, taken: list[tuple[Request, Claim]]) -> None:
        """Ready claims ``take_back`` removed, whose release failed: held again."""
        for request, claim in reversed(taken):
            self.claims[claim.token] = claim
            self.ready.appendleft((request, claim))

    def unstarted(self) -> list[tuple[int, str]]:
        """(token, lane) of every claim still held: to release when closing."""
        return [(c.token, c.lane) for c in self.claims.values()]

    def clear(self) -> None:
        self.claims.clear()
        self.ready.clear()
        self.local.clear()
        self.deferred.clear()
        self.suspects.clear()


def _first_startable(ready: deque[tuple[Request, Claim]],
                     startable: Callable[[Claim], bool]) -> int | None:
    """The index of the first ready claim ``startable`` lets start, None: none. A
    slot's answer is asked once: claims of one download slot get the same."""
    refused: set[str | None] = set()
    for i, (_, claim) in enumerate(ready):
        if claim.slot in refused:
            continue
        if startable(claim):
            return i
        refused.add(claim.slot)
    return None
