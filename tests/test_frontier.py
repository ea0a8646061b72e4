"""The Redis state machine (``scrapy_leased.frontier`` + ``lua/*.lua``) against a REAL
redis-server (``tests/support/redis_server.py``), with exact outcomes.

Concurrency tests run several OS processes (multiprocessing "spawn"), each with its own
connection, released together by a barrier: what they prove is the atomicity of the
Lua scripts, not the GIL or one event loop's ordering.

Tests marked ``xfail(strict=True)`` pin down bugs found in the package: they assert the
correct behaviour, fail today, and turn into an XPASS (= failure) once the bug is fixed,
so the marker has to be removed then.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
import redis

from scrapy_leased.config import SEEN_BUCKET_BITS
from scrapy_leased.connection import make_client
from scrapy_leased.fingerprints import split_fingerprint
from scrapy_leased.frontier import Envelope, Failure, Frontier, NewRequest
from scrapy_leased.keys import CrawlKeys
from scrapy_leased.scripts import script_source
from tests.support.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
PROC_TIMEOUT = 120  # seconds a group of child processes may take (a hang guard, not a check)


# --------------------------------------------------------------------------- helpers


def new_frontier(url: str, crawl_id: str, *, lease_ms: int = 60_000, max_attempts: int = 3,
                 recover_batch: int = 500) -> Frontier:
    """A Frontier on its own asyncio connection, built like the scheduler builds it."""
    return Frontier(make_client(url), CrawlKeys(crawl_id), lease_ms=lease_ms,
                    max_attempts=max_attempts, recover_batch=recover_batch)


def run(srv: RedisServer, crawl_id: str, body: Callable[..., Awaitable[Any]], **kw: Any) -> Any:
    """asyncio.run(body(frontier, r)); r is a sync decode_responses client for checks."""
    r = srv.client(decode_responses=True)

    async def main() -> Any:
        f = new_frontier(srv.url, crawl_id, **kw)
        try:
            return await body(f, r)
        finally:
            await f.client.aclose()

    try:
        return asyncio.run(main())
    finally:
        r.close()


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def wait_redis_past(r: redis.Redis, deadline_ms: int, timeout: float = 30) -> None:
    """Sleep until Redis TIME is strictly after deadline_ms (the server's clock decides)."""
    limit = time.monotonic() + timeout
    while redis_ms(r) <= deadline_ms:
        assert time.monotonic() < limit, "Redis TIME did not pass the deadline"
        time.sleep(0.01)


def queue_envelopes(r: redis.Redis, keys: CrawlKeys) -> list[Envelope]:
    """The queue in claim order (members are '<12 hex seq><envelope>')."""
    return [Envelope.parse(m[12:]) for m in r.zrange(keys.queue, 0, -1)]


def stats(r: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall(keys.stats).items()}


def lease_scores(r: redis.Redis, keys: CrawlKeys) -> dict[int, int]:
    return {int(t): int(s) for t, s in r.zrange(keys.leases, 0, -1, withscores=True)}


def snapshot(r: redis.Redis, keys: CrawlKeys) -> dict[str, Any]:
    """Everything a fail/ack could change, for 'nothing changed' checks."""
    return {
        "queue": r.zrange(keys.queue, 0, -1, withscores=True),
        "leases": r.zrange(keys.leases, 0, -1, withscores=True),
        "inflight": r.hgetall(keys.inflight),
        "dead": r.hgetall(keys.dead),
        "stats": r.hgetall(keys.stats),
        "seq": r.get(keys.seq),
        "done": r.get(keys.done),
    }


def url_request(url: str, priority: int = 0, bits: int = SEEN_BUCKET_BITS) -> NewRequest:
    bucket, member = split_fingerprint(hashlib.sha1(url.encode()).digest(), bits)
    return NewRequest(url, priority, bucket, member)


def commandstats(r: redis.Redis) -> dict[str, int]:
    """calls per command since CONFIG RESETSTAT, without the test's own INFO/CONFIG."""
    out = {}
    for name, st in r.info("commandstats").items():
        cmd = name.removeprefix("cmdstat_")
        if cmd.split("|")[0] not in ("info", "config", "ping", "hello", "client"):
            out[cmd] = int(st["calls"])
    return out


@pytest.fixture(autouse=True)
def _drop_crawl_keys(redis_server, crawl_id):
    """Keep the shared server small: delete this test's keys afterwards."""
    yield
    r = redis_server.client()
    try:
        for key in r.scan_iter(match=f"leased:{{{crawl_id}}}:*", count=1000):
            r.unlink(key)
    finally:
        r.close()


# ------------------------------------------------------------- child processes (spawn)


def _child(kind: str, url: str, crawl_id: str, seed: int, barrier: Any, out: Any,
           extra: Any) -> None:
    """Entry point of a child process: connect, wait for the others, do the work, report."""
    try:
        result = asyncio.run(_CHILD_WORK[kind](url, crawl_id, seed, barrier, extra))
        out.put((seed, "ok", result))
    except BaseException:  # report every failure to the parent instead of hanging it
        out.put((seed, "error", traceback.format_exc()))


async def _claim_until_empty(url: str, crawl_id: str, seed: int, barrier: Any,
                             extra: Any) -> list[tuple[int, int, str]]:
    f = new_frontier(url, crawl_id, lease_ms=600_000)
    rng = random.Random(seed)
    await f.claim(0, f"claimer-{seed}")  # connect + load the script before the start line
    barrier.wait()
    got: list[tuple[int, int, str]] = []
    while True:
        res = await f.claim(rng.randint(1, 50), f"claimer-{seed}")
        if not res.claims:
            break
        got += [(token, env.rid, env.payload) for token, env in res.claims]
    await f.client.aclose()
    return got


async def _produce(url: str, crawl_id: str, seed: int, barrier: Any,
                   urls: list[str]) -> list[tuple[str, bool]]:
    f = new_frontier(url, crawl_id)
    rng = random.Random(seed)
    order = list(urls)
    rng.shuffle(order)
    await f.enqueue([])  # connect + load the script
    barrier.wait()
    results: list[tuple[str, bool]] = []
    i = 0
    while i < len(order):
        batch = order[i:i + rng.randint(1, 100)]
        queued = await f.enqueue([url_request(u) for u in batch])
        results += list(zip(batch, queued))
        i += len(batch)
    await f.client.aclose()
    return results


async def _recover_all(url: str, crawl_id: str, seed: int, barrier: Any,
                       batch: int) -> tuple[int, int, int]:
    f = new_frontier(url, crawl_id, max_attempts=5, recover_batch=batch)
    await f.client.script_load(script_source("recover"))  # connect + load, no effect
    barrier.wait()
    requeued = dead = calls = 0
    while True:
        r, d, left = await f.recover()
        calls += 1
        requeued += r
        dead += d
        if left == 0:
            break
    await f.client.aclose()
    return requeued, dead, calls


_CHILD_WORK = {"claim": _claim_until_empty, "produce": _produce, "recover": _recover_all}


def run_children(kind: str, url: str, crawl_id: str, n: int, extra: Any = None) -> list[Any]:
    """Start n spawned processes released together by a barrier; their results by seed."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(kind, url, crawl_id, seed, barrier, out, extra))
             for seed in range(n)]
    for p in procs:
        p.start()
    try:
        results: dict[int, Any] = {}
        errors = []
        for _ in range(n):
            seed, status, value = out.get(timeout=PROC_TIMEOUT)
            if status == "ok":
                results[seed] = value
            else:
                errors.append(value)
                barrier.abort()  # free the others if they still wait at the start line
        for p in procs:
            p.join(PROC_TIMEOUT)
        assert not errors, "child process failed:\n" + "\n".join(errors)
        assert [p.exitcode for p in procs] == [0] * n
        return [results[s] for s in range(n)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


# ----------------------------------------------------------------- concurrency (processes)


def test_8_concurrent_claimers_claim_each_request_exactly_once(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    n = 10_000

    async def fill(f, r):
        for start in range(0, n, 1000):
            assert await f.enqueue([NewRequest(f"req-{i}") for i in range(start, start + 1000)]) \
                == [True] * 1000

    run(redis_server, crawl_id, fill)
    per_proc = run_children("claim", redis_server.url, crawl_id, 8)

    claimed = [c for got in per_proc for c in got]
    assert len(claimed) == n
    assert sorted(p for _, _, p in claimed) == sorted(f"req-{i}" for i in range(n))
    assert len({rid for _, rid, _ in claimed}) == n
    assert sorted(t for t, _, _ in claimed) == list(range(1, n + 1))  # fencing tokens 1..n
    # the claimers really raced (each of 8 processes made ~25 claims of 1..50)
    assert sum(1 for got in per_proc if got) >= 2, [len(g) for g in per_proc]

    r = redis_server.client(decode_responses=True)
    assert r.zcard(keys.queue) == 0
    assert r.zcard(keys.leases) == n
    inflight = r.hgetall(keys.inflight)
    assert len(inflight) == n
    for token, rid, payload in claimed:
        assert Envelope.parse(inflight[str(token)]) == Envelope(rid, 0, 0, payload)
    assert stats(r, keys) == {"enqueued": n, "claimed": n}
    assert set(r.zrange(keys.workers, 0, -1)) == {f"claimer-{i}" for i in range(8)}


def test_8_concurrent_producers_of_the_same_urls_queue_each_once(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    urls = [f"http://example.com/item/{i}" for i in range(1000)]
    per_proc = run_children("produce", redis_server.url, crawl_id, 8, extra=urls)

    assert [len(res) for res in per_proc] == [1000] * 8  # every producer pushed every URL
    winners = Counter(u for res in per_proc for u, queued in res if queued)
    assert winners == Counter(urls)  # each URL was "new" for exactly one producer

    r = redis_server.client(decode_responses=True)
    queue = queue_envelopes(r, keys)
    assert len(queue) == 1000
    assert sorted(e.payload for e in queue) == sorted(urls)
    assert sorted(e.rid for e in queue) == list(range(1, 1001))
    assert all(e.attempts == 0 for e in queue)
    assert stats(r, keys) == {"enqueued": 1000, "duplicates": 7000}
    buckets = {url_request(u).bucket for u in urls}
    assert sum(r.scard(keys.seen_bucket(b)) for b in buckets) == 1000


def test_2_racing_recoverers_requeue_each_expired_lease_exactly_once(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    payloads = [f"exp-{i}" for i in range(1000)]

    async def claim_short(f, r):
        assert await f.enqueue([NewRequest(p) for p in payloads]) == [True] * 1000
        res = await f.claim(1000, "doomed-worker")
        assert len(res.claims) == 1000
        return res

    res = run(redis_server, crawl_id, claim_short, lease_ms=200)
    original = {e.rid: e for _, e in res.claims}
    r = redis_server.client(decode_responses=True)
    wait_redis_past(r, res.now_ms + 200)
    assert r.zcount(keys.leases, "-inf", redis_ms(r)) == 1000  # all expired, none recovered

    # two processes, batches of 3: ~330 interleaved recover calls
    per_proc = run_children("recover", redis_server.url, crawl_id, 2, extra=3)
    assert sum(req for req, _, _ in per_proc) == 1000
    assert sum(dead for _, dead, _ in per_proc) == 0

    queue = queue_envelopes(r, keys)
    assert len(queue) == 1000
    assert len(set(r.zrange(keys.queue, 0, -1))) == 1000
    assert sorted(e.rid for e in queue) == sorted(original)
    assert all(e.attempts == 1 for e in queue), Counter(e.attempts for e in queue)
    assert all(e.payload == original[e.rid].payload and e.priority == 0 for e in queue)
    assert r.zcard(keys.leases) == 0
    assert r.hlen(keys.inflight) == 0
    assert stats(r, keys) == {"enqueued": 1000, "claimed": 1000, "recovered": 1000}
