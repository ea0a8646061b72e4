"""AutoThrottle's learning, shared by the fleet (``LEASED_SHARED_AUTOTHROTTLE``).

Each worker runs Scrapy's AutoThrottle on its own download slots. AutoThrottle starts a
slot at ``AUTOTHROTTLE_START_DELAY`` (5 s) and lowers its delay only on a 200 response
(halfway to the latency each time), so a worker that gets few 200s of a host (pages
reached through a redirect, or few pages at all) stays near the start delay while
another worker of the crawl has learnt that the host answers fast. Here a worker shares
what its AutoThrottle learns:

- Written: when a slot's delay moved by more than ``CHANGE`` (a tenth) from what this
  worker last wrote or adopted for it, AutoThrottle changed it (up or down): the new
  delay is written for the crawl (keys.py: ``throttle``; lua/throttle_share.lua). The
  entry of a slot is thus the last delay any worker's AutoThrottle set for it; once no
  worker wrote it for ``MAX_AGE_SECONDS`` it is gone, and a worker using the slot
  writes what it learnt again.
- Adopted: every ``SHARE_SECONDS`` (and with each write) the worker reads the entries of
  the slots it used in the last ``MAX_AGE_SECONDS``; where an entry is lower than the
  slot's delay by more than a tenth, the slot takes it (clamped to AutoThrottle's
  ``DOWNLOAD_DELAY`` .. ``AUTOTHROTTLE_MAX_DELAY``), and so does a slot at the moment a
  request reaches it (before Scrapy computes that request's wait). A delay is never
  raised by the fleet: each worker's AutoThrottle raises its own on slow responses, at
  once. An entry not written for ``MAX_AGE_SECONDS`` is not adopted (Scrapy forgets an
  idle slot's delay after a minute too).

Only ``slot.delay`` is read and set, as AutoThrottle itself does, from the
``request_reached_downloader`` and ``response_downloaded`` signals. A Redis failure
leaves each worker on its own AutoThrottle (a WARNING, once per outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import signals

from ..frontier.scripts import Scripts, as_str, pairs
from ._leasekeeper import Kick, WarnOnce, running

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from ..frontier.keys import CrawlKeys

logger = logging.getLogger(__name__)

#: worker/lua/throttle_share.lua: AutoThrottle's delays
SCRIPTS = Scripts("scrapy_leased.worker", {"throttle_share": ("lib_time",)})
#: A slot's delay is written when it moved by more than this fraction, and adopted when
#: the fleet's is lower by more than it.
CHANGE = 0.1
#: How often a worker reads the fleet's delays of the slots it uses.
SHARE_SECONDS = 0.5
#: An entry not written for this long is not adopted; a slot unused this long is not read.
MAX_AGE_SECONDS = 60.0
#: The most slots one read names (the most recently used).
MAX_SLOTS = 100
RETRY_CAP_SECONDS = 5.0
#: Slot keys remembered as read (``ready``), at most; forgotten all at once beyond.
MAX_READ = 4096


def autothrottle(crawler: Crawler) -> Any:
    """The crawler's AutoThrottle extension (or a subclass), None when it is off."""
    from scrapy.extensions.throttle import AutoThrottle

    extensions = getattr(getattr(crawler, "extensions", None), "middlewares", ())
    return next((ext for ext in extensions if isinstance(ext, AutoThrottle)), None)


