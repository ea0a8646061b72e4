"""One crawl over several Redis masters: what sharding by host costs Redis, and how the
load spreads. The simulation of issue 26 item 2, before the feature exists.

    python benchmarks/bench_shards.py [--shards 1,2,4,8] [--workers 16] [--window 12]

The design measured: a crawl of S shards is S frontiers of today's kind (the same
scripts, keys and guarantees), each on its own hash tag, here each on its own
redis-server (a Redis Cluster master); a host (lane) belongs to shard
``bench_frontier.shard_of(host, S)``. A simulated worker (``bench_frontier.SimWorker``:
same links, latency, claim sizing, renewals and sweeps as the fleet simulation's) holds
one ``Frontier`` and one ``CommitWriter`` per shard:

* it claims from the shards in turn (each claim sized as the scheduler sizes one, from
  the lanes that shard last reported ready; an empty reply moves on to the next shard),
  the waiting commit of that shard sent right before it (``CommitWriter.flush``);
* a page's links go to the writer of their own shard; its ack goes to its own shard's
  writer once every link it yielded to another shard is committed there (the tags of
  ``CommitWriter.add_request`` come back with the results): children first, parent
  after, so a worker dying in between only makes the parent be processed again;
* renewals run per shard (each shard's leases), the sweep of expired leases visits one
  shard a tick, in turn;
* the commit writers linger ``--linger`` seconds a shard (``LINGER_PER_SHARD``, 0.05:
  the scheduler's), S times that in all: see there.

One shard runs the same code (every link in the parent's shard, acked at once, the
scheduler's linger): the baseline, today's cost. ``--reps`` repeats the shard counts
interleaved and keeps each one's median. For each S, one window: Redis CPU (``INFO
cpu`` of every server) per page acked (the sum of the shards' ``acked``), the ratio to
one shard's, and each master's share of the Redis CPU and of the pages acked. Each
server's idle CPU (its cron) is measured for 2 s before the window and reported; it is
not taken off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import bench_frontier as bf  # puts the repository on sys.path

#: The commit writers' linger per shard (seconds): S shards linger S times this. A page's
#: links spread over the shards, so each shard's writer gets a few of them per page and
#: commits about as often as one shard's would: at the scheduler's 0.05 s for all, 4
#: shards made 0.43 commit calls a page against one shard's 0.15 (1.56x one shard's Redis
#: CPU per page, one run, 2026-12-07); at 0.2 s, 0.16 (1.05x, medians of 5), while 8
#: shards at 0.2 s made 0.27 (1.25x).
LINGER_PER_SHARD = 0.05


def shard_tags(crawl: str, shards: int) -> list[str]:
    """The crawl ids of a crawl's shards on a Redis Cluster: shard k's is the first
    ``<crawl>#k.<n>`` whose hash tag's slot is in [k * 16384 / S, (k + 1) * 16384 / S), so
    that the shards spread over the masters as the slots do (``<crawl>#k`` alone lands
    on CRC16 slots that cluster: 16 such tags on 3 masters of even slot ranges sit 3 / 5 /
    8). Computed, not stored: any worker or tool finds the same."""
    from redis.crc import key_slot

    from scrapy_leased.frontier.keys import CrawlKeys

    tags = []
    for k in range(shards):
        lo, hi = k * 16384 // shards, (k + 1) * 16384 // shards
        n = 0
        while not lo <= key_slot(CrawlKeys(f"{crawl}#{k}.{n}").stats.encode()) < hi:
            n += 1
        tags.append(f"{crawl}#{k}.{n}")
    return tags


def seed_shards(urls: list[str], n: int, hosts: int,
                crawls: list[str] | None = None) -> list[int]:
    """The seed requests, each queued in its host's shard (``urls[k]``, crawl id
    ``crawls[k]`` or CRAWL_ID); how many went to each."""
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    reqs = bf.seed_requests(n, hosts)
    parts: list[list[Any]] = [[] for _ in urls]
    for req in reqs:
        parts[bf.shard_of(req.lane, len(urls))].append(req)

    async def go() -> None:
        for k, (url, part) in enumerate(zip(urls, parts)):
            crawl = crawls[k] if crawls else bf.CRAWL_ID
            f = Frontier(make_client(url), CrawlKeys(crawl), lease_ms=bf.LEASE_MS,
                         max_attempts=4)
            for i in range(0, len(part), 500):
                await f.enqueue(part[i:i + 500])
            await f.client.aclose()

    asyncio.run(go())
    return [len(p) for p in parts]


def run_sharded(shards: int, procs: int, workers: int, latency: tuple[float, float],
                hosts: int, seeds: int, window: float, warmup: float = 3.0,
                linger: float | None = None, masters: int = 0) -> dict[str, Any]:
    """One fleet over ``shards`` fresh redis-servers (``masters`` 0), or over one fresh
    Redis Cluster of ``masters`` masters without replicas, the shards' crawl ids from
    shard_tags(); one measured window."""
    import redis

    from scrapy_leased.frontier.keys import CrawlKeys
    from tests.support.redis_ha import RedisCluster
    from tests.support.redis_server import RedisServer

    cluster = RedisCluster(masters=masters, replicas=0).start() if masters else None
    servers = cluster.nodes if cluster else [RedisServer(appendonly=False).start()
                                             for _ in range(shards)]
    crawls = shard_tags(bf.CRAWL_ID, shards) if cluster else [bf.CRAWL_ID] * shards
    try:
        clients = [s.client() for s in servers]  # each master's CPU
        if cluster:
            urls = [cluster.url] * shards
            host, port = servers[0].address.rsplit(":", 1)
            reader: Any = redis.RedisCluster(host=host, port=int(port))
            readers = [reader] * shards
        else:
            urls = [s.url for s in servers]
            readers = clients
        seeded = seed_shards(urls, seeds, hosts, crawls)

        def acked_now() -> list[int]:
            return [int(r.hget(CrawlKeys(c).stats, "acked") or 0)
                    for r, c in zip(readers, crawls)]

        idle0 = [bf.redis_cpu(c) for c in clients]
        time.sleep(2.0)
        idle = [(bf.redis_cpu(c) - x) / 2.0 for c, x in zip(clients, idle0)]
        children, ws, we = bf.start_fleet(urls, procs, workers, latency, hosts, seeds,
                                          window, warmup, linger=linger, crawls=crawls)
        time.sleep(max(0.0, ws - time.time()))
        cpu0, acked0 = [bf.redis_cpu(c) for c in clients], acked_now()
        busy0, t0 = bf.system_busy(), time.time()
        time.sleep(max(0.0, we - time.time()))
        cpu1, acked1 = [bf.redis_cpu(c) for c in clients], acked_now()
        busy1, t1 = bf.system_busy(), time.time()
        reports = bf.fleet_reports(children)
        for c in {id(x): x for x in clients + readers}.values():
            c.close()
    finally:
        if cluster:
            cluster.close()
        else:
            for s in servers:
                s.close()
    span = t1 - t0
    cpu = [b - a for a, b in zip(cpu0, cpu1)]
    acked = [b - a for a, b in zip(acked0, acked1)]
    pages, redis_s = sum(acked), sum(cpu)
    counts: dict[str, int] = {}
    calls: dict[str, int] = {}
    for x in reports:
        for k, v in x["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in x["calls"].items():
            calls[k] = calls.get(k, 0) + v
    client_cpu = sum(x["cpu_s"] for x in reports)
    return {
        "shards": shards, "workers": workers, "hosts": hosts, "latency": list(latency),
        "linger": linger, "masters": masters, "crawls": crawls,
        "window_s": span, "pages": pages, "pages_per_s": pages / span,
        "redis_cpu_s": redis_s, "redis_cores": redis_s / span,
        "redis_us_per_page": 1e6 * redis_s / pages if pages else None,
        "pages_per_redis_cpu_s": pages / redis_s if redis_s else None,
        "cpu_share": [x / redis_s if redis_s else 0.0 for x in cpu],
        "pages_share": [x / pages if pages else 0.0 for x in acked],
        "seeded": seeded, "idle_cores": idle,
        "client_cores": client_cpu / span,
        "others_cores": max(0.0, (busy1 - busy0) - redis_s - client_cpu) / span,
        "calls_per_page": {k: v / pages for k, v in sorted(calls.items())} if pages else {},
        "links_away_per_page": counts.get("links_away", 0) / max(1, counts.get("pages", 0)),
        "pages_per_commit": (counts.get("acks_committed", 0) / counts["commits"]
                             if counts.get("commits") else None),
    }


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table of run_sharded() rows, ratios against the first (one shard)."""
    base = rows[0]["redis_us_per_page"] or 0.0
    lines = ["| shards | pages/s | Redis CPU, cores (all masters) | Redis µs per page | "
             "x one shard | pages per Redis CPU-second | each master's share of Redis CPU "
             "| each shard's share of the pages acked | links to another shard per page | "
             "script calls per page (claim / commit) | pages per commit | masters idle, "
             "cores each |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | ---: | --- |"]
    for r in rows:
        us = r["redis_us_per_page"] or 0.0
        cp = r["calls_per_page"]
        lines.append(
            f"| {r['shards']} | {r['pages_per_s']:,.0f} | {r['redis_cores']:.2f} | {us:.1f} | "
            f"{us / base if base else 0:.2f}x | {r['pages_per_redis_cpu_s'] or 0:,.0f} | "
            + " / ".join(f"{100 * x:.0f} %" for x in r["cpu_share"]) + " | "
            + " / ".join(f"{100 * x:.0f} %" for x in r["pages_share"]) + " | "
            f"{r['links_away_per_page']:.2f} | {cp.get('claim', 0):.3f} / "
            f"{cp.get('commit', 0):.3f} | {r['pages_per_commit'] or 0:.1f} | "
            + " / ".join(f"{x:.3f}" for x in r["idle_cores"]) + " |")
    return lines


