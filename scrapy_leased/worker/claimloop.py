"""The claim loop: one round at a time, it sizes a claim to the room this worker has
(_claimsize.py), names the lanes to claim from, claims from Redis (the commit waiting
rides along), takes the claims into the book, drains the feed when the reply says it
has entries, and sees when the crawl is drained fleet-wide (nothing queued, no live
lease anywhere, nothing this worker wrote since). Between rounds it waits for a kick
(new work, a settled claim, room freed), the idle poll, or the time a lane's budget or
a throttled slot lets a claim through."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._supervise import PartFailed
from ..frontier import RUNNING, Budget, ClaimResult, Failure, Revisit
from ..frontier.scripts import WrongKeyType, safe_text
from ..meta import META_CLAIM, META_FREE_SINCE, revisit_ms
from ._claimbook import Claim
from ._leasekeeper import running

if TYPE_CHECKING:
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)

RETRY_CAP_SECONDS = 2.0
FIRST_RETRY_SECONDS = 0.05


@dataclass(eq=False)
class ClaimLoop:
    w: LeasedScheduler
    lanes: list[str] = field(default_factory=list)  # lanes the last claim reported ready
    # The last claim found nothing: wait for the idle poll (or for new work this
    # worker wrote) instead of asking Redis again each time the engine looks.
    starved: bool = False
    drained_seen_at: int = -1  # writer generation at which the frontier looked drained
    # Rounds started and finished, for start() pacing (start_request_sent)
    rounds_started: int = 0
    rounds_done: int = 0
    fresh_round: int = 0  # the first round whose "drained" is to be believed
    round_done: asyncio.Event | None = None
    # The claims of the claim reply being taken (absorb): released when closing if
    # an error left them out of the book
    absorbing: list[tuple[int, Any]] = field(default_factory=list)
    retry_delay: float = FIRST_RETRY_SECONDS

    async def run(self) -> None:
        assert self.w.kick is not None
        while running(lambda: self.w._closing):
            self.rounds_started += 1
            wait = await self.round(self.rounds_started)
            if wait is not None:
                self.w.kick.clear()
                await self.w.kick.wait(wait)

    async def round(self, round_: int) -> float | None:
        """One round; None: the next one at once, else the most to wait for a kick."""
        w = self.w
        assert w.writer is not None and w.kick is not None
        await w.slots.give_back()
        want = self.capacity()
        wait = w.config.idle_poll
        asked, cap, full = self.candidates(max(want, 0))
        if cap is not None:
            want = min(want, cap)
        if full and not asked and w.control.state == RUNNING:
            # every ready lane's throttled download slot holds what it starts soon:
            # claim when one of them starts its next request
            slot_wait = w.slots.wait(full)
            if slot_wait is not None:
                wait = min(wait, slot_wait)
        elif w.sizer.worth_claiming(want, w.book.waiting()) \
                or w.control.state != RUNNING:  # paused: ask until resumed
            generation = w.writer.generation
            w.writer.flush()  # the commit waiting rides along with the claim
            want = max(want, 0)
            try:
                result, sent = await self.claim(want, asked)
            except (RedisError, OSError) as exc:
                self.round_finished()
                await self.claim_failed(exc)
                return None
            if result.control != RUNNING:  # paused or stopping: nothing claimed
                self.starved = True
                self.round_finished()
                return wait
            self.lanes = result.ready_lanes
            self.absorb(result, sent)
            self.absorbing = []
            # stale: lanes with requests were left for a tier this worker had not
            # learnt (lua/claim.lua); the reply named it: claim again at once
            self.starved = not result.claims and not result.stale
            if result.feed and await self.drain_feed():
                self.starved = False
                w.engine.wake()
                self.round_finished()
                return None  # claim what was just queued
            if result.claims:
                w.engine.wake()
                if len(result.claims) == want or result.stale:
                    self.round_finished()
                    return None
            elif result.stale:
                self.round_finished()
                return None
            elif self.drained(result, generation, round_):
                self.drained_seen_at = generation
                w.engine.wake()  # lets the engine notice it is idle and ask to close
            elif result.next_ms > result.now_ms:  # a lane's budget lets a claim through then
                wait = min(wait, (result.next_ms - result.now_ms) / 1000)
        self.round_finished()
        due = w.book.next_due()
        if due is not None:  # its lane is skipped until it is out: claim again then
            wait = min(wait, max(0.001, due - asyncio.get_running_loop().time()))
        return wait

    def drained(self, result: ClaimResult, generation: int, round_: int) -> bool:
        """Whether ``result`` shows the crawl drained fleet-wide: nothing queued or due,
        no live lease, nothing in the feed, nothing this worker wrote since the claim
        was sent (writer ``generation``), in a round that started after the seeder's
        requests were known to be in Redis (``fresh_round``)."""
        assert self.w.writer is not None
        return result.next_ms < 0 and result.leases == 0 and not result.feed \
            and not self.w.writer.pending \
            and generation == self.w.writer.generation \
            and round_ >= self.fresh_round

    async def claim(self, want: int, asked: list[tuple[str, Budget]]
                    ) -> tuple[ClaimResult, float]:
        """Claim ``want`` requests from the lanes ``asked`` (and from the ready lanes the
        reply names, when it got fewer); the reply, and when the call was sent."""
        w = self.w
        assert w.frontier is not None
        sent = time.monotonic()
        result = await w.frontier.claim(want, w.worker_id, asked)
        self.absorbing = result.claims
        w.sizer.claimed(time.monotonic() - sent)
        if len(result.claims) < want and self.more_candidates(result, asked):
            # ready lanes this claim did not name (others emptied some)
            self.lanes = result.ready_lanes
            result = await self.claim_more(result, want, asked)
            self.absorbing = result.claims
        self.retry_delay = FIRST_RETRY_SECONDS
        w.warn.clear("claim")
        return result, sent

    async def claim_failed(self, exc: RedisError | OSError) -> None:
        """A claim call failed: a control key of the wrong type is moved aside (and the
        claim sent again at once); else warn, and wait before the next round."""
        assert self.w.frontier is not None
        if isinstance(exc, WrongKeyType) and exc.key == self.w.frontier.keys.control:
            with contextlib.suppress(RedisError, OSError):
                if await self.w.control.set_aside():
                    return  # claim again at once: the claim changed nothing
        self.w.warn("claim", "Cannot claim from Redis, retrying: %s", exc)
        await asyncio.sleep(self.retry_delay)
        self.retry_delay = min(self.retry_delay * 2, RETRY_CAP_SECONDS)

    def capacity(self) -> int:
        if self.w.engine.closing():
            return 0  # the engine is shutting down: claim nothing new
        if self.w.failed_task is not None:
            return 0  # stopping on a bug: claim nothing new
        if self.w.book.suspects or self.w.book.isolated is not None:
            return 0  # a suspect runs alone: claim nothing until it is settled
        if self.w.engine.scraper_backs_out():
            return 0  # the engine takes nothing while responses pile up in the scraper
        book = self.w.book
        unstarted = book.waiting()
        return self.w.sizer.capacity(self.w.engine.downloading(len(book.handed)), unstarted,
                                     len(book.handed) + unstarted + len(book.suspects))

    def want_claims(self) -> None:
        if self.w.kick is not None and not self.starved and self.capacity() > 0:
            self.w.kick.set()

    def round_finished(self) -> None:
        self.rounds_done += 1
        if self.round_done is not None:
            done, self.round_done = self.round_done, asyncio.Event()
            done.set()

    async def next_round(self) -> None:
        """Wait for a claim loop round that starts from now on to be done."""
        assert self.w.kick is not None
        target = self.rounds_started + 1
        while self.rounds_done < target and not self.w._closing:
            event = self.round_done
            assert event is not None
            self.w.kick.set()
            await event.wait()

    async def drain_feed(self) -> bool:
        """Queue a batch of the feed's entries (feed/drain.py); whether any were taken."""
        assert self.w.feed is not None
        try:
            taken = await self.w.feed.drain_once()
        except (RedisError, OSError) as exc:
            self.w.warn("feed", "Cannot take entries off the feed, retrying: %s", exc)
            return False
        except Exception as exc:
            # a bug: it ends the claim loop, which stops the worker, reported as one in
            # the feed drain (_supervise.py); the batch it took goes back to the feed
            # after its lease
            raise PartFailed("the feed drain", exc) from exc
        self.w.warn.clear("feed")
        return taken > 0

    def absorb(self, result: ClaimResult, sent: float) -> None:
        """Take the claims of ``result``, from a claim call sent at ``sent``
        (time.monotonic()). Their ``META_FREE_SINCE`` is ``sent``, not the reply's
        arrival: a penalty this worker hears of after ``sent`` may have been set before
        the claim ran in Redis, so those requests are checked at download time
        (ratelimit/watch.py)."""
        w = self.w
        assert w.spider is not None and w.writer is not None
        claimed_at = sent
        for token, env in result.claims:
            claim = Claim(token, env.rid, env.lane, env.priority, since=time.monotonic())
            try:
                request = w.codec.decode(env.payload, w.spider, env.priority)
                after_ms = revisit_ms(request, w.config.revisit_after_ms)
                if after_ms > 0:
                    claim.revisit = Revisit(after_ms, env.priority, env.lane, env.payload)
            except Exception as exc:  # whatever a stored payload makes decoding raise
                why = str(exc) if isinstance(exc, ValueError) \
                    else f"{type(exc).__name__}: {exc}"
                w.stats.inc_value("leased/undecodable")
                logger.error("Dead-lettering stored request %(rid)d: %(error)s",
                             {"rid": env.rid, "error": safe_text(why)})
                w.book.settling.add(token)
                w.writer.add_fail(Failure(token, why, permanent=True, lane=env.lane,
                                          rid=env.rid, priority=env.priority))
                continue
            request.meta[META_CLAIM] = token
            claim.slot = w.slots.key(request)
            w.slots.remember(env.lane, claim.slot)
            if env.lane in result.free_lanes:
                request.meta[META_FREE_SINCE] = claimed_at
            w.book.add(request, claim, suspect=bool(env.expiries))
            w.tally.add("leased/claimed")
            if env.attempts:
                w.tally.add("leased/claimed_retry")

    async def claim_more(self, first: ClaimResult, want: int,
                         first_asked: list[tuple[str, Budget]]) -> ClaimResult:
        """A second claim, for what ``first`` did not get, from the lanes it reported
        ready; the claims of both in the result (``first`` alone when the second call
        fails: it is sent again by the next claim, Frontier._pending_claim). It continues
        ``first``: a request whose lease expired before is not claimed beside first's
        claims (claim.lua keeps those alone)."""
        assert self.w.frontier is not None
        rest = want - len(first.claims)
        # not the lanes ``first`` named: its claims are not in the book yet
        asked, cap, _ = self.candidates(rest, frozenset(lane for lane, _ in first_asked))
        if cap is not None:
            rest = min(rest, cap)
        if rest <= 0 or not asked:
            return first
        try:
            more = await self.w.frontier.claim(rest, self.w.worker_id, asked,
                                               continues=bool(first.claims))
        except (RedisError, OSError):
            if not first.claims:
                raise
            return first
        more.claims = first.claims + more.claims
        more.free_lanes |= first.free_lanes
        return more

    def candidates(self, want: int, exclude: frozenset[str] = frozenset()
                   ) -> tuple[list[tuple[str, Budget]], int | None, set[str]]:
        """Lanes to claim ``want`` requests from: those last reported ready (ready
        longest first), except lanes this worker already holds waiting requests for
        (their budget is spoken for) and lanes whose throttled download slot holds what
        it starts soon already (_claimsize.py); as many as a claim of that size needs
        (every lane named costs Redis time). Also the most to claim from them (None: no
        bound; the room of their throttled slots otherwise) and the keys of the full
        slots whose lanes were left out."""
        waiting = self.w.book.waiting_lanes()
        limit = self.w.sizer.candidates(want)
        rooms: dict[str, int | None] = {}
        ready_by_slot: Counter[str] | None = None
        picked: list[str] = []
        full: set[str] = set()
        cap: int | None = 0
        for lane in self.lanes:
            if lane in waiting or lane in exclude:
                continue
            key = self.w.slots.lane_slot.get(lane, lane)
            if key not in rooms:
                quota, pending, _, _ = self.w.slots.pending(key)
                if quota is None:
                    rooms[key] = None
                else:
                    if ready_by_slot is None:
                        ready_by_slot = Counter(c.slot for _, c in self.w.book.ready if c.slot)
                    rooms[key] = max(0, quota - pending - ready_by_slot[key])
            room = rooms[key]
            if room == 0:
                full.add(key)
                continue
            if room is None:
                cap = None
            picked.append(lane)
            if len(picked) >= limit:
                break
        if not picked:
            cap = None  # nothing named: the claim reports the ready lanes
        elif cap is not None:  # every lane named is throttled: their slots' room
            slots = {self.w.slots.lane_slot.get(lane, lane) for lane in picked}
            cap = sum(rooms[key] or 0 for key in slots)
        return [(lane, self.w.budgets.for_lane(lane)) for lane in picked], cap, full

    def more_candidates(self, result: ClaimResult, asked: list[tuple[str, Budget]]) -> bool:
        """Whether ``result`` reports ready lanes that its claim did not name."""
        named = {lane for lane, _ in asked}
        waiting = self.w.book.waiting_lanes()
        return any(lane not in named and lane not in waiting for lane in result.ready_lanes)
