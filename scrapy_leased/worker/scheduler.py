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
import contextlib
import json
import logging
import os
import socket
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.python.failure import Failure as TwistedFailure

from .. import signals as leased_signals
from .._cancel import cancel_and_wait
from .._command import exit_if_command_line
from .._compat import asyncio_loop_in_use, slot_clock
from .._redis.connection import LeasedRedisError, redact
from .._supervise import BUG_REASON, PartFailed, close_crawl, supervise
from ..bootstrap import connect_crawl
from ..codec import Codec, PayloadError, safe_text
from ..config import LeasedConfig
from ..feed.drain import FeedDrainer
from ..feed.packer import RequestPacker
from ..feedexports import (
    ExportFiles,
    FeedCollisionError,
    claim_paths,
    feed_exporter,
    local_feeds,
)
from ..frontier import (
    PAUSED,
    RUNNING,
    STOPPING,
    Budget,
    ClaimResult,
    CommitResult,
    CrawlKeys,
    Failure,
    Frontier,
    NewRequest,
    Revisit,
)
from ..frontier.run import SEED, SEEDED, RunMarker
from ..frontier.scripts import WrongKeyType
from ..frontier.workerid import enter, new_worker_id
from ..frontier.writer import LINGER_SECONDS, Batch, CommitWriter
from ..meta import META_CLAIM, META_FREE_SINCE, META_NOT_BEFORE, claim_token, revisit_ms
from ..middleware import describe
from ..order import QueueOrder
from ..ratelimit.budgets import Budgets
from ..runtime import attach
from ._claimbook import Claim, ClaimBook
from ._claimsize import GIVE_BACK_SECONDS, ClaimSizer, slot_quota, slot_room_in
from ._leasekeeper import Kick, LeaseKeeper, WarnOnce, running
from ._throttleshare import ThrottleShare, autothrottle
from .dropped import dead_letter
from .dupefilter import LeasedDupeFilter

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

logger = logging.getLogger(__name__)

RETRY_CAP_SECONDS = 2.0
#: A seeding worker with no room for more claims reads start() on, at most this many
#: start requests ahead of what is written to Redis.
START_BUFFER = 1000
#: While a throttled slot's next start is due, the engine is woken this often (at most).
SLOT_POLL_SECONDS = 0.1
#: Lanes whose download slot this worker remembers (lane -> slot key), at most.
LANE_SLOTS_MAX = 4096
#: The close reason of a worker closed by the fleet's ``stopping`` state (``scrapy leased
#: stop``, or a LEASED_CLOSE_* limit reached by the fleet).
STOP_REASON = "leased_stopped"

__all__ = ["LeasedScheduler"]


class _FinishHook(set):  # type: ignore[type-arg]
    """Stands in for the engine's set of in-progress requests: Scrapy removes a
    request from it exactly when it has fully processed it (download, callback,
    items through pipelines, child requests handed to the scheduler)."""

    def __init__(self, items: set[Request], on_remove: Any) -> None:
        super().__init__(items)
        self._on_remove = on_remove

    def remove(self, request: Request) -> None:
        super().remove(request)
        self._on_remove(request)


