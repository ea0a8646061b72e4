"""Every benchmark of scrapy_leased side by side with its baselines, in one go.

    python benchmarks/run_all.py [--quick] [--reps 5] [--only scheduler,memory,e2e,...]
                                 [--out BENCHMARKS.md] [--no-wait]

Sections (``--only`` names; all but ``e2e_defaults`` by default):

* ``scheduler``: the scheduler alone (no network), 50,000 requests: enqueue / dequeue
  (claim + ack) rates of scrapy_leased vs Scrapy's default scheduler vs scrapy-redis's
  (``bench_scheduler.py``, a fresh process per run);
* ``memory``: Redis memory per seen URL and per queued plain GET at 100k and 1M URLs vs
  scrapy-redis's layout (``bench_memory.py``);
* ``memory_prio``: Redis memory per queued request at priority 0, spread over 8
  priorities and at priority 1, at 100k and 1M (``bench_memory.py --priorities``);
* ``e2e``: end-to-end crawl of the local test site (5,000 pages, CPU-bound): pages/s of
  plain Scrapy, scrapy-redis (1 and 2 workers) and scrapy_leased (1, 2 and 3 workers
  with ``LEASED_UPSERT_ENABLED = False``, 1 and 2 at its defaults, where the upsert
  pipeline is off too unless ``LEASED_UPSERT_URL`` is set), each run ending by itself,
  duplicates and misses from the site's log, CPU, and Redis round trips per page from
  ``INFO commandstats`` (``bench_e2e.py``); ``e2e_defaults``: only plain Scrapy and
  scrapy_leased at its defaults;
* ``latency``: a latency-bound crawl, every page answering after 100 ms (4 hosts),
  plain Scrapy (and 2 and 4 independent plain crawls) vs scrapy_leased at its defaults
  (1, 2, 4 workers) vs scrapy-redis (1, 2, 4), downloads in flight and claims held
  (``bench_latency.py``, the site's ``--profile``); ``spread``: the same with delays of
  20-500 ms (8 hosts, 2 of them slow);
* ``worker_instr``: instructions a worker runs per page (callgrind, CPU-bound site, one
  worker): plain Scrapy vs scrapy_leased at its defaults, as a ratio
  (``bench_worker_instructions.py``);
* ``redis_instr``: instructions Redis runs per page for the claim and commit scripts
  (callgrind, a worker's claim batch of pages a call, 10 links a page), beside
  ``floor.lua``: the fewest commands a page needs (``bench_script_instructions.py
  --floor``);
* ``frontier``: the frontier at fleet scale, simulated workers without HTTP against one
  Redis: pages/s, Redis CPU per page, commands and round trips per page, beside the
  trivial-script ceiling of the same Redis, and where the scripts spend
  (``bench_frontier.py``);
* ``shards``: one crawl over 1, 2, 4 and 8 Redis masters, simulated as ``frontier`` is:
  Redis CPU per page against one shard's and each master's share
  (``bench_shards.py``: the sharding design of issue 26, measured before it is built).

Timed cases are repeated (``--reps``, in rotating order so a change of machine load
hits every case alike) and reported as median (min-max), with ratios of medians.
Needs ``redis-server`` on PATH and ``pip install -e '.[bench]'`` (scrapy-redis).
``--quick`` (2 repetitions, 10,000 requests, 100k URLs, 1,000 pages, 300 latency pages
per worker, small fleets and 4 s windows) checks that everything runs; only a full run
is fit for BENCHMARKS.md. ``--no-wait`` skips the wait for a quiet machine before each
timed run (figures taken while other work runs are noisy: say so).

Writes BENCHMARKS.md at the repository root: the machine, the versions, the command
and the tables. Whatever follows the line ``<!-- hand-written -->`` in an existing
BENCHMARKS.md (the analysis of missed targets) is kept as it is.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCH))

import bench_worker_instructions as bwi  # noqa: E402

from tests.support.redis_server import RedisServer  # noqa: E402

HAND_WRITTEN = "<!-- hand-written -->"
E2E_SETUPS = [("plain", 1), ("plain", 2), ("scrapy_redis", 1), ("scrapy_redis", 2),
              ("leased", 1), ("leased", 2), ("leased", 3),
              ("leased_defaults", 1), ("leased_defaults", 2)]
# --only e2e_defaults: the add-on at its defaults against plain Scrapy, nothing else
E2E_DEFAULTS_SETUPS = [("plain", 1), ("plain", 2), ("leased_defaults", 1), ("leased_defaults", 2)]
SETUP_NAMES = {"plain": "plain Scrapy", "scrapy_redis": "scrapy-redis",
               "leased": "scrapy_leased (upsert pipeline off)",
               "leased_defaults": "scrapy_leased at its defaults",
               # section 8's controls for LEASED_GC_FREEZE (bench_worker_instructions)
               bwi.PLAIN_FROZEN: "plain Scrapy, gc.freeze() once open",
               bwi.LEASED_UNFROZEN: "scrapy_leased, LEASED_GC_FREEZE = False"}
SECTIONS = ("scheduler", "memory", "memory_prio", "e2e", "e2e_defaults", "latency", "spread",
            "frontier", "worker_instr", "redis_instr", "shards")
SCHEDULERS = [("scrapy", "Scrapy default (in memory)"), ("scrapy_redis", "scrapy-redis"),
              ("leased", "scrapy_leased")]

OUT: list[str] = []  # markdown of the tables, in order


def setup_name(mode: str, workers: int) -> str:
    if mode == "plain" and workers > 1:
        return f"control: {workers} independent plain Scrapy crawls at once"
    return SETUP_NAMES[mode]


def emit(line: str = "") -> None:
    print(line, flush=True)
    OUT.append(line)


def note(line: str) -> None:
    """Progress, printed but not written to BENCHMARKS.md."""
    print(f"  .. {line}", file=sys.stderr, flush=True)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def open_section(title: str) -> None:
    """A section's heading, then the load average before it runs."""
    emit(title)
    emit()
    emit(f"Load average before: {load()}")


def memory_section(title: str, key: str, measure: Callable[..., dict], n: int, raw: dict,
                   per: str) -> dict:
    """Open a memory section, measure up to ``n`` (kept as ``raw[key]``), and say what
    its bytes are: the growth of used_memory ``per`` item."""
    open_section(title)
    raw[key] = res = measure(n, log=note)
    emit()
    emit("Bytes = growth of `INFO memory` `used_memory` from an emptied server / " + per)
    return res


QUIET = {"enabled": True, "waited": 0.0, "gave_up": 0, "repeated": 0, "kept_disturbed": 0}
DISTURBED_CORES = 0.3  # a timed run during which other processes used more is run again
MAX_REPEATS = 3
QUIET_CORES = 0.25  # busy cores (other processes) below which the machine counts as quiet
QUIET_MAX_WAIT_S = 300.0


def wait_quiet() -> None:
    """Before a timed run: wait until the machine's other processes use less than
    QUIET_CORES cores over 2 s (none of the benchmark's own processes runs then), at
    most QUIET_MAX_WAIT_S; then run anyway (counted, and the tables show the load)."""
    if not QUIET["enabled"]:
        return
    from bench_e2e import system_busy

    t0 = time.monotonic()
    while True:
        b0 = system_busy()
        time.sleep(2.0)
        busy = (system_busy() - b0) / 2.0
        if busy < QUIET_CORES:
            break
        if time.monotonic() - t0 > QUIET_MAX_WAIT_S:
            QUIET["gave_up"] += 1
            note(f"machine still busy ({busy:.2f} cores) after {QUIET_MAX_WAIT_S:.0f} s: running")
            break
    QUIET["waited"] += time.monotonic() - t0


def undisturbed(label: str, go: Callable[[], dict], others: Callable[[dict], float]) -> dict:
    """Run ``go`` after waiting for a quiet machine; run it again (at most MAX_REPEATS
    times) when other processes used more than DISTURBED_CORES meanwhile."""
    for attempt in range(MAX_REPEATS + 1):
        wait_quiet()
        res = go()
        busy = others(res)
        if not QUIET["enabled"] or busy <= DISTURBED_CORES:
            return res
        if attempt < MAX_REPEATS:
            QUIET["repeated"] += 1
            note(f"{label}: other processes used {busy:.2f} cores meanwhile: running it again")
    QUIET["kept_disturbed"] += 1
    return res


