"""Scheduler alone (no network): enqueue and dequeue rates of one scheduler, one run.

    python benchmarks/bench_scheduler.py --which leased|scrapy|scrapy_redis \\
        [--n 50000] [--redis-url URL] [--concurrency 16]

Prints one JSON line. ``benchmarks/run_all.py`` runs it in a fresh process per
repetition and scheduler, against an emptied private redis-server.

Every scheduler is the real class, built by Scrapy from a real ``Crawler``
(``scrapy.utils.test.get_crawler``: settings, stats, request fingerprinter,
dupefilter from ``DUPEFILTER_CLASS``) and driven through Scrapy's scheduler
interface, the way the engine drives it:

* enqueue: ``enqueue_request`` for N distinct requests shaped like the ones a crawl
  produces (``callback=spider.parse``, ``meta={"depth": 1}``, a ``Referer`` header),
  10 at a time (one page's links) with a return to the event loop in between;
  scrapy_leased's rate includes the wait until its ``CommitWriter`` has written all of
  them to Redis;
* dequeue: ``next_request`` until N requests were handed out, with at most
  ``CONCURRENT_REQUESTS`` (16) in flight as in the engine; each handed-out request is
  "downloaded" instantly and finished the way the engine finishes it (removed from the
  engine slot's ``inprogress`` set); before that, its download slot is looked up
  (``Downloader.get_slot_key``, which parses the URL once per request object), as the
  engine's ``fetch`` does first with every request, so for scrapy_leased a dequeue is a full cycle:
  claim (``claim.lua`` through the scheduler's own claim loop), hand out, finish, ack
  (``commit.lua``); the rate includes the wait until every ack is in Redis. For
  Scrapy's and scrapy-redis's schedulers a dequeue is ``next_request`` alone (they
  have no acknowledgement).

The engine itself is replaced by a stand-in with the two things schedulers use: a
real ``Downloader`` (slot keys, for Scrapy's ``DownloaderAwarePriorityQueue``) and a
slot with ``inprogress`` and ``nextcall`` (how scrapy_leased follows completion and
wakes the engine when claims arrive). No request is downloaded.

For scrapy_leased, ``--which leased_ops`` also measures each operation alone with the
exact calls the scheduler makes (``Frontier.claim`` of ``CONCURRENT_REQUESTS`` requests
+ ``decode_request``, as ``_claim_loop``/``_absorb`` do; ``CommitWriter.add_ack`` as
claims finish, 16 at a time), so claim and ack have separate rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from scrapy.utils.reactor import install_reactor  # noqa: E402

install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")

import scrapy  # noqa: E402
from benchspider import BenchSpider  # noqa: E402
from scrapy.core.downloader import Downloader  # noqa: E402
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future  # noqa: E402
from scrapy.utils.misc import load_object  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402

PAGE_LINKS = 10  # requests enqueued between two returns to the event loop


def make_requests(spider: BenchSpider, n: int) -> list[scrapy.Request]:
    ref = {"Referer": "http://example.com/p/0"}
    return [scrapy.Request(f"http://example.com/p/{i}", callback=spider.parse,
                           meta={"depth": 1}, headers=ref) for i in range(1, n + 1)]


class _NextCall:
    """The engine's ``nextcall``: scrapy_leased calls ``schedule()`` when claims arrive."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def schedule(self, delay: float = 0) -> None:
        self.event.set()


def settings_for(which: str, redis_url: str | None, concurrency: int) -> dict[str, Any]:
    common = {"LOG_LEVEL": "WARNING", "CONCURRENT_REQUESTS": concurrency}
    if which.startswith("leased"):
        return {**common, "ADDONS": {"scrapy_leased.Addon": 100}, "LEASED_REDIS_URL": redis_url,
                "LEASED_CRAWL_ID": f"bench-{uuid.uuid4().hex[:8]}",
                "LEASED_UPSERT_ENABLED": False}
    if which == "scrapy_redis":
        return {**common, "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
                "SCHEDULER_PERSIST": True, "REDIS_URL": redis_url}
    return common  # Scrapy's defaults: in-memory queues, RFPDupeFilter


async def open_scheduler(which: str, redis_url: str | None, concurrency: int):
    crawler = get_crawler(BenchSpider, settings_for(which, redis_url, concurrency))
    spider = crawler._create_spider()
    crawler.spider = spider
    slot = SimpleNamespace(inprogress=set(), nextcall=_NextCall(), closing=None)
    # no scraper queue: each request is finished as soon as it is handed out
    crawler.engine = SimpleNamespace(downloader=Downloader(crawler), _slot=slot,
                                     scraper=SimpleNamespace(slot=None))
    sched_cls = load_object(crawler.settings["SCHEDULER"])
    sched = sched_cls.from_crawler(crawler)
    d = sched.open(spider)
    if d is not None:
        await maybe_deferred_to_future(d)
    return crawler, spider, slot, sched


async def close_scheduler(sched) -> None:
    d = sched.close("finished")
    if d is not None:
        await maybe_deferred_to_future(d)