class ThrottleShare:
    """Shares the delays AutoThrottle sets for this worker's download slots with the
    other workers of the crawl, and adopts theirs when lower (module docstring)."""

    def __init__(self, crawler: Crawler, client: Any, keys: CrawlKeys, extension: Any,
                 closing: Callable[[], bool], warn: WarnOnce) -> None:
        self.crawler = crawler
        self.client = client
        self.key = keys.throttle
        self.extension = extension
        self.closing = closing
        self.warn = warn
        self.stats = crawler.stats
        self.script = SCRIPTS.register(client, "throttle_share")["throttle_share"]
        self.kick = Kick()
        #: slot key -> the delay this worker last wrote or adopted (or first saw)
        self._known: dict[str, float] = {}
        #: slot key -> the delay to write (an AutoThrottle change not written yet)
        self._dirty: dict[str, float] = {}
        #: slot key -> the fleet's delay, as the last read returned it
        self._fleet: dict[str, float] = {}
        #: slot key -> AutoThrottle changes seen (a read older than one is not adopted)
        self._changes: dict[str, int] = {}
        self._used: dict[str, float] = {}  # slot key -> time.monotonic() of last use
        self._objects: dict[str, Any] = {}  # slot key -> the Scrapy slot it was seen as
        #: slot keys whose delay AutoThrottle changed here, or that adopted the fleet's
        self._learned: set[str] = set()
        #: slot keys a request is about to open: read before it is handed out (``ready``)
        self._wanted: set[str] = set()
        self._read: set[str] = set()  # slot keys read since this worker first wanted them
        #: called when the fleet's delays of wanted slots are in (the scheduler hands out)
        self.on_read: Callable[[], None] | None = None

    def connect(self) -> None:
        sig = self.crawler.signals
        sig.connect(self._on_reached, signals.request_reached_downloader)
        sig.connect(self._on_downloaded, signals.response_downloaded)

    def ready(self, key: str) -> bool:
        """Whether a request for download slot ``key`` may be handed to the engine: the
        slot is open already, or the fleet's delay for it has been read. Scrapy's
        downloader waits the delay a slot has when it starts a request before the next
        one, so a slot's first request is held until the fleet's delay for it is in
        (one read, for every slot wanted meanwhile)."""
        if key in self._read or key in self._slots():
            return True
        if key not in self._wanted:
            self._wanted.add(key)
            self.kick.set()
        return False

    # -- signals (synchronous, in the downloader's own step) -----------------------------

    def _slot(self, request: Request) -> tuple[str | None, Any]:
        key = request.meta.get("download_slot")
        slots = self._slots()
        if key is None or key not in slots:
            return None, None
        return str(key), slots[key]

    def _on_reached(self, request: Request, spider: Spider) -> None:
        key, slot = self._slot(request)
        if key is None:
            return
        self._observe(key, slot)
        self._adopt(key, slot)  # before the downloader computes this request's wait

    def _on_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        key, slot = self._slot(request)
        if key is not None:
            self._observe(key, slot)

    def _observe(self, key: str, slot: Any) -> None:
        """Note the slot's delay: a move of more than CHANGE from what this worker last
        wrote or adopted is AutoThrottle's, to be written."""
        self._used[key] = time.monotonic()
        delay = _delay(slot)
        known = self._known.get(key)
        if known is None or self._objects.get(key) is not slot:
            # a new slot (Scrapy drops one idle for a minute): its start delay, which
            # AutoThrottle has not moved
            self._objects[key] = slot
            self._known[key] = delay
            return
        if abs(delay - known) > CHANGE * known:
            self._known[key] = delay
            self._learned.add(key)
            self._dirty[key] = delay
            self._changes[key] = self._changes.get(key, 0) + 1
            self._fleet.pop(key, None)  # older than this change
            self.kick.set()

    def _adopt(self, key: str, slot: Any) -> None:
        fleet = self._fleet.get(key)
        if fleet is None:
            return
        low, high = self._bounds()
        target = max(low, fleet if high is None else min(fleet, high))
        if target < (1 - CHANGE) * _delay(slot):
            slot.delay = target
            self._known[key] = target
            self._learned.add(key)
            self.stats.inc_value("leased/autothrottle_adopted")

    # -- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        delay = 0.05
        while running(self.closing):
            self.kick.clear()
            try:
                await self._share()
            except (RedisError, OSError) as exc:
                self.warn("throttle", "Cannot share AutoThrottle's delays in Redis, "
                          "retrying: %s", exc)
                self._got(set(self._wanted))  # requests never wait for Redis: start them
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_SECONDS)
                continue
            delay = 0.05
            self.warn.clear("throttle")
            await self.kick.wait(SHARE_SECONDS)

    async def start(self) -> None:
        """Read the fleet's delays of every slot (before the first request): a worker
        joining a crawl starts each slot the fleet knows at the fleet's delay."""
        try:
            for key, delay in (await self._call({}, None))[:MAX_READ]:
                if delay is not None:
                    self._fleet[key] = delay
                    self._read.add(key)
        except (RedisError, OSError) as exc:
            self.warn("throttle", "Cannot share AutoThrottle's delays in Redis, "
                      "retrying: %s", exc)

    async def _call(self, writes: dict[str, float], reads: list[str] | None
                    ) -> list[tuple[str, float | None]]:
        """lua/throttle_share.lua: write ``writes``, read ``reads`` (None: every entry);
        the (slot key, delay or None) read."""
        args: list[Any] = [int(MAX_AGE_SECONDS * 1000), len(writes),
                           -1 if reads is None else len(reads)]
        for key, value in writes.items():
            args += [key, repr(float(value))]
        reply = await self.script(keys=[self.key], args=[*args, *(reads or ())])
        out: list[tuple[str, float | None]] = []
        for key, value in pairs(reply):
            delay: float | None = None
            if value:
                with contextlib.suppress(ValueError):
                    delay = float(as_str(value))
            out.append((as_str(key), delay))
        return out

    async def _share(self) -> None:
        """One write of the changed delays and read of the fleet's, in one call."""
        now = time.monotonic()
        for key, used in list(self._used.items()):
            if now - used > MAX_AGE_SECONDS:  # unused: forgotten, as Scrapy's slot is
                for table in (self._used, self._known, self._fleet, self._changes,
                              self._objects):
                    table.pop(key, None)
                self._learned.discard(key)
                self._read.discard(key)
        slots = self._slots()
        low = self._bounds()[0]
        reads = [key for key in sorted(self._used, key=self._used.__getitem__, reverse=True)
                 if key in slots and (_delay(slots[key]) > low or key in self._learned)]
        wanted = set(self._wanted)
        reads = [*wanted, *(key for key in reads[:MAX_SLOTS] if key not in wanted)]
        writes, self._dirty = self._dirty, {}
        if not writes and not reads:
            return
        changes = {key: self._changes.get(key, 0) for key in reads}
        try:
            reply = await self._call(writes, reads)
        except BaseException:
            for key, value in writes.items():  # written with the next call
                self._dirty.setdefault(key, value)
            raise
        if writes:
            self.stats.inc_value("leased/autothrottle_shared", len(writes))
        slots = self._slots()
        for key, delay in reply:
            if changes.get(key) != self._changes.get(key, 0):
                continue  # AutoThrottle changed it meanwhile: that is newer
            if delay is None:
                self._fleet.pop(key, None)
                if key in self._learned and key not in writes:
                    # no worker wrote it for MAX_AGE_SECONDS: what this one learnt is
                    # the fleet's again
                    self._dirty[key] = self._known[key]
                continue
            self._fleet[key] = delay
            slot = slots.get(key)
            if slot is not None:
                self._adopt(key, slot)
        self._got(wanted)

    def _got(self, keys: set[str]) -> None:
        """The fleet's delays of these wanted slots are in: their requests may go."""
        if not keys:
            return
        self._wanted -= keys
        if len(self._read) > MAX_READ:
            self._read.clear()
        self._read |= keys
        if self.on_read is not None:
            self.on_read()

    def _slots(self) -> dict[str, Any]:
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        return getattr(downloader, "slots", None) or {}

    def _bounds(self) -> tuple[float, float | None]:
        """AutoThrottle's smallest and largest delay (DOWNLOAD_DELAY,
        AUTOTHROTTLE_MAX_DELAY), as its extension has them."""
        low = float(getattr(self.extension, "mindelay", 0) or 0)
        high = getattr(self.extension, "maxdelay", None)
        return low, None if high is None else float(high)


def _delay(slot: Any) -> float:
    try:
        return float(getattr(slot, "delay", 0) or 0)
    except (TypeError, ValueError):
        return 0.0
