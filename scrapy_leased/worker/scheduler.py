"""The leased Scrapy scheduler (``SCHEDULER``): the frontier lives in Redis.

A worker claims requests in batches (each claim is a lease with a token), hands them
to the engine, and settles each claim once Scrapy has fully processed it: downloaded,
callback run, its items through the pipelines, the requests it yielded written to
Redis. Then the claim is acked, or failed when the callback or errback raised or a
pipeline raised, or parked in the dead letters when its download failed for good with
no errback to handle it. A heartbeat renews the leases; any worker requeues expired
ones.

Continuations and new requests. Scrapy's own continuations of a request (a retry, a
redirect, any Request a downloader middleware returns instead of a response) reach
``enqueue_request`` while the request is still being downloaded: the engine schedules
them as soon as the downloader hands them back, before anything reaches the scraper.
Every other request (from a callback, an errback, a spider middleware, ``start()``)
is scheduled while its parent's response or failure is in the scraper. So a request
is a continuation only when the meta's claim token names a claim of this worker whose
current request is not in the scraper; anything else is a new request for the frontier
(deduplicated, written to Redis before its parent's ack), whatever its meta holds: a
token copied with ``meta=response.meta``, ``request.replace()`` or ``copy()`` is never
trusted. A continuation that Scrapy's scheduler would not deduplicate (``dont_filter``:
a retry) continues the claim in this worker; one it would (a redirect) goes to the
frontier as a new request, deduplicated fleet-wide as Scrapy's dupefilter would, and the
claim ends once its download step is done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler, load_object

from .._supervise import BUG_REASON, close_crawl, supervise
from ..codec import Codec, PayloadError
from ..frontier import PAUSED, RUNNING, STOPPING, NewRequest
from ..frontier.workerid import new_worker_id
from ..meta import META_NOT_BEFORE, claim_token
from ..order import QueueOrder
from ..settings import Budgets, LeasedConfig, config_for
from ._claimbook import Claim, ClaimBook
from ._claimsize import ClaimSizer
from ._engine import EngineHooks
from ._leasekeeper import Kick, LeaseKeeper, WarnOnce
from .claimloop import ClaimLoop
from .control import STOP_REASON, Control
from .dropped import dead_letter
from .failures import Failures
from .opening import Opening
from .runs import Runs
from .seeder import START_BUFFER, Seeder
from .seen import seen_for
from .settle import Settlement
from .slots import Slots
from .tally import Tally

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from ..feed.drain import FeedDrainer
    from ..frontier import Frontier
    from ..frontier.run import RunMarker
    from ..frontier.writer import CommitWriter
    from ._throttleshare import ThrottleShare

logger = logging.getLogger(__name__)

#: The dequeue stats by where a request was (``ClaimBook.take``), as Scrapy names them
DEQUEUED = {"memory": "scheduler/dequeued/memory", "redis": "scheduler/dequeued/redis"}

__all__ = ["START_BUFFER", "STOP_REASON", "LeasedScheduler"]


class LeasedScheduler(BaseScheduler):
    """Scrapy's scheduler interface; the work is done by its parts: the claim loop
    (claimloop.py), the claims held (_claimbook.py), the throttled download slots
    (slots.py), settling and the commit bookkeeping (settle.py), failures from signals
    (failures.py), the fleet's control state (control.py), seeding (seeder.py), the run
    joined (runs.py), the open and close sequences (opening.py), the engine hooks
    (_engine.py), the dupefilter (seen.py)."""

    def __init__(self, crawler: Crawler, config: LeasedConfig, dupefilter: Any,
                 budgets: Budgets, order: QueueOrder | None = None,
                 codec: Codec | None = None) -> None:
        self.crawler = crawler
        self.config = config
        self.budgets = budgets
        self.order = order or QueueOrder.from_settings(crawler.settings)
        self.codec = codec or Codec.from_settings(crawler.settings)
        self.stats = crawler.stats
        self.tally = Tally(self.stats)  # per-request counts, passed on per commit
        self.df = dupefilter
        self.seen = seen_for(dupefilter, self.tally)
        self.concurrency = crawler.settings.getint("CONCURRENT_REQUESTS")
        self.sizer = ClaimSizer(self.concurrency, config.prefetch)
        self.book = ClaimBook()
        #: host:pid:random (frontier/workerid.py); another one when a live worker of the
        #: crawl has it (enter(), at open)
        self.worker_id = new_worker_id()
        #: Whether this worker seeds the current run of the crawl (runs start()).
        self.seeds = False
        self.joined = False  # joined the crawl's run (run.py): leaves it when closing
        self.spider: Spider | None = None
        # built at open (opening.py)
        self.frontier: Frontier | None = None
        self.writer: CommitWriter | None = None
        self.run: RunMarker | None = None
        self.keeper: LeaseKeeper | None = None
        self.feed: FeedDrainer | None = None
        self.kick: Kick | None = None
        #: AutoThrottle's delays shared with the fleet (LEASED_SHARED_AUTOTHROTTLE)
        self.throttle: ThrottleShare | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        #: holds the freeze of the start-up objects (LEASED_GC_FREEZE, gcfreeze.py)
        self.gc_frozen = False
        self.started = time.time()
        self.unconfirmed = 0  # requests given to the writer, not yet written to Redis
        self.warn = WarnOnce()
        #: The background task that stopped this worker on an unexpected exception
        self.failed_task: str | None = None
        self._bug_task: asyncio.Future[None] | None = None
        #: The local feed files this worker writes (worker/feedexports.py), in its registry entry
        self.exports: list[str] = []
        # the parts
        self.engine = EngineHooks(crawler)
        self.slots = Slots(self)
        self.claims = ClaimLoop(self)
        self.control = Control(self)
        self.settle = Settlement(self)
        self.failures = Failures(self.book, config)
        self.seeder = Seeder(self)
        self.runs = Runs(self)
        self.opening = Opening(self)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = config_for(crawler)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(crawler, config, build_from_crawler(df_cls, crawler), config.budgets)

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self.opening.open(spider))

    def close(self, reason: str) -> Deferred[None] | None:
        if self.frontier is None:
            return None
        return deferred_from_coro(self.opening.close(reason))

    def has_pending_requests(self) -> bool:
        """True while this worker has requests to hand out, or may get some: until the
        frontier was seen drained fleet-wide (nothing queued, no live lease anywhere)
        after everything this worker wrote. The engine sends ``spider_idle`` only when
        this is False (and nothing is being downloaded or scraped)."""
        if self.book.has_waiting():
            return True
        if self._closing or self.writer is None:
            return False
        if self.control.state == PAUSED:
            return True  # a paused crawl is not finished: wait for resume (or stop)
        if self.config.keep_alive or self.book.claims or self.writer.pending:
            return True
        return self.claims.drained_seen_at != self.writer.generation

    def enqueue_request(self, request: Request) -> bool:
        claim = self.continued_claim(request)
        if claim is not None and (request.dont_filter or META_NOT_BEFORE in request.meta):
            # a retry (dont_filter), or back from the rate middleware: the same claim
            claim.outstanding += 1
            delay = request.meta.pop(META_NOT_BEFORE, None)
            if delay:  # no rate budget for it yet: wait without holding a slot
                self.defer(request, claim, float(delay))
            else:
                self.book.local.append((request, claim))
                self.engine.wake()
            self.tally.add("scheduler/enqueued/memory")
            self.tally.add("scheduler/enqueued")
            return True
        assert self.writer is not None and self.spider is not None
        key: tuple[int, int] | None = None
        if not request.dont_filter:
            duplicate, key = self.seen.screen(request, self.spider)
            if duplicate:
                return False
        try:
            payload = self.codec.encode(request, self.spider)
        except PayloadError as exc:
            self.dropped(request, exc)
            return False
        lane = self.budgets.lane_of(request)
        order = self.order.of(request)
        priority = int(request.priority)  # an int subclass (IntEnum): redis-py sends repr()
        if key is None:
            new = NewRequest(payload, priority, lane=lane, order=order)
        else:
            new = NewRequest(payload, priority, key[0], key[1], lane, order)
        self.writer.add_request(new, request)
        self.unconfirmed += 1
        self.tally.add("leased/enqueue_sent")
        return True

    def dropped(self, request: Request, exc: PayloadError) -> None:
        """A request the spider yielded cannot be stored: a WARNING naming it, the key and
        the fix (the error's text), and a dead letter with what of it can be kept,
        written with the next batch (dropped.py)."""
        assert self.writer is not None
        self.stats.inc_value("leased/unserializable")
        self.stats.inc_value("leased/dropped")
        field, letter = dead_letter(self.codec, request, self.spider, str(exc))
        self.writer.add_drop(field, letter)
        logger.warning("Dropped a request that cannot be stored: %(error)s (callback "
                       "%(callback)s); kept as a dead letter: scrapy leased dead",
                       {"error": exc, "callback": json.loads(letter)["callback"]},
                       extra={"spider": self.spider})

    def next_request(self) -> Request | None:
        taken = self.book.take(asyncio.get_running_loop().time(),
                               fresh=self.control.state == RUNNING,
                               startable=self.slots.startable)
        if taken is None:
            held = bool(self.book.ready) and self.control.state == RUNNING
            if held:  # the slots of the ready claims are full: hand them out later
                self.slots.arm_timer({c.slot for _, c in self.book.ready if c.slot})
            if held or self.book.wants_more():
                self.claims.want_claims()
            return None
        request, claim, where = taken
        self.slots.handed(request, claim.slot)
        if where == "redis":
            self.sizer.handed_out()
            if claim.slot is not None:
                self.slots.approaching[request] = claim.slot
        self.tally.add(DEQUEUED[where])
        self.tally.add("scheduler/dequeued")
        if self.kick is not None and len(self.book.ready) < self.concurrency // 2:
            self.kick.set()
        return request

    def count(self, name: str, n: int = 1) -> None:
        self.tally.add(name, n)

    def flush_counts(self) -> None:
        self.tally.flush()

    def continued_claim(self, request: Request) -> Claim | None:
        """The claim a request continues (a retry, a redirect: see the module's
        docstring), or None for a new request."""
        token = claim_token(request)
        if token is None:
            return None
        claim = self.book.claims.get(token)
        if claim is None or claim.current is None:
            return None
        if self.engine.in_scraper(claim.current):
            return None  # from its callback or errback: a new request
        return claim

    def defer(self, request: Request, claim: Claim, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self.book.defer(request, claim, loop.time() + delay)
        loop.call_later(delay, self.engine.wake)

    # -- for the add-on's other components (runtime.Worker) -------------------------

    @property
    def closing(self) -> bool:
        """Whether ``close`` has begun (the Redis client is about to be closed)."""
        return self._closing

    @property
    def stopping(self) -> bool:
        """Whether the fleet is stopping (this worker closes with ``STOP_REASON``)."""
        return self.control.state == STOPPING

    def run_beside(self, coro: Coroutine[Any, Any, None], name: str = "a background task"
                   ) -> bool:
        """Run ``coro`` as a task of this worker named ``name``, supervised
        (_supervise.py: an unexpected exception ending it stops the worker) and
        cancelled when the scheduler closes (before its Redis client is closed); False
        (and ``coro`` closed) once closing."""
        if self._closing or self.frontier is None:
            coro.close()
            return False
        self._tasks.append(supervise(name, coro, self.task_failed))
        return True

    def task_failed(self, name: str, exc: BaseException) -> None:
        """A background task named ``name`` ended on an unexpected exception (logged by
        _supervise.py): stop this worker with the close reason ``BUG_REASON``. It claims
        nothing more; the requests in progress finish, the claims not started are
        released (``close``)."""
        self.stats.inc_value("leased/task_errors")
        if self.failed_task is not None or self._closing:
            return
        self.failed_task = name
        if self.kick is not None:
            self.kick.set()
        self._bug_task = asyncio.ensure_future(
            close_crawl(self.crawler, BUG_REASON, lambda: self._closing))

    def is_handed(self, request: Request) -> bool:
        """Whether this request object is one this scheduler handed to the engine (a
        claim of this worker being processed)."""
        return request in self.book.handed

    async def start_request_sent(self) -> None:
        await self.seeder.start_request_sent()

    async def start_exhausted(self) -> None:
        await self.seeder.start_exhausted()

    async def wait_for_seeding(self) -> bool:
        return await self.seeder.wait_for_seeding()

    def worker_info(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "started": self.started, "inflight": len(self.book.claims),
                           "acked": self.stats.get_value("leased/acked", 0),
                           "control": self.control.state, "exports": self.exports,
                           # claims held, not started (_claimsize.py: throttled slots)
                           **dict(zip(("unstarted", "unstarted_s", "slot_delay"),
                                      self.slots.holding_info())),
                           "capacity": self.concurrency + self.sizer.margin
                           + self.sizer.batch - 1})