async def run_scheduler(which: str, n: int, redis_url: str | None, concurrency: int) -> dict:
    crawler, spider, slot, sched = await open_scheduler(which, redis_url, concurrency)
    reqs = make_requests(spider, n)
    writer = getattr(sched, "writer", None)

    # -- enqueue
    t0 = time.perf_counter()
    accepted = 0
    for i, r in enumerate(reqs, 1):
        accepted += bool(sched.enqueue_request(r))
        if i % PAGE_LINKS == 0:
            await asyncio.sleep(0)
    if writer is not None:
        await writer.drain()
    t_enq = time.perf_counter() - t0
    if writer is not None:
        accepted = crawler.stats.get_value("leased/enqueued", 0)
    del reqs

    # -- dequeue (scrapy_leased: claim + hand out + finish + ack)
    nextcall: _NextCall = slot.nextcall
    downloader = crawler.engine.downloader
    handed = 0
    t0 = time.perf_counter()
    t_last_handed = t0
    idle_rounds = 0
    while handed < accepted:
        inflight = []
        while len(inflight) < concurrency:
            r = sched.next_request()
            if r is None:
                break
            downloader.get_slot_key(r)  # as the engine's fetch does first (_get_slot)
            slot.inprogress.add(r)
            inflight.append(r)
        if inflight:
            handed += len(inflight)
            t_last_handed = time.perf_counter()
            for r in inflight:  # downloaded instantly; the engine finishes it
                slot.inprogress.remove(r)
            idle_rounds = 0
            await asyncio.sleep(0)
            continue
        if writer is None:  # synchronous schedulers: None means empty
            break
        nextcall.event.clear()  # the engine waits until the scheduler wakes it
        try:
            await asyncio.wait_for(nextcall.event.wait(), 1.0)
        except asyncio.TimeoutError:
            idle_rounds += 1
            if idle_rounds > 10:
                raise RuntimeError(
                    f"{which}: stuck after {handed} of {accepted} requests") from None
    claimed_s = t_last_handed - t0
    if writer is not None:
        await writer.drain()
    t_deq = time.perf_counter() - t0
    stats = crawler.stats.get_stats()
    await close_scheduler(sched)
    return {
        "which": which, "n": n, "accepted": accepted, "dequeued": handed,
        "enqueue_s": t_enq, "dequeue_s": t_deq, "claimed_s": claimed_s,
        "enqueue_rate": accepted / t_enq, "dequeue_rate": handed / t_deq,
        "acked": stats.get("leased/acked"), "claimed": stats.get("leased/claimed"),
    }


async def run_leased_ops(n: int, redis_url: str, concurrency: int) -> dict:
    """claim alone and ack alone, with the calls LeasedScheduler makes."""
    from scrapy_leased.codec import decode_request
    from scrapy_leased.meta import META_CLAIM

    crawler, spider, slot, sched = await open_scheduler("leased", redis_url, concurrency)
    # stop the scheduler's own background loops (as its close() does): this run calls
    # the frontier directly
    sched._closing = True
    for task in sched._tasks:
        task.cancel()
    await asyncio.gather(*sched._tasks, return_exceptions=True)
    sched._tasks = []
    reqs = make_requests(spider, n)
    t0 = time.perf_counter()
    for i, r in enumerate(reqs, 1):
        sched.enqueue_request(r)
        if i % PAGE_LINKS == 0:
            await asyncio.sleep(0)
    await sched.writer.drain()
    t_enq = time.perf_counter() - t0
    del reqs
    frontier, writer = sched.frontier, sched.writer

    # -- claim alone: claim.lua, CONCURRENT_REQUESTS at a time, payloads decoded
    claims: list[tuple[int, int]] = []
    lanes: list[str] = []
    t0 = time.perf_counter()
    while True:
        result = await frontier.claim(concurrency, sched.worker_id,
                                      [(lane, sched.budgets.for_lane(lane)) for lane in lanes])
        if not result.claims and set(result.ready_lanes) - set(lanes):
            lanes = result.ready_lanes
            continue
        lanes = result.ready_lanes
        if not result.claims:
            break
        for token, env in result.claims:
            request = decode_request(env.payload, spider, env.priority)
            request.meta[META_CLAIM] = token
            claims.append((token, env.rid))
    t_claim = time.perf_counter() - t0

    # -- ack alone: CommitWriter, acks arriving CONCURRENT_REQUESTS at a time
    t0 = time.perf_counter()
    for i in range(0, len(claims), concurrency):
        for token, rid in claims[i:i + concurrency]:
            writer.add_ack(token, rid)
        await asyncio.sleep(0)
    await writer.drain()
    t_ack = time.perf_counter() - t0
    acked = crawler.stats.get_value("leased/acked", 0)
    await close_scheduler(sched)
    return {"which": "leased_ops", "n": n, "claimed": len(claims), "acked": acked,
            "enqueue_rate": n / t_enq, "claim_rate": len(claims) / t_claim,
            "ack_rate": acked / t_ack, "claim_s": t_claim, "ack_s": t_ack}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--which", required=True,
                    choices=("leased", "leased_ops", "scrapy", "scrapy_redis"))
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--profile", default=None, help="write a cProfile dump here")
    ns = ap.parse_args()
    if ns.which != "scrapy" and not ns.redis_url:
        ap.error("--redis-url is required for this scheduler")

    from twisted.internet import reactor

    out: dict[str, Any] = {}

    async def go() -> None:
        if ns.which == "leased_ops":
            out.update(await run_leased_ops(ns.n, ns.redis_url, ns.concurrency))
        else:
            out.update(await run_scheduler(ns.which, ns.n, ns.redis_url, ns.concurrency))

    def done(result: Any) -> None:
        if hasattr(result, "getTraceback"):
            out["error"] = result.getTraceback()
        reactor.stop()

    def start() -> None:
        deferred_from_coro(go()).addBoth(done)

    prof = None
    if ns.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    reactor.callWhenRunning(start)
    reactor.run()
    if prof is not None:
        prof.disable()
        prof.dump_stats(ns.profile)
    print(json.dumps(out), flush=True)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
