"""Fleet-scale frontier: how many pages/s one Redis sustains, and what each page costs it.

    python benchmarks/bench_frontier.py [--quick] [--fleets 4,8,16,32] [--window 12] [--profile]

No HTTP and no Scrapy: many simulated workers, spread over ``--procs`` processes, do
to Redis exactly what a scrapy_leased worker does, with ``scrapy_leased.frontier.
Frontier`` and ``scrapy_leased.frontier.writer.CommitWriter`` (the classes the scheduler uses):

* a claim loop as ``ClaimLoop.run`` (worker/claimloop.py), sized by the worker's own
  ``ClaimSizer`` (``worker/_claimsize.py``): ``CONCURRENT_REQUESTS`` (16) download slots; a
  claim when there is room for a batch (or nothing claimed waits to be started), for
  the room (slots + margin + batch - 1 - downloading - unstarted), naming as many of the
  lanes the last claim reported ready as ``ClaimSizer.candidates`` says (one more call
  for the rest when the reply names ready lanes it did not), the commit waiting sent
  right before it (``CommitWriter.flush``); wait for a finished page (or
  ``LEASED_IDLE_POLL``, 0.2 s) otherwise;
* each claimed page waits for a free slot, then is "downloaded" for a time drawn from
  ``--latency`` (uniform, ms;
  ``0`` = no wait, every page done at once: the busiest a worker can be), then it
  yields 10 links of which 7 are duplicates (URLs already in the seen set: the seed
  URLs) and 3 are new (2 of them on the page's host, 1 on a random host), every one
  sent to Redis (no local seen cache: the worst case for Redis), and its claim is
  acked; links and acks go through ``CommitWriter`` with the scheduler's linger
  (``LINGER_SECONDS``: a batch waits for the next claim, at most that long), as in the
  scheduler;
* a heartbeat renewing the worker's leases every 10 s (``renew.lua``) and a sweep of
  expired leases every 2 s (``expired.lua``, then ``hot_keys.lua``), the defaults.

Payloads are shaped like the scheduler's (``{"u":..., "k":{"depth":3}, "h":{"Referer":
[...]}, "cb":"parse"}``, about 130 bytes), spread over ``--hosts`` lanes (no rate
budget), fingerprints split as ``LeasedDupeFilter`` does (2^14 seen buckets).

Each fleet size runs on an emptied private redis-server seeded with ``--seeds``
requests; after a warm-up, one window of ``--window`` seconds is measured:
* pages/s: growth of the crawl's ``acked`` counter (Redis stats hash) / window;
* Redis CPU: ``INFO cpu`` used_cpu_sys + used_cpu_user of the redis-server process,
  as cores and as CPU seconds per 1,000 pages (and its inverse, pages per Redis
  CPU-second);
* commands per page: every command Redis ran (``INFO commandstats``, statistics reset
  at the window's start; a script's ``redis.call``s count under their own names), of
  which sent by clients (= round trips; EVALSHA and the rest), and per script (each
  process counts its calls of each script in the window);
* the simulated workers' own CPU (cores), and what other processes used meanwhile.

Beside the frontier, the largest fleet runs ``benchmarks/lua/floor.lua`` instead (the
floor protocol of ``bench_script_instructions.py --floor``: one call per batch of the
worker's claim size that acks the last batch, queues its pages' links and claims the
next, one lease per batch, no guard, lanes, tiers, rate or checks; two such batches in
flight per worker: 16 pages, as the frontier's 16 slots), the same links and latency:
the pages per Redis CPU-second any protocol of one call per batch is held to.

The ceiling of the same redis-server for a trivial script (``return 1`` by EVALSHA) is
measured in the same run, twice: with ``redis-benchmark`` (C clients, no pipelining:
what the server can do) and with the same Python fleet (what these clients can push).

``--profile`` adds one more window at the largest fleet with ``SLOWLOG`` recording
every command (``slowlog-log-slower-than 0``, sampled every 50 ms): Redis time per call
of each script, and per nested command (``INFO commandstats`` usec) with the scripts
that call it, i.e. where the scripts spend.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from mdtable import row  # noqa: E402

CRAWL_ID = "fleet"
SEEN_BITS = 14
CONCURRENCY = 16
LINKS_NEW = 3
LINKS_DUP = 7
RENEW_S = 10.0
SWEEP_S = 2.0
IDLE_POLL_S = 0.2
LEASE_MS = 30_000
TRIVIAL = "return 1"
#: The floor protocol (bench_script_instructions.py --floor): one script per batch that
#: acks, queues what is new and claims, with none of the frontier's guarantees beyond a
#: lease per batch. Its fleet (mode "floor") is the yardstick of pages per Redis
#: CPU-second: what any protocol of one call per batch costs this Redis.
FLOOR_LUA = REPO_ROOT / "benchmarks" / "lua" / "floor.lua"
FLOOR_KEYS = [f"floor:{k}" for k in ("queue", "leases", "inflight", "done", "rids", "stats")]
LUA_DIR = REPO_ROOT / "scrapy_leased" / "frontier" / "lua"
_CALL_RE = re.compile(r"(?:redis\.p?call\(|batch_call\(|pcall\(redis\.call,)\s*'([A-Za-z]+)'")


# -- links ----------------------------------------------------------------------------


def payload(url: str, referer: str) -> str:
    return (f'{{"u":"{url}","k":{{"depth":3}},"h":{{"Referer":["{referer}"]}},'
            f'"cb":"parse"}}')


def new_request(url: str, referer: str, lane: str) -> Any:
    from scrapy_leased.frontier import NewRequest
    from scrapy_leased.frontier.fingerprints import split_fingerprint

    bucket, member = split_fingerprint(hashlib.sha1(url.encode()).digest(), SEEN_BITS)
    return NewRequest(payload(url, referer), 0, bucket, member, lane)


def host(i: int) -> str:
    return f"host{i}.example.com"


def page_links(rng: random.Random, lane: str, referer: str, url_of: Any, pool: list[Any],
               hosts: int) -> list[Any]:
    """A page's links as the simulated workers send them: LINKS_NEW new URLs (the first
    two on the page's lane, the others on a random one of ``hosts``; ``url_of(lane)``
    names each), then LINKS_DUP seed URLs of ``pool`` (duplicates)."""
    out = []
    for k in range(LINKS_NEW):
        to = lane if k < 2 else host(rng.randrange(hosts))
        out.append(new_request(url_of(to), referer, to))
    return out + [pool[rng.randrange(len(pool))] for _ in range(LINKS_DUP)]


def seed_requests(n: int, hosts: int) -> list[Any]:
    """The seed URLs: queued before a run, and the duplicates every page links to."""
    return [new_request(f"https://{host(i % hosts)}/p/s{i}", f"https://{host(i % hosts)}/",
                        host(i % hosts)) for i in range(n)]


# -- one simulated worker ---------------------------------------------------------------


class Window:
    """The measured window, in time.time(): counters only count inside it."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.calls: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    def inside(self) -> bool:
        return self.start <= time.time() < self.end


