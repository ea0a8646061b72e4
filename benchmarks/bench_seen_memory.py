"""Memory of the fleet-wide seen set: scrapy_leased's layout vs scrapy-redis's.

    python benchmarks/bench_seen_memory.py [--urls 1000000] [--bits 14] [--via commit|pipeline]

Starts its own redis-server on a free port (tests/support/redis_server.py), computes N
real fingerprints (Scrapy's default request fingerprinter on
``Request(f"http://example.com/p/{i}")``) and measures, from ``INFO memory`` used_memory
on an emptied server, the bytes each seen URL costs in:

* scrapy_leased: 2**bits SETs of signed 64-bit integers (``split_fingerprint``), filled
  with the real ``commit.lua`` through ``Frontier.commit`` in batches of 1000 (``--via
  commit``, the default; the queue entries commit also writes are deleted before each
  measurement) or with plain SADDs of the same bucket/member values (``--via pipeline``);
* scrapy-redis: one SET of 40-character hex fingerprints (its ``<spider>:dupefilter``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from scrapy import Request  # noqa: E402
from scrapy.utils.request import RequestFingerprinter  # noqa: E402

from scrapy_leased._redis.connection import make_client  # noqa: E402
from scrapy_leased.frontier import Frontier, NewRequest  # noqa: E402
from scrapy_leased.frontier.fingerprints import split_fingerprint  # noqa: E402
from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

BATCH = 1000
CRAWL_ID = "bench"
BASELINE_KEY = "bench:dupefilter"  # scrapy-redis: "<spider>:dupefilter"


def used_memory(r) -> int:
    return int(r.info("memory")["used_memory"])


def fingerprints(n: int) -> list[bytes]:
    fp = RequestFingerprinter()  # what crawler.request_fingerprinter is by default
    return [fp.fingerprint(Request(f"http://example.com/p/{i}")) for i in range(n)]


def fill_leased_commit(url: str, keys: CrawlKeys, pairs: list[tuple[int, int]]) -> int:
    async def main() -> int:
        f = Frontier(make_client(url), keys, lease_ms=30_000, max_attempts=4)
        new = 0
        try:
            for i in range(0, len(pairs), BATCH):
                queued = await f.enqueue([NewRequest("", 0, b, m) for b, m in pairs[i:i + BATCH]])
                new += sum(queued)
        finally:
            await f.client.aclose()
        return new

    return asyncio.run(main())


def fill_leased_pipeline(r, keys: CrawlKeys, pairs: list[tuple[int, int]]) -> int:
    new = 0
    for i in range(0, len(pairs), BATCH):
        p = r.pipeline(transaction=False)
        for b, m in pairs[i:i + BATCH]:
            p.sadd(keys.seen_bucket(b), m)
        new += sum(p.execute())
    return new


def fill_baseline(r, hexes: list[str]) -> int:
    new = 0
    for i in range(0, len(hexes), BATCH):
        p = r.pipeline(transaction=False)
        for h in hexes[i:i + BATCH]:
            p.sadd(BASELINE_KEY, h)
        new += sum(p.execute())
    return new


def bucket_report(r, keys: CrawlKeys, bits: int) -> tuple[Counter, int, int]:
    """(encodings, largest bucket, sum of MEMORY USAGE) over all bucket keys."""
    p = r.pipeline(transaction=False)
    for b in range(2 ** bits):
        k = keys.seen_bucket(b)
        p.object("encoding", k)
        p.scard(k)
        p.memory_usage(k, samples=0)
    out = p.execute()
    enc = Counter(e.decode() if isinstance(e, bytes) else e for e in out[0::3] if e is not None)
    return enc, max(out[1::3]), sum(x or 0 for x in out[2::3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls", type=int, default=1_000_000)
    ap.add_argument("--bits", type=int, default=14)
    ap.add_argument("--via", choices=("commit", "pipeline"), default="commit")
    args = ap.parse_args()
    n, bits = args.urls, args.bits
    checkpoints = sorted({c for c in (100_000, n) if c <= n})

    srv = RedisServer(appendonly=False).start()
    try:
        r = srv.client()
        info = r.info("server")
        intset_max = r.config_get("set-max-intset-entries")["set-max-intset-entries"]
        print("seen-set memory: scrapy_leased vs scrapy-redis layout")
        print(f"redis-server {info['redis_version']} (private, {srv.url}), "
              f"set-max-intset-entries {intset_max}")

        t0 = time.perf_counter()
        fps = fingerprints(n)
        print(f"fingerprints: Scrapy's default RequestFingerprinter on "
              f'Request("http://example.com/p/{{i}}"), {n:,} URLs, '
              f"{time.perf_counter() - t0:.1f} s")
        pairs = [split_fingerprint(fp, bits) for fp in fps]
        hexes = [fp.hex() for fp in fps]
        del fps
        keys = CrawlKeys(CRAWL_ID)
        how = (f"Frontier.commit (lua/commit.lua) in batches of {BATCH}; the queue entries "
               f"commit also writes are deleted before each measurement"
               if args.via == "commit" else
               f"SADD of the same bucket/member values through a pipeline, batches of {BATCH}")
        print(f"scrapy_leased: 2**{bits} = {2 ** bits} SETs of 64-bit integers "
              f"(split_fingerprint), pushed with {how}")
        print(f"scrapy-redis : one SET of 40-char hex fingerprints, SADD through a pipeline "
              f"in batches of {BATCH}")
        print("bytes per URL = growth of INFO memory used_memory from an empty server (FLUSHALL)")
        print()

        # --- scrapy_leased layout
        r.flushall()
        base = used_memory(r)
        leased: dict[int, float] = {}
        done = 0
        t0 = time.perf_counter()
        for cp in checkpoints:
            chunk = pairs[done:cp]
            new = (fill_leased_commit(srv.url, keys, chunk) if args.via == "commit"
                   else fill_leased_pipeline(r, keys, chunk))
            assert new == len(chunk), f"{len(chunk) - new} fingerprints collided"
            done = cp
            # not part of the seen set
            r.delete(keys.queue, keys.lane_fifo(""), keys.stats)
            leased[cp] = (used_memory(r) - base) / cp
        leased_s = time.perf_counter() - t0
        enc, largest, usage = bucket_report(r, keys, bits)

        # --- scrapy-redis layout
        r.flushall()
        base = used_memory(r)
        baseline: dict[int, float] = {}
        done = 0
        for cp in checkpoints:
            new = fill_baseline(r, hexes[done:cp])
            assert new == cp - done
            done = cp
            baseline[cp] = (used_memory(r) - base) / cp
        base_enc = r.object("encoding", BASELINE_KEY)
        base_enc = base_enc.decode() if isinstance(base_enc, bytes) else base_enc
        base_usage = r.memory_usage(BASELINE_KEY, samples=0)
        r.flushall()

        print(f"{'URLs':>10} | {'scrapy_leased B/URL':>19} | {'scrapy-redis B/URL':>18} | ratio")
        for cp in checkpoints:
            print(f"{cp:>10,} | {leased[cp]:>19.1f} | {baseline[cp]:>18.1f} | "
                  f"{baseline[cp] / leased[cp]:.1f}x smaller")
        print()
        print(f"encodings at {n:,}: scrapy_leased "
              + ", ".join(f"{e} x{c}" for e, c in enc.most_common())
              + f" (largest bucket {largest} members); scrapy-redis {base_enc} x1")
        print(f"cross-check, MEMORY USAGE at {n:,}: scrapy_leased buckets {usage:,} B "
              f"({usage / n:.1f} B/URL), scrapy-redis set {base_usage:,} B "
              f"({base_usage / n:.1f} B/URL)")
        print(f"scrapy_leased fill time: {leased_s:.1f} s ({args.via})")
        if n >= 1_000_000:
            verdict = "met" if leased[n] <= 16 else "MISSED"
            print(f"target <= 16 B/URL at {n:,}: {verdict} ({leased[n]:.1f} B/URL)")
        return 0
    finally:
        srv.close()


if __name__ == "__main__":
    sys.exit(main())