def med(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt(values: list[float], digits: int = 0) -> str:
    m, lo, hi = med(values)
    return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def ratio(a: list[float], b: list[float]) -> str:
    return f"{statistics.median(a) / statistics.median(b):.2f}x"


def rotate(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


# -- machine ---------------------------------------------------------------------


def machine(redis_version: str) -> list[str]:
    import redis
    import scrapy
    import scrapy_redis
    import twisted

    mem_kb = 0
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return [
        f"- Machine: `nproc` = {nproc} ({cpu}), {mem_kb / 1024 / 1024:.1f} GiB memory, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, Scrapy {scrapy.__version__}, "
        f"Twisted {twisted.__version__}, redis-py {redis.__version__}, "
        f"Redis server {redis_version} (a private `redis-server` on loopback, no persistence), "
        f"scrapy-redis {getattr(scrapy_redis, '__version__', '?')}",
    ]


# -- 1. scheduler ------------------------------------------------------------------


def run_scheduler(which: str, n: int, redis: RedisServer) -> dict:
    import resource

    from bench_e2e import redis_cpu, system_busy

    client = redis.client()
    client.flushall()
    cmd = [sys.executable, str(BENCH / "bench_scheduler.py"), "--which", which, "--n", str(n),
           "--redis-url", redis.url]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, redis0, t0 = system_busy(), redis_cpu(client), time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime) + redis_cpu(client) - redis0
    others = max(0.0, system_busy() - busy0 - own)
    client.close()
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return {**json.loads(lines[-1]), "others_cores": others / wall}


def section_scheduler(n: int, reps: int, redis: RedisServer, raw: dict) -> dict:
    open_section(f"## 1. Scheduler alone (no network), {n:,} requests")
    order = [w for w, _ in SCHEDULERS] + ["leased_ops"]
    runs: dict[str, list[dict]] = {w: [] for w in order}
    for rep in range(reps):
        for which in rotate(order, rep):
            res = undisturbed(f"scheduler {which}",
                              lambda which=which: run_scheduler(which, n, redis),
                              lambda r: r["others_cores"])
            runs[which].append(res)
            note(f"scheduler rep {rep + 1}/{reps} {which}: "
                 + ", ".join(f"{k} {v:,.0f}" for k, v in res.items() if k.endswith("_rate")))
    emit(f"Load average after: {load()}")
    others = [r["others_cores"] for w in runs for r in runs[w]]
    emit(f"Other processes meanwhile (CPU of the machine minus the benchmark's process and "
         f"redis-server, over each run's wall time): {statistics.median(others):.2f} cores "
         f"busy (median), {max(others):.2f} (max)")
    emit()
    raw["scheduler"] = runs
    enq = {w: [r["enqueue_rate"] for r in runs[w]] for w in runs}
    deq = {w: [r["dequeue_rate"] for r in runs[w]] for w in runs if w != "leased_ops"}
    emit(f"Requests/s, median (min-max) of {reps} runs, each in a fresh process. "
         "Ratios: scrapy_leased's median over the other's.")
    emit()
    emit("| scheduler | enqueue req/s | dequeue req/s |")
    emit("| --- | ---: | ---: |")
    for which, name in SCHEDULERS:
        label = name + (" (dequeue = claim + hand out + finish + ack)" if which == "leased" else "")
        emit(f"| {label} | {fmt(enq[which])} | {fmt(deq[which])} |")
    emit(f"| scrapy_leased / Scrapy default | {ratio(enq['leased'], enq['scrapy'])} "
         f"| {ratio(deq['leased'], deq['scrapy'])} |")
    emit(f"| scrapy_leased / scrapy-redis | {ratio(enq['leased'], enq['scrapy_redis'])} "
         f"| {ratio(deq['leased'], deq['scrapy_redis'])} |")
    emit()
    ops = runs["leased_ops"]
    claim = [r["claim_rate"] for r in ops]
    ack = [r["ack_rate"] for r in ops]
    emit("scrapy_leased operations alone (the scheduler's own calls: `Frontier.claim` of 16 "
         "requests + `decode_request`, as `_claim_loop`/`_absorb` do; "
         "`CommitWriter.add_ack` for 16 finished claims per event-loop turn, then drained):")
    emit()
    emit("| operation | req/s |")
    emit("| --- | ---: |")
    emit(f"| enqueue (`enqueue_request` + `CommitWriter`, as above) | {fmt(enq['leased_ops'])} |")
    emit(f"| claim alone | {fmt(claim)} |")
    emit(f"| ack alone | {fmt(ack)} |")
    emit()
    emit("How: each scheduler is the real class, built by Scrapy from a real `Crawler` "
         "(`get_crawler`: settings, stats, fingerprinter, the dupefilter of "
         "`DUPEFILTER_CLASS`) and driven through Scrapy's scheduler interface with an "
         "engine stand-in (a real `Downloader` for slot keys; an engine slot whose "
         "`inprogress` set and `nextcall` are what scrapy_leased uses to follow completion "
         "and to wake the engine). Requests: `Request(url, callback=spider.parse, "
         "meta={'depth': 1}, headers={'Referer': ...})`, one host, all distinct. Enqueue: "
         "`enqueue_request`, 10 at a time (one page's links) between returns to the event "
         "loop; scrapy_leased's time includes its `CommitWriter` writing all of them to "
         "Redis. Dequeue: `next_request` with at most `CONCURRENT_REQUESTS` (16) in "
         "flight; each request's download slot is looked up "
         "(`Downloader.get_slot_key`, as the engine's `fetch` does first: scrapy_leased "
         "looks it up itself when it claims a request, and the downloader's lookup then "
         "finds the URL already parsed), then the request is finished at once as the "
         "engine finishes it; for "
         "scrapy_leased that is a claim by its claim loop, then an ack, and the time "
         "includes the last ack reaching Redis. Scrapy's and scrapy-redis's schedulers "
         "have no ack: their dequeue is `next_request` and the slot lookup. See "
         "`benchmarks/bench_scheduler.py`.")
    emit()
    return {"enqueue": statistics.median(enq["leased"]),
            "claim": statistics.median(deq["leased"]),
            "claim_alone": statistics.median(claim)}


# -- 2. memory -------------------------------------------------------------------


def section_memory(n: int, raw: dict) -> dict:
    from bench_memory import measure

    res = memory_section(
        f"## 2. Redis memory per seen URL and per queued request, up to {n:,} URLs",
        "memory", measure, n, raw,
        "URLs (one run: the figures are deterministic up to the allocator). "
        "URLs `http://example.com/p/{i}`: plain GETs, one host.")
    emit()
    emit("| URLs | seen: scrapy_leased | seen: scrapy-redis | ratio | "
         "queued: scrapy_leased | queued: scrapy-redis | ratio |")
    emit("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cp in res["checkpoints"]:
        ls, ss = res["leased_seen"][cp], res["sr_seen"][cp]
        lq, sq = res["leased_queue"][cp], res["sr_queue"][cp]
        emit(f"| {cp:,} | {ls:.1f} B | {ss:.1f} B | {ss / ls:.1f}x smaller | "
             f"{lq:.1f} B | {sq:.1f} B | {sq / lq:.1f}x smaller |")
    emit()
    enc = ", ".join(f"{k} x{v}" for k, v in res["leased_seen_encodings"].items())
    emit(f"scrapy_leased seen set: 2^14 SETs of 64-bit integers ({enc}, largest "
         f"{res['leased_seen_largest_bucket']} members), filled through `commit.lua`; "
         f"scrapy-redis: one SET of 40-hex SHA-1 strings. Queue: scrapy_leased's lane LIST "
         f"for priority 0 (`{res['leased_queue_encoding']}`), member "
         f"{res['leased_member_bytes']} bytes, e.g. "
         f"`{res['leased_member_example']}`; scrapy-redis's PriorityQueue ZSET, member "
         f"{res['sr_member_bytes']} bytes (pickle of `Request.to_dict`). The queue is measured "
         f"without any seen entry. See `benchmarks/bench_memory.py`.")
    emit()
    emit("The same requests with `priority=1` (each priority other than 0 is kept in a "
         f"LIST of the lane's tier, `{res['leased_prio_encoding']}`, member "
         f"{res['leased_prio_member_bytes']} bytes, e.g. `{res['leased_prio_member_example']}`): "
         + ", ".join(f"{res['leased_queue_prio'][cp]:.1f} B at {cp:,}"
                     for cp in res["checkpoints"]) + " per queued request.")
    emit()
    last = res["checkpoints"][-1]
    return {"seen": res["leased_seen"][last], "queued": res["leased_queue"][last], "at": last}


# -- 3 and 4. end to end ---------------------------------------------------------------


def section_e2e(pages: int, reps: int, redis: RedisServer, raw: dict,
                nodelay: bool = True, setups: list[tuple[str, int]] | None = None) -> dict:
    from bench_e2e import run

    setups = setups or E2E_SETUPS
    open_section(f"## 3. End to end: the local test site, {pages:,} pages")
    workdir = Path(tempfile.mkdtemp(prefix="leased-e2e-"))
    results: dict[tuple[str, int], list[dict]] = {s: [] for s in setups}
    for rep in range(reps):
        for mode, workers in rotate(setups, rep):
            res = undisturbed(
                f"e2e {mode} x{workers}",
                lambda mode=mode, workers=workers: run(mode, workers, pages, redis, workdir,
                                                         nodelay=nodelay),
                lambda r: r["cpu"]["others"] / r["wall"])
            res["load"] = load()
            if "error" in res:
                raise RuntimeError(f"{mode} x{workers}: {res['error']}")
            results[(mode, workers)].append(res)
            note(f"e2e rep {rep + 1}/{reps} {mode} x{workers}: {res['pages_per_s']:.0f} pages/s, "
                 f"wall {res['wall']:.1f} s, dup {res['site']['duplicates']}, "
                 f"miss {res['site']['misses']}, load {res['load']}")
    emit(f"Load average after: {load()}")
    emit()
    raw["e2e"] = {f"{m}x{w}": v for (m, w), v in results.items()}
    plain = [r["pages_per_s"] for r in results[("plain", 1)]]
    emit(f"pages/s = distinct pages / time from the first to the last request the site "
         f"served; median (min-max) of {reps} runs; ratio to plain Scrapy's median. Wall: "
         f"launch of the processes to the exit of the last one (Python start-up, and for "
         f"scrapy-redis its idle timeout, included). Duplicates and misses: totals over "
         f"all {reps} runs, from the site's log. HTTP connections opened: the TCP "
         f"connections the crawl opened to the site (distinct client ports in the site's "
         f"log; median, min-max), all workers together.")
    emit()
    emit("| setup | workers | pages/s | vs plain Scrapy | wall s | duplicates | misses "
         "| HTTP connections opened | every worker ended by itself |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for mode, workers in setups:
        rs = results[(mode, workers)]
        pps = [r["pages_per_s"] for r in rs]
        ended = all(c == 0 for r in rs for c in r["exit_codes"]) and all(
            x == "finished" for r in rs for x in r["reasons"])
        emit(f"| {setup_name(mode, workers)} | {workers} | {fmt(pps)} | {ratio(pps, plain)} | "
             f"{fmt([r['wall'] for r in rs], 1)} | "
             f"{sum(r['site']['duplicates'] for r in rs)} | "
             f"{sum(r['site']['misses'] for r in rs)} | "
             f"{fmt([r['site'].get('connections', 0) for r in rs])} | "
             f"{'yes (finished, exit 0)' if ended else 'NO'} |")
    emit()
    emit("Setup (`benchmarks/project`, one spider for all): the spider follows every link "
         "and yields one small item per page; no item pipeline; `LOG_LEVEL = 'WARNING'`; "
         "Scrapy's defaults otherwise (`CONCURRENT_REQUESTS` 16, "
         "`CONCURRENT_REQUESTS_PER_DOMAIN` 8, `ROBOTSTXT_OBEY` off); start: Scrapy's "
         "default `start()` from `start_urls` (one `dont_filter` request per worker). The "
         "site (`scrapy_leased/testing/site.py`, a subprocess) links page i to pages "
         "10i+1..10i+10 (those below 5,000) and to two cross links, so 15,000 links lead to "
         "5,000 distinct pages. The control row runs two plain Scrapy crawls at once, each "
         "of its own copy of the site (10,000 pages in all; its pages/s is the sum of "
         "both): what two processes that share nothing reach on this machine, the "
         "ceiling for two workers. "
         + ("It runs with TCP_NODELAY (the site's `--nodelay`): the stock server writes "
            "headers and body in two sends, and on a keep-alive connection Nagle's algorithm "
            "plus the client's delayed ACK made every response wait ~44 ms (measured on one "
            "connection: 44.0 ms p50, 0.39 ms with TCP_NODELAY), which capped every setup "
            "at ~8 requests in flight / 44 ms, about 200 pages/s per worker. "
            if nodelay else
            "It runs as it is (`--stock-site`): each keep-alive response waits ~44 ms "
            "(Nagle + delayed ACK), so every worker is capped near 8 / 44 ms. ")
         + "scrapy_leased (upsert pipeline off): the add-on with "
         "`LEASED_UPSERT_ENABLED = False` (the others store nothing either), everything "
         "else at its defaults; scrapy_leased at its defaults: the add-on exactly as a "
         "user gets it: every middleware and extension of the add-on on, and no "
         "`UpsertPipeline` (off by default unless `LEASED_UPSERT_URL` is set, so the "
         "project's items reach its own pipelines untouched); workers end when the crawl is "
         "drained. scrapy-redis: "
         "`SCHEDULER = 'scrapy_redis.scheduler.Scheduler'`, "
         "`DUPEFILTER_CLASS = 'scrapy_redis.dupefilter.RFPDupeFilter'`, "
         "`SCHEDULER_PERSIST = True` (otherwise the first worker to close deletes the "
         "shared queue), a plain `scrapy.Spider` (scrapy-redis's `RedisSpider` feeds start "
         "URLs through `start_requests`, which Scrapy 2.19 ignores); its default "
         "`PriorityQueue` ignores `SCHEDULER_IDLE_BEFORE_CLOSE`, so a benchmark extension "
         "(`IdleClose`) keeps an idle worker open until it has had no response for 6 s, "
         "then lets it close with `finished` (Scrapy fires `spider_idle` every 5 s). "
         "One private redis-server serves every run (`FLUSHALL` and `CONFIG RESETSTAT` "
         "before each).")
    emit()

    emit("Per 1,000 pages (median), from the same runs: CPU seconds of the workers "
         "(`getrusage` from the crawler's creation to spider_closed, all workers together), "
         "of redis-server (`INFO cpu`) and of the site (`/proc`), and the workers' context "
         "switches (`getrusage`, same window); the share is the three CPUs against "
         f"what the machine had: {os.cpu_count()} cores x the time from the first crawler's "
         "creation to the last spider_closed. Other processes: CPU the whole machine used "
         "during a run (`/proc/stat`) minus this run's processes, over the run's wall time "
         "(the largest of the runs): load from anything else on the machine.")
    emit()
    emit("| setup | workers | workers CPU s | Redis CPU s | site CPU s | all three, "
         "share of the machine | worker context switches (voluntary + involuntary) | "
         "other processes meanwhile, cores busy (max) |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ncpu = os.cpu_count() or 1

    def switches(r: dict, f: float) -> float:
        return f * sum(sum(w["crawl_switches"]) for w in r["worker_reports"] if w)
    for mode, workers in setups:
        rs = results[(mode, workers)]
        k = [1000.0 / r["site"]["distinct"] for r in rs]
        wc = [r["cpu"]["workers_crawl"] * f for r, f in zip(rs, k)]
        rc = [r["cpu"].get("redis", 0.0) * f for r, f in zip(rs, k)]
        sc = [r["cpu"]["site"] * f for r, f in zip(rs, k)]
        busy = [100.0 * (r["cpu"]["workers_crawl"] + r["cpu"].get("redis", 0.0) + r["cpu"]["site"])
                / (ncpu * r["crawl_window"]) for r in rs]
        emit(f"| {setup_name(mode, workers)} | {workers} | {statistics.median(wc):.2f} | "
             f"{statistics.median(rc):.2f} | {statistics.median(sc):.2f} | "
             f"{statistics.median(busy):.0f} % | "
             f"{statistics.median(switches(r, f) for r, f in zip(rs, k)):,.0f} | "
             f"{max(r['cpu']['others'] / r['wall'] for r in rs):.2f} |")
    emit()

    emit("## 4. Redis round trips per crawled page")
    emit()
    emit(f"From the same runs: `INFO commandstats` after each run (statistics reset "
         f"before it), divided by the distinct pages crawled; median (min-max) of {reps} "
         f"runs.")
    emit()
    emit("| setup | workers | commands sent / page | round trips / page | "
         "client-side writes / page | run inside scripts / page | sent, by command (one run) |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    trips: dict[tuple[str, int], float] = {}
    for mode, workers in setups:
        if mode == "plain":
            continue
        rs = results[(mode, workers)]
        per = [r["site"]["distinct"] for r in rs]
        sent = [r["commands"]["sent"] / p for r, p in zip(rs, per)]
        rt = [r["commands"]["round_trips"] / p for r, p in zip(rs, per)]
        cl = [r["redis_sends"] / p for r, p in zip(rs, per)]
        ins = [r["commands"]["inside_scripts"] / p for r, p in zip(rs, per)]
        trips[(mode, workers)] = statistics.median(rt)
        by = rs[len(rs) // 2]["commands"]["sent_by_command"]
        by_s = ", ".join(f"{k} {v:,}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
        emit(f"| {setup_name(mode, workers)} | {workers} | {fmt(sent, 2)} | {fmt(rt, 2)} | "
             f"{fmt(cl, 2)} | {fmt(ins, 1)} | {by_s} |")
    emit()
    emit("How the commands sent are told apart from the commands scripts run: Redis counts "
         "a command a Lua script runs with `redis.call` in `INFO commandstats` under that "
         "command's own name, exactly like one a client sends. So a command counts as "
         "sent by a client when it is EVALSHA/EVAL/SCRIPT, or when no script of "
         "scrapy_leased calls that command (names read from `scrapy_leased/**/lua/*.lua`); "
         "the commands scripts call are counted as run inside them. scrapy_leased's "
         "Python code sends only EVALSHA while crawling (plus HELLO/PING per new "
         "connection and HSETNX/HGET once at start; that one HGET per worker is counted as "
         "in-script). scrapy-redis runs no script, so every command it ran was sent. A "
         "MULTI/EXEC transaction (scrapy-redis's pop: MULTI ZRANGE ZREMRANGEBYRANK EXEC) "
         "is written in one go: round trips count it once. Cross-check: each worker counts "
         "the requests its redis-py connections write to the socket (a pipeline once), "
         "in `benchproject/extensions.py`; that is the client-side column.")
    emit()
    pps_med = {s: statistics.median([r["pages_per_s"] for r in results[s]]) for s in results}
    conns = {s: statistics.median([r["site"]["connections"] for r in results[s]])
             for s in results}
    redis_pps = {s: statistics.median([r["site"]["distinct"] / r["cpu"]["redis"]
                                       for r in results[s]])
                 for s in results if all(r["cpu"].get("redis") for r in results[s])}
    return {"pps": pps_med, "plain": statistics.median(plain), "trips": trips, "pages": pages,
            "conns_per_host": conns, "pages_per_redis_cpu_s": redis_pps}


# -- 5. latency-bound ----------------------------------------------------------------

LATENCY_SETUPS = [("plain", 1), ("plain", 2), ("plain", 4),
                  ("leased_defaults", 1), ("leased_defaults", 2), ("leased_defaults", 4),
                  ("scrapy_redis", 1), ("scrapy_redis", 2), ("scrapy_redis", 4)]
LATENCY_TITLES = {"fixed100": "every page answers after 100 ms",
                  "spread": "a spread of delays, 20-500 ms, two slow hosts"}


def section_latency(profile: str, number: str, pages: int, reps: int, redis: RedisServer,
                    raw: dict) -> dict:
    from bench_latency import HOSTS, Setup, run_one, table

    from scrapy_leased.testing.latency import FAST_MS, SLOW_HOSTS, SLOW_MS, profile_summary

    setups = [Setup(m, w, label=setup_name(m, w)) for m, w in LATENCY_SETUPS]
    hosts = HOSTS[profile]
    prof = profile_summary(profile, pages, hosts)
    open_section(
        f"## {number}. Latency-bound: {LATENCY_TITLES[profile]} ({pages:,} pages per worker)")
    workdir = Path(tempfile.mkdtemp(prefix="leased-latency-"))
    results: dict[str, list[dict]] = {st.spec: [] for st in setups}
    for rep in range(reps):
        for st in rotate(setups, rep):
            res = undisturbed(f"{profile} {st.spec}",
                              lambda st=st: run_one(st, profile, pages, redis, workdir),
                              lambda r: r["cpu"]["others"] / r["wall"] if "cpu" in r else 0.0)
            if "error" in res:
                raise RuntimeError(f"{profile} {st.spec}: {res['error']}")
            results[st.spec].append(res)
            pr = res["probe"]
            note(f"{profile} rep {rep + 1}/{reps} {st.spec}: {res['pages_per_s']:.0f} pages/s, "
                 f"in flight at the site {res['site']['inflight'] or 0:.1f}, "
                 f"unstarted max {pr.get('unstarted_max')}, load {load()}")
    emit(f"Load average after: {load()}")
    emit()
    raw[f"latency_{profile}"] = results
    emit(f"pages/s = distinct pages / time from the first to the last request the site "
         f"served; median (min-max) of {reps} runs. A setup of N workers crawls a site of "
         f"N x {pages:,} pages (every setup's crawl lasts about as long); \"vs plain "
         f"Scrapy\" divides by the median of one plain process on {pages:,} pages (a target "
         f"\"2 workers >= 1.9x\" means 1.9 times one plain process), \"per worker\" "
         f"divides that by N. The control rows run N independent plain crawls at once, each "
         f"of its own {pages:,}-page site: what N processes sharing nothing reach on this "
         f"machine.")
    emit()
    for line in table(results, setups, setups[0].spec):
        emit(line)
    emit()
    if profile == "fixed100":
        delays = "every page 100 ms"
    else:
        delays = (f"pages of {hosts - SLOW_HOSTS} hosts {FAST_MS[0]:.0f}-{FAST_MS[1]:.0f} ms "
                  f"(log-uniform), of the {SLOW_HOSTS} slow hosts "
                  f"{SLOW_MS[0]:.0f}-{SLOW_MS[1]:.0f} ms (uniform), "
                  f"{100 * prof['slow_share']:.0f} % of the pages on slow hosts")
    emit(f"The site (`scrapy_leased/testing/site.py --profile {profile}`, a subprocess): "
         f"the test site's pages and links spread over {hosts} hosts (127.0.0.1-{hosts}: "
         f"one download slot and one lane "
         f"each; page j on host j % {hosts}, absolute links), each page answered after a "
         f"fixed delay of its own ({delays}; mean {1000 * prof['mean_s']:.0f} ms), by a thread "
         f"that sleeps (no CPU), with TCP_NODELAY. Every setup runs with Scrapy's "
         f"defaults: `CONCURRENT_REQUESTS` 16, `CONCURRENT_REQUESTS_PER_DOMAIN` 8, no "
         f"download delay; so with no overhead at all one worker would hold 16 requests in "
         f"flight, {16 / prof['mean_s']:.0f} pages/s. scrapy_leased is the add-on at its "
         f"defaults; scrapy-redis as in section 3. In flight at the "
         f"site: sum over the pages of (answer written - request read) / span, the "
         f"crawl's real concurrency. Per worker (`BenchReport`, sampled every 20 ms over "
         f"the span, mean over the workers): requests in the downloader "
         f"(`downloader.active`, what Scrapy counts against `CONCURRENT_REQUESTS`) and on "
         f"the wire (download slots' `transferring`); for scrapy_leased the claims it "
         f"holds and the claims not yet handed to the engine (leases no other worker can "
         f"take; max over every sample of every worker in brackets). Site CPU: its CPU "
         f"seconds / span (it must stay far below 1 core).")
    emit()
    plain = statistics.median(r["pages_per_s"] for r in results[setups[0].spec])
    pps = {(st.mode, st.workers): statistics.median(r["pages_per_s"] for r in results[st.spec])
           for st in setups}
    umax = max((r["probe"]["unstarted_max"] for st in setups if st.mode.startswith("leased")
                for r in results[st.spec] if r["probe"].get("unstarted_max") is not None),
               default=None)
    site = max(r["site_cores"] for st in setups for r in results[st.spec])
    conns = {(st.mode, st.workers): statistics.median(r["site"]["connections"] / hosts
                                                      for r in results[st.spec])
             for st in setups}
    return {"pps": pps, "plain": plain, "unstarted_max": umax, "site_cores": site,
            "conns_per_host": conns}


# -- 7. frontier at fleet scale --------------------------------------------------------

SERVED_SHARE = 0.9  # the headline fleet: served at least this share of its offered load


def section_worker_instr(quick: bool, raw: dict) -> dict:
    open_section("## 8. Instructions a worker runs per page")
    small, large = (100, 300) if quick else (200, 700)
    wait_quiet()
    out = bwi.run(["plain", "leased_defaults", bwi.PLAIN_FROZEN, bwi.LEASED_UNFROZEN],
                  small, large)
    raw["worker_instr"] = out
    emit(f"`valgrind --tool=callgrind` counts the instructions of a whole `scrapy crawl` "
         f"of the CPU-bound test site (one worker), once with {small} pages and once with "
         f"{large}: (difference) / {large - small} pages is the cost of a page, start-up "
         f"cancelled out. Instructions repeat run to run where seconds on this machine do "
         f"not; under valgrind a worker runs ~50x slower, so timing-dependent batching "
         f"differs from full speed (`benchmarks/bench_worker_instructions.py`). The "
         f"add-on freezes a worker's start-up objects out of Python's full garbage "
         f"collections (`LEASED_GC_FREEZE`); the two controls below tell its own cost "
         f"from that gain: plain Scrapy doing the same `gc.freeze()`, and the add-on "
         f"without it.")
    emit()
    emit("| setup | instructions, whole crawl of " + f"{small} pages | of {large} pages "
         "| per 1,000 pages | vs plain Scrapy | vs plain Scrapy with gc.freeze() |")
    emit("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = out["plain"]["per_1000"]
    frozen = out[bwi.PLAIN_FROZEN]["per_1000"]
    for mode, row in out.items():
        emit(f"| {SETUP_NAMES[mode]} | {row['small']:,} | {row['large']:,} "
             f"| {row['per_1000']:,.0f} | {row['per_1000'] / base:.3f}x "
             f"| {row['per_1000'] / frozen:.3f}x |")
    emit()
    return out


def section_redis_instr(quick: bool, raw: dict) -> dict:
    import bench_script_instructions as bsi

    open_section("## 9. Instructions Redis runs per page")
    calls = 50 if quick else 200
    wait_quiet()
    totals = bsi.measure(calls, floor=True)
    page = bsi.per_page(totals, calls)
    raw["redis_instr"] = {"totals": totals, "per_page": page}
    emit(f"`valgrind --tool=callgrind` counts the instructions of a private redis-server "
         f"(`benchmarks/bench_script_instructions.py --floor`), {calls} calls of each: "
         f"claims of {bsi.PAGES} requests from {bsi.CANDIDATES} candidate lanes, commits of "
         f"{bsi.PAGES} pages (10 links a page, 3 of them new, and their acks), as the fleet "
         f"simulation's workers send them (a worker's claim batch at Scrapy's default "
         f"concurrency); and `benchmarks/lua/floor.lua` with the same pages: one script per "
         f"{bsi.PAGES} pages that "
         f"acks, queues what is new and claims with the fewest commands a page needs (one "
         f"lease entry per batch; no guard, lanes, tiers, rate or checks). A page costs "
         f"its claim's share plus its commit's share.")
    emit()
    emit("| phase | instructions per call | per page |")
    emit("| --- | ---: | ---: |")
    for label, total in totals.items():
        if label.startswith(("claim.lua", "commit.lua", "floor.lua")):
            emit(f"| {label} | {total / calls:,.0f} | {total / calls / bsi.FLOOR_PAGES:,.0f} |")
    emit(f"| claim + commit, per page | | {page['frontier']:,.0f} "
         f"({page['frontier'] / page['floor']:.2f}x the floor) |")
    emit()
    return page


def section_frontier(quick: bool, raw: dict) -> dict:
    import bench_frontier as bf

    open_section("## 7. The frontier at fleet scale: one Redis, many simulated workers, no HTTP")
    if quick:
        fleets, window, seeds, busy, one_host = [4, 12], 4.0, 5_000, 3, 4
    else:
        fleets, window, seeds, busy, one_host = [4, 8, 16, 32], 12.0, 20_000, 6, 16
    latency, hosts, procs = (50.0, 150.0), 64, 3
    wait_quiet()
    t0 = time.monotonic()
    out = bf.measure(fleets, procs, latency, hosts, seeds, window, True, busy, one_host,
                     log=note, cost_calls=800 if quick else 2000)
    emit(f"Load average after: {load()} ({time.monotonic() - t0:.0f} s)")
    emit()
    raw["frontier"] = out
    rb, tp = out["redis_benchmark"], out["trivial_python"]
    emit(f"Simulated workers (`benchmarks/bench_frontier.py`: `Frontier` and `CommitWriter` "
         f"as the scheduler uses them, no Scrapy, no HTTP) in {procs} processes; each has 16 "
         f"download slots and claims as the scheduler does (`ClaimSizer`: in batches of 8, "
         f"or at once when nothing claimed waits to start; naming the batch + 4 of the lanes "
         f"last reported ready; its waiting commit sent right before each claim), "
         f"\"downloads\" each page for {latency[0]:.0f}-{latency[1]:.0f} ms "
         f"(uniform; \"none\": done at "
         f"once, the busiest a worker can be), then commits its 10 links (7 duplicates of "
         f"URLs already seen, 3 new; all sent to Redis, no local seen cache) and its ack "
         f"through `CommitWriter` (which waits up to 50 ms for the next claim); "
         f"renews its leases every 10 s, sweeps expired leases "
         f"every 2 s. Requests spread over {hosts} hosts (lanes, no rate budget), payloads "
         f"shaped like the scheduler's (~130 B). Each row: an emptied redis-server seeded "
         f"with {seeds:,} requests, 3 s of warm-up, then a {window:.0f} s window: pages = "
         f"growth of the crawl's acked counter; Redis CPU = `INFO cpu` used_cpu_sys + "
         f"used_cpu_user; commands = `INFO commandstats` (reset at the window's start), "
         f"every command Redis ran, inside scripts too; round trips = commands sent by "
         f"clients (EVALSHA and the rest) per page, which is also per page per worker (each "
         f"page is one worker's); calls per script counted by the workers.")
    emit()
    for line in bf.report(out):
        emit(line)
    emit()
    if rb and "error" not in rb:
        emit(f"Ceiling of the same redis-server, same run, for a trivial script "
             f"(`EVALSHA` of `return 1`): {rb['calls_per_s']:,.0f} calls/s from "
             f"`redis-benchmark` ({rb['clients']} C clients, no pipelining), Redis at "
             f"{rb['redis_cores']:.2f} cores, {rb['redis_us_per_call']:.1f} µs of Redis CPU "
             f"per call ({1e6 / rb['redis_us_per_call']:,.0f} calls per Redis CPU-second); "
             f"{tp['calls_per_s']:,.0f} calls/s from the Python fleet of {tp['workers']} "
             f"(clients at {tp['client_cores']:.2f} cores, Redis {tp['redis_cores']:.2f} "
             f"cores, {tp['redis_us_per_call']:.1f} µs per call). One `redis.call` inside a "
             f"script (`EXISTS`, measured as a script of {bf.NESTED} of them against the "
             f"trivial one): {rb.get('nested_call_us', 0):.2f} µs of Redis CPU.")
        emit()
    fl = out.get("floor")
    if fl:
        emit(f"The floor protocol in the same run, same links and latency, instead of the "
             f"frontier: {bf.floor_line(fl)} What the frontier's pages per Redis CPU-second "
             f"are held to by any protocol of one call per batch on this Redis.")
        emit()
    emit("What each script costs Redis alone (`bench_frontier.script_costs`: one client, "
         "one call at a time, against a queue of 100,000 requests over 32 lanes; Redis CPU "
         "by `INFO cpu` over the calls, so a call's wake-up of an idle server is in every "
         "row, and the trivial script's row is the cost of a round trip). Pages committed: "
         "10 links each (7 duplicates, 3 new) and an ack:")
    emit()
    for line in bf.cost_report(out["script_costs"]):
        emit(line)
    emit()
    emit("This machine cannot saturate Redis with these clients: the simulated workers "
         "(Python, redis-py) need more CPU per page than Redis does and share its 2 cores, "
         "so pages per Redis CPU-second (the pages/s one Redis core would sustain) is the "
         "figure to compare with the trivial ceiling. The share after pages/s is the "
         "fleet's pages/s against its offered load (workers x 16 pages in flight / the mean "
         "latency): a fleet far below 100 % had workers waiting for CPU, which makes them "
         "claim and commit in bigger batches than real workers, and Redis cheaper per "
         f"page; the targets below are read at the largest fleet that served at least "
         f"{100 * SERVED_SHARE:.0f} % of its offered load.")
    emit()
    prof = out.get("profile")
    if prof:
        pf = prof["fleet"]
        emit(f"Where the scripts spend (one more window, {pf['workers']} workers, "
             f"{pf['pages_per_s']:,.0f} pages/s, with `SLOWLOG` recording every command, "
             f"sampled every 50 ms: Redis time per call of each script; `INFO commandstats` "
             f"for the commands run inside them). EVALSHA time per page "
             f"{prof['evalsha_us_per_page']:.0f} µs, of which the commands the scripts run "
             f"{prof['nested_us_per_page']:.0f} µs (each command alone); the rest "
             f"({prof['evalsha_us_per_page'] - prof['nested_us_per_page']:.0f} µs) is the Lua "
             f"code and argument handling around the commands. These are wall-clock "
             f"durations as Redis records them: on a loaded machine they include time the "
             f"server was descheduled mid-script (Redis CPU per page in this window: "
             f"{1e6 * pf['redis_cores'] / pf['pages_per_s']:.0f} µs).")
        emit()
        emit("| script | calls / page | Redis µs / call (p90) | Redis µs / page | samples |")
        emit("| --- | ---: | ---: | ---: | ---: |")
        for name, x in sorted(prof["scripts"].items(), key=lambda kv: -kv[1]["us_per_page"]):
            emit(f"| {name}.lua | {x['calls_per_page']:.3f} | {x['us_per_call']:.0f} "
                 f"({x['us_p90']}) | {x['us_per_page']:.0f} | {x['samples']:,} |")
        emit()
        emit("| command run inside scripts | calls / page | µs / call (the command alone) | "
             "µs / page | scripts that call it |")
        emit("| --- | ---: | ---: | ---: | --- |")
        for x in prof["nested"]:
            if x["per_page"] < 0.01:
                continue
            emit(f"| {x['command'].upper()} | {x['per_page']:.2f} | {x['us_per_call']:.2f} | "
                 f"{x['us_per_page']:.1f} | {', '.join(x['scripts'])} |")
        emit()
    # the headline: the largest fleet that got at least 90 % of its offered load (its
    # workers did not wait for CPU, so they batch no more than real workers would)
    steps = [st for st in out["steps"] if not st["label"]]
    fit = [st for st in steps if (st["per_page"]["served_share"] or 0) >= SERVED_SHARE]
    main_step = fit[-1] if fit else steps[0]
    return {"pages_per_redis_cpu_s": main_step["per_page"]["pages_per_redis_cpu_s"],
            "round_trips": main_step["per_page"]["sent"], "workers": main_step["workers"],
            "served_share": main_step["per_page"]["served_share"],
            "max_pages_per_s": max(st["pages_per_s"] for st in out["steps"]),
            "trivial": rb["calls_per_s"] if rb and "error" not in rb else None,
            "floor_pages_per_redis_cpu_s": fl["pages_per_redis_cpu_s"] if fl else None,
            "busy_pages_per_redis_cpu_s": next(
                (st["per_page"]["pages_per_redis_cpu_s"] for st in out["steps"]
                 if st["label"] == "busy"), None)}


# -- memory for every priority -------------------------------------------------------


def section_memory_prio(n: int, raw: dict) -> dict:
    from bench_memory import PRIORITIES, measure_priorities

    res = memory_section(
        f"## 2b. Redis memory per queued request by priority, up to {n:,} requests",
        "memory_prio", measure_priorities, n, raw,
        "queued requests (plain GETs `http://example.com/p/{i}`, one lane, queued through "
        "`Frontier.enqueue` without dedupe, so no seen set). 8 priorities: "
        f"{PRIORITIES[0]}..{PRIORITIES[-1]}, request i gets i % {len(PRIORITIES)} "
        f"({n // len(PRIORITIES):,} each at {n:,}).")
    cps = res["checkpoints"]
    emit()
    emit("| queued requests | " + " | ".join(f"at {cp:,}" for cp in cps)
         + " | the lane's keys at the end (type, encoding, members) |")
    emit("| --- | " + " | ".join("---:" for _ in cps) + " | --- |")
    for case, x in res["cases"].items():
        ks = ", ".join(f"`{k}` {v['type']} {v['encoding']} {v['len']:,}"
                       for k, v in x["keys"].items() if v["len"] > 1)
        emit(f"| {case} | " + " | ".join(f"{x['bytes'][cp]:.1f} B" for cp in cps)
             + f" | {ks} |")
    emit()
    last = cps[-1]
    return {"at": last, **{case: x["bytes"][last] for case, x in res["cases"].items()}}


# -- issue #12 targets -----------------------------------------------------------------


def row(name: str, value: str, ok: bool) -> None:
    """One line of a targets table."""
    emit(f"| {name} | {value} | {'met' if ok else '**missed**'} |")


def section_targets_12(lat: dict | None, spread: dict | None, e: dict | None,
                       fr: dict | None, mp: dict | None) -> None:
    emit("## Targets of issue #12")
    emit()
    emit("| target | measured (median) | |")
    emit("| --- | ---: | --- |")

    if lat:
        p = lat["plain"]
        for w, target in ((1, 0.97), (2, 1.9), (4, 3.6)):
            v = lat["pps"][("leased_defaults", w)] / p
            row(f"100 ms per page, defaults: {w} worker{'s' if w > 1 else ''} >= {target}x "
                f"plain Scrapy (one process)", f"{v:.3f}x", v >= target)
        emit(f"| (context: the site's CPU, at most) | {lat['site_cores']:.2f} cores | |")
        ctl = lat["pps"].get(("plain", 4))
        if ctl:
            emit(f"| (context: 4 independent plain crawls at once reached) | {ctl / p:.3f}x | |")
    if spread:
        v = spread["pps"][("leased_defaults", 1)] / spread["plain"]
        row("spread of delays, defaults: 1 worker >= 0.95x plain Scrapy", f"{v:.3f}x", v >= 0.95)
    if e and ("leased_defaults", 1) in e["pps"]:
        for w, target in ((1, 0.95), (2, 1.8)):
            v = e["pps"][("leased_defaults", w)] / e["plain"]
            row(f"CPU-bound ({e['pages']:,}-page site), defaults: "
                f"{w} worker{'s' if w > 1 else ''} >= "
                f"{target}x plain Scrapy", f"{v:.3f}x", v >= target)
    if fr:
        v = fr["pages_per_redis_cpu_s"] or 0
        row(f"frontier: >= 30,000 pages per Redis CPU-second ({fr['workers']} workers, "
            f"50-150 ms pages, 64 hosts, {100 * (fr['served_share'] or 0):.0f} % of the "
            f"offered load served)", f"{v:,.0f}", v >= 30_000)
        if fr.get("busy_pages_per_redis_cpu_s"):
            emit(f"| (context: workers with no page latency, the largest batches) | "
                 f"{fr['busy_pages_per_redis_cpu_s']:,.0f} | |")
        if fr.get("trivial"):
            emit(f"| (context: trivial-script ceiling, calls/s) | {fr['trivial']:,.0f} | |")
        emit(f"| (context: the most pages/s any fleet of this run reached) | "
             f"{fr['max_pages_per_s']:,.0f} | |")
        row("frontier: <= 1 round trip per page per worker", f"{fr['round_trips']:.2f}",
            fr["round_trips"] <= 1)
    if mp:
        v8, v0 = mp["8 priorities"], mp["priority 0"]
        row(f"<= 70 B per queued request over 8 priorities at {mp['at']:,}", f"{v8:.1f} B",
            v8 <= 70)
        row(f"<= 63 B per queued request at priority 0 at {mp['at']:,}", f"{v0:.1f} B", v0 <= 63)
    umax = [x["unstarted_max"] for x in (lat, spread) if x and x.get("unstarted_max") is not None]
    if umax:
        row("claims waiting unstarted in any worker <= CONCURRENT_REQUESTS (16) + 4 "
            "(latency runs, max of every 20 ms sample)", f"{max(umax):.0f}", max(umax) <= 20)
    emit()
    emit("Not measured here: \"a worker killed with kill -9 at full speed still returns every "
         "claim it held\" is the fault tests' (`python -m pytest -q tests/`).")
    emit()


def section_shards(quick: bool, reps: int, raw: dict) -> dict:
    import bench_shards as bs

    open_section("## 10. One crawl over several Redis masters (the sharding design, "
                 "simulated)")
    counts = [1, 4] if quick else [1, 2, 4, 8]
    window, seeds, workers, hosts = (4.0, 5_000, 8, 64) if quick else (12.0, 20_000, 16, 64)
    latency = (50.0, 150.0)
    wait_quiet()
    t0 = time.monotonic()
    rows, runs = bs.measure(counts, reps, workers, 3, latency, hosts, seeds, window,
                            log=note)
    emit(f"Load average after: {load()} ({time.monotonic() - t0:.0f} s)")
    emit()
    raw["shards"] = runs
    emit(f"`benchmarks/bench_shards.py`: {workers} simulated workers (section 7's: 16 "
         f"download slots, {latency[0]:.0f}-{latency[1]:.0f} ms a page, 10 links a page) "
         f"crawl {hosts} hosts spread by a hash of the host over S redis-servers (the "
         f"masters), each holding an unchanged frontier of its hosts; a worker claims from "
         f"the shards in turn, sends each link to its host's shard and acks a page in its "
         f"own shard once its links are committed in the others; renewals per shard, the "
         f"sweep one shard a tick; the commit writers linger {bs.LINGER_PER_SHARD} s a "
         f"shard (one shard: the scheduler's linger). The sharding itself "
         f"(`LEASED_SHARDS`) is not built: this measures its design. Medians of {reps} "
         f"interleaved repetitions by Redis µs per page (Redis CPU of all masters over the "
         f"{window:.0f} s window / pages acked in all shards):")
    emit()
    for line in bs.report(rows):
        emit(line)
    emit()
    wait_quiet()
    t0 = time.monotonic()
    crows, cruns = bs.measure([1, 3], reps, workers, 3, latency, hosts, seeds, window,
                              log=note, masters=3)
    emit(f"Load average after: {load()} ({time.monotonic() - t0:.0f} s)")
    emit()
    raw["shards_cluster"] = cruns
    emit("The same fleet on one Redis Cluster of 3 masters (no replicas), 1 and 3 shards: "
         "each shard's crawl id is the first `<crawl>#k.<n>` whose hash slot lies in the "
         "k-th third of the slots (`bench_shards.shard_tags`), so the 3 shards sit on the "
         "3 masters; one shard is today's crawl on one master. Medians of "
         f"{reps} interleaved repetitions:")
    emit()
    for line in bs.report(crows):
        emit(line)
    emit()
    base = rows[0]["redis_us_per_page"] or 0.0
    return {"rows": rows,
            "ratio": {r["shards"]: (r["redis_us_per_page"] or 0.0) / base if base else None
                      for r in rows},
            "max_share": {r["shards"]: max(r["cpu_share"]) for r in rows}}


# -- issue #26 targets -----------------------------------------------------------------


def section_targets_26(lat: dict | None, e: dict | None, wi: dict | None,
                       ri: dict | None = None, fr: dict | None = None,
                       sh: dict | None = None) -> None:
    """The lines of issue #26 this run measures, read off sections 3, 5, 8, 9 and the
    fleet simulation."""
    if not (lat or e or wi or ri or fr or sh):
        return
    emit("## Targets of issue #26")
    emit()
    emit("| target | measured (median) | |")
    emit("| --- | ---: | --- |")
    if ri:
        v = ri["frontier"]
        row("Redis: <= 280,000 instructions per page, claim + commit share (section 9)",
            f"{v:,.0f}", v <= 280_000)
    if fr:
        v = fr["pages_per_redis_cpu_s"]
        floor = fr.get("floor_pages_per_redis_cpu_s")
        beside = f" (floor.lua: {floor:,.0f})" if floor else ""
        row("Redis: >= 30,000 pages per Redis CPU-second, fleet simulation",
            f"{v:,.0f}{beside}", v >= 30_000)
    if e and ("leased_defaults", 2) in e.get("pages_per_redis_cpu_s", {}):
        v = e["pages_per_redis_cpu_s"][("leased_defaults", 2)]
        row(f"Redis: >= 25,000 pages per Redis CPU-second, 2 workers, CPU-bound site "
            f"({e['pages']:,} pages, section 3)", f"{v:,.0f}", v >= 25_000)

    for name, res in (("CPU-bound site (section 3)", e), ("100 ms site (section 5)", lat)):
        conns = (res or {}).get("conns_per_host", {})
        if ("plain", 1) in conns and ("leased_defaults", 1) in conns:
            mine, plain = conns[("leased_defaults", 1)], conns[("plain", 1)]
            v = mine / plain if plain else float("inf")
            row(f"{name}: HTTP connections per host, 1 worker <= 1.2x plain Scrapy's",
                f"{mine:.1f} vs {plain:.1f}: {v:.3f}x", v <= 1.2)
    if wi:
        v = wi["leased_defaults"]["per_1000"] / wi["plain"]["per_1000"]
        frozen = wi.get(bwi.PLAIN_FROZEN)
        beside = (f" (plain Scrapy with the same gc.freeze(): "
                  f"{wi['leased_defaults']['per_1000'] / frozen['per_1000']:.3f}x)"
                  if frozen else "")
        row("worker instructions per page <= 1.05x plain Scrapy's (section 8)",
            f"{v:.3f}x{beside}", v <= 1.05)
    if lat:
        p = lat["plain"]
        for w, target in ((1, 0.97), (2, 1.9)):
            v = lat["pps"][("leased_defaults", w)] / p
            row(f"100 ms site: {w} worker{'s' if w > 1 else ''} >= {target}x plain Scrapy",
                f"{v:.3f}x", v >= target)
        ctl = lat["pps"].get(("plain", 4))
        if ctl:
            v = lat["pps"][("leased_defaults", 4)] / ctl
            row("100 ms site: 4 workers >= 0.95x of 4 independent plain crawls",
                f"{v:.3f}x", v >= 0.95)
    if e and ("leased_defaults", 1) in e["pps"]:
        v = e["pps"][("leased_defaults", 1)] / e["plain"]
        row("CPU-bound site: 1 worker >= 0.95x plain Scrapy", f"{v:.3f}x", v >= 0.95)
        ctl = e["pps"].get(("plain", 2))
        if ctl and ("leased_defaults", 2) in e["pps"]:
            v = e["pps"][("leased_defaults", 2)] / ctl
            row("CPU-bound site: 2 workers >= 0.95x of 2 independent plain crawls",
                f"{v:.3f}x", v >= 0.95)
    if sh and 4 in sh["ratio"]:
        v, share = sh["ratio"][4], sh["max_share"][4]
        row("Sharding: 4 shards, Redis CPU per page <= 1.15x one shard's and no master's "
            "share above 30 %, 64 hosts (section 10: the design simulated, LEASED_SHARDS "
            "not built)", f"{v:.2f}x, largest share {100 * share:.0f} % (the design "
            f"{'within' if v <= 1.15 and share <= 0.30 else 'outside'} the bounds)", False)
    emit()
    emit("Not measured here: the sharded cluster crawl with a master killed (item 2, not "
         "built)" + ("" if ri else "; the Redis "
         "instructions per page: section `redis_instr`") + ("" if fr else "; the fleet "
         "simulation: section `frontier`") + ("" if sh else "; the sharded simulation: "
         "section `shards`") + ".")
    emit()


# -- profile -----------------------------------------------------------------------


def section_profile(pages: int, redis: RedisServer, nodelay: bool = True) -> None:
    from bench_e2e import run, summarize_profile

    emit("## Profile: where a scrapy_leased worker spends its CPU")
    emit()
    emit(f"One crawl each of plain Scrapy and of one scrapy_leased worker ({pages:,} pages) "
         "under `py-spy record -r 200` (which slows the worker: these pages/s are not "
         "comparable with the tables above). Shares are of the samples where the worker's "
         "thread was running, inclusive (a function's callees count with it).")
    emit()
    workdir = Path(tempfile.mkdtemp(prefix="leased-prof-"))
    out = {}
    for mode in ("plain", "leased"):
        path = str(workdir / f"{mode}.txt")
        res = run(mode, 1, pages, redis, workdir, profile=path, nodelay=nodelay)
        if "error" in res:
            raise RuntimeError(res["error"])
        out[mode] = (res, summarize_profile(path))
    emit("| | plain Scrapy | scrapy_leased, 1 worker |")
    emit("| --- | ---: | ---: |")
    (_, pp), (_, lp) = out["plain"], out["leased"]
    emit(f"| samples | {pp['samples']:,} | {lp['samples']:,} |")
    for name in ("scrapy_leased", "redis", "parsel", "w3lib"):
        label = {"redis": "redis-py", "scrapy_leased": "scrapy_leased (all its frames)"}.get(
            name, name)
        emit(f"| {label} | {pp['packages'][name]:.1f} % | {lp['packages'][name]:.1f} % |")
    for label, share in lp["functions"].items():
        emit(f"| {label.replace('  of which', '&nbsp;&nbsp;of which')} | | {share:.1f} % |")
    emit()


# -- targets -----------------------------------------------------------------------


def section_targets(s: dict | None, m: dict | None, e: dict | None) -> None:
    if not (s or m or e):
        return
    emit("## Targets for scrapy_leased")
    emit()
    emit("| target | measured (median) | |")
    emit("| --- | ---: | --- |")

    def x(v: float) -> str:  # 3 decimals: a ratio just under a target must not print as it
        return f"{v:.3f}x"

    if e:
        r1 = e["pps"][("leased", 1)] / e["plain"]
        r2 = e["pps"][("leased", 2)] / e["plain"]
        row("1 worker >= 0.9x plain Scrapy pages/s", x(r1), r1 >= 0.9)
        row("2 workers >= 1.5x plain Scrapy pages/s (2 cores)", x(r2), r2 >= 1.5)
        ctl = e["pps"][("plain", 2)] / e["plain"]
        emit(f"| (context: the control, 2 independent plain Scrapy crawls, reached) | "
             f"{x(ctl)} | |")
    if s:
        row("scheduler enqueue >= 10,000 req/s", f"{s['enqueue']:,.0f} req/s",
            s["enqueue"] >= 10_000)
        row("scheduler claim >= 10,000 req/s (claim + ack cycle)", f"{s['claim']:,.0f} req/s",
            s["claim"] >= 10_000)
        row("scheduler claim >= 10,000 req/s (claim alone)", f"{s['claim_alone']:,.0f} req/s",
            s["claim_alone"] >= 10_000)
    if m:
        row(f"<= 16 B per seen URL at {m['at']:,}", f"{m['seen']:.1f} B", m["seen"] <= 16)
        row(f"<= 100 B per queued plain GET at {m['at']:,}", f"{m['queued']:.1f} B",
            m["queued"] <= 100)
    if e:
        for w in (1, 2, 3):
            t = e["trips"][("leased", w)]
            row(f"<= 3 Redis round trips per page ({w} worker{'s' if w > 1 else ''})",
                f"{t:.2f}", t <= 3)
    emit()


# -- main --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="2 repetitions, 10,000 requests, 100k URLs, 1,000 pages, "
                         "300 latency pages per worker, small fleets")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; quick 2)")
    ap.add_argument("--only", default=",".join(x for x in SECTIONS if x != "e2e_defaults"),
                    help="comma-separated sections: " + ", ".join(SECTIONS))
    ap.add_argument("--out", default=str(REPO_ROOT / "BENCHMARKS.md"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one plain and one scrapy_leased worker with py-spy")
    ap.add_argument("--no-wait", action="store_true",
                    help="do not wait for a quiet machine before each timed run")
    ap.add_argument("--stock-site", action="store_true",
                    help="crawl the test site without TCP_NODELAY (each response ~44 ms)")
    ns = ap.parse_args()
    reps = ns.reps or (2 if ns.quick else 5)
    sched_n = 10_000 if ns.quick else 50_000
    mem_n = 100_000 if ns.quick else 1_000_000
    pages = 1_000 if ns.quick else 5_000
    only = {x.strip() for x in ns.only.split(",") if x.strip()}
    QUIET["enabled"] = not ns.no_wait
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")

    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    redis = RedisServer(appendonly=False).start()
    raw: dict[str, Any] = {}
    try:
        c = redis.client()
        redis_version = c.info("server")["redis_version"]
        c.close()
        head = ["# Benchmarks", ""]
        head += ["Generated by `benchmarks/run_all.py`; real output of one run, nothing edited "
                 "by hand above the hand-written section.", ""]
        head += machine(redis_version)
        head += [f"- Date: {started:%Y-%m-%d %H:%M} UTC",
                 "- Command: `" + " ".join(["python", "benchmarks/run_all.py"]
                                          + [shlex.quote(a) for a in sys.argv[1:]]) + "`",
                 f"- Load average at start (1, 5, 15 min): {load()}", ""]
        for line in head:
            emit(line)
        took: dict[str, float] = {}

        failed: list[str] = []

        def timed(name: str, go: Callable[[], Any]) -> Any:
            """Run a section; one that fails is reported where its figures would be and
            the run goes on (the sections after it keep their figures; BENCHMARKS.md is
            not written, see below)."""
            if name not in only:
                return None
            t = time.monotonic()
            try:
                return go()
            except Exception as exc:
                failed.append(name)
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                emit(f"**Section `{name}` failed**: {type(exc).__name__}: {exc}")
                emit()
                return None
            finally:
                took[name] = time.monotonic() - t

        s = timed("scheduler", lambda: section_scheduler(sched_n, reps, redis, raw))
        m = timed("memory", lambda: section_memory(mem_n, raw))
        mp = timed("memory_prio", lambda: section_memory_prio(mem_n, raw))
        e2e = "e2e" if "e2e" in only else "e2e_defaults"
        e = timed(e2e, lambda: section_e2e(
            pages, reps, redis, raw, nodelay=not ns.stock_site,
            setups=E2E_SETUPS if e2e == "e2e" else E2E_DEFAULTS_SETUPS))
        lat_pages = 300 if ns.quick else 2_000
        lat = timed("latency", lambda: section_latency("fixed100", "5", lat_pages, reps, redis,
                                                       raw))
        spread = timed("spread", lambda: section_latency("spread", "6", lat_pages, reps, redis,
                                                         raw))
        fr = timed("frontier", lambda: section_frontier(ns.quick, raw))
        wi = timed("worker_instr", lambda: section_worker_instr(ns.quick, raw))
        ri = timed("redis_instr", lambda: section_redis_instr(ns.quick, raw))
        sh = timed("shards", lambda: section_shards(ns.quick, reps, raw))
        if ns.profile:
            section_profile(pages, redis, nodelay=not ns.stock_site)
        section_targets(s, m, e if e and ("leased", 1) in e["pps"] else None)
        section_targets_12(lat, spread, e, fr, mp)
        section_targets_26(lat, e, wi, ri, fr, sh)
        emit("Time per section: " + ", ".join(f"`{k}` {v:.0f} s" for k, v in took.items())
             + ".")
        emit()
        emit(f"Total time {time.monotonic() - t0:.0f} s; load average at the end: {load()}. "
             + (f"Before each timed run the harness waited for other processes to use less "
                f"than {QUIET_CORES} cores over 2 s ({QUIET['waited']:.0f} s of waiting in "
                f"all, {QUIET['gave_up']} runs started without quiet after "
                f"{QUIET_MAX_WAIT_S:.0f} s), and ran again any timed run during which they "
                f"used more than {DISTURBED_CORES} cores on average ({QUIET['repeated']} "
                f"runs repeated, {QUIET['kept_disturbed']} kept after {MAX_REPEATS} "
                f"repeats)." if QUIET["enabled"] else
                "No waiting for a quiet machine (`--no-wait`)."))
        emit()
    finally:
        redis.close()
    raw_path = Path(tempfile.gettempdir()) / f"scrapy-leased-bench-{started:%Y%m%d-%H%M%S}.json"
    raw_path.write_text(json.dumps(raw, indent=1, default=str))
    print(f"raw results: {raw_path}", file=sys.stderr)
    if failed:
        # what the other sections measured is kept, but not as BENCHMARKS.md: a table of
        # targets with a section missing would read as the run's whole answer
        partial = raw_path.with_suffix(".md")
        partial.write_text("\n".join(OUT) + "\n", encoding="utf-8")
        print(f"sections failed: {', '.join(failed)}; {ns.out} not written, the run's "
              f"output is in {partial}", file=sys.stderr)
        return 1
    if not ns.no_write:
        out = Path(ns.out)
        kept = ""
        if out.exists():
            text = out.read_text(encoding="utf-8")
            if HAND_WRITTEN in text:
                kept = text[text.index(HAND_WRITTEN):]
        out.write_text("\n".join(OUT) + "\n" + (kept or f"{HAND_WRITTEN}\n"), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
