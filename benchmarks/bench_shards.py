"""One crawl over several Redis masters: what sharding by host costs Redis, and how the
load spreads. The simulation of issue 26 item 2, before the feature exists.

    python benchmarks/bench_shards.py [--shards 1,2,4,8] [--workers 16] [--window 12]

The design measured: a crawl of S shards is S frontiers of today's kind (the same
scripts, keys and guarantees), each on its own hash tag, here each on its own
redis-server (a Redis Cluster master); a host (lane) belongs to shard
``shard_of(host, S)``. A simulated worker (bench_frontier.py's, same links, latency,
claim sizing, renewals and sweeps) holds one ``Frontier`` and one ``CommitWriter`` per
shard:

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
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
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


def shard_of(lane: str, shards: int) -> int:
    """The shard of a host: the first 8 bytes of its SHA-1, modulo ``shards``."""
    if shards == 1:
        return 0
    return int.from_bytes(hashlib.sha1(lane.encode()).digest()[:8], "big") % shards


@dataclass(eq=False)
class ShardedWorker:
    """bench_frontier.SimWorker with one frontier and one commit writer per shard."""

    urls: list[str]
    wid: str
    window: bf.Window
    latency: tuple[float, float]
    hosts: int
    pool: list[Any]
    rng: random.Random
    unstarted: list[tuple[int, int, Any]] = field(default_factory=list)  # (shard, token, env)
    downloading: int = 0
    held: list[set[int]] = field(default_factory=list)
    lanes: list[list[str]] = field(default_factory=list)
    #: parent page -> [its shard, token, rid, links not committed yet]
    waiting: dict[int, list[int]] = field(default_factory=dict)
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    n: int = 0
    pages_started: int = 0
    turn: int = 0
    stopped: bool = False
    #: the commit writers' linger, seconds (None: the scheduler's, LINGER_SECONDS)
    linger: float | None = None

    def __post_init__(self) -> None:
        from scrapy_leased._redis.connection import make_client
        from scrapy_leased.frontier import Frontier
        from scrapy_leased.frontier.keys import CrawlKeys
        from scrapy_leased.frontier.writer import LINGER_SECONDS, CommitWriter
        from scrapy_leased.worker._claimsize import ClaimSizer

        self.frontiers, self.writers = [], []
        for k, url in enumerate(self.urls):
            f = Frontier(make_client(url), CrawlKeys(bf.CRAWL_ID), lease_ms=bf.LEASE_MS,
                         max_attempts=4)
            for name, script in list(f._s.items()):
                f._s[name] = bf.counted(self.window, name, script)
            f.claims.script = f._s["claim"]
            self.frontiers.append(f)
            self.writers.append(CommitWriter(
                f, lambda batch, result, k=k: self._on_commit(k, batch, result),
                linger=self.linger if self.linger is not None else LINGER_SECONDS))
            self.held.append(set())
            self.lanes.append([])
        self.sizer = ClaimSizer(bf.CONCURRENCY)

    @property
    def shards(self) -> int:
        return len(self.urls)

    def _on_commit(self, shard: int, batch: Any, result: Any) -> None:
        if self.window.inside():
            c = self.window.counts
            c["commits"] += 1
            c["links_sent"] += len(result.queued)
            c["links_new"] += sum(result.queued)
            c["acks_committed"] += len(result.acks)
        for parent in batch.tags:
            if parent is None:
                continue
            w = self.waiting[parent]
            w[3] -= 1
            if w[3] == 0:  # every child in Redis: the parent's ack may go
                del self.waiting[parent]
                self.writers[w[0]].add_ack(w[1], w[2])
        if any(result.queued):
            self.kick.set()

    def held_count(self) -> int:
        return sum(len(h) for h in self.held)

    async def claim_loop(self, stop: asyncio.Event) -> None:
        from scrapy_leased.frontier import NO_BUDGET

        def named(shard: int, want: int) -> list[tuple[str, Any]]:
            return [(lane, NO_BUDGET)
                    for lane in self.lanes[shard][:self.sizer.candidates(want)]]

        while not stop.is_set():
            want = self.sizer.capacity(self.downloading, len(self.unstarted),
                                       self.held_count())
            got_all = False
            if self.sizer.worth_claiming(want, len(self.unstarted)):
                for _ in range(self.shards):  # the next shard in turn with work
                    shard = self.turn
                    self.turn = (self.turn + 1) % self.shards
                    got = await self._claim(shard, want, named)
                    want -= got
                    if want <= 0:
                        got_all = True
                        break
                    if got:
                        break
                self._start()
                if got_all:
                    continue
            self.kick.clear()
            timer = asyncio.get_running_loop().call_later(bf.IDLE_POLL_S, self.kick.set)
            try:
                await self.kick.wait()
            finally:
                timer.cancel()

    async def _claim(self, shard: int, want: int, named: Any) -> int:
        """One claim of ``want`` from ``shard`` (as SimWorker.claim_loop's); how many."""
        f = self.frontiers[shard]
        self.writers[shard].flush()
        asked = named(shard, want)
        sent = time.monotonic()
        result = await f.claim(want, self.wid, asked)
        self.sizer.claimed(time.monotonic() - sent)
        if len(result.claims) < want and \
                set(result.ready_lanes) - {lane for lane, _ in asked}:
            self.lanes[shard] = result.ready_lanes
            first = result.claims
            result = await f.claim(want - len(first), self.wid,
                                   named(shard, want - len(first)))
            result.claims = first + result.claims
        self.lanes[shard] = result.ready_lanes
        if self.window.inside():
            self.window.counts["claimed"] += len(result.claims)
        for token, env in result.claims:
            self.held[shard].add(token)
            self.unstarted.append((shard, token, env))
        return len(result.claims)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        lo, hi = self.latency
        while self.unstarted and self.downloading < bf.CONCURRENCY:
            shard, token, env = self.unstarted.pop(0)
            self.downloading += 1
            self.sizer.handed_out()
            delay = self.rng.uniform(lo, hi) / 1000 if hi > 0 else 0
            loop.call_later(delay, self._page_done, shard, token, env)

    def _page_done(self, shard: int, token: int, env: Any) -> None:
        if self.stopped:
            return
        self.pages_started += 1
        parent = self.pages_started
        away = 0
        for link in bf.page_links(self.rng, env.lane, f"https://{env.lane}/p/{env.rid}",
                                  self._new_url, self.pool, self.hosts):
            to = shard_of(link.lane, self.shards)
            if to == shard:
                self.writers[shard].add_request(link, None)
            else:
                self.writers[to].add_request(link, parent)
                away += 1
        if away:
            self.waiting[parent] = [shard, token, env.rid, away]
        else:
            self.writers[shard].add_ack(token, env.rid)
        self.held[shard].discard(token)
        self.downloading -= 1
        if self.window.inside():
            self.window.counts["pages"] += 1
            self.window.counts["links_away"] += away
        self._start()
        self.kick.set()

    def _new_url(self, lane: str) -> str:
        self.n += 1
        return f"https://{lane}/p/{self.wid}.{self.n}"

    async def renew_loop(self, stop: asyncio.Event, shard: int) -> None:
        info = json.dumps({"host": "sim", "pid": os.getpid(), "started": time.time(),
                           "inflight": 0, "acked": 0, "capacity": bf.CONCURRENCY})
        while not stop.is_set():
            await bf._sleep_or_stop(stop, bf.RENEW_S * self.rng.uniform(0.5, 1.0))
            if not stop.is_set():
                await self.frontiers[shard].renew(self.wid, list(self.held[shard]), info)

    async def sweep_loop(self, stop: asyncio.Event) -> None:
        """The scheduler's sweep, one shard a tick in turn: each shard is swept 1 / S as
        often by each worker as one shard is (a fleet of W workers still sweeps it
        about every S / W ticks), so the sweeps cost Redis no more than with one shard."""
        k = self.rng.randrange(self.shards)
        while not stop.is_set():
            await bf._sleep_or_stop(stop, bf.SWEEP_S * self.rng.uniform(0.5, 1.0))
            if not stop.is_set():
                await self.frontiers[k].recover()
                await self.frontiers[k].hash_hot_keys()
                k = (k + 1) % self.shards

    async def close(self) -> None:
        for w in self.writers:
            await w.drain(timeout=30)
        for f in self.frontiers:
            await f.client.aclose()


async def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One process of the fleet: cfg['workers'] sharded simulated workers."""
    window = bf.Window(cfg["window_start"], cfg["window_end"])
    pool = bf.seed_requests(cfg["seeds"], cfg["hosts"])
    workers = [ShardedWorker(cfg["urls"], f"sim{cfg['proc']}-{w}", window,
                             tuple(cfg["latency"]), cfg["hosts"], pool,
                             random.Random(cfg["proc"] * 1000 + w), linger=cfg["linger"])
               for w in range(cfg["workers"])]
    loop = asyncio.get_running_loop()
    cpu: dict[str, float] = {}
    loop.call_at(loop.time() + cfg["window_start"] - time.time(),
                 lambda: cpu.__setitem__("start", time.process_time()))
    loop.call_at(loop.time() + cfg["window_end"] - time.time(),
                 lambda: cpu.__setitem__("end", time.process_time()))
    await asyncio.sleep(max(0.0, cfg["start_at"] - time.time()))
    stop = asyncio.Event()
    tasks = []
    for w in workers:
        tasks += [asyncio.ensure_future(w.claim_loop(stop)),
                  asyncio.ensure_future(w.sweep_loop(stop))]
        tasks += [asyncio.ensure_future(w.renew_loop(stop, k)) for k in range(w.shards)]
    await asyncio.sleep(max(0.0, cfg["stop_at"] - time.time()))
    stop.set()
    for w in workers:
        w.stopped = True
        w.kick.set()
    await asyncio.gather(*tasks)
    for w in workers:
        await w.close()
    return {"proc": cfg["proc"], "calls": dict(window.calls), "counts": dict(window.counts),
            "cpu_s": cpu.get("end", 0.0) - cpu.get("start", 0.0)}


def seed_shards(urls: list[str], n: int, hosts: int) -> list[int]:
    """The seed requests, each queued in its host's shard; how many went to each."""
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    reqs = bf.seed_requests(n, hosts)
    parts: list[list[Any]] = [[] for _ in urls]
    for req in reqs:
        parts[shard_of(req.lane, len(urls))].append(req)

    async def go() -> None:
        for url, part in zip(urls, parts):
            f = Frontier(make_client(url), CrawlKeys(bf.CRAWL_ID), lease_ms=bf.LEASE_MS,
                         max_attempts=4)
            for i in range(0, len(part), 500):
                await f.enqueue(part[i:i + 500])
            await f.client.aclose()

    asyncio.run(go())
    return [len(p) for p in parts]


def run_sharded(shards: int, procs: int, workers: int, latency: tuple[float, float],
                hosts: int, seeds: int, window: float, warmup: float = 3.0,
                linger: float | None = None) -> dict[str, Any]:
    """One fleet over ``shards`` fresh redis-servers; one measured window."""
    from scrapy_leased.frontier.keys import CrawlKeys
    from tests.support.redis_server import RedisServer

    servers = [RedisServer(appendonly=False).start() for _ in range(shards)]
    stats_key = CrawlKeys(bf.CRAWL_ID).stats
    try:
        clients = [s.client() for s in servers]
        urls = [s.url for s in servers]
        seeded = seed_shards(urls, seeds, hosts)
        idle0 = [bf.redis_cpu(c) for c in clients]
        time.sleep(2.0)
        idle = [(bf.redis_cpu(c) - x) / 2.0 for c, x in zip(clients, idle0)]
        per = [workers // procs + (1 if k < workers % procs else 0) for k in range(procs)]
        start_at = time.time() + 2.0
        ws, we = start_at + warmup, start_at + warmup + window
        children = []
        for k, n in enumerate(per):
            if not n:
                continue
            cfg = {"urls": urls, "proc": k, "workers": n, "latency": list(latency),
                   "hosts": hosts, "seeds": seeds, "start_at": start_at, "linger": linger,
                   "window_start": ws, "window_end": we, "stop_at": we + 0.5}
            children.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
                stdout=subprocess.PIPE, text=True))
        time.sleep(max(0.0, ws - time.time()))
        cpu0 = [bf.redis_cpu(c) for c in clients]
        acked0 = [int(c.hget(stats_key, "acked") or 0) for c in clients]
        busy0, t0 = bf.system_busy(), time.time()
        time.sleep(max(0.0, we - time.time()))
        cpu1 = [bf.redis_cpu(c) for c in clients]
        acked1 = [int(c.hget(stats_key, "acked") or 0) for c in clients]
        busy1, t1 = bf.system_busy(), time.time()
        reports = []
        for p in children:
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"fleet process failed ({p.returncode}):\n{out[-3000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        for c in clients:
            c.close()
    finally:
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
        "linger": linger,
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
             "| of pages acked | links to another shard per page | script calls per page "
             "(claim / commit) | pages per commit | masters idle, cores each |",
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
            linger: float = LINGER_PER_SHARD, log: Any = print
            ) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Each shard count of ``counts`` ``reps`` times, interleaved (S shards lingering S x
    ``linger``): each one's median run (by Redis µs per page), and all runs."""
    runs: dict[int, list[dict[str, Any]]] = {s: [] for s in counts}
    for _ in range(reps):
        for s in counts:
            r = run_sharded(s, min(procs, workers), workers, latency, hosts, seeds, window,
                            linger=linger * s)
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
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
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
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(asyncio.run(child(json.loads(ns.child)))), flush=True)
        return 0
    counts = [int(x) for x in ns.shards.split(",")]
    lat = (float(ns.latency.split(",")[0]), float(ns.latency.split(",")[1]))
    rows, runs = measure(counts, ns.reps, ns.workers, ns.procs, lat, ns.hosts, ns.seeds,
                         ns.window, ns.linger, log=lambda m: print(m, file=sys.stderr))
    print("\n".join(report(rows)))
    if ns.json:
        Path(ns.json).write_text(json.dumps(runs, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