def counted(window: Window, name: str, script: Any) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        if window.inside():
            window.calls[name] += 1
        return await script(*args, **kwargs)
    return call


def shard_of(lane: str, shards: int) -> int:
    """The shard of a host when a crawl is sharded over ``shards`` frontiers
    (bench_shards.py): the first 8 bytes of its SHA-1, modulo ``shards``."""
    if shards == 1:
        return 0
    return int.from_bytes(hashlib.sha1(lane.encode()).digest()[:8], "big") % shards


@dataclass(eq=False)
class SimWorker:
    """One simulated worker: claims, "downloads" (sleeps its ``latency``), commits; its
    script calls inside ``window`` are counted. ``urls``: the frontier of each shard of
    the crawl (one: an unsharded crawl; several: bench_shards.py, a host belonging to
    shard ``shard_of``), each with its own ``CommitWriter`` lingering ``linger`` seconds
    (None: the scheduler's ``LINGER_SECONDS``). With several shards it claims from them
    in turn (an empty or short reply moves on to the next), sends each link to its
    host's shard and acks a page in its own shard once every link it yielded to another
    shard is committed there (the tags of ``CommitWriter.add_request`` come back with
    the results): children first, so a crash in between re-processes the parent."""

    urls: list[str]
    wid: str
    window: Window
    latency: tuple[float, float]
    hosts: int
    pool: list[Any]
    rng: random.Random
    linger: float | None = None
    #: each shard's crawl id (its hash tag; None: CRAWL_ID for every shard, one per server)
    crawls: list[str] | None = None
    unstarted: list[tuple[int, int, Any]] = field(default_factory=list)  # (shard, token, env)
    downloading: int = 0
    held: list[set[int]] = field(default_factory=list)  # per shard
    lanes: list[list[str]] = field(default_factory=list)  # per shard: last reported ready
    #: parent page -> [its shard, token, rid, its links not committed yet]
    waiting: dict[int, list[int]] = field(default_factory=dict)
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    n: int = 0
    pages: int = 0
    turn: int = 0
    stopped: bool = False

    def __post_init__(self) -> None:
        from scrapy_leased._redis.connection import make_client
        from scrapy_leased.frontier import Frontier
        from scrapy_leased.frontier.keys import CrawlKeys
        from scrapy_leased.frontier.writer import LINGER_SECONDS, CommitWriter
        from scrapy_leased.worker._claimsize import ClaimSizer

        self.frontiers: list[Any] = []
        self.writers: list[Any] = []
        for k, url in enumerate(self.urls):
            crawl = self.crawls[k] if self.crawls else CRAWL_ID
            f = Frontier(make_client(url), CrawlKeys(crawl), lease_ms=LEASE_MS, max_attempts=4)
            for name, script in list(f._s.items()):
                f._s[name] = counted(self.window, name, script)
            # the claim call object took the claim script when the frontier was built
            f.claims.script = f._s["claim"]
            self.frontiers.append(f)
            self.writers.append(CommitWriter(
                f, lambda batch, result, k=k: self._on_commit(k, batch, result),
                linger=LINGER_SECONDS if self.linger is None else self.linger))
            self.held.append(set())
            self.lanes.append([])
        self.sizer = ClaimSizer(CONCURRENCY)

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

    async def claim_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            want = self.sizer.capacity(self.downloading, len(self.unstarted),
                                       sum(len(h) for h in self.held))
            if self.sizer.worth_claiming(want, len(self.unstarted)):
                got_all = False
                for _ in range(self.shards):  # the next shard in turn
                    shard = self.turn
                    self.turn = (self.turn + 1) % self.shards
                    got = await self._claim(shard, want)
                    want -= got
                    got_all = want <= 0
                    if got:
                        break
                self._start()
                if got_all:
                    continue
            self.kick.clear()
            timer = asyncio.get_running_loop().call_later(IDLE_POLL_S, self.kick.set)
            try:
                await self.kick.wait()
            finally:
                timer.cancel()

    async def _claim(self, shard: int, want: int) -> int:
        """A claim of ``want`` from ``shard``, the commit waiting there sent right before
        it; one more call for the rest when the reply names ready lanes the first did
        not (as the scheduler's claim loop). Returns how many were claimed."""
        from scrapy_leased.frontier import NO_BUDGET

        def named(want: int) -> list[tuple[str, Any]]:
            return [(lane, NO_BUDGET) for lane in self.lanes[shard][:self.sizer.candidates(want)]]

        f = self.frontiers[shard]
        self.writers[shard].flush()
        asked = named(want)
        sent = time.monotonic()
        result = await f.claim(want, self.wid, asked)
        self.sizer.claimed(time.monotonic() - sent)
        if len(result.claims) < want and \
                set(result.ready_lanes) - {lane for lane, _ in asked}:
            self.lanes[shard] = result.ready_lanes
            first = result.claims
            result = await f.claim(want - len(first), self.wid, named(want - len(first)))
            result.claims = first + result.claims
        self.lanes[shard] = result.ready_lanes
        if self.window.inside():
            self.window.counts["claimed"] += len(result.claims)
        for token, env in result.claims:
            self.held[shard].add(token)
            self.unstarted.append((shard, token, env))
        return len(result.claims)

    def _start(self) -> None:
        """Claims waiting to be started take the free download slots."""
        loop = asyncio.get_running_loop()
        lo, hi = self.latency
        while self.unstarted and self.downloading < CONCURRENCY:
            shard, token, env = self.unstarted.pop(0)
            self.downloading += 1
            self.sizer.handed_out()
            delay = self.rng.uniform(lo, hi) / 1000 if hi > 0 else 0
            loop.call_later(delay, self._page_done, shard, token, env)

    def _page_done(self, shard: int, token: int, env: Any) -> None:
        if self.stopped:
            return  # after the run: its lease just expires (the next run flushes Redis)
        self.pages += 1
        parent, away = self.pages, 0
        for link in page_links(self.rng, env.lane, f"https://{env.lane}/p/{env.rid}",
                               self._new_url, self.pool, self.hosts):
            to = shard_of(link.lane, self.shards)
            self.writers[to].add_request(link, None if to == shard else parent)
            away += to != shard
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

    async def renew_loop(self, stop: asyncio.Event, shard: int = 0) -> None:
        info = json.dumps({"host": "sim", "pid": os.getpid(), "started": time.time(),
                           "inflight": 0, "acked": 0, "capacity": CONCURRENCY})
        while not stop.is_set():
            await _sleep_or_stop(stop, RENEW_S * self.rng.uniform(0.5, 1.0))
            if not stop.is_set():
                await self.frontiers[shard].renew(self.wid, list(self.held[shard]), info)

    async def sweep_loop(self, stop: asyncio.Event) -> None:
        """The scheduler's sweep; with several shards, one shard a tick in turn (each
        is swept 1 / S as often by a worker: the sweeps cost Redis what one shard's do)."""
        k = self.rng.randrange(self.shards)
        while not stop.is_set():
            await _sleep_or_stop(stop, SWEEP_S * self.rng.uniform(0.5, 1.0))
            if not stop.is_set():
                await self.frontiers[k].recover()
                await self.frontiers[k].hash_hot_keys()  # as the workers' sweep does
                k = (k + 1) % self.shards

    async def floor_loop(self, stop: asyncio.Event, batch: int) -> None:
        """floor.lua in a loop: each call acks the batch the last one claimed, queues its
        pages' links (LINKS_NEW new, LINKS_DUP seed URLs) and claims the next batch of
        ``batch`` (the worker's claim size); then the batch is "downloaded" (one draw of the
        latency: its pages in parallel), or the loop waits IDLE_POLL_S when the call
        claimed nothing. A worker runs CONCURRENCY / batch such loops (child()), so that
        it has as many pages in flight as the frontier's workers."""
        script = counted(self.window, "floor",
                         self.frontiers[0].client.register_script(FLOOR_LUA.read_text()))
        token: Any = ""
        rids: list[bytes] = []
        links: list[Any] = []
        lo, hi = self.latency
        rng = self.rng
        while not stop.is_set():
            keys, args = list(FLOOR_KEYS), []
            for req in links:
                keys.append(f"floor:seen:{req.bucket}")
                args += [len(keys), req.member, req.payload]
            token, envs = await script(keys=keys, args=[batch, token, len(rids), len(links),
                                                        *rids, *args])
            if self.window.inside():
                self.window.counts["pages"] += len(rids)
                self.window.counts["claimed"] += len(envs)
            rids, links = [env.split(b"|", 1)[0] for env in envs], []
            for rid in rids:  # floor envelopes name no lane: the page's is drawn
                lane = host(rng.randrange(self.hosts))
                links += page_links(rng, lane, f"https://{lane}/p/{rid.decode()}",
                                    self._new_url, self.pool, self.hosts)
            if not envs:
                await _sleep_or_stop(stop, IDLE_POLL_S)
            elif hi > 0:
                await _sleep_or_stop(stop, rng.uniform(lo, hi) / 1000)

    async def trivial_loop(self, stop: asyncio.Event) -> None:
        script = self.frontiers[0].client.register_script(TRIVIAL)
        while not stop.is_set():
            await script()
            if self.window.inside():
                self.window.counts["trivial"] += 1

    async def close(self) -> None:
        for writer in self.writers:
            await writer.drain(timeout=30)
        for f in self.frontiers:
            await f.client.aclose()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass


