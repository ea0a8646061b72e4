"""The open and close sequences of a worker: connect, build the frontier and its
writer, lay the run (a fresh run, one to continue, or the one on), register in the
worker registry, claim the feed files, start the background tasks; and at close, stop
them, write what is left and give back the claims not started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from scrapy import Spider, signals

from .._cancel import cancel_and_wait
from .._command import exit_if_command_line
from .._compat import asyncio_loop_in_use
from .._redis.connection import LeasedRedisError, redact
from .._redis.watchdog import EmbeddedRedisError
from .._supervise import supervise
from ..bootstrap import connect_crawl
from ..feed.drain import FeedDrainer
from ..feed.packer import RequestPacker
from ..frontier import STOPPING, CrawlKeys, Frontier
from ..frontier.run import SEED, RunMarker
from ..frontier.workerid import enter
from ..frontier.writer import LINGER_SECONDS, CommitWriter
from ..runtime import attach
from . import gcfreeze
from ._leasekeeper import Kick, LeaseKeeper
from ._throttleshare import ThrottleShare, autothrottle
from .feedexports import ExportFiles, FeedCollisionError, claim_paths, feed_exporter, local_feeds

if TYPE_CHECKING:
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)


class Opening:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker

    async def open(self, spider: Spider) -> None:
        w = self.w
        attach(w.crawler, w)  # worker_of(crawler), for the other components
        if not asyncio_loop_in_use():
            raise LeasedRedisError(
                "scrapy_leased needs an asyncio event loop: TWISTED_REACTOR = "
                "'twisted.internet.asyncioreactor.AsyncioSelectorReactor' (Scrapy's "
                "default) or TWISTED_REACTOR_ENABLED = False")
        w.spider = spider
        try:
            client, url = await connect_crawl(w.config)
        except (LeasedRedisError, EmbeddedRedisError) as exc:
            exit_if_command_line(exc)
            logger.error("%(error)s", {"error": exc})
            raise
        keys = CrawlKeys(w.config.crawl_id or spider.name)
        await self.build(client, keys, spider)
        run_on = await self.lay_run(spider)
        await self.join_run(client, keys, run_on)
        await self.start_parts(client, keys)
        if w.config.gc_freeze:
            w.stats.set_value("leased/gc_frozen", gcfreeze.hold())
            w.gc_frozen = True
        logger.info("Leased frontier %(crawl)s on %(url)s, worker %(worker)s",
                    {"crawl": keys.crawl_id, "url": redact(url), "worker": w.worker_id})

    async def build(self, client: Any, keys: CrawlKeys, spider: Spider) -> None:
        """The frontier, its commit writer, the feed drainer, the engine hooks and the
        run marker."""
        w = self.w
        w.frontier = Frontier(client, keys, lease_ms=w.config.lease_ms,
                              max_attempts=w.config.max_attempts,
                              recover_batch=w.config.recover_batch,
                              half_life_ms=w.budgets.half_life_ms,
                              caller=w.worker_id, prune_ms=w.config.prune_ms,
                              limits=w.config.limits)
        w.frontier.on_epoch = w.settle.on_epoch
        w.frontier.on_control = w.control.on_control
        await self.scrapy_redis_hint(client, keys, spider)
        # the queues' layout once flushed, when flushing (a fresh run may start a crawl
        # whose queues an earlier version laid out)
        await w.frontier.check_layout(w.config.seen_bucket_bits, w.config.seen_ttl_ms,
                                      queues=not w.config.flush_on_start)
        w.frontier.on_seen_gen = w.settle.on_seen_gen
        await w.frontier.record_half_life()
        w.writer = CommitWriter(w.frontier, w.settle.on_commit, linger=LINGER_SECONDS,
                                on_bug=w.task_failed)
        packer = RequestPacker(w.crawler.request_fingerprinter, w.config.seen_bucket_bits,
                               w.codec, w.budgets)
        w.feed = FeedDrainer(w.frontier, packer, spider, w.stats,
                             closing=lambda: w._closing,
                             entry_format=w.config.feed_format)
        w.engine.install(w.settle.on_request_finished)
        worker_ttl_ms = int(w.config.worker_ttl * 1000)
        w.run = RunMarker(client, keys, w.worker_id,
                          max(worker_ttl_ms, 3 * int(w.config.renew_interval * 1000)),
                          worker_ttl_ms, int(w.config.run_grace * 1000))

    async def lay_run(self, spider: Spider) -> bool:
        """A fresh run (LEASED_FLUSH_ON_START, or a finished crawl started again), or
        the crawl continued; registered in the worker registry; the feed files
        claimed. True when a run of the crawl was on (joined, nothing flushed)."""
        w = self.w
        assert w.frontier is not None and w.feed is not None
        # a feed key a producer wrote with the wrong command, a control key written by
        # hand: moved aside before a fresh run reads them (lua/run_flush.lua refuses them)
        await w.feed.set_aside()
        await w.control.set_aside()
        run_on = await self.w.runs.fresh_start()
        if not w.joined:  # a flush registered this worker, its id checked in one step
            await self.enter()
        await self.claim_exports(spider)
        return run_on

    async def join_run(self, client: Any, keys: CrawlKeys, run_on: bool) -> None:
        """Join the run of the crawl (and learn whether this worker seeds it), unless the
        fleet is stopping; then be in the registry before the first claim."""
        w = self.w
        assert w.frontier is not None and w.run is not None
        state = await client.hget(keys.control, "state")
        if state is not None and state in (STOPPING, STOPPING.encode()):
            # the fleet is stopping: this worker neither seeds nor claims; it closes with
            # the fleet's reason until `scrapy leased resume`
            # a WARNING: a worker started then crawls nothing and exits 0 (#25 item 8)
            logger.warning("Crawl %(crawl)s is stopping (scrapy leased stop, or a "
                           "LEASED_CLOSE_* limit): this worker closes at once without "
                           "crawling (`scrapy leased resume %(crawl)s` lets workers crawl "
                           "again)", {"crawl": keys.crawl_id})
            w.control.on_control(STOPPING)
        else:
            if not w.joined:
                w.seeds = await w.run.join() == SEED
                w.joined = True
                if w.seeds and run_on:
                    # the run found on ended before this worker joined it (its last worker
                    # closed in between): this worker begins a new run, which starts afresh
                    # as it would have a moment later, rather than sending its start
                    # requests again into a finished crawl's seen set
                    await self.w.runs.fresh_start()
                if w.seeds and w.config.resume:
                    await self.w.runs.say_resumed()
        # in the registry with its host and pid before its first claim (status, reset);
        # if Redis fails now, the first heartbeat records them
        with contextlib.suppress(RedisError, OSError):
            await w.frontier.renew(w.worker_id, [], w.worker_info())

    async def start_parts(self, client: Any, keys: CrawlKeys) -> None:
        """Signals connected, the lease keeper, the shared AutoThrottle, and the
        background tasks: the claim loop, the renewals, the recovery of expired leases."""
        w = self.w
        assert w.frontier is not None and w.run is not None
        w.failures.connect(w.crawler)
        w.crawler.signals.connect(w.slots.on_reached_downloader,
                                  signals.request_reached_downloader)
        w.crawler.signals.connect(w.slots.left, signals.request_left_downloader)
        w.kick = Kick()
        w.claims.round_done = asyncio.Event()
        w.keeper = LeaseKeeper(
            w.frontier, w.run, w.book, w.stats, worker_id=w.worker_id,
            renew_interval=w.config.renew_interval,
            sweep_interval=w.config.sweep_interval, closing=lambda: w._closing,
            worker_info=w.worker_info, on_lost=w.settle.drop_unstarted,
            on_recovered=w.kick.set, warn=w.warn)
        if w.joined:
            # revisits that fell due while no worker ran are queued before the first claim,
            # so that a worker finding nothing else does not take the crawl for finished
            with contextlib.suppress(RedisError, OSError):
                await w.keeper.revisit()
        extension = autothrottle(w.crawler)
        if w.config.shared_autothrottle and extension is not None:
            # the fleet's delays read before the first request reaches a download slot
            w.throttle = ThrottleShare(w.crawler, client, keys, extension,
                                       closing=lambda: w._closing, warn=w.warn)
            await w.throttle.start()
            w.throttle.connect()
            w.throttle.on_read = w.engine.wake
        w._tasks = [supervise(name, coro, w.task_failed) for name, coro in
                    (("the claim loop", w.claims.run()),
                     ("the lease renewals", w.keeper.renew_loop()),
                     ("the recovery of expired leases", w.keeper.sweep_loop()))]
        if w.throttle is not None:
            w._tasks.append(supervise("the shared AutoThrottle", w.throttle.run(),
                                      w.task_failed))

    async def scrapy_redis_hint(self, client: Any, keys: CrawlKeys, spider: Spider) -> None:
        """A WARNING when the spider has scrapy-redis state in this Redis (a queue, start
        URLs, a dupefilter: feed/fromscrapyredis.py), which this crawl does not read."""
        from ..feed import fromscrapyredis

        try:
            found = await fromscrapyredis.find(
                client, fromscrapyredis.SourceKeys.of(spider.name, self.w.crawler.settings))
            exists = bool(found) and bool(await client.exists(keys.meta, keys.stats))
        except (RedisError, OSError):  # only a hint: the crawl goes on without it
            return
        message = fromscrapyredis.warning(found, spider.name, exists)
        if message:
            logger.warning("%(message)s", {"message": message})

    async def enter(self) -> None:
        """Register in the crawl's worker registry (lua/worker_enter.lua: the check and the
        write in one script), under a new id when a live worker has this one, before the
        heartbeat, the run, the claims and the commits use it. After a flush (which reads
        the registry: workers registered before would keep one another from flushing);
        a flush under an id in use changes nothing, as that worker's run is on."""
        assert self.w.frontier is not None and self.w.run is not None
        keys = self.w.frontier.keys
        self.w.worker_id, taken = await enter(self.w.frontier.client, keys, self.w.worker_id,
                                            int(self.w.config.worker_ttl * 1000))
        self.w.frontier.caller = self.w.run.worker_id = self.w.worker_id
        if taken:
            logger.warning("Worker id %(taken)s is alive in crawl %(crawl)s already: this "
                           "worker is %(worker)s", {"taken": ", ".join(taken),
                                                    "crawl": keys.crawl_id,
                                                    "worker": self.w.worker_id})

    async def claim_exports(self, spider: Spider) -> None:
        """The feed exports (worker/feedexports.py): this worker's local feed files recorded in
        its registry entry, or one error at open when a live worker of the crawl on this
        host writes one of them; the feed files flushed before each commit that acks."""
        assert self.w.frontier is not None and self.w.writer is not None
        paths, uncovered = local_feeds(self.w.crawler, spider)
        if uncovered:
            logger.warning("FEEDS: not flushed before the pages of their items are acked, "
                           "so a worker killed with kill -9 may lose items of acked pages: "
                           "%(feeds)s (UpsertPipeline keeps every item: docs/upsert.md)",
                           {"feeds": "; ".join(uncovered)})
        if paths:
            self.w.exports = paths
            try:
                await claim_paths(self.w.frontier.client, self.w.frontier.keys, self.w.worker_id,
                                  int(self.w.config.worker_ttl * 1000), self.w.worker_info(),
                                  paths)
            except FeedCollisionError as exc:
                await self.w.frontier.client.aclose()
                exit_if_command_line(exc)  # scrapy crawl: one line, exit status 1
                logger.error("%(error)s", {"error": exc})
                raise
        if feed_exporter(self.w.crawler) is not None:
            self.w.writer.before_acks = ExportFiles.for_crawler(self.w.crawler).make_durable

    async def close(self, reason: str) -> None:
        try:
            await self.close_parts()
        finally:
            if self.w.gc_frozen:
                self.w.gc_frozen = False
                gcfreeze.release()

    async def close_parts(self) -> None:
        w = self.w
        assert w.frontier is not None and w.writer is not None
        w._closing = True
        if await cancel_and_wait(w._tasks):
            logger.warning("A background task of this worker did not end when cancelled; "
                           "closing without it")
        if w.claims.round_done is not None:
            w.claims.round_done.set()  # a start() pacing wait ends
        if not await w.writer.drain(timeout=max(30.0, w.config.lease_seconds), final=True):
            logger.error("Could not write everything to Redis before closing; the claims "
                         "concerned return to the queue when their leases expire")
        w.slots.cancel_timer()
        # Claims still here were never started (or wait for a retry): give them back,
        # with those of a claim call whose reply was lost, and those being given back.
        tokens = w.book.unstarted() + w.slots.giving
        tokens += [(token, env.lane) for token, env in w.claims.absorbing
                   if token not in w.book.claims and token not in w.book.settling]
        try:
            tokens += [(token, env.lane) for token, env in await w.frontier.resolve_claim()]
        except (RedisError, OSError):
            pass  # its claims, if it ran, return to the queue when their leases expire
        try:
            released = await w.frontier.release(w.worker_id, tokens)
            if w.run is not None and w.joined and await w.run.leave():
                if w.config.run_grace:
                    logger.info("Last worker of this run of the crawl: the run ended; a "
                                "worker starting within LEASED_RUN_GRACE (%(grace)gs) joins "
                                "it without running start()",
                                {"grace": w.config.run_grace})
                else:
                    logger.info("Last worker of this run of the crawl: the run ended (the "
                                "next worker to start runs start() again)")
        except (RedisError, OSError) as exc:
            logger.error("Could not release %(n)d claims (%(exc)s); they return to the queue "
                         "when their leases expire", {"n": len(tokens), "exc": exc})
        else:
            w.stats.inc_value("leased/released", released)
            if released:
                logger.info("Released %(n)d unstarted requests back to the queue",
                            {"n": released})
        w.book.clear()
        w.tally.flush()  # before Scrapy dumps its stats
        await w.frontier.client.aclose()
