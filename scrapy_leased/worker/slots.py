"""Download slots: which Scrapy download slot a claim goes to, how much room it has for
this worker's requests, when it has room again, and (throttled slots, _claimsize.py) the
claims given back to the fleet after waiting too long for one.

A slot is given no more of this worker's requests than it transfers at once (its
``concurrency``: ``CONCURRENT_REQUESTS_PER_DOMAIN`` or ``_PER_IP``, ``DOWNLOAD_SLOTS``),
counted from the hand-out to the engine until the request leaves the downloader. In
asyncio mode Scrapy's downloader starts every request queued in a slot as soon as one
transfer ends (``_process_queue`` counts a transfer only once its task runs), so a slot
whose queue is fed in bursts transfers up to ``CONCURRENT_REQUESTS`` at once, and the
HTTP pool, which keeps ``CONCURRENT_REQUESTS_PER_DOMAIN`` idle connections per host,
closes the extra ones when the burst ends and opens new ones at the next: a worker fed
by claims (which come in batches) opened 5-10 times the connections of plain Scrapy on
a fast site. The requests held back wait in the claim book instead of the slot's queue
(they count as unstarted claims, as those in the queue did)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from redis.exceptions import RedisError
from scrapy import Request, Spider

from .._compat import slot_clock
from ..frontier import RUNNING
from ._claimsize import GIVE_BACK_SECONDS, slot_quota, slot_room_in

if TYPE_CHECKING:
    from ._claimbook import Claim
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)

#: While a throttled slot's next start is due, the engine is woken this often (at most).
SLOT_POLL_SECONDS = 0.1
#: Lanes whose download slot this worker remembers (lane -> slot key), at most.
LANE_SLOTS_MAX = 4096


class Slots:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker
        # The slot key of each lane claimed from, the requests handed to the engine that
        # have not reached their slot yet (request -> slot key), the timer that wakes the
        # engine when a full slot may start its next request, the claims being given
        # back (released when closing)
        self.lane_slot: dict[str, str] = {}
        self.approaching: dict[Request, str] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.giving: list[tuple[int, str]] = []
        # Requests handed to the engine whose download is not over (request -> slot
        # key), and their count per slot
        self.downloading: dict[Request, str] = {}
        self.in_slot: Counter[str] = Counter()
        # slots found full when a claim of theirs was to start: the engine is woken
        # when one of their requests leaves
        self.refused: set[str] = set()
        # (slot key, setting) -> what a slot the downloader has not made yet gets
        self.new_slot: dict[tuple[str, str], float] = {}

    def remember(self, lane: str, key: str | None) -> None:
        """The download slot of ``lane``'s requests is ``key`` (None: not known)."""
        if key is not None and self.lane_slot.get(lane) != key:
            if len(self.lane_slot) >= LANE_SLOTS_MAX:
                self.lane_slot.pop(next(iter(self.lane_slot)))
            self.lane_slot[lane] = key

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def on_reached_downloader(self, request: Request, spider: Spider) -> None:
        self.approaching.pop(request, None)  # in its slot's queue now

    def handed(self, request: Request, key: str | None) -> None:
        """``request`` goes to the engine, for download slot ``key``."""
        if key is not None and request not in self.downloading:
            self.downloading[request] = key
            self.in_slot[key] += 1

    def left(self, request: Request, spider: Spider | None = None) -> None:
        """``request`` left the downloader (``request_left_downloader``), or was fully
        processed without reaching it: its slot has room for one more."""
        key = self.downloading.pop(request, None)
        if key is None:
            return
        n = self.in_slot[key] - 1
        if n > 0:
            self.in_slot[key] = n
        else:
            del self.in_slot[key]
        if key in self.refused:  # a claim waits for this room: hand it out now
            self.refused.discard(key)
            self.w.engine.wake()

    def _setting(self, key: str, name: str, defaults: tuple[str, ...]) -> float:
        """Download slot ``key``'s ``name`` (``concurrency``, ``delay``), or what a new
        slot gets: ``DOWNLOAD_SLOTS``, else the first of the downloader's ``defaults``
        attributes that is set."""
        downloader = self.w.engine.downloader()
        slot = getattr(downloader, "slots", {}).get(key)
        if slot is not None:
            return float(getattr(slot, name, 0) or 0)
        value = self.new_slot.get((key, name))
        if value is None:  # from settings, which do not change while crawling
            default = next((v for a in defaults if (v := getattr(downloader, a, 0))), 0)
            per_slot = getattr(downloader, "per_slot_settings", None) or {}
            try:
                value = float(per_slot.get(key, {}).get(name, default) or 0)
            except (TypeError, ValueError, AttributeError):
                value = float(default)
            if len(self.new_slot) >= LANE_SLOTS_MAX:
                self.new_slot.pop(next(iter(self.new_slot)))
            self.new_slot[(key, name)] = value
        return value

    def concurrency(self, key: str) -> int:
        """How many requests download slot ``key`` transfers at once (0: no bound)."""
        return int(self._setting(key, "concurrency", ("ip_concurrency", "domain_concurrency")))

    def full(self, key: str) -> bool:
        """Whether download slot ``key`` has as many of this worker's requests as it
        transfers at once."""
        n = self.in_slot.get(key, 0)
        if not n:
            return False
        cap = self.concurrency(key)
        return 0 < cap <= n

    def key(self, request: Request) -> str | None:
        """The key of the Scrapy download slot ``request`` goes to."""
        get = getattr(self.w.engine.downloader(), "get_slot_key", None)
        if get is None:
            return None
        try:
            return str(get(request))
        except Exception:  # a project's downloader: no slot to look at
            return None

    def delay(self, key: str) -> float:
        """The delay of download slot ``key`` (AutoThrottle changes it), or the delay a
        new one gets (DOWNLOAD_DELAY, DOWNLOAD_SLOTS, AUTOTHROTTLE_START_DELAY)."""
        return self._setting(key, "delay", ("_delay",))

    def next_start(self, key: str) -> tuple[float, float]:
        """(delay, wait) of download slot ``key``: its delay (``delay``) and the
        seconds until it may start its next request (<= 0: now; a slot Scrapy has not
        made yet starts its first request at once)."""
        delay = self.delay(key)
        slot = getattr(self.w.engine.downloader(), "slots", {}).get(key)
        if slot is None or delay <= 0:
            return delay, 0.0
        return delay, float(getattr(slot, "lastseen", 0) or 0) + delay - slot_clock()

    def pending(self, key: str) -> tuple[int | None, int, float, float]:
        """(quota, pending, delay, wait) of download slot ``key``: how many requests it
        starts within SOON_SECONDS (None: no delay, no bound; 0 while its next start is
        further away), how many of this worker's wait to start in it (in its queue, or
        handed to the engine and not there yet), and ``next_start``."""
        delay, wait = self.next_start(key)
        quota = slot_quota(delay, wait)
        if quota is None:
            return None, 0, delay, wait
        slot = getattr(self.w.engine.downloader(), "slots", {}).get(key)
        queued = len(getattr(slot, "queue", ())) if slot is not None else 0
        pending = queued + sum(1 for k in self.approaching.values() if k == key)
        return quota, pending, delay, wait

    def startable(self, claim: Claim) -> bool:
        """Whether the download slot of ``claim`` has room for it now (and, with the
        shared AutoThrottle, the fleet's delay for a slot not open yet is in)."""
        if claim.slot is None:
            return True
        if self.full(claim.slot):
            self.refused.add(claim.slot)
            return False
        throttle = self.w.throttle
        if throttle is None:
            if not self.delay(claim.slot):
                return True  # no delay: a slot with room starts it at once
        elif not throttle.ready(claim.slot):
            return False
        quota, pending, _, _ = self.pending(claim.slot)
        return quota is None or pending < quota

    def wait(self, keys: set[str]) -> float | None:
        """Seconds until one of these throttled download slots has room for one more
        request of this worker (``slot_room_in``; then polled every SLOT_POLL_SECONDS
        at most); None: none is known."""
        best: float | None = None
        for key in keys:
            quota, pending, delay, wait = self.pending(key)
            if quota is None:
                continue
            room_in = slot_room_in(delay, wait, pending)
            if room_in <= 0:  # due (a randomized delay may start it later): poll
                room_in = min(SLOT_POLL_SECONDS, delay / 4)
            best = room_in if best is None else min(best, room_in)
        return None if best is None else max(0.01, best)

    def arm_timer(self, keys: set[str]) -> None:
        if self.timer is not None or self.w._closing:
            return
        wait = self.wait(keys)
        if wait is not None:
            self.timer = asyncio.get_running_loop().call_later(wait, self.freed)

    def freed(self) -> None:
        self.timer = None
        self.w.engine.wake()
        if self.w.kick is not None:
            self.w.kick.set()

    async def give_back(self) -> None:
        """Release the ready claims that waited more than GIVE_BACK_SECONDS for a
        download slot with no room for them: the other workers take them."""
        if not self.w.book.ready or self.w.control.state != RUNNING or self.w.frontier is None:
            return
        now = time.monotonic()
        room: dict[str, int | None] = {}
        stale: set[int] = set()
        for _, claim in self.w.book.ready:
            key = claim.slot
            if key is None:
                continue
            if key not in room:
                quota, pending, _, _ = self.pending(key)
                room[key] = None if quota is None else quota - pending
            left = room[key]
            if left is None:
                continue
            if left > 0:
                room[key] = left - 1  # handed out next
            elif now - claim.since > GIVE_BACK_SECONDS:
                stale.add(claim.token)
        if not stale:
            return
        taken = self.w.book.take_back(stale)
        self.giving = [(claim.token, claim.lane) for _, claim in taken]
        try:
            released = await self.w.frontier.release(self.w.worker_id, self.giving, leave=False)
        except (RedisError, OSError) as exc:
            # held again; if the release did run, the next renewal finds them lost and
            # drops them (they were never started)
            self.w.book.put_back(taken)
            self.w.warn("give_back", "Cannot give back claims to Redis, retrying: %s", exc)
            return
        finally:
            self.giving = []
        self.w.warn.clear("give_back")
        self.w.stats.inc_value("leased/given_back", released)
        logger.debug("Gave back %(n)d claims that waited for a throttled download slot "
                     "(DOWNLOAD_DELAY, AutoThrottle)", {"n": released})

    def holding(self) -> tuple[int, float, float]:
        """Claims this worker holds and has not started (claimed, or waiting in a
        download slot's queue): how many, the longest any has waited (seconds), the
        largest delay of their download slots."""
        now = time.monotonic()
        n, oldest, delay = 0, 0.0, 0.0
        for _, claim in [*self.w.book.ready, *self.w.book.suspects]:
            n += 1
            oldest = max(oldest, now - claim.since)
            if claim.slot is not None:
                delay = max(delay, self.delay(claim.slot))
        handed = self.w.book.handed
        for slot in list(getattr(self.w.engine.downloader(), "slots", {}).values()):
            for request, _ in list(getattr(slot, "queue", ())):
                held = handed.get(request)
                if held is not None:
                    n += 1
                    oldest = max(oldest, now - held.since)
                    delay = max(delay, float(getattr(slot, "delay", 0) or 0))
        return n, oldest, delay

    def holding_info(self) -> tuple[int, float, float]:
        n, oldest, delay = self.holding()
        return n, round(oldest, 1), round(delay, 3)