async def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One process of the fleet: cfg['workers'] simulated workers."""
    from scrapy_leased.worker._claimsize import ClaimSizer

    window = Window(cfg["window_start"], cfg["window_end"])
    pool = seed_requests(cfg["seeds"], cfg["hosts"])
    workers = [SimWorker(cfg["urls"], f"sim{cfg['proc']}-{w}", window,
                         tuple(cfg["latency"]), cfg["hosts"], pool,
                         random.Random(cfg["proc"] * 1000 + w), cfg.get("linger"),
                         cfg.get("crawls"))
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
        if cfg["mode"] == "trivial":
            tasks.append(asyncio.ensure_future(w.trivial_loop(stop)))
        elif cfg["mode"] == "floor":  # CONCURRENCY pages in flight, as the frontier's
            batch = ClaimSizer(CONCURRENCY).batch
            tasks += [asyncio.ensure_future(w.floor_loop(stop, batch))
                      for _ in range(max(1, CONCURRENCY // batch))]
        else:
            tasks += [asyncio.ensure_future(t) for t in (w.claim_loop(stop), w.sweep_loop(stop))]
            tasks += [asyncio.ensure_future(w.renew_loop(stop, k)) for k in range(w.shards)]
    await asyncio.sleep(max(0.0, cfg["stop_at"] - time.time()))
    stop.set()
    for w in workers:
        w.stopped = True
        w.kick.set()
    await asyncio.gather(*tasks, return_exceptions=False)
    for w in workers:
        await w.close()
    return {"proc": cfg["proc"], "calls": dict(window.calls), "counts": dict(window.counts),
            "cpu_s": cpu.get("end", 0.0) - cpu.get("start", 0.0)}


# -- harness ----------------------------------------------------------------------------


def script_commands() -> dict[str, set[str]]:
    """Command name -> the scripts (with their lib_*.lua) that call it."""
    from scrapy_leased.frontier.scripts import LIBS

    used: dict[str, set[str]] = {}
    for path in LUA_DIR.glob("*.lua"):
        if path.stem.startswith("lib_"):
            continue
        files = [path] + [LUA_DIR / f"{lib}.lua" for lib in LIBS.get(path.stem, ())]
        for f in files:
            for m in _CALL_RE.findall(f.read_text(encoding="utf-8")):
                used.setdefault(m.lower(), set()).add(path.stem)
    return used


def commandstats(r: Any) -> dict[str, dict[str, float]]:
    out = {}
    for key, value in r.info("commandstats").items():
        name = key[len("cmdstat_"):] if key.startswith("cmdstat_") else key
        out[name.replace("|", " ")] = {"calls": int(value["calls"]), "usec": float(value["usec"])}
    return out


def redis_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def system_busy() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def seed(url: str, n: int, hosts: int) -> None:
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    async def go() -> None:
        f = Frontier(make_client(url), CrawlKeys(CRAWL_ID), lease_ms=LEASE_MS, max_attempts=4)
        reqs = seed_requests(n, hosts)
        for i in range(0, n, 500):
            await f.enqueue(reqs[i:i + 500])
        await f.client.aclose()

    asyncio.run(go())


def seed_floor(url: str, n: int, hosts: int) -> None:
    """floor.lua's keys: the seed requests queued (envelopes of rids 1..n) and seen."""
    import redis

    r = redis.Redis.from_url(url)
    reqs = seed_requests(n, hosts)
    pipe = r.pipeline(transaction=False)
    for i, req in enumerate(reqs):
        pipe.sadd(f"floor:seen:{req.bucket}", req.member)
        pipe.rpush("floor:queue", f"{i + 1}|0|0|0||{req.payload}")
    pipe.set("floor:rids", n)
    pipe.execute()
    r.close()


