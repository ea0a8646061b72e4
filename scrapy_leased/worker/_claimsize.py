"""How many requests a worker claims: as many as Scrapy's downloader will start soon.

Scrapy counts a request against ``CONCURRENT_REQUESTS`` while it is in the downloader
(``Downloader.active``: from ``fetch`` until the download ends); the engine asks the
scheduler for more whenever the downloader has room. A worker therefore claims up to

    CONCURRENT_REQUESTS + margin - (requests in the downloader) - (claims not yet started)

A claim whose download is over no longer counts (its lease is still held and renewed
until its callback, items and children are done), so a latency-bound crawl keeps as
many downloads in flight as plain Scrapy. The responses being processed are bounded by
Scrapy (the engine stops pulling requests while the scraper holds more than
``SCRAPER_SLOT_MAX_ACTIVE_SIZE``) and, here, by ``held_bound``: at most
``2 * CONCURRENT_REQUESTS + margin`` claims held in all.

The margin is what keeps the downloader fed while a claim is on its way: the requests
the engine takes during one claim round trip, ``x = claim latency / hand-out interval``
(both measured by the worker, as moving averages), rounded up and at most
``max(2, CONCURRENT_REQUESTS // 4)``. Where claiming on demand costs less than 1 % of the
downloads' time (``x < CONCURRENT_REQUESTS / 100``: slow pages, or nothing measured yet)
the margin is 0, so a worker never holds a claim it cannot start soon (a lease nobody
else can take). ``LEASED_PREFETCH``, when set, replaces it.

Claims go in batches: a worker claims when it has room for ``batch`` requests
(``max(1, CONCURRENT_REQUESTS // 2)``, 8 at Scrapy's default 16), or when nothing
claimed waits to be started; the room counts ``batch - 1`` more so that a batch fits
while the downloader is full. A worker thus holds at most ``margin + batch - 1``
claims unstarted (11 at the default 16) and about half as many on average, and one claim
call (with the commit that rides along, frontier/writer.py) serves several pages: fewer
calls to Redis per page for the fleet. Half of ``CONCURRENT_REQUESTS`` rather than a
quarter: on the CPU-bound benchmark site (2 workers, 5,000 pages) 17 % fewer script calls
and 15 % more pages per Redis CPU-second, the same pages/s on the 100 ms site with 1, 2
and 4 workers; a whole ``CONCURRENT_REQUESTS`` took half the calls but crawled the
CPU-bound site 10 % slower (medians of 3-5 interleaved runs, 2026-12-06). With
``LEASED_PREFETCH`` set, ``batch`` is 1 (claims as before: the set prefetch is the whole
margin).

Throttled download slots. A Scrapy download slot with a delay (``DOWNLOAD_DELAY``,
``DOWNLOAD_SLOTS``, AutoThrottle's ``slot.delay``) starts one request per delay, however
many wait in it; a request waiting there is a claim no other worker can take. So for a
lane whose slot has a delay, a worker holds (claimed, not started: waiting in the slot
or in the claim book) at most what the slot starts within ``SOON_SECONDS`` from now,
counted from its next start (``wait`` seconds away: its last start plus its delay):
none while that is further than ``SOON_SECONDS``, else ``1 + (SOON_SECONDS - wait) //
delay`` (``slot_quota``). It claims no more for the lane, and hands the engine a request
of it only while the slot holds fewer than that; it claims again when the slot has room
(``slot_room_in``). So a worker whose slot waits long (AutoThrottle's 5 s start delay)
holds nothing that another worker would start sooner. A claim that still waits after
``GIVE_BACK_SECONDS`` for a slot that has no room (the delay grew, or a claim took more
of the lane than asked) is given back (released to the front of its lane) for the other
workers. A lane's rate budget (``LEASED_RATE``) already paces its claims (lua/claim.lua
claims at the budget's rate). The delays themselves are the workers' own; with
AutoThrottle, the ones it learns are shared (_throttleshare.py).

Each claim names at most ``batch + CANDIDATE_SLACK`` candidate lanes (the ones ready
longest first, as the last claim reported them): what a claim of that size needs, a few
more for lanes another worker emptied meanwhile; every lane passed costs Redis time in
the claim (lua/claim.lua reads each one).
"""

