"""What the shared rate budget costs per request: Redis round trips and added latency.

Runs a private redis-server, then W simulated workers x C concurrent requests, each
taking budget before its "download" (never refused here: the cost of asking). Side by
side: no limiter, the lesson's fixed-window acquire (INCR + EXPIRE in one pipeline),
and scrapy_leased's GCRA acquire (one Lua script, Redis TIME).

    python benchmarks/bench_ratelimit.py [--requests 20000] [--workers 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis.asyncio as aioredis

from scrapy_leased.frontier import Budget, Frontier
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.redis_server import RedisServer

HOSTS = [f"host{i}.example" for i in range(20)]


async def none(client, host: str) -> None:
    return None


async def fixed_window(client, host: str) -> None:
    window = int(time.time() // 60)
    key = f"rate:{host}:{window}"
    async with client.pipeline(transaction=True) as p:
        p.incr(key).expire(key, 120)
        await p.execute()


def gcra(frontier: Frontier):
    budget = Budget(interval_ms=1, burst=1_000_000)  # huge: measure the cost, never wait

    async def take(client, host: str) -> None:
        assert (await frontier.acquire(host, budget))[0] == 0
    return take


async def measure(url: str, take_factory, n: int, workers: int, conc: int) -> dict:
    clients = [aioredis.from_url(url) for _ in range(workers)]
    takes = [take_factory(c) for c in clients]
    latencies: list[float] = []
    per_task = n // (workers * conc)

    async def task(w: int, j: int) -> None:
        for i in range(per_task):
            t0 = time.perf_counter()
            await takes[w](clients[w], HOSTS[(j + i) % len(HOSTS)])
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(task(w, j) for w in range(workers) for j in range(conc)))
    wall = time.perf_counter() - t0
    for c in clients:
        await c.aclose()
    done = per_task * workers * conc
    latencies.sort()
    return {"rate": done / wall, "p50": latencies[len(latencies) // 2] * 1e6,
            "p99": latencies[int(len(latencies) * 0.99)] * 1e6}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    with RedisServer() as srv:
        keys = CrawlKeys("bench")
        cases = {
            "no limiter": lambda c: none,
            "lesson fixed window": lambda c: fixed_window,
            "scrapy_leased GCRA": lambda c: gcra(Frontier(c, keys, lease_ms=30_000,
                                                          max_attempts=4)),
        }
        for workers, conc in ((1, 1), (a.workers, a.concurrency)):
            n = a.requests if conc > 1 else a.requests // 4
            print(f"\n{n:,} budget checks, {workers} client(s) x {conc} concurrent, 20 hosts, "
                  f"private redis-server; median of {a.reps} runs")
            print(f"{'':22}{'checks/s':>10}{'p50 us':>9}{'p99 us':>9}{'round trips':>13}")
            rows = {}
            for name, factory in cases.items():
                runs = [await measure(srv.url, factory, n, workers, conc) for _ in range(a.reps)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                rows[name] = med
                trips = 0 if name == "no limiter" else 1
                print(f"{name:22}{med['rate']:>10,.0f}{med['p50']:>9.0f}{med['p99']:>9.0f}"
                      f"{trips:>13}")
            g, f = rows["scrapy_leased GCRA"], rows["lesson fixed window"]
            print(f"GCRA vs fixed window: {g['rate'] / f['rate']:.2f}x the rate, "
                  f"p50 {g['p50'] / f['p50']:.2f}x, p99 {g['p99'] / f['p99']:.2f}x")
        print("\nA refused GCRA check costs the same one round trip and sends the request back "
              "to the scheduler;\nthe lesson's fixed window sleeps 0.5 s and asks again.")


if __name__ == "__main__":
    asyncio.run(main())