def measure(counts: list[int], reps: int, workers: int, procs: int,
            latency: tuple[float, float], hosts: int, seeds: int, window: float,
            linger: float = LINGER_PER_SHARD, log: Any = print, masters: int = 0
            ) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Each shard count of ``counts`` ``reps`` times, interleaved (S shards lingering S x
    ``linger``): each one's median run (by Redis µs per page), and all runs."""
    runs: dict[int, list[dict[str, Any]]] = {s: [] for s in counts}
    for _ in range(reps):
        for s in counts:
            r = run_sharded(s, min(procs, workers), workers, latency, hosts, seeds, window,
                            linger=linger * s, masters=masters)
            runs[s].append(r)
            log(f"{s} shards: {r['pages_per_s']:,.0f} pages/s, "
                f"{r['redis_us_per_page'] or 0:.1f} Redis µs/page, CPU shares "
                + " ".join(f"{x:.2f}" for x in r["cpu_share"]))
    rows = []
    for s in counts:
        ordered = sorted(runs[s], key=lambda r: r["redis_us_per_page"] or 0.0)
        rows.append(ordered[len(ordered) // 2])
    return rows, runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", default="1,2,4,8", help="shard counts, one window each; "
                    "the first is the baseline of the ratios")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--procs", type=int, default=3, help="processes the workers run in")
    ap.add_argument("--latency", default="50,150", help="page latency range, ms")
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=20_000)
    ap.add_argument("--window", type=float, default=12.0)
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions, interleaved; the table shows each shard count's "
                    "median by Redis µs per page")
    ap.add_argument("--linger", type=float, default=LINGER_PER_SHARD,
                    help="the commit writers' linger per shard, seconds (S shards: S times "
                    "this; default the scheduler's LINGER_SECONDS)")
    ap.add_argument("--cluster", type=int, default=0, metavar="MASTERS",
                    help="run every shard count on one Redis Cluster of this many masters "
                    "(no replicas; shard_tags() spreads the shards over its slots) instead "
                    "of one redis-server per shard")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    counts = [int(x) for x in ns.shards.split(",")]
    lat = (float(ns.latency.split(",")[0]), float(ns.latency.split(",")[1]))
    rows, runs = measure(counts, ns.reps, ns.workers, ns.procs, lat, ns.hosts, ns.seeds,
                         ns.window, ns.linger, log=lambda m: print(m, file=sys.stderr),
                         masters=ns.cluster)
    print("\n".join(report(rows)))
    if ns.json:
        Path(ns.json).write_text(json.dumps(runs, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