from __future__ import annotations

import math
import time

#: Weight of a new observation in the moving averages.
ALPHA = 0.1
#: Candidate lanes passed to a claim beyond the number of requests it asks for.
CANDIDATE_SLACK = 4
#: A throttled download slot is given claims for what it starts within this many seconds.
SOON_SECONDS = 1.0
#: A claim not handed out this long after its claim, for a slot with no room, goes back.
GIVE_BACK_SECONDS = 2.0


def slot_quota(delay: float, wait: float = 0.0) -> int | None:
    """How many requests a download slot with this ``delay`` (seconds between two
    starts) starts within ``SOON_SECONDS`` when its next start is ``wait`` seconds
    away: what a worker holds unstarted for it at most (0 while that next start is
    further away). None without a delay: the slot starts what it gets
    (CONCURRENT_REQUESTS bounds it)."""
    if not delay or delay <= 0:
        return None
    wait = max(0.0, wait)
    if wait > SOON_SECONDS:
        return 0
    return 1 + int((SOON_SECONDS - wait) // delay)


def slot_room_in(delay: float, wait: float, pending: int) -> float:
    """Seconds until a slot (``delay``, next start ``wait`` seconds away, ``pending``
    requests of this worker waiting in it) has room for one more under
    ``slot_quota``: when the start that request would get is ``SOON_SECONDS`` away
    (<= 0: room now)."""
    return max(0.0, wait) + pending * delay - SOON_SECONDS


class ClaimSizer:
    """The margin of claims beyond what the downloader runs, from what the worker
    measures. ``fixed`` (``LEASED_PREFETCH``) replaces the measured margin."""

    def __init__(self, concurrency: int, fixed: int | None = None) -> None:
        self.concurrency = concurrency
        self.fixed = fixed
        self.upper = max(2, concurrency // 4)
        #: The smallest claim worth a call while claims wait unstarted (see above).
        self.batch = 1 if fixed is not None else max(1, concurrency // 2)
        self._claim_s: float | None = None  # claim round trip, seconds
        self._handout_s: float | None = None  # time between two hand-outs, seconds
        self._last_handout: float | None = None

    def claimed(self, seconds: float) -> None:
        """A claim round trip that took ``seconds``."""
        self._claim_s = seconds if self._claim_s is None else (
            self._claim_s + ALPHA * (seconds - self._claim_s))

    def handed_out(self, now: float | None = None) -> None:
        """The engine took a claimed request."""
        now = time.monotonic() if now is None else now
        if self._last_handout is not None:
            gap = now - self._last_handout
            self._handout_s = gap if self._handout_s is None else (
                self._handout_s + ALPHA * (gap - self._handout_s))
        self._last_handout = now

    @property
    def margin(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self._claim_s is None or not self._handout_s:
            return 0
        x = self._claim_s / self._handout_s  # hand-outs during one claim round trip
        if x * 100 < self.concurrency:  # a slot idles x / C of each page's time: < 1 %
            return 0
        return max(1, min(self.upper, math.ceil(x)))

    def capacity(self, downloading: int, unstarted: int, held: int) -> int:
        """Requests to claim now: ``downloading`` in Scrapy's downloader, ``unstarted``
        claimed and not yet handed to the engine, ``held`` all claims of the worker
        that are not finished (handed ones included)."""
        margin = self.margin
        fill = self.concurrency + margin + self.batch - 1 - downloading - unstarted
        return min(fill, self.held_bound(margin) - held)

    def worth_claiming(self, capacity: int, unstarted: int) -> bool:
        """Whether to claim ``capacity`` requests now: a whole batch, or anything when
        nothing claimed waits to be started (the downloader would idle)."""
        return capacity > 0 and (capacity >= self.batch or unstarted == 0)

    def candidates(self, want: int) -> int:
        """How many candidate lanes a claim of ``want`` requests names."""
        return max(want, 1) + CANDIDATE_SLACK

    def held_bound(self, margin: int | None = None) -> int:
        """The most claims a worker holds at once."""
        return 2 * self.concurrency + (self.margin if margin is None else margin) \
            + self.batch - 1