HARNESS_CALLS = {"info": 2, "hget": 2}  # the harness's own commands inside the window


def start_fleet(urls: list[str], procs: int, workers: int, latency: tuple[float, float],
                hosts: int, seeds: int, window: float, warmup: float = 3.0,
                mode: str = "frontier", linger: float | None = None,
                crawls: list[str] | None = None
                ) -> tuple[list[subprocess.Popen[str]], float, float]:
    """``workers`` simulated workers (child()) in ``procs`` processes, on the frontiers
    of ``urls`` (one per shard; ``crawls``: their crawl ids, SimWorker); they start in
    2 s (import and connect meanwhile) and stop 0.5 s after the window. Returns the
    processes and the window (time.time())."""
    per = [workers // procs + (1 if k < workers % procs else 0) for k in range(procs)]
    start_at = time.time() + 2.0
    ws, we = start_at + warmup, start_at + warmup + window
    children = []
    for k, n in enumerate(per):
        if not n:
            continue
        cfg = {"urls": urls, "proc": k, "workers": n, "latency": list(latency),
               "hosts": hosts, "seeds": seeds, "mode": mode, "start_at": start_at,
               "window_start": ws, "window_end": we, "stop_at": we + 0.5, "linger": linger,
               "crawls": crawls}
        children.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
            stdout=subprocess.PIPE, text=True))
    return children, ws, we