class LeasedScheduler(BaseScheduler):
    def __init__(self, crawler: Crawler, config: LeasedConfig, dupefilter: Any,
                 budgets: Budgets, order: QueueOrder | None = None,
                 codec: Codec | None = None) -> None:
        self.crawler = crawler
        self.config = config
        self.budgets = budgets
        self.order = order or QueueOrder.from_settings(crawler.settings)
        self.codec = codec or Codec.from_settings(crawler.settings)
        self.df = dupefilter
        if isinstance(dupefilter, LeasedDupeFilter):
            dupefilter.fleet_wide = True  # Redis decides; not a local filter
        self.stats = crawler.stats
        self.concurrency = crawler.settings.getint("CONCURRENT_REQUESTS")
        self.sizer = ClaimSizer(self.concurrency, config.prefetch)
        #: host:pid:random (frontier/workerid.py); another one when a live worker of the
        #: crawl has it (enter(), at open)
        self.worker_id = new_worker_id()
        self.frontier: Frontier | None = None
        self.writer: CommitWriter | None = None
        self.run: RunMarker | None = None
        #: Whether this worker seeds the current run of the crawl (runs start()).
        self.seeds = False
        self.spider: Spider | None = None
        self.book = ClaimBook()
        self.keeper: LeaseKeeper | None = None
        self.feed: FeedDrainer | None = None
        self._lanes: list[str] = []  # lanes the last claim reported ready
        self._tasks: list[asyncio.Task[None]] = []
        self._kick: Kick | None = None
        self._nextcall: Any = None
        self._engine_slot: Any = None
        self._scraper: Any = None
        self._closing = False
        # The last claim found nothing: wait for the idle poll (or for new work this
        # worker wrote) instead of asking Redis again each time the engine looks.
        self._starved = False
        self._started = time.time()
        self._drained_seen_at = -1  # writer generation at which the frontier looked drained
        # Claim loop rounds started and finished, for start() pacing (start_request_sent)
        self._rounds_started = 0
        self._rounds_done = 0
        self._fresh_round = 0  # the first claim round whose "drained" is to be believed
        self._round_done: asyncio.Event | None = None
        self._unconfirmed = 0  # requests given to the writer, not yet written to Redis
        self._warn = WarnOnce()
        # The fleet's control state as this worker last saw it (keys.py: control)
        self._control = RUNNING
        self._paused_idle = False  # paused, and nothing started is left here (logged)
        self._stop_task: asyncio.Future[None] | None = None
        self._joined = False  # joined the crawl's run (run.py): leaves it when closing
        #: The background task that stopped this worker on an unexpected exception
        self.failed_task: str | None = None
        self._bug_task: asyncio.Future[None] | None = None
        # The claims of the claim reply being taken (_absorb): released when closing if
        # an error left them out of the book
        self._absorbing: list[tuple[int, Any]] = []
        #: The local feed files this worker writes (feedexports.py), in its registry entry
        self._exports: list[str] = []
        # Throttled download slots (_claimsize.py): the slot key of each lane claimed
        # from, the requests handed to the engine that have not reached their slot yet
        # (request -> slot key), the timer that wakes the engine when a full slot may
        # start its next request, the claims being given back (released when closing)
        self._lane_slot: dict[str, str] = {}
        self._approaching: dict[Request, str] = {}
        self._slot_timer: asyncio.TimerHandle | None = None
        self._giving: list[tuple[int, str]] = []
        #: AutoThrottle's delays shared with the fleet (LEASED_SHARED_AUTOTHROTTLE)
        self.throttle: ThrottleShare | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = LeasedConfig.from_settings(crawler.settings)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(crawler, config, build_from_crawler(df_cls, crawler), config.budgets)

    # -- lifecycle -------------------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        attach(self.crawler, self)  # worker_of(crawler), for the other components
        if not asyncio_loop_in_use():
            raise LeasedRedisError(
                "scrapy_leased needs an asyncio event loop: TWISTED_REACTOR = "
                "'twisted.internet.asyncioreactor.AsyncioSelectorReactor' (Scrapy's "
                "default) or TWISTED_REACTOR_ENABLED = False")
        self.spider = spider
        try:
            client, url = await connect_crawl(self.config)
        except LeasedRedisError as exc:
            exit_if_command_line(exc)
            logger.error("%(error)s", {"error": exc})
            raise
        keys = CrawlKeys(self.config.crawl_id or spider.name)
        self.frontier = Frontier(client, keys, lease_ms=self.config.lease_ms,
                                 max_attempts=self.config.max_attempts,
                                 recover_batch=self.config.recover_batch,
                                 half_life_ms=self.budgets.half_life_ms,
                                 caller=self.worker_id, prune_ms=self.config.prune_ms,
                                 limits=self.config.limits)
        self.frontier.on_epoch = self._on_epoch
        self.frontier.on_control = self._on_control
        # the queues' layout once flushed, when flushing (a fresh run may start a crawl
        # whose queues an earlier version laid out)
        await self.frontier.check_layout(self.config.seen_bucket_bits, self.config.seen_ttl_ms,
                                         queues=not self.config.flush_on_start)
        self.frontier.on_seen_gen = self._on_seen_gen
        await self.frontier.record_half_life()
        self.writer = CommitWriter(self.frontier, self._on_commit, linger=LINGER_SECONDS,
                                   on_bug=self.task_failed)
        packer = RequestPacker(self.crawler.request_fingerprinter, self.config.seen_bucket_bits,
                               self.codec, self.budgets)
        self.feed = FeedDrainer(self.frontier, packer, spider, self.stats,
                                closing=lambda: self._closing)
        self._install_engine_hooks()
        worker_ttl_ms = int(self.config.worker_ttl * 1000)
        self.run = RunMarker(client, keys, self.worker_id,
                             max(worker_ttl_ms, 3 * int(self.config.renew_interval * 1000)),
                             worker_ttl_ms)
        # a feed key a producer wrote with the wrong command, a control key written by
        # hand: moved aside before a fresh run reads them (lua/run_flush.lua refuses them)
        await self.feed.set_aside()
        await self._control_aside()
        if self.config.flush_on_start:
            # first: a fresh run also ends a stop a LEASED_CLOSE_* limit set (run_flush.lua)
            await self._flush_on_start()
            await self.frontier.check_layout(self.config.seen_bucket_bits,
                                             self.config.seen_ttl_ms)
        elif not self.config.resume:
            await self._afresh_if_finished()
        if not self._joined:  # a flush registered this worker, its id checked in one step
            await self._enter()
        await self._claim_exports(spider)
        state = await client.hget(keys.control, "state")
        if state is not None and state in (STOPPING, STOPPING.encode()):
            # the fleet is stopping: this worker neither seeds nor claims; it closes with
            # the fleet's reason until `scrapy leased resume`
            # a WARNING: a worker started then crawls nothing and exits 0 (#25 item 8)
            logger.warning("Crawl %(crawl)s is stopping (scrapy leased stop, or a "
                           "LEASED_CLOSE_* limit): this worker closes at once without "
                           "crawling (`scrapy leased resume %(crawl)s` lets workers crawl "
                           "again)", {"crawl": keys.crawl_id})
            self._on_control(STOPPING)
        else:
            if not self._joined:
                self.seeds = await self.run.join() == SEED
                self._joined = True
                if self.seeds and self.config.resume:
                    await self._say_resumed()
        # in the registry with its host and pid before its first claim (status, reset);
        # if Redis fails now, the first heartbeat records them
        with contextlib.suppress(RedisError, OSError):
            await self.frontier.renew(self.worker_id, [], self._worker_info())
        sig = self.crawler.signals
        sig.connect(self._on_spider_error, signals.spider_error)
        sig.connect(self._on_item_error, signals.item_error)
        sig.connect(self._on_request_failed, leased_signals.request_failed)
        sig.connect(self._on_reached_downloader, signals.request_reached_downloader)
        self._kick = Kick()
        self._round_done = asyncio.Event()
        self.keeper = LeaseKeeper(
            self.frontier, self.run, self.book, self.stats, worker_id=self.worker_id,
            renew_interval=self.config.renew_interval,
            sweep_interval=self.config.sweep_interval, closing=lambda: self._closing,
            worker_info=self._worker_info, on_lost=self._drop_unstarted,
            on_recovered=self._kick.set, warn=self._warn)
        if self._joined:
            # revisits that fell due while no worker ran are queued before the first claim,
            # so that a worker finding nothing else does not take the crawl for finished
            with contextlib.suppress(RedisError, OSError):
                await self.keeper.revisit()
        extension = autothrottle(self.crawler)
        if self.config.shared_autothrottle and extension is not None:
            # the fleet's delays read before the first request reaches a download slot
            self.throttle = ThrottleShare(self.crawler, client, keys, extension,
                                          closing=lambda: self._closing, warn=self._warn)
            await self.throttle.start()
            self.throttle.connect()
            self.throttle.on_read = self._wake_engine
        self._tasks = [supervise(name, coro, self.task_failed) for name, coro in
                       (("the claim loop", self._claim_loop()),
                        ("the lease renewals", self.keeper.renew_loop()),
                        ("the recovery of expired leases", self.keeper.sweep_loop()))]
        if self.throttle is not None:
            self._tasks.append(supervise("the shared AutoThrottle", self.throttle.run(),
                                         self.task_failed))
        logger.info("Leased frontier %(crawl)s on %(url)s, worker %(worker)s",
                    {"crawl": keys.crawl_id, "url": redact(url), "worker": self.worker_id})

    async def _enter(self) -> None:
        """Register in the crawl's worker registry (lua/worker_enter.lua: the check and the
        write in one script), under a new id when a live worker has this one, before the
        heartbeat, the run, the claims and the commits use it. After a flush (which reads
        the registry: workers registered before would keep one another from flushing);
        a flush under an id in use changes nothing, as that worker's run is on."""
        assert self.frontier is not None and self.run is not None
        keys = self.frontier.keys
        self.worker_id, taken = await enter(self.frontier.client, keys, self.worker_id,
                                            int(self.config.worker_ttl * 1000))
        self.frontier.caller = self.run.worker_id = self.worker_id
        if taken:
            logger.warning("Worker id %(taken)s is alive in crawl %(crawl)s already: this "
                           "worker is %(worker)s", {"taken": ", ".join(taken),
                                                    "crawl": keys.crawl_id,
                                                    "worker": self.worker_id})

    async def _claim_exports(self, spider: Spider) -> None:
        """The feed exports (feedexports.py): this worker's local feed files recorded in
        its registry entry, or one error at open when a live worker of the crawl on this
        host writes one of them; the feed files flushed before each commit that acks."""
        assert self.frontier is not None and self.writer is not None
        paths, uncovered = local_feeds(self.crawler, spider)
        if uncovered:
            logger.warning("FEEDS: not flushed before the pages of their items are acked, "
                           "so a worker killed with kill -9 may lose items of acked pages: "
                           "%(feeds)s (UpsertPipeline keeps every item: docs/upsert.md)",
                           {"feeds": "; ".join(uncovered)})
        if paths:
            self._exports = paths
            try:
                await claim_paths(self.frontier.client, self.frontier.keys, self.worker_id,
                                  int(self.config.worker_ttl * 1000), self._worker_info(),
                                  paths)
            except FeedCollisionError as exc:
                await self.frontier.client.aclose()
                exit_if_command_line(exc)  # scrapy crawl: one line, exit status 1
                logger.error("%(error)s", {"error": exc})
                raise
        if feed_exporter(self.crawler) is not None:
            self.writer.before_acks = ExportFiles.for_crawler(self.crawler).make_durable

    async def _flush_on_start(self) -> None:
        """LEASED_FLUSH_ON_START: begin a fresh run of the crawl (its frontier state
        deleted, UpsertPipeline's records kept) when no run of it is on; else join the
        run on, flushing nothing."""
        assert self.run is not None
        crawl = self.run.keys.crawl_id
        deleted, alive = await self.run.flush(self.config.upsert.prefix)
        if deleted is None:
            logger.warning("LEASED_FLUSH_ON_START: not flushing crawl %(crawl)s: a run of it "
                           "is on (%(alive)s); joining that run instead (a crawl is flushed "
                           "only when no worker of it is alive)",
                           {"crawl": crawl, "alive": ", ".join(alive)})
            return
        self.seeds = True
        self._joined = True
        self.stats.inc_value("leased/flushed_keys", deleted)
        logger.info("LEASED_FLUSH_ON_START: flushed crawl %(crawl)s (%(n)d keys: queue, seen "
                    "set, done, dead letters, counters; the feed and UpsertPipeline's records "
                    "kept): this worker starts a fresh run", {"crawl": crawl, "n": deleted})

    async def _afresh_if_finished(self) -> None:
        """A new ``scrapy crawl`` of a crawl that finished starts afresh, as a Scrapy
        crawl does (LEASED_RESUME unset, the default): its frontier state is deleted as
        by LEASED_FLUSH_ON_START. A crawl with work left (queued, leased, in the feed,
        revisits waiting), paused or stopping is continued, and a run that is on is
        joined. The first WARNING says which, and how to get the other."""
        assert self.run is not None
        crawl = self.run.keys.crawl_id
        out = await self.run.fresh_run(self.config.upsert.prefix, only_if_finished=True)
        if out.deleted is not None:
            self.seeds = True
            self._joined = True
            self.stats.inc_value("leased/flushed_keys", out.deleted)
            if out.done_before:
                logger.warning(
                    "Crawl %(crawl)s finished before (%(done)d requests done): starting it "
                    "afresh, as a new Scrapy crawl (its seen set, queue and dead letters "
                    "cleared; UpsertPipeline's records kept). Set LEASED_RESUME = True to "
                    "continue it instead, crawling only what it has not seen.",
                    {"crawl": crawl, "done": out.done_before})
            assert self.frontier is not None
            await self.frontier.check_layout(self.config.seen_bucket_bits,
                                             self.config.seen_ttl_ms)
        elif not out.left:  # a run is on: joined, as any worker of a fleet
            if all(a.startswith("run marker") for a in out.alive):  # but no worker alive
                logger.warning(
                    "Crawl %(crawl)s: continuing the run of workers that ended without "
                    "closing (killed?); its requests left are crawled. To start it "
                    "afresh instead, once no worker is alive: `scrapy leased reset "
                    "%(crawl)s --yes`.", {"crawl": crawl})
        else:
            left = ", ".join(f"{v} {k}" for k, v in out.left.items()
                             if k != "control" and v) or f"state {out.left['control']}"
            logger.warning(
                "Crawl %(crawl)s has work left from an earlier run (%(left)s): continuing "
                "it. To start it afresh instead: LEASED_FLUSH_ON_START = True (or "
                "`scrapy leased reset %(crawl)s --yes`).", {"crawl": crawl, "left": left})

    async def _say_resumed(self) -> None:
        """LEASED_RESUME, this worker starting a new run: say so when the crawl ran
        before (its seen set still drops what it crawled)."""
        assert self.frontier is not None
        keys = self.frontier.keys
        with contextlib.suppress(RedisError, OSError, ValueError, TypeError):
            done = int(await self.frontier.client.hget(keys.stats, "done") or 0)
            if done:
                logger.warning(
                    "LEASED_RESUME: continuing crawl %(crawl)s (%(done)d requests done "
                    "before): requests seen before are dropped as duplicates. Unset "
                    "LEASED_RESUME for a fresh crawl of it.",
                    {"crawl": keys.crawl_id, "done": done})

    def _install_engine_hooks(self) -> None:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        scraper = getattr(engine, "scraper", None)
        if slot is None or not isinstance(getattr(slot, "inprogress", None), set) or not hasattr(
            slot, "nextcall"
        ) or not hasattr(scraper, "slot"):
            import scrapy

            raise RuntimeError(
                f"scrapy_leased cannot follow request completion in Scrapy {scrapy.__version__}"
                " (engine slot without 'inprogress'/'nextcall', or a scraper without 'slot');"
                " supported: Scrapy 2.13.4-2.19"
            )
        slot.inprogress = _FinishHook(slot.inprogress, self._on_request_finished)
        self._nextcall = slot.nextcall
        self._engine_slot = slot
        self._scraper = scraper

    def close(self, reason: str) -> Deferred[None] | None:
        if self.frontier is None:
            return None
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        assert self.frontier is not None and self.writer is not None
        self._closing = True
        if await cancel_and_wait(self._tasks):
            logger.warning("A background task of this worker did not end when cancelled; "
                           "closing without it")
        if self._round_done is not None:
            self._round_done.set()  # a start() pacing wait ends
        if not await self.writer.drain(timeout=max(30.0, self.config.lease_seconds), final=True):
            logger.error("Could not write everything to Redis before closing; the claims "
                         "concerned return to the queue when their leases expire")
        if self._slot_timer is not None:
            self._slot_timer.cancel()
            self._slot_timer = None
        # Claims still here were never started (or wait for a retry): give them back,
        # with those of a claim call whose reply was lost, and those being given back.
        tokens = self.book.unstarted() + self._giving
        tokens += [(token, env.lane) for token, env in self._absorbing
                   if token not in self.book.claims and token not in self.book.settling]
        try:
            tokens += [(token, env.lane) for token, env in await self.frontier.resolve_claim()]
        except (RedisError, OSError):
            pass  # its claims, if it ran, return to the queue when their leases expire
        try:
            released = await self.frontier.release(self.worker_id, tokens)
            if self.run is not None and self._joined and await self.run.leave():
                logger.info("Last worker of this run of the crawl: the run ended (the next "
                            "worker to start runs start() again)")
        except (RedisError, OSError) as exc:
            logger.error("Could not release %(n)d claims (%(exc)s); they return to the queue "
                         "when their leases expire", {"n": len(tokens), "exc": exc})
        else:
            self.stats.inc_value("leased/released", released)
            if released:
                logger.info("Released %(n)d unstarted requests back to the queue",
                            {"n": released})
        self.book.clear()
        await self.frontier.client.aclose()

    # -- Scrapy's scheduler interface -----------------------------------------------

    def has_pending_requests(self) -> bool:
        """True while this worker has requests to hand out, or may get some: until the
        frontier was seen drained fleet-wide (nothing queued, no live lease anywhere)
        after everything this worker wrote. The engine sends ``spider_idle`` only when
        this is False (and nothing is being downloaded or scraped)."""
        if self.book.has_waiting():
            return True
        if self._closing or self.writer is None:
            return False
        if self._control == PAUSED:
            return True  # a paused crawl is not finished: wait for resume (or stop)
        if self.config.keep_alive or self.book.claims or self.writer.pending:
            return True
        return self._drained_seen_at != self.writer.generation

    def enqueue_request(self, request: Request) -> bool:
        claim = self._continued_claim(request)
        if claim is not None and (request.dont_filter or META_NOT_BEFORE in request.meta):
            # a retry (dont_filter), or back from the rate middleware: the same claim
            claim.outstanding += 1
            delay = request.meta.pop(META_NOT_BEFORE, None)
            if delay:  # no rate budget for it yet: wait without holding a slot
                self._defer(request, claim, float(delay))
            else:
                self.book.local.append((request, claim))
                self._wake_engine()
            self.stats.inc_value("scheduler/enqueued/memory")
            self.stats.inc_value("scheduler/enqueued")
            return True
        assert self.writer is not None and self.spider is not None
        key: tuple[int, int] | None = None
        if request.dont_filter:
            pass
        elif isinstance(self.df, LeasedDupeFilter):
            key = self.df.seen_key(request)
            if key in self.df.known:  # Redis already said so: no need to ask again
                self.stats.inc_value("leased/seen_cached")
                self.df.log(request, self.spider)
                return False
        elif self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        try:
            payload = self.codec.encode(request, self.spider)
        except PayloadError as exc:
            self._dropped(request, exc)
            return False
        lane = self.budgets.lane_of(request)
        order = self.order.of(request)
        priority = int(request.priority)  # an int subclass (IntEnum): redis-py sends repr()
        if key is None:
            new = NewRequest(payload, priority, lane=lane, order=order)
        else:
            new = NewRequest(payload, priority, key[0], key[1], lane, order)
        self.writer.add_request(new, request)
        self._unconfirmed += 1
        self.stats.inc_value("leased/enqueue_sent")
        return True

    def _dropped(self, request: Request, exc: PayloadError) -> None:
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
                               fresh=self._control == RUNNING, startable=self._startable)
        if taken is None:
            held = bool(self.book.ready) and self._control == RUNNING
            if held:  # the slots of the ready claims are full: hand them out later
                self._arm_slot_timer({c.slot for _, c in self.book.ready if c.slot})
            if held or self.book.wants_more():
                self._want_claims()
            return None
        request, claim, where = taken
        if where == "redis":
            self.sizer.handed_out()
            if claim.slot is not None:
                self._approaching[request] = claim.slot
        self.stats.inc_value(f"scheduler/dequeued/{where}")
        self.stats.inc_value("scheduler/dequeued")
        if self._kick is not None and len(self.book.ready) < self.concurrency // 2:
            self._kick.set()
        return request

    # -- for the add-on's other components ----------------------------------------

    @property
    def closing(self) -> bool:
        """Whether ``close`` has begun (the Redis client is about to be closed)."""
        return self._closing

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
        if self._kick is not None:
            self._kick.set()
        self._bug_task = asyncio.ensure_future(
            close_crawl(self.crawler, BUG_REASON, lambda: self._closing))

    def is_handed(self, request: Request) -> bool:
        """Whether this request object is one this scheduler handed to the engine (a
        claim of this worker being processed)."""
        return request in self.book.handed

    async def start_request_sent(self) -> None:
        """Called by LeasedStartMiddleware after each start request, before the next
        one is read: while this worker has room for more claims, wait until the
        request is written to Redis and a claim that started afterwards is done (so
        the first start requests are claimed in the order they came, as Scrapy sends
        the first CONCURRENT_REQUESTS at once); a full worker reads on, at most
        START_BUFFER requests ahead of Redis."""
        assert self.writer is not None
        if self._closing:
            return
        if self._capacity() > 0 and self.writer.pending:
            await self.writer.drain()
            if self._capacity() > 0:
                await self._next_claim_round()
        elif self._unconfirmed >= START_BUFFER:
            await self.writer.drain()

    async def start_exhausted(self) -> None:
        """The seeding worker's start() is exhausted: once its requests are in Redis,
        the other workers of the run skip it."""
        assert self.run is not None and self.writer is not None
        if not await self.writer.drain():
            return  # stopped on a bug: not seeded (the next run sends start() again)
        try:
            await self.run.seeded()
        except (RedisError, OSError) as exc:
            logger.warning("Could not mark the run as seeded (%(exc)s): a worker started "
                           "after this one dies may run start() again", {"exc": exc})

    async def wait_for_seeding(self) -> bool:
        """On a worker that does not seed the run: wait until the seeder exhausted
        start() (True: skip it), or died before (False: this worker seeds it now). The
        worker claims and processes requests meanwhile; its start() is pending, so it
        does not take the crawl for finished."""
        assert self.run is not None
        delay = self.config.idle_poll
        while True:
            try:
                state = await self.run.join()
            except (RedisError, OSError) as exc:
                self._warn("run", "Cannot read the run of the crawl, retrying: %s", exc)
                state = None
            if state == SEEDED:
                # what the claim loop saw before is stale: the seeder's requests are in
                # Redis now; only a claim round started from now on may find the crawl
                # drained (not one in flight)
                self._drained_seen_at = -1
                self._fresh_round = self._rounds_started + 1
                self._starved = False
                if self._kick is not None:
                    self._kick.set()
                return True
            if state == SEED:
                self.seeds = True
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_SECONDS)

    async def _next_claim_round(self) -> None:
        """Wait for a claim loop round that starts from now on to be done."""
        assert self._kick is not None
        target = self._rounds_started + 1
        while self._rounds_done < target and not self._closing:
            event = self._round_done
            assert event is not None
            self._kick.set()
            await event.wait()

    def _continued_claim(self, request: Request) -> Claim | None:
        """The claim a request continues (a retry, a redirect: see the module's
        docstring), or None for a new request."""
        token = claim_token(request)
        if token is None:
            return None
        claim = self.book.claims.get(token)
        if claim is None or claim.current is None:
            return None
        current = claim.current
        slot = self._scraper.slot  # the scraper's (result, request) queue and active set
        if slot is not None and (current in slot.active
                                 or any(r is current for _, r, _ in slot.queue)):
            return None  # from its callback or errback: a new request
        return claim

    # -- completion ------------------------------------------------------------------

    def _on_request_finished(self, request: Request) -> None:
        self._approaching.pop(request, None)
        claim = self.book.finished(request)
        if claim is not None:
            self._settle(claim)
        if self._control == PAUSED:
            self._check_paused_idle()

    # -- the fleet's control state (scrapy leased pause / resume / stop, limits) -------

    @property
    def stopping(self) -> bool:
        """Whether the fleet is stopping (this worker closes with ``STOP_REASON``)."""
        return self._control == STOPPING

    def _on_control(self, state: str) -> None:
        """The control state a claim or heartbeat reported (keys.py: control)."""
        if state not in (PAUSED, STOPPING):
            state = RUNNING
        if state == self._control or self._control == STOPPING:
            return  # stopping is final for this worker
        self._control = state
        crawl = self.frontier.keys.crawl_id if self.frontier is not None else "?"
        if state == PAUSED:
            self._paused_idle = False
            logger.info("Crawl %(crawl)s paused (scrapy leased pause): this worker claims and "
                        "starts nothing new, finishes what it started and keeps the leases "
                        "of the %(n)d claims it holds", {"crawl": crawl,
                                                         "n": len(self.book.claims)})
            self._check_paused_idle()
        elif state == RUNNING:
            logger.info("Crawl %(crawl)s resumed: claiming again", {"crawl": crawl})
            self._starved = False
            if self._kick is not None:
                self._kick.set()
            self._wake_engine()
        else:
            logger.info("Crawl %(crawl)s is stopping (scrapy leased stop, or a LEASED_CLOSE_* "
                        "limit reached): this worker finishes what it started, gives back "
                        "the rest and closes (%(reason)s)", {"crawl": crawl,
                                                             "reason": STOP_REASON})
            if self._kick is not None:
                self._kick.set()
            self._stop_task = asyncio.ensure_future(self._close_engine())

    def _check_paused_idle(self) -> None:
        if self._paused_idle or self.book.started_busy():
            return
        self._paused_idle = True
        logger.info("Crawl paused: nothing in progress on this worker; %(n)d unstarted claims "
                    "held until resume", {"n": len(self.book.claims)})

    async def _close_engine(self) -> None:
        """Close the spider through the engine, as Scrapy's CloseSpider does: requests in
        progress finish and are acked, the unstarted claims are released (``close``)."""
        with contextlib.suppress(RedisError, OSError, AttributeError):
            assert self.frontier is not None
            by, why = await self.frontier.client.hmget(self.frontier.keys.control, "by",
                                                       "reason")
            if by or why:
                logger.info("The fleet's stop was set by %(by)s%(why)s",
                            {"by": _text(by), "why": f": {_text(why)}" if why else ""})
        await close_crawl(self.crawler, STOP_REASON, lambda: self._closing)

    def _settle(self, claim: Claim) -> None:
        assert self.writer is not None
        if self.book.settle(claim):  # the suspect that ran alone: the others may start
            self._wake_engine()
        if claim.failure is None:
            self.writer.add_ack(claim.token, claim.rid, claim.revisit)
        else:
            self.writer.add_fail(Failure(claim.token, claim.failure, claim.permanent, claim.lane,
                                         claim.rid, claim.priority))
        if self._kick is not None:
            self._kick.set()

    def _mark_failed(self, request: Request | None, reason: str, permanent: bool = False) -> None:
        if request is not None:
            self.book.mark_failed(claim_token(request), reason, permanent)

    def _on_request_failed(self, request: Request, reason: str, permanent: bool = False) -> None:
        self._mark_failed(request, reason, permanent)

    def _on_spider_error(self, failure: TwistedFailure, response: Any, spider: Spider) -> None:
        # Scrapy processes such a request once: parked in the dead letters, unless
        # LEASED_RETRY_ERRORS requeues it (its items until the error come again then)
        self._mark_failed(_request_of(response), f"callback error: {_error(failure)}",
                          permanent=not self.config.retry_errors)

    def _on_item_error(self, item: Any, response: Any, spider: Spider,
                       failure: TwistedFailure) -> None:
        from ..upsert.stores.base import StoreError  # (upsert imports this module)

        # UpsertPipeline's store being down is transient: always retried
        transient = isinstance(failure.value, StoreError)
        self._mark_failed(_request_of(response), f"item pipeline error: {_error(failure)}",
                          permanent=not (transient or self.config.retry_errors))

    def _on_commit(self, batch: Batch, result: CommitResult) -> None:
        if any(result.queued) and self._kick is not None:
            self._starved = False  # this worker just queued work: claim it at once
            self._kick.set()
        self._unconfirmed -= len(batch.enqueue)
        self.book.written([token for token, _ in batch.acks] + [f.token for f in batch.fails])
        stats = self.stats
        known = self.df.known if isinstance(self.df, LeasedDupeFilter) else None
        filled: set[str] = set()
        for new, tag, queued in zip(batch.enqueue, batch.tags, result.queued):
            if known is not None and new.bucket is not None:
                known.add(new.bucket, new.member)  # in the seen set now, whoever put it there
            if queued:
                filled.add(new.lane)
                stats.inc_value("leased/enqueued")
                stats.inc_value("scheduler/enqueued/redis")
                stats.inc_value("scheduler/enqueued")
            elif isinstance(tag, Request):  # a duplicate, fleet-wide: dropped as Scrapy does
                if known is not None:
                    self.df.log(tag, self.spider)
                self.crawler.signals.send_catch_log(signals.request_dropped, request=tag,
                                                    spider=self.spider)
        # lanes this worker just queued to are ready as far as it knows: the next claim
        # names them (else a claim before the next reply that reports them gets nothing
        # from them, and a second call is needed)
        filled.difference_update(self._lanes)
        if filled:
            self._lanes = self._lanes + sorted(filled)
        for flags in result.acks:
            stats.inc_value("leased/acked" if flags & 1 else "leased/acked_stale")
            if not flags & 1 and self._warn.once("stale"):
                logger.warning("Acked a request after its lease was lost (this worker was "
                               "too slow or paused, or Redis went back in time); it may have "
                               "been processed twice (counted in leased/acked_stale, logged "
                               "once)")
        for outcome in result.fails:
            stats.inc_value(("leased/failed_stale", "leased/failed", "leased/dead")[outcome])

    # -- claiming --------------------------------------------------------------------

    def _capacity(self) -> int:
        if self._engine_slot is not None and self._engine_slot.closing is not None:
            return 0  # the engine is shutting down: claim nothing new
        if self.failed_task is not None:
            return 0  # stopping on a bug: claim nothing new
        if self.book.suspects or self.book.isolated is not None:
            return 0  # a suspect runs alone: claim nothing until it is settled
        slot = getattr(self._scraper, "slot", None)
        if slot is not None and slot.needs_backout():
            return 0  # the engine takes nothing while responses pile up in the scraper
        unstarted = self.book.waiting()
        return self.sizer.capacity(self._downloading(), unstarted,
                                   len(self.book.handed) + unstarted + len(self.book.suspects))

    def _downloading(self) -> int:
        """Requests in Scrapy's downloader: what it counts against CONCURRENT_REQUESTS."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        active = getattr(downloader, "active", None)
        return len(active) if active is not None else len(self.book.handed)

    def _want_claims(self) -> None:
        if self._kick is not None and not self._starved and self._capacity() > 0:
            self._kick.set()

    def _wake_engine(self) -> None:
        if self._nextcall is not None:
            self._nextcall.schedule()

    def _round_finished(self) -> None:
        self._rounds_done += 1
        if self._round_done is not None:
            done, self._round_done = self._round_done, asyncio.Event()
            done.set()

    async def _claim_loop(self) -> None:
        assert self.frontier is not None and self.writer is not None and self._kick
        delay = 0.05
        while running(lambda: self._closing):
            self._rounds_started += 1
            round_ = self._rounds_started
            await self._give_back()
            want = self._capacity()
            wait = self.config.idle_poll
            asked, cap, full = self._candidates(max(want, 0))
            if cap is not None:
                want = min(want, cap)
            if full and not asked and self._control == RUNNING:
                # every ready lane's throttled download slot holds what it starts soon:
                # claim when one of them starts its next request
                slot_wait = self._slot_wait(full)
                if slot_wait is not None:
                    wait = min(wait, slot_wait)
            elif self.sizer.worth_claiming(want, self.book.waiting()) \
                    or self._control != RUNNING:  # paused: ask until resumed
                generation = self.writer.generation
                self.writer.flush()  # the commit waiting rides along with the claim
                try:
                    want = max(want, 0)
                    sent = time.monotonic()
                    result = await self.frontier.claim(want, self.worker_id, asked)
                    self._absorbing = result.claims
                    self.sizer.claimed(time.monotonic() - sent)
                    if len(result.claims) < want and self._more_candidates(result, asked):
                        # ready lanes this claim did not name (others emptied some)
                        self._lanes = result.ready_lanes
                        result = await self._claim_more(result, want, asked)
                        self._absorbing = result.claims
                except (RedisError, OSError) as exc:
                    self._round_finished()
                    if isinstance(exc, WrongKeyType) and exc.key == self.frontier.keys.control:
                        with contextlib.suppress(RedisError, OSError):
                            if await self._control_aside():
                                continue  # claim again at once: the claim changed nothing
                    self._warn("claim", "Cannot claim from Redis, retrying: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_CAP_SECONDS)
                    continue
                delay = 0.05
                self._warn.clear("claim")
                if result.control != RUNNING:  # paused or stopping: nothing claimed
                    self._starved = True
                    self._round_finished()
                    self._kick.clear()
                    await self._kick.wait(wait)
                    continue
                self._lanes = result.ready_lanes
                self._absorb(result, sent)
                self._absorbing = []
                # stale: lanes with requests were left for a tier this worker had not
                # learnt (lua/claim.lua); the reply named it: claim again at once
                self._starved = not result.claims and not result.stale
                if result.feed and await self._drain_feed():
                    self._starved = False
                    self._wake_engine()
                    self._round_finished()
                    continue  # claim what was just queued
                if result.claims:
                    self._wake_engine()
                    if len(result.claims) == want or result.stale:
                        self._round_finished()
                        continue
                elif result.stale:
                    self._round_finished()
                    continue
                elif result.next_ms < 0 and result.leases == 0 and not result.feed \
                        and not self.writer.pending \
                        and generation == self.writer.generation \
                        and round_ >= self._fresh_round:
                    self._drained_seen_at = generation
                    self._wake_engine()  # lets the engine notice it is idle and ask to close
                elif result.next_ms > result.now_ms:  # a lane's budget lets a claim through then
                    wait = min(wait, (result.next_ms - result.now_ms) / 1000)
            self._round_finished()
            due = self.book.next_due()
            if due is not None:  # its lane is skipped until it is out: claim again then
                wait = min(wait, max(0.001, due - asyncio.get_running_loop().time()))
            self._kick.clear()
            await self._kick.wait(wait)

    async def _control_aside(self) -> bool:
        """A control key of another type than a HASH (a ``SET ...:control paused`` by
        hand) cannot be read by the claims (lua/claim.lua refuses them, changing
        nothing), and the fleet could claim nothing more: move it aside whole
        (Frontier.set_aside), say so once at ERROR with both keys and what to do, count
        it (``leased/control_set_aside``). The fleet then runs as with no control state
        (running). Whether it was moved; raises RedisError like any call."""
        assert self.frontier is not None
        moved = await self.frontier.set_aside("control")
        if moved is None:
            return False
        kind, aside = moved
        self.stats.inc_value("leased/control_set_aside")
        logger.error(
            "Redis key %(key)s, the fleet's control state, was a %(kind)s, not a hash: it "
            "was written by hand, not by `scrapy leased pause|resume|stop`. It was moved, "
            "whole, to %(aside)s, and the fleet runs as with no control state (running); "
            "nothing was deleted. Pause, resume or stop the fleet with `scrapy leased "
            "pause|resume|stop`, then delete %(aside)s.",
            {"key": self.frontier.keys.control, "kind": kind, "aside": aside})
        return True

    async def _drain_feed(self) -> bool:
        """Queue a batch of the feed's entries (feed/drain.py); whether any were taken."""
        assert self.feed is not None
        try:
            taken = await self.feed.drain_once()
        except (RedisError, OSError) as exc:
            self._warn("feed", "Cannot take entries off the feed, retrying: %s", exc)
            return False
        except Exception as exc:
            # a bug: it ends the claim loop, which stops the worker, reported as one in
            # the feed drain (_supervise.py); the batch it took goes back to the feed
            # after its lease
            raise PartFailed("the feed drain", exc) from exc
        self._warn.clear("feed")
        return taken > 0

    def _on_reached_downloader(self, request: Request, spider: Spider) -> None:
        self._approaching.pop(request, None)  # in its slot's queue now

    # -- throttled download slots (_claimsize.py) -------------------------------------

    def _downloader(self) -> Any:
        return getattr(self.crawler.engine, "downloader", None)

    def _slot_key(self, request: Request) -> str | None:
        """The key of the Scrapy download slot ``request`` goes to."""
        get = getattr(self._downloader(), "get_slot_key", None)
        if get is None:
            return None
        try:
            return str(get(request))
        except Exception:  # a project's downloader: no slot to look at
            return None

    def _slot_delay(self, key: str) -> float:
        """The delay of download slot ``key`` (AutoThrottle changes it), or the delay a
        new one gets (DOWNLOAD_DELAY, DOWNLOAD_SLOTS, AUTOTHROTTLE_START_DELAY)."""
        downloader = self._downloader()
        slot = getattr(downloader, "slots", {}).get(key)
        if slot is not None:
            return float(getattr(slot, "delay", 0) or 0)
        per_slot = getattr(downloader, "per_slot_settings", None) or {}
        default = getattr(downloader, "_delay", 0) or 0
        try:
            return float(per_slot.get(key, {}).get("delay", default) or 0)
        except (TypeError, ValueError, AttributeError):
            return 0.0

    def _slot_next(self, key: str) -> tuple[float, float]:
        """(delay, wait) of download slot ``key``: its delay (``_slot_delay``) and the
        seconds until it may start its next request (<= 0: now; a slot Scrapy has not
        made yet starts its first request at once)."""
        delay = self._slot_delay(key)
        slot = getattr(self._downloader(), "slots", {}).get(key)
        if slot is None or delay <= 0:
            return delay, 0.0
        return delay, float(getattr(slot, "lastseen", 0) or 0) + delay - slot_clock()

    def _slot_pending(self, key: str) -> tuple[int | None, int, float, float]:
        """(quota, pending, delay, wait) of download slot ``key``: how many requests it
        starts within SOON_SECONDS (None: no delay, no bound; 0 while its next start is
        further away), how many of this worker's wait to start in it (in its queue, or
        handed to the engine and not there yet), and ``_slot_next``."""
        delay, wait = self._slot_next(key)
        quota = slot_quota(delay, wait)
        if quota is None:
            return None, 0, delay, wait
        slot = getattr(self._downloader(), "slots", {}).get(key)
        queued = len(getattr(slot, "queue", ())) if slot is not None else 0
        pending = queued + sum(1 for k in self._approaching.values() if k == key)
        return quota, pending, delay, wait

    def _startable(self, claim: Claim) -> bool:
        """Whether the download slot of ``claim`` has room for it now (and, with the
        shared AutoThrottle, the fleet's delay for a slot not open yet is in)."""
        if claim.slot is None:
            return True
        if self.throttle is not None and not self.throttle.ready(claim.slot):
            return False
        quota, pending, _, _ = self._slot_pending(claim.slot)
        return quota is None or pending < quota

    def _slot_wait(self, keys: set[str]) -> float | None:
        """Seconds until one of these throttled download slots has room for one more
        request of this worker (``slot_room_in``; then polled every SLOT_POLL_SECONDS
        at most); None: none is known."""
        best: float | None = None
        for key in keys:
            quota, pending, delay, wait = self._slot_pending(key)
            if quota is None:
                continue
            room_in = slot_room_in(delay, wait, pending)
            if room_in <= 0:  # due (a randomized delay may start it later): poll
                room_in = min(SLOT_POLL_SECONDS, delay / 4)
            best = room_in if best is None else min(best, room_in)
        return None if best is None else max(0.01, best)

    def _arm_slot_timer(self, keys: set[str]) -> None:
        if self._slot_timer is not None or self._closing:
            return
        wait = self._slot_wait(keys)
        if wait is not None:
            self._slot_timer = asyncio.get_running_loop().call_later(wait, self._slot_freed)

    def _slot_freed(self) -> None:
        self._slot_timer = None
        self._wake_engine()
        if self._kick is not None:
            self._kick.set()

    async def _give_back(self) -> None:
        """Release the ready claims that waited more than GIVE_BACK_SECONDS for a
        download slot with no room for them: the other workers take them."""
        if not self.book.ready or self._control != RUNNING or self.frontier is None:
            return
        now = time.monotonic()
        room: dict[str, int | None] = {}
        stale: set[int] = set()
        for _, claim in self.book.ready:
            key = claim.slot
            if key is None:
                continue
            if key not in room:
                quota, pending, _, _ = self._slot_pending(key)
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
        taken = self.book.take_back(stale)
        self._giving = [(claim.token, claim.lane) for _, claim in taken]
        try:
            released = await self.frontier.release(self.worker_id, self._giving, leave=False)
        except (RedisError, OSError) as exc:
            # held again; if the release did run, the next renewal finds them lost and
            # drops them (they were never started)
            self.book.put_back(taken)
            self._warn("give_back", "Cannot give back claims to Redis, retrying: %s", exc)
            return
        finally:
            self._giving = []
        self._warn.clear("give_back")
        self.stats.inc_value("leased/given_back", released)
        logger.debug("Gave back %(n)d claims that waited for a throttled download slot "
                     "(DOWNLOAD_DELAY, AutoThrottle)", {"n": released})

    def _holding(self) -> tuple[int, float, float]:
        """Claims this worker holds and has not started (claimed, or waiting in a
        download slot's queue): how many, the longest any has waited (seconds), the
        largest delay of their download slots."""
        now = time.monotonic()
        n, oldest, delay = 0, 0.0, 0.0
        for _, claim in [*self.book.ready, *self.book.suspects]:
            n += 1
            oldest = max(oldest, now - claim.since)
            if claim.slot is not None:
                delay = max(delay, self._slot_delay(claim.slot))
        handed = self.book.handed
        for slot in list(getattr(self._downloader(), "slots", {}).values()):
            for request, _ in list(getattr(slot, "queue", ())):
                held = handed.get(request)
                if held is not None:
                    n += 1
                    oldest = max(oldest, now - held.since)
                    delay = max(delay, float(getattr(slot, "delay", 0) or 0))
        return n, oldest, delay

    def _holding_info(self) -> tuple[int, float, float]:
        n, oldest, delay = self._holding()
        return n, round(oldest, 1), round(delay, 3)

    def _absorb(self, result: ClaimResult, sent: float) -> None:
        """Take the claims of ``result``, from a claim call sent at ``sent``
        (time.monotonic()). Their ``META_FREE_SINCE`` is ``sent``, not the reply's
        arrival: a penalty this worker hears of after ``sent`` may have been set before
        the claim ran in Redis, so those requests are checked at download time
        (ratelimit/watch.py)."""
        assert self.spider is not None and self.writer is not None
        claimed_at = sent
        for token, env in result.claims:
            claim = Claim(token, env.rid, env.lane, env.priority, since=time.monotonic())
            try:
                request = self.codec.decode(env.payload, self.spider, env.priority)
                after_ms = revisit_ms(request, self.config.revisit_after_ms)
                if after_ms > 0:
                    claim.revisit = Revisit(after_ms, env.priority, env.lane, env.payload)
            except Exception as exc:  # whatever a stored payload makes decoding raise
                why = str(exc) if isinstance(exc, ValueError) \
                    else f"{type(exc).__name__}: {exc}"
                self.stats.inc_value("leased/undecodable")
                logger.error("Dead-lettering stored request %(rid)d: %(error)s",
                             {"rid": env.rid, "error": safe_text(why)})
                self.book.settling.add(token)
                self.writer.add_fail(Failure(token, why, permanent=True, lane=env.lane,
                                             rid=env.rid, priority=env.priority))
                continue
            request.meta[META_CLAIM] = token
            claim.slot = self._slot_key(request)
            if claim.slot is not None and self._lane_slot.get(env.lane) != claim.slot:
                if len(self._lane_slot) >= LANE_SLOTS_MAX:
                    self._lane_slot.pop(next(iter(self._lane_slot)))
                self._lane_slot[env.lane] = claim.slot
            if env.lane in result.free_lanes:
                request.meta[META_FREE_SINCE] = claimed_at
            self.book.add(request, claim, suspect=bool(env.expiries))
            self.stats.inc_value("leased/claimed")
            if env.attempts:
                self.stats.inc_value("leased/claimed_retry")

    async def _claim_more(self, first: ClaimResult, want: int,
                          first_asked: list[tuple[str, Budget]]) -> ClaimResult:
        """A second claim, for what ``first`` did not get, from the lanes it reported
        ready; the claims of both in the result (``first`` alone when the second call
        fails: it is sent again by the next claim, Frontier._pending_claim). It continues
        ``first``: a request whose lease expired before is not claimed beside first's
        claims (claim.lua keeps those alone)."""
        assert self.frontier is not None
        rest = want - len(first.claims)
        # not the lanes ``first`` named: its claims are not in the book yet
        asked, cap, _ = self._candidates(rest, frozenset(lane for lane, _ in first_asked))
        if cap is not None:
            rest = min(rest, cap)
        if rest <= 0 or not asked:
            return first
        try:
            more = await self.frontier.claim(rest, self.worker_id, asked,
                                             continues=bool(first.claims))
        except (RedisError, OSError):
            if not first.claims:
                raise
            return first
        more.claims = first.claims + more.claims
        more.free_lanes |= first.free_lanes
        return more

    def _candidates(self, want: int, exclude: frozenset[str] = frozenset()
                    ) -> tuple[list[tuple[str, Budget]], int | None, set[str]]:
        """Lanes to claim ``want`` requests from: those last reported ready (ready
        longest first), except lanes this worker already holds waiting requests for
        (their budget is spoken for) and lanes whose throttled download slot holds what
        it starts soon already (_claimsize.py); as many as a claim of that size needs
        (every lane named costs Redis time). Also the most to claim from them (None: no
        bound; the room of their throttled slots otherwise) and the keys of the full
        slots whose lanes were left out."""
        waiting = self.book.waiting_lanes()
        limit = self.sizer.candidates(want)
        rooms: dict[str, int | None] = {}
        ready_by_slot: Counter[str] | None = None
        picked: list[str] = []
        full: set[str] = set()
        cap: int | None = 0
        for lane in self._lanes:
            if lane in waiting or lane in exclude:
                continue
            key = self._lane_slot.get(lane, lane)
            if key not in rooms:
                quota, pending, _, _ = self._slot_pending(key)
                if quota is None:
                    rooms[key] = None
                else:
                    if ready_by_slot is None:
                        ready_by_slot = Counter(c.slot for _, c in self.book.ready if c.slot)
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
            slots = {self._lane_slot.get(lane, lane) for lane in picked}
            cap = sum(rooms[key] or 0 for key in slots)
        return [(lane, self.budgets.for_lane(lane)) for lane in picked], cap, full

    def _more_candidates(self, result: ClaimResult, asked: list[tuple[str, Budget]]) -> bool:
        """Whether ``result`` reports ready lanes that its claim did not name."""
        named = {lane for lane, _ in asked}
        waiting = self.book.waiting_lanes()
        return any(lane not in named and lane not in waiting for lane in result.ready_lanes)

    def _defer(self, request: Request, claim: Claim, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self.book.defer(request, claim, loop.time() + delay)
        loop.call_later(delay, self._wake_engine)

    # -- Redis restarted, failed over or went back in time (lua/lib_guard.lua) ----------

    def _on_epoch(self, old: int, new: int) -> None:
        """A new epoch: what this worker cached about Redis may be gone from it. Forget
        the seen-set entries it remembered (a URL Redis forgot must be queued again),
        and renew at once: the claims Redis no longer knows that were not started yet
        are dropped (their requests are queued again in Redis, or will be found again)."""
        self.stats.inc_value("leased/epoch_changes")
        if isinstance(self.df, LeasedDupeFilter):
            self.df.known.clear()
        if self.keeper is not None:
            self.keeper.renew_now.set()
        logger.warning("Redis restarted, failed over or went back in time (epoch %(old)d -> "
                       "%(new)d): forgetting the seen URLs this worker remembered and the "
                       "claims Redis no longer has", {"old": old, "new": new})

    def _on_seen_gen(self, old: int, new: int) -> None:
        """The seen set moved to a new generation (LEASED_SEEN_TTL): entries this worker
        remembers as seen may have expired in Redis; forget them."""
        if isinstance(self.df, LeasedDupeFilter):
            self.df.known.clear()

    def _drop_unstarted(self, lost: set[int]) -> None:
        """Drop claims whose lease is gone and that were never handed to the engine:
        another worker processes them (recovered), or Redis forgot them (rollback)."""
        if not lost:
            return
        dropped = self.book.drop_unstarted(lost)
        if dropped:
            self.stats.inc_value("leased/dropped_lost", dropped)
        if self._kick is not None:
            self._kick.set()

    def _worker_info(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "started": self._started, "inflight": len(self.book.claims),
                           "acked": self.stats.get_value("leased/acked", 0),
                           "control": self._control, "exports": self._exports,
                           # claims held, not started (_claimsize.py: throttled slots)
                           **dict(zip(("unstarted", "unstarted_s", "slot_delay"),
                                      self._holding_info())),
                           "capacity": self.concurrency + self.sizer.margin
                           + self.sizer.batch - 1})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _request_of(response: Any) -> Request | None:
    if isinstance(response, Response):
        return response.request
    return getattr(response, "request", None)  # a Failure from a download error


def _error(failure: TwistedFailure) -> str:
    return describe(failure.value) if failure.value is not None else repr(failure)
