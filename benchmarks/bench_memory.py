"""Redis memory per seen URL and per queued request: scrapy_leased vs scrapy-redis.

    python benchmarks/bench_memory.py [--urls 1000000]

Measured on an emptied private redis-server (``FLUSHALL``) as the growth of
``INFO memory`` ``used_memory`` divided by the number of URLs, at 100,000 and at
``--urls`` URLs (``http://example.com/p/{i}``: plain GETs, one host):

* seen: the fleet-wide seen set, filled the way ``benchmarks/bench_seen_memory.py`` does
  (scrapy_leased: ``commit.lua`` through ``Frontier.commit``, queue entries deleted
  before measuring; scrapy-redis: its ``<spider>:dupefilter`` SET of 40-hex SHA-1s);
* queued: the queue alone, no seen set. scrapy_leased: ``Frontier.commit`` of
  ``NewRequest(encode_request(Request(url)), lane="example.com")`` without dedupe (the
  envelope and lane queue exactly as ``LeasedScheduler.enqueue_request`` writes them,
  minus the seen entry): priority 0 lands in the lane's LIST; scrapy-redis: its
  ``PriorityQueue`` ZSET, members made by its own ``_encode_request`` (pickle of
  ``Request.to_dict``), ZADD pipelined 1,000 at a time;
* queued with another priority: the same requests with ``priority=1``, which
  scrapy_leased keeps in the LIST of the lane's tier ``p1`` (lua/lib_settle.lua), for
  comparison.

``--priorities`` (``measure_priorities``, ``run_all.py --only memory_prio``): the queue
alone (no seen set) at priority 0, spread over 8 priorities (0..7, request i gets
i % 8: a LIST per priority, and the lane's tier index listing the 7 above 0) and at
priority 1, with every key
of the crawl listed afterwards (type, encoding, length, ``MEMORY USAGE``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import scrapy  # noqa: E402
from bench_seen_memory import (  # noqa: E402
    BATCH,
    bucket_report,
    fill_baseline,
    fill_leased_commit,
    fingerprints,
    used_memory,
)

from scrapy_leased._redis.connection import make_client  # noqa: E402
from scrapy_leased.codec import encode_request  # noqa: E402
from scrapy_leased.frontier import Frontier, NewRequest  # noqa: E402
from scrapy_leased.frontier.fingerprints import split_fingerprint  # noqa: E402
from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

CRAWL_ID = "bench"
LANE = "example.com"
SR_QUEUE_KEY = "bench:requests"  # scrapy-redis: "<spider>:requests"
PRIORITIES = tuple(range(8))  # the spread case: priorities 0..7, request j gets j % 8


class BenchSpider(scrapy.Spider):
    name = "bench"


def url(i: int) -> str:
    return f"http://example.com/p/{i}"


def fill_leased_queue(redis_url: str, keys: CrawlKeys, spider, lo: int, hi: int,
                      priority: int | None = 0) -> int:
    """Queue requests lo..hi-1 through ``Frontier.enqueue``; ``priority`` None spreads
    them over PRIORITIES (request j gets PRIORITIES[j % 8])."""
    async def main() -> int:
        f = Frontier(make_client(redis_url), keys, lease_ms=30_000, max_attempts=4)
        new = 0
        try:
            for i in range(lo, hi, BATCH):
                batch = []
                for j in range(i, min(i + BATCH, hi)):
                    p = PRIORITIES[j % len(PRIORITIES)] if priority is None else priority
                    batch.append(NewRequest(encode_request(scrapy.Request(url(j), priority=p),
                                                           spider), p, lane=LANE))
                new += sum(await f.enqueue(batch))
        finally:
            await f.client.aclose()
        return new

    return asyncio.run(main())


def fill_sr_queue(r, spider, lo: int, hi: int) -> int:
    from scrapy_redis.queue import PriorityQueue

    q = PriorityQueue(r, spider, SR_QUEUE_KEY)
    new = 0
    for i in range(lo, hi, BATCH):
        p = r.pipeline(transaction=False)
        for j in range(i, min(i + BATCH, hi)):
            req = scrapy.Request(url(j))
            p.execute_command("ZADD", q.key, -req.priority, q._encode_request(req))
        new += sum(p.execute())
    return new


def bytes_per_item(r, checkpoints: list[int], fill) -> dict[int, float]:
    """From an emptied server, ``fill(lo, hi)`` items up to each checkpoint: growth of
    used_memory / items at each."""
    r.flushall()
    base = used_memory(r)
    res: dict[int, float] = {}
    done = 0
    for cp in checkpoints:
        fill(done, cp)
        done = cp
        res[cp] = (used_memory(r) - base) / cp
    return res


@contextmanager
def private_redis(out: dict) -> Iterator[tuple[RedisServer, Any]]:
    """A redis-server of its own for one measurement, and its client; the server's
    version goes into ``out`` and its data is flushed once the measurement is done."""
    srv = RedisServer(appendonly=False).start()
    try:
        r = srv.client()
        yield srv, r
        out["redis_version"] = r.info("server")["redis_version"]
        r.flushall()
    finally:
        srv.close()


def measure(n: int, log=print) -> dict:
    checkpoints = sorted({c for c in (100_000, n) if c <= n})
    spider = BenchSpider()
    out: dict = {"checkpoints": checkpoints}
    with private_redis(out) as (srv, r):
        keys = CrawlKeys(CRAWL_ID)
        t0 = time.perf_counter()
        fps = fingerprints(n)
        pairs = [split_fingerprint(fp, 14) for fp in fps]
        hexes = [fp.hex() for fp in fps]
        del fps
        log(f"  fingerprints of {n:,} URLs: {time.perf_counter() - t0:.0f} s")

        def series(fill) -> dict[int, float]:
            return bytes_per_item(r, checkpoints, fill)

        def leased_seen(lo: int, hi: int) -> None:
            assert fill_leased_commit(srv.url, keys, pairs[lo:hi]) == hi - lo
            r.delete(keys.queue, keys.lane_fifo(""), keys.stats, keys.rids, keys.todo,
                     keys.lanes, keys.throughput)  # not part of the seen set

        t0 = time.perf_counter()
        out["leased_seen"] = series(leased_seen)
        enc, largest, _ = bucket_report(r, keys, 14)
        out["leased_seen_encodings"] = dict(enc)
        out["leased_seen_largest_bucket"] = largest
        log(f"  scrapy_leased seen set: {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        out["sr_seen"] = series(lambda lo, hi: fill_baseline(r, hexes[lo:hi]))
        log(f"  scrapy-redis seen set: {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        out["leased_queue"] = series(
            lambda lo, hi: fill_leased_queue(srv.url, keys, spider, lo, hi))
        member = r.lindex(keys.lane_fifo(LANE), 0)
        out["leased_member_bytes"] = len(member)
        out["leased_member_example"] = member.decode()
        out["leased_queue_encoding"] = r.object("encoding", keys.lane_fifo(LANE)).decode()
        log(f"  scrapy_leased queue: {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        out["sr_queue"] = series(lambda lo, hi: fill_sr_queue(r, spider, lo, hi))
        out["sr_member_bytes"] = len(r.zrange(SR_QUEUE_KEY, 0, 0)[0])
        log(f"  scrapy-redis queue: {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        out["leased_queue_prio"] = series(
            lambda lo, hi: fill_leased_queue(srv.url, keys, spider, lo, hi, priority=1))
        member = r.lindex(keys.lane_tier(LANE, "p1"), 0)
        out["leased_prio_member_bytes"] = len(member)
        out["leased_prio_member_example"] = member.decode()
        out["leased_prio_encoding"] = r.object("encoding", keys.lane_tier(LANE, "p1")).decode()
        log(f"  scrapy_leased queue, priority 1: {time.perf_counter() - t0:.0f} s")
    return out


def queue_keys_report(r, keys: CrawlKeys) -> dict[str, dict]:
    """Every key of the crawl after a fill: type, encoding, length, MEMORY USAGE."""
    out = {}
    for k in r.scan_iter(match=keys.prefix + "*", count=1000):
        name = k.decode()[len(keys.prefix):]
        kind = r.type(k).decode()
        n = {"list": r.llen, "zset": r.zcard, "hash": r.hlen, "set": r.scard}.get(
            kind, lambda _k: 1)(k)
        out[name] = {"type": kind, "encoding": r.object("encoding", k).decode(), "len": n,
                     "bytes": r.memory_usage(k, samples=0)}
    return out


def measure_priorities(n: int, log=print) -> dict:
    """Bytes per queued request (plain GETs, one lane, no seen set) at 100k and ``n``:
    all at priority 0, spread over the 8 PRIORITIES, all at priority 1."""
    checkpoints = sorted({c for c in (100_000, n) if c <= n})
    spider = BenchSpider()
    out: dict = {"checkpoints": checkpoints, "priorities": list(PRIORITIES), "cases": {}}
    with private_redis(out) as (srv, r):
        keys = CrawlKeys(CRAWL_ID)
        # the scripts loaded before the first baseline (FLUSHALL keeps them), so that the
        # first case is not charged their memory (~0.5 MB: 0.5 B per request at 1M)
        fill_leased_queue(srv.url, keys, spider, 0, 1)
        for case, prio in (("priority 0", 0), ("8 priorities", None), ("priority 1", 1)):
            t0 = time.perf_counter()

            def fill(lo: int, hi: int, prio: int | None = prio) -> None:
                assert fill_leased_queue(srv.url, keys, spider, lo, hi, prio) == hi - lo
            res = bytes_per_item(r, checkpoints, fill)
            out["cases"][case] = {"bytes": res, "keys": queue_keys_report(r, keys)}
            log(f"  scrapy_leased queue, {case}: {time.perf_counter() - t0:.0f} s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=1_000_000)
    ap.add_argument("--priorities", action="store_true",
                    help="only the queue: priority 0, 8 priorities, priority 1")
    ns = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    res = measure_priorities(ns.urls, log) if ns.priorities else measure(ns.urls, log)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