def fleet_reports(children: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """What each process of start_fleet() reported (child()'s JSON)."""
    reports = []
    for p in children:
        out, _ = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"fleet process failed ({p.returncode}):\n{out[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def run_fleet(srv: Any, procs: int, workers: int, latency: tuple[float, float], hosts: int,
              seeds: int, window: float, warmup: float = 3.0, mode: str = "frontier",
              slowlog: bool = False) -> dict[str, Any]:
    """One fleet of ``workers`` simulated workers in ``procs`` processes; one window."""
    from scrapy_leased.frontier.keys import CrawlKeys

    r = srv.client()
    r.flushall()
    r.config_set("slowlog-log-slower-than", -1)
    if mode == "frontier":
        seed(srv.url, seeds, hosts)
    elif mode == "floor":
        seed_floor(srv.url, seeds, hosts)
    stats_key = "floor:stats" if mode == "floor" else CrawlKeys(CRAWL_ID).stats
    children, ws, we = start_fleet([srv.url], procs, workers, latency, hosts, seeds, window,
                                   warmup, mode)
    time.sleep(max(0.0, ws - time.time()))
    r.config_resetstat()
    cpu0, busy0, t0 = redis_cpu(r), system_busy(), time.time()
    acked0 = int(r.hget(stats_key, "acked") or 0)
    samples: list[dict] = []
    if slowlog:
        r.config_set("slowlog-max-len", 128)
        r.config_set("slowlog-log-slower-than", 0)
        r.slowlog_reset()
        while time.time() < we - 0.05:
            time.sleep(0.05)
            samples += r.slowlog_get(128)
            r.slowlog_reset()
        r.config_set("slowlog-log-slower-than", -1)
    else:
        time.sleep(max(0.0, we - time.time()))
    cpu1, busy1, t1 = redis_cpu(r), system_busy(), time.time()
    acked1 = int(r.hget(stats_key, "acked") or 0)
    calls = commandstats(r)
    reports = fleet_reports(children)
    queued = int(r.get(CrawlKeys(CRAWL_ID).todo) or 0)
    mem = int(r.info("memory")["used_memory"])
    r.close()
    span = t1 - t0
    client_cpu = sum(x["cpu_s"] for x in reports)
    redis_s = cpu1 - cpu0
    for name, n in HARNESS_CALLS.items():
        if name in calls:
            calls[name]["calls"] -= n
    if slowlog:
        for name in ("config set", "slowlog get", "slowlog reset"):
            calls.pop(name, None)
    calls.pop("config resetstat", None)
    counts: Counter[str] = Counter()
    script_calls: Counter[str] = Counter()
    for x in reports:
        counts.update(x["counts"])
        script_calls.update(x["calls"])
    pages = counts["trivial"] if mode == "trivial" else acked1 - acked0
    return {"mode": mode, "procs": len(children), "workers": workers, "latency": latency,
            "window_s": span, "pages": pages, "pages_per_s": pages / span,
            "redis_cpu_s": redis_s, "redis_cores": redis_s / span,
            "client_cores": client_cpu / span,
            "others_cores": max(0.0, (busy1 - busy0) - redis_s - client_cpu) / span,
            "commands": calls, "script_calls": dict(script_calls), "counts": dict(counts),
            "queued_after": queued, "used_memory": mem,
            "slowlog": [_slow_entry(e) for e in samples]}


def _slow_entry(e: dict[str, Any]) -> tuple[str, str, int]:
    """(command, first argument, duration µs) of a SLOWLOG entry (redis-py joins the
    arguments with spaces)."""
    cmd = e["command"]
    cmd = cmd.decode("latin-1") if isinstance(cmd, bytes) else str(cmd)
    parts = cmd.split(" ", 2)
    return parts[0].lower(), parts[1] if len(parts) > 1 else "", int(e["duration"])


NESTED = 100  # redis.call()s of the calibration script
CALIBRATION = (f"for i = 1, {NESTED} do redis.call('EXISTS', KEYS[1]) end return 1")


