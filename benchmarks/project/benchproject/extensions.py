"""Benchmark-only extensions: a per-worker report, and an idle timeout for scrapy-redis."""

from __future__ import annotations

import gc
import json
import os
import resource
import time

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured

from scrapy_leased.runtime import worker_of

# Requests written to a Redis socket by this process (one per command, or one per
# pipeline): the client side of "round trips". Counted by wrapping redis-py's
# send_packed_command, for its synchronous (scrapy-redis) and asyncio (scrapy_leased)
# connections.
SENDS = {"sync": 0, "async": 0}


def _count_redis_sends() -> None:
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    if getattr(sconn.AbstractConnection.send_packed_command, "_bench", False):
        return
    sync_send = sconn.AbstractConnection.send_packed_command
    async_send = aconn.AbstractConnection.send_packed_command

    def send(self, command, check_health=True):
        SENDS["sync"] += 1
        return sync_send(self, command, check_health)

    async def asend(self, command, check_health=True):
        SENDS["async"] += 1
        return await async_send(self, command, check_health)

    send._bench = asend._bench = True
    sconn.AbstractConnection.send_packed_command = send
    aconn.AbstractConnection.send_packed_command = asend


_count_redis_sends()  # at import, before the scheduler opens its connections


def _context_switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of this process so far (Linux)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_nvcsw, ru.ru_nivcsw


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class BenchReport:
    """At spider_closed (after the scheduler closed), writes one JSON object to the
    file named by ``BENCH_REPORT``: close reason, a few stats, Redis sends.

    With ``BENCH_SAMPLE`` (seconds, e.g. 0.02) it also samples, from the spider's
    opening to its closing, what this worker holds: requests in the downloader
    (``downloader.active``: what Scrapy counts against CONCURRENT_REQUESTS), requests
    on the wire (``transferring`` of every download slot) and, for scrapy_leased's
    scheduler, claims held (``_claims``), claims not yet handed to the engine
    (``book.ready`` + ``book.suspects`` + ``book.deferred``: leases no other worker can take) and
    requests handed to the engine and not finished (``_handed``). The samples go into
    the report as rows ``[t, active, transferring, claims, unstarted, handed]``
    (-1 where the scheduler has no such thing); benchmarks/bench_latency.py averages
    them over the crawl's span. Reads private attributes: a benchmark's probe only."""

    def __init__(self, crawler, path: str, sample: float = 0.0) -> None:
        self.crawler = crawler
        self.path = path
        self.opened = time.time()
        self.cpu_opened = _cpu_seconds()
        self.csw_opened = _context_switches()
        self.sample_every = sample
        self.samples: list[list[float]] = []
        self._loop = None

    @classmethod
    def from_crawler(cls, crawler):
        settings = crawler.settings
        if not settings.get("BENCH_REPORT"):
            raise NotConfigured  # not a benchmark's run
        o = cls(crawler, settings["BENCH_REPORT"], settings.getfloat("BENCH_SAMPLE", 0.0))
        handlers = {signals.spider_closed: o.spider_closed}
        if o.sample_every > 0:
            handlers[signals.spider_opened] = o.spider_opened
        for signal, handler in handlers.items():
            crawler.signals.connect(handler, signal=signal)
        return o

    def spider_opened(self, spider):
        from twisted.internet import task

        self._loop = task.LoopingCall(self._sample)
        self._loop.start(self.sample_every, now=True)

    def _sample(self) -> None:
        engine = self.crawler.engine
        downloader = getattr(engine, "downloader", None)
        if downloader is None:
            return
        transferring = sum(len(s.transferring) for s in downloader.slots.values())
        sched = worker_of(self.crawler)
        claims = unstarted = handed = -1
        if sched is not None:
            book = sched.book
            claims = len(book.claims)
            unstarted = len(book.ready) + len(book.suspects) + len(book.deferred)
            handed = len(book.handed)
        self.samples.append([round(time.time(), 4), len(downloader.active), transferring,
                             claims, unstarted, handed])

    def spider_closed(self, spider, reason):
        stats = self.crawler.stats.get_stats()
        keep = ("response_received_count", "item_scraped_count", "downloader/request_count",
                "dupefilter/filtered", "leased/claimed", "leased/acked", "leased/enqueued",
                "leased/budget_waits", "scheduler/enqueued/redis", "scheduler/dequeued/redis")
        report = {
            "pid": os.getpid(), "reason": reason, "opened": self.opened, "closed": time.time(),
            "stats": {k: stats.get(k) for k in keep if stats.get(k) is not None},
            "redis_sends": SENDS["sync"] + SENDS["async"],
            "cpu_s": _cpu_seconds(),  # the whole process, start-up included
            "crawl_cpu_s": _cpu_seconds() - self.cpu_opened,  # from the crawler's creation
            "crawl_switches": [b - a for a, b in zip(self.csw_opened, _context_switches())],
        }
        if self._loop is not None:
            if self._loop.running:
                self._loop.stop()
            report["samples"] = self.samples
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(report, f)


class IdleClose:
    """For scrapy-redis workers (a plain Spider never waits for peers): keep an idle
    worker open until it has had no response for ``BENCH_IDLE_CLOSE`` seconds, then
    let it close with reason ``finished``. Scrapy fires spider_idle again every 5 s
    (its heartbeat), when scrapy-redis's scheduler polls the shared queue again."""

    def __init__(self, crawler, seconds: float) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    @classmethod
    def from_crawler(cls, crawler):
        o = cls(crawler, crawler.settings.getfloat("BENCH_IDLE_CLOSE", 6))
        crawler.signals.connect(o.response_received, signal=signals.response_received)
        crawler.signals.connect(o.spider_idle, signal=signals.spider_idle)
        return o

    def response_received(self, response, request, spider):
        self.last = time.monotonic()

    def spider_idle(self, spider):
        if time.monotonic() - self.last < self.seconds:
            raise DontCloseSpider


class GcFreeze:
    """``BENCH_GC_FREEZE``: what ``LEASED_GC_FREEZE`` does in a worker
    (scrapy_leased/worker/gcfreeze.py), done to plain Scrapy: once the spider has opened,
    garbage collected once and every object alive frozen (``gc.freeze``), so that full
    collections no longer walk the start-up objects. The control that tells the
    add-on's own cost from the freeze's gain."""

    @classmethod
    def from_crawler(cls, crawler):
        if not crawler.settings.getbool("BENCH_GC_FREEZE"):
            raise NotConfigured
        o = cls()
        crawler.signals.connect(o.spider_opened, signal=signals.spider_opened)
        return o

    def spider_opened(self, spider):
        gc.collect()
        gc.freeze()
