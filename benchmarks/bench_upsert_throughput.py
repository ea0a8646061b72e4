"""Items/s of UpsertPipeline per backend: batched (LEASED_UPSERT_BATCH_SIZE=500) against
a one-write-per-item baseline (batch size 1), same items, same pipeline code.

    python benchmarks/bench_upsert_throughput.py [--items 10000] [--concurrency 100]
                                           [--postgres-url URL]

Starts a private redis-server (from PATH) on a free port, writes SQLite files in a
temp dir, and uses the PostgreSQL at --postgres-url (default: the local server,
database ``test``; skipped with a message when unreachable). Each run writes fresh
tables (removed afterwards) and checks that records == distinct keys.
``--concurrency`` is how many items are in the pipeline at once (Scrapy's
CONCURRENT_ITEMS is 100 per response).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from scrapy import Spider  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402

from scrapy_leased.frontier.keys import CrawlKeys  # noqa: E402
from scrapy_leased.upsert import UpsertPipeline  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


def make_item(i: int) -> dict:
    return {"url": f"https://shop.example/product/{i}", "title": f"Product {i}",
            "price": round(9.99 + i % 500, 2), "currency": "EUR", "in_stock": i % 3 != 0,
            "sku": f"SKU-{i:08d}", "brand": f"brand-{i % 37}",
            "tags": ["a", "b", f"t{i % 11}"], "description": "lorem ipsum " * 8}


async def run(settings: dict, items: int, concurrency: int) -> tuple[float, int, int]:
    """(seconds, records stored, store round trips) for ``items`` distinct items."""
    crawler = get_crawler(settings_dict=settings)
    crawler.spider = Spider(name="bench")
    pipe = UpsertPipeline.from_crawler(crawler)
    await pipe.open_spider()
    try:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                item = make_item(i)
                pipe.fences.note(item, i + 1)  # as the fence middleware does
                await pipe.process_item(item)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(items)))
        elapsed = time.perf_counter() - start
        stored = await pipe.store.count("dict")
    finally:
        await pipe.close_spider()
    return elapsed, stored, crawler.stats.get_value("leased/upsert/batches", 0)


def drop_pg(url: str, prefixes: list[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        for p in prefixes:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{p}_dict")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=10_000, help="items stored per run")
    ap.add_argument("--concurrency", type=int, default=100,
                    help="items in the pipeline at once (Scrapy's CONCURRENT_ITEMS)")
    ap.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test",
                    help="the PostgreSQL to write to (skipped when unreachable)")
    ns = ap.parse_args()

    redis = RedisServer(appendonly=False).start()
    tmp = Path(tempfile.mkdtemp(prefix="leased-bench-"))
    crawl = f"bench-{uuid.uuid4().hex[:8]}"
    backends: list[tuple[str, dict]] = [
        ("redis", {"LEASED_REDIS_URL": redis.url, "LEASED_UPSERT_ENABLED": True}),
        ("sqlite", {"LEASED_UPSERT_URL": f"sqlite:///{tmp}/bench.db"}),
    ]
    try:
        import psycopg

        psycopg.connect(ns.postgres_url, connect_timeout=3).close()
        backends.append(("postgresql", {"LEASED_UPSERT_URL": ns.postgres_url}))
    except Exception as exc:
        print(f"postgresql: skipped ({type(exc).__name__}: {exc})")
    pg_prefixes: list[str] = []
    print(f"{ns.items} distinct items per run, {ns.concurrency} in the pipeline at once")
    print(f"{'backend':<11} {'batched items/s':>16} {'1-per-item items/s':>19} "
          f"{'ratio':>7} {'round trips':>18}")
    try:
        for name, base in backends:
            result = {}
            for mode, batch in (("batched", 500), ("single", 1)):
                prefix = f"bench_{mode}_{uuid.uuid4().hex[:6]}"
                pg_prefixes.append(prefix)
                settings = {"LEASED_CRAWL_ID": crawl, "LEASED_UPSERT_PREFIX": prefix,
                            "LEASED_UPSERT_BATCH_SIZE": batch, "LOG_LEVEL": "WARNING", **base}
                elapsed, stored, trips = asyncio.run(run(settings, ns.items, ns.concurrency))
                if stored != ns.items:
                    raise SystemExit(f"{name} {mode}: {stored} records for {ns.items} keys")
                result[mode] = (ns.items / elapsed, trips)
            (b, bt), (s, st) = result["batched"], result["single"]
            print(f"{name:<11} {b:>16,.0f} {s:>19,.0f} {b / s:>6.1f}x {bt:>8} vs {st:<8}",
                  flush=True)
        print("records == distinct keys in every run")
    finally:
        if any(n == "postgresql" for n, _ in backends):
            drop_pg(ns.postgres_url, pg_prefixes)
        client = redis.client()
        for key in client.scan_iter(match=CrawlKeys(crawl).prefix + "*"):
            client.delete(key)
        redis.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