def redis_benchmark(srv: Any, clients: int = 32, n: int = 200_000) -> dict[str, Any] | None:
    """The trivial script by redis-benchmark's C clients (one command at a time each):
    calls/s and Redis CPU per call; then the same with a script of NESTED
    ``redis.call('EXISTS', k)``, for the Redis CPU of one call made inside a script."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None

    def one(script: str, keys: int, count: int) -> dict[str, Any]:
        r = srv.client()
        r.flushall()
        sha = r.script_load(script)
        r.config_resetstat()
        cpu0, t0 = redis_cpu(r), time.time()
        p = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(srv.port), "-c", str(clients),
                            "-n", str(count), "-P", "1", "EVALSHA", sha, str(keys)]
                           + ["k"] * keys, capture_output=True, text=True, timeout=600)
        t1, cpu1 = time.time(), redis_cpu(r)
        evals = commandstats(r).get("evalsha", {"calls": 0})["calls"]
        r.close()
        if p.returncode != 0:
            return {"error": p.stderr[-500:]}
        span = t1 - t0
        return {"clients": clients, "calls": evals, "calls_per_s": evals / span,
                "redis_cores": (cpu1 - cpu0) / span,
                "redis_us_per_call": 1e6 * (cpu1 - cpu0) / evals if evals else None}

    out = one(TRIVIAL, 0, n)
    cal = one(CALIBRATION, 1, n // 10)
    if out.get("redis_us_per_call") and cal.get("redis_us_per_call"):
        out["nested_call_us"] = (cal["redis_us_per_call"] - out["redis_us_per_call"]) / NESTED
    return out


def script_costs(srv: Any, calls: int = 2000, log: Any = print) -> list[dict[str, Any]]:
    """Redis CPU per call of claim.lua and commit.lua alone, one client, one call at a
    time, for a few shapes (candidate lanes, requests per claim, pages per commit), with
    the trivial script as the cost of a round trip: input for making the scripts cheaper.
    It measures one version per run: to compare two versions on a shared machine, use
    bench_script_ab.py (both on one server, calls interleaved)."""
    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.frontier import NO_BUDGET, Frontier
    from scrapy_leased.frontier.keys import CrawlKeys

    hosts = 32
    r = srv.client()
    r.flushall()
    r.close()
    seed(srv.url, 100_000, hosts)  # 3,125 a lane: more than any case below takes
    pool = seed_requests(100_000, hosts)
    rows: list[dict[str, Any]] = []

    async def go() -> None:
        f = Frontier(make_client(srv.url), CrawlKeys(CRAWL_ID), lease_ms=LEASE_MS,
                     max_attempts=4)
        lanes_all = [host(i) for i in range(hosts)]
        trivial = f.client.register_script(TRIVIAL)
        held: list[tuple[int, Any]] = []
        rng = random.Random(7)
        counter = [0]

        def new_url(lane: str) -> str:
            counter[0] += 1
            return f"https://{lane}/p/c{counter[0]}"

        def links(env: Any) -> list[Any]:
            return page_links(rng, env.lane, "https://x/", new_url, pool, hosts)

        async def timed(label: str, n: int, call: Any, per_call_pages: float) -> None:
            c = srv.client()
            cpu0 = redis_cpu(c)
            for _ in range(n):
                await call()
            cpu1 = redis_cpu(c)
            c.close()
            us = 1e6 * (cpu1 - cpu0) / n
            rows.append({"case": label, "calls": n, "us_per_call": us,
                         "units": per_call_pages})
            log(f"  script cost {label}: {us:.1f} µs per call")

        await timed("trivial script (`return 1`)", calls, lambda: trivial(), 0)
        turn = [0]
        for want, nl in ((1, 1), (1, 8), (1, 32), (16, 1), (16, 32)):
            async def claim(want: int = want, nl: int = nl) -> None:
                # candidates: nl lanes, the first one different at each call (each lane
                # holds 3,125 requests: none runs dry)
                turn[0] += 1
                cands = [(lanes_all[(turn[0] + i) % hosts], NO_BUDGET) for i in range(nl)]
                res = await f.claim(want, "cost", cands)
                held.extend(res.claims)
            before = len(held)
            n = calls // 4 if want == 1 else calls // 16
            await timed(f"claim.lua: {want} request{'s' if want > 1 else ''} from "
                        f"{nl} candidate lane{'s' if nl > 1 else ''}", n, claim, want)
            if len(held) - before != n * want:
                raise RuntimeError(f"claim cost: {len(held) - before} claimed, not {n * want}")
        for pages in (1, 16):
            async def commit(pages: int = pages) -> None:
                done = [held.pop() for _ in range(pages)]
                new = [x for _, env in done for x in links(env)]
                await f.commit(new, [(t, env.rid) for t, env in done])
            n = min(calls // 4, len(held) // pages)
            await timed(f"commit.lua: {pages} page{'s' if pages > 1 else ''} "
                        f"({10 * pages} links, {pages} ack{'s' if pages > 1 else ''})", n,
                        commit, pages)
        await f.client.aclose()

    asyncio.run(go())
    return rows


# -- summaries --------------------------------------------------------------------------


#: Commands clients send. Not INFO: the scripts' guard runs ``INFO server`` inside each
#: call (lib_guard.lua; the harness's own INFOs are taken off, HARNESS_CALLS).
SENT = {"evalsha", "eval", "script load", "hello", "ping", "client setinfo",
        "select", "client setname"}


def per_page(res: dict[str, Any]) -> dict[str, Any]:
    pages = res["pages"] or 1
    calls = res["commands"]
    total = sum(c["calls"] for c in calls.values())
    sent = sum(c["calls"] for k, c in calls.items() if k in SENT)
    evalsha = calls.get("evalsha", {"calls": 0})["calls"]
    c = res["counts"]
    lo, hi = res["latency"]
    # what the fleet would do if its workers never waited for CPU: every worker keeps
    # CONCURRENCY pages in flight, each lasting the mean latency
    offered = res["workers"] * CONCURRENCY / ((lo + hi) / 2000) if hi > 0 else None
    return {
        "offered_pages_per_s": offered,
        "served_share": res["pages_per_s"] / offered if offered else None,
        "commands": total / pages, "sent": sent / pages, "evalsha": evalsha / pages,
        "by_script": {k: v / pages for k, v in sorted(res["script_calls"].items())},
        "redis_ms_per_1000": 1000 * res["redis_cpu_s"] / pages * 1000,
        "pages_per_redis_cpu_s": pages / res["redis_cpu_s"] if res["redis_cpu_s"] else None,
        "dup_share": 1 - c.get("links_new", 0) / c["links_sent"] if c.get("links_sent") else None,
        "claimed_per_claim_call": (c.get("claimed", 0) / res["script_calls"]["claim"]
                                   if res["script_calls"].get("claim") else None),
        "pages_per_commit": (c.get("acks_committed", 0) / c["commits"]
                             if c.get("commits") else None),
    }


def where_it_spends(res: dict[str, Any], shas: dict[str, str]) -> dict[str, Any]:
    """Per script: Redis µs per call (SLOWLOG samples); per nested command: calls and
    µs per page (commandstats), with the scripts that call it."""
    pages = res["pages"] or 1
    by_sha: dict[str, list[int]] = {}
    for cmd, sha, dur in res["slowlog"]:
        if cmd == "evalsha":
            by_sha.setdefault(sha, []).append(dur)
    scripts = {}
    for name, sha in shas.items():
        durs = by_sha.get(sha)
        n_calls = res["script_calls"].get(name, 0)
        if durs:
            scripts[name] = {"samples": len(durs), "us_per_call": statistics.fmean(durs),
                             "us_p90": sorted(durs)[int(0.9 * (len(durs) - 1))],
                             "calls_per_page": n_calls / pages,
                             "us_per_page": statistics.fmean(durs) * n_calls / pages}
    users = script_commands()
    nested = []
    for name, c in res["commands"].items():
        if name in SENT or c["calls"] <= 0:
            continue
        nested.append({"command": name, "per_page": c["calls"] / pages,
                       "us_per_call": c["usec"] / c["calls"],
                       "us_per_page": c["usec"] / pages,
                       "scripts": sorted(users.get(name.split(" ")[0], ()))})
    nested.sort(key=lambda x: -x["us_per_page"])
    ev = res["commands"].get("evalsha", {"usec": 0.0})
    inner = sum(x["us_per_page"] for x in nested)
    return {"scripts": scripts, "nested": nested,
            "evalsha_us_per_page": ev["usec"] / pages, "nested_us_per_page": inner}


def script_shas() -> dict[str, str]:
    """name -> SHA of every frontier script, as Redis names it in EVALSHA."""
    from scrapy_leased.frontier.scripts import LIBS, script_source

    return {name: hashlib.sha1(script_source(name).encode()).hexdigest() for name in LIBS}


def measure(fleets: list[int], procs: int, latency: tuple[float, float], hosts: int,
            seeds: int, window: float, profile: bool, busy_workers: int,
            one_host: int = 0, log: Any = print, cost_calls: int = 2000) -> dict[str, Any]:
    """The fleets at ``latency`` and ``hosts``, then (when not 0) a busy fleet (no
    latency) and a fleet on one host (one lane), the trivial-script ceilings, and the
    SLOWLOG window at the largest fleet (``profile``)."""
    from tests.support.redis_server import RedisServer

    srv = RedisServer(appendonly=False).start()
    out: dict[str, Any] = {"latency": latency, "hosts": hosts, "seeds": seeds,
                           "window": window, "procs": procs, "steps": []}
    plan = [(w, latency, hosts, "") for w in fleets]
    if busy_workers:
        plan.append((busy_workers, (0.0, 0.0), hosts, "busy"))
    if one_host:
        plan.append((one_host, latency, 1, "one host"))
    try:
        c = srv.client()
        out["redis_version"] = c.info("server")["redis_version"]
        c.close()
        out["redis_benchmark"] = redis_benchmark(srv)
        log(f"trivial EVALSHA, redis-benchmark: {out['redis_benchmark']}")
        out["script_costs"] = script_costs(srv, calls=cost_calls, log=log)
        for w, lat, h, label in plan:
            res = run_fleet(srv, min(procs, w), w, lat, h, seeds, window)
            res["per_page"] = per_page(res)
            res["hosts"], res["label"] = h, label
            res.pop("slowlog")
            out["steps"].append(res)
            log(f"fleet {w} workers, {h} hosts, {lat[0]:.0f}-{lat[1]:.0f} ms: "
                f"{res['pages_per_s']:,.0f} pages/s, Redis {res['redis_cores']:.2f} cores, "
                f"clients {res['client_cores']:.2f} cores, others {res['others_cores']:.2f}, "
                f"{res['per_page']['pages_per_redis_cpu_s'] or 0:,.0f} pages per Redis CPU-s, "
                f"{res['per_page']['sent']:.2f} round trips/page")
        w = fleets[-1]
        res = run_fleet(srv, min(procs, w), w, latency, hosts, seeds, window, mode="floor")
        pp = per_page(res)
        out["floor"] = {"workers": w, "pages_per_s": res["pages_per_s"],
                        "redis_cores": res["redis_cores"], "client_cores": res["client_cores"],
                        "served_share": pp["served_share"],
                        "pages_per_redis_cpu_s": pp["pages_per_redis_cpu_s"],
                        "commands": pp["commands"], "sent": pp["sent"],
                        "claimed_per_call": (res["counts"].get("claimed", 0)
                                             / res["script_calls"].get("floor", 1))}
        log(f"floor.lua, fleet of {w}: {out['floor']}")
        res = run_fleet(srv, min(procs, w), w, latency, hosts, seeds, window, mode="trivial")
        out["trivial_python"] = {"workers": w, "calls_per_s": res["pages_per_s"],
                                 "redis_cores": res["redis_cores"],
                                 "client_cores": res["client_cores"],
                                 "redis_us_per_call": 1e6 * res["redis_cpu_s"] / res["pages"]
                                 if res["pages"] else None}
        log(f"trivial EVALSHA, the Python fleet of {w}: {out['trivial_python']}")
        if profile:
            res = run_fleet(srv, min(procs, w), w, latency, hosts, seeds, window, slowlog=True)
            res["per_page"] = per_page(res)
            out["profile"] = where_it_spends(res, script_shas())
            out["profile"]["fleet"] = {k: res[k] for k in ("workers", "pages_per_s",
                                                           "redis_cores", "per_page")}
            log(f"profile window: {res['pages_per_s']:,.0f} pages/s")
    finally:
        srv.close()
    return out


def cost_report(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table of script_costs()."""
    base = rows[0]["us_per_call"]
    lines = ["| call (one client, one call at a time) | calls | Redis CPU µs / call | above the "
             "trivial call | above it, per request claimed or page committed |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        above = r["us_per_call"] - base
        per = f"{above / r['units']:.1f}" if r["units"] else ""
        lines.append(f"| {r['case']} | {r['calls']:,} | {r['us_per_call']:.1f} | "
                     f"{above:.1f} | {per} |")
    return lines


def floor_line(fl: dict[str, Any]) -> str:
    """A sentence on the floor.lua fleet (measure()'s ``floor``)."""
    return (f"floor.lua (one call per batch: acks, links, claim; no guarantee beyond a "
            f"lease per batch), fleet of {fl['workers']}: {fl['pages_per_s']:,.0f} pages/s, "
            f"Redis {fl['redis_cores']:.2f} cores, {fl['pages_per_redis_cpu_s'] or 0:,.0f} "
            f"pages per Redis CPU-second, {fl['commands']:.1f} commands and "
            f"{fl['sent']:.2f} round trips per page, {fl['claimed_per_call']:.1f} requests "
            f"claimed per call.")


def report(out: dict[str, Any]) -> list[str]:
    """Markdown tables of a measure() result."""
    lines = ["| simulated workers | processes | hosts (lanes) | page latency | pages/s (share of "
             "the offered load) | Redis CPU, cores | "
             "Redis CPU s per 1,000 pages | pages per Redis CPU-second | commands run / page "
             "| round trips / page (per worker) | claim / commit / renew / sweep calls per "
             "page | requests per claim call | pages per commit | links that were "
             "duplicates | workers' CPU, cores | other processes, cores |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- "
             "| ---: | ---: "
             "| ---: | ---: | ---: |"]
    for s in out["steps"]:
        pp = s["per_page"]
        bs = pp["by_script"]
        lat = f"{s['latency'][0]:.0f}-{s['latency'][1]:.0f} ms" if s["latency"][1] else "none"
        calls = " / ".join(f"{bs.get(k, 0):.3f}" for k in ("claim", "commit", "renew"))
        calls += f" / {bs.get('expired', 0) + bs.get('recover', 0):.3f}"
        served = f" ({100 * pp['served_share']:.0f} %)" if pp["served_share"] else ""
        lines.append(row(
            s["workers"], s["procs"], s["hosts"], lat, f"{s['pages_per_s']:,.0f}{served}",
            f"{s['redis_cores']:.2f}", f"{pp['redis_ms_per_1000'] / 1000:.3f}",
            f"{pp['pages_per_redis_cpu_s'] or 0:,.0f}", f"{pp['commands']:.1f}",
            f"{pp['sent']:.2f}", calls, f"{pp['claimed_per_claim_call'] or 0:.1f}",
            f"{pp['pages_per_commit'] or 0:.1f}", f"{100 * (pp['dup_share'] or 0):.0f} %",
            f"{s['client_cores']:.2f}", f"{s['others_cores']:.2f}"))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small fleets, short windows")
    ap.add_argument("--fleets", default="4,8,16,32", help="simulated workers per step")
    ap.add_argument("--procs", type=int, default=3, help="processes the workers run in")
    ap.add_argument("--latency", default="50,150", help="page latency range, ms")
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=20_000)
    ap.add_argument("--window", type=float, default=12.0)
    ap.add_argument("--busy", type=int, default=6,
                    help="also a fleet of this many workers with no latency (0: none)")
    ap.add_argument("--one-host", type=int, default=16,
                    help="also a fleet of this many workers on one host (0: none)")
    ap.add_argument("--profile", action="store_true", help="SLOWLOG window: where it spends")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(asyncio.run(child(json.loads(ns.child)))), flush=True)
        return 0
    fleets = [int(x) for x in ns.fleets.split(",")]
    window = ns.window
    if ns.quick:
        fleets, window = [4, 16], 4.0
    lat = tuple(float(x) for x in ns.latency.split(","))
    out = measure(fleets, ns.procs, lat, ns.hosts, ns.seeds, window, ns.profile, ns.busy,
                  ns.one_host, log=lambda m: print(m, file=sys.stderr))
    print("\n".join(report(out)))
    print("\n" + floor_line(out["floor"]))
    if "profile" in out:
        print(json.dumps(out["profile"], indent=1))
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
