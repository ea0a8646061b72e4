"""The Redis state machine (``scrapy_leased.frontier`` + ``lua/*.lua``) against a REAL
redis-server (``tests/support/redis_server.py``), with exact outcomes.

Concurrency tests run several OS processes (multiprocessing "spawn"), each with its own
connection, released together by a barrier: what they prove is the atomicity of the
Lua scripts, not the GIL or one event loop's ordering.

Three tests pin down bugs found while writing this file (rids beyond the done bitmap's
2**32 offsets, reasons clipped inside a UTF-8 character, released requests reordered).
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import NO_BUDGET, Budget, Envelope, Failure, Frontier, NewRequest
from scrapy_leased.frontier.fingerprints import split_fingerprint
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.scripts import script_source
from scrapy_leased.settings.defaults import SEEN_BUCKET_BITS
from tests.support.queue import (
    queue_keys,
    queue_len,
    queued,
    queued_envelopes,
    tier_lists,
    tiers,
)
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
    """The default lane's queue in claim order."""
    return queued_envelopes(r, keys)


def stats(r: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall(keys.stats).items()}


def lease_scores(r: redis.Redis, keys: CrawlKeys) -> dict[int, int]:
    return {int(t): int(s) for t, s in r.zrange(keys.leases, 0, -1, withscores=True)}


def snapshot(r: redis.Redis, keys: CrawlKeys) -> dict[str, Any]:
    """Everything a fail/ack could change, for 'nothing changed' checks."""
    return {
        "queue": r.zrange(keys.queue, 0, -1, withscores=True),
        "tiers": tier_lists(r, keys),
        "leases": r.zrange(keys.leases, 0, -1, withscores=True),
        "inflight": r.hgetall(keys.inflight),
        "owners": r.hgetall(keys.owners),
        "dead": r.hgetall(keys.dead),
        "stats": r.hgetall(keys.stats),
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
        batch = []
        for key in r.scan_iter(match=f"leased:{{{crawl_id}}}:*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                r.unlink(*batch)
                batch.clear()
        if batch:
            r.unlink(*batch)
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
    # fencing tokens: n distinct ones, each at least Redis TIME in µs when it was issued
    # (lib_guard.lua), the last one issued in the counter
    tokens = sorted(t for t, _, _ in claimed)
    assert len(set(tokens)) == n
    r = redis_server.client(decode_responses=True)
    sec, usec = r.time()
    assert tokens[-1] == int(r.get(keys.tokens)) <= sec * 1_000_000 + usec + n
    assert tokens[0] > (sec - 600) * 1_000_000
    # the claimers really raced (each of 8 processes made ~25 claims of 1..50)
    assert sum(1 for got in per_proc if got) >= 2, [len(g) for g in per_proc]

    r = redis_server.client(decode_responses=True)
    assert queue_len(r, keys) == 0
    assert r.zcard(keys.leases) == n
    inflight = r.hgetall(keys.inflight)
    assert len(inflight) == n
    for token, rid, payload in claimed:
        assert Envelope.parse(inflight[str(token)]) == Envelope(rid=rid, attempts=0, expiries=0, priority=0, lane="",
                                                                   payload=payload)
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
    assert len(set(queued(r, keys))) == 1000
    assert sorted(e.rid for e in queue) == sorted(original)
    assert all(e.attempts == 1 for e in queue), Counter(e.attempts for e in queue)
    assert all(e.expiries == 1 for e in queue), Counter(e.expiries for e in queue)
    assert all(e.payload == original[e.rid].payload and e.priority == 0 for e in queue)
    assert r.zcard(keys.leases) == 0
    assert r.hlen(keys.inflight) == 0
    assert stats(r, keys) == {"enqueued": 1000, "claimed": 1000, "recovered": 1000}


# ----------------------------------------------------------------------- clock skew


SKEWED_CHILD = r"""
import asyncio, json, sys, time
from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Frontier
from scrapy_leased.frontier.keys import CrawlKeys

url, crawl_id, worker, expected_skew_s = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokens = [int(t) for t in sys.argv[5].split(",")]


async def server_ms(c):
    s, us = await c.time()
    return int(s) * 1000 + int(us) // 1000


async def main():
    f = Frontier(make_client(url), CrawlKeys(crawl_id), lease_ms=30_000, max_attempts=3)
    c = f.client
    client_ms = int(time.time() * 1000)
    srv_ms = await server_ms(c)
    skew_ms = client_ms - srv_ms
    # the fake clock must really be in effect, else this proves nothing
    assert abs(skew_ms - expected_skew_s * 1000) < 60_000, skew_ms
    recovered = await f.recover()
    before_claim = await server_ms(c)
    claim = await f.claim(0, worker)  # count-only: reports Redis time, claims nothing
    before = await server_ms(c)
    lost = await f.renew(worker, tokens)
    after = await server_ms(c)
    await c.aclose()
    print(json.dumps({"skew_ms": skew_ms, "recover": list(recovered), "claim_now": claim.now_ms,
                      "before_claim": before_claim, "claim_queued": claim.queued, "claim_leases": claim.leases,
                      "before": before, "after": after, "lost": lost}))


asyncio.run(main())
"""


def run_skewed(srv: RedisServer, crawl_id: str, worker: str, skew_s: int,
               tokens: list[int]) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME=f"{skew_s:+d}s", FAKETIME_DONT_FAKE_MONOTONIC="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                        env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", SKEWED_CHILD, srv.url, crawl_id, worker,
                           str(skew_s), ",".join(map(str, tokens))],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=PROC_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists(LIBFAKETIME),
                    reason=f"libfaketime not installed ({LIBFAKETIME}); apt-get install faketime")
def test_clock_skewed_clients_neither_reap_live_leases_nor_misplace_renewals(redis_server,
                                                                            crawl_id):
    keys = CrawlKeys(crawl_id)

    async def claim20(f, r):  # each skewed worker renews its own claims (owners)
        await f.enqueue([NewRequest(f"live-{i}") for i in range(20)])
        return [await f.claim(n, w) for n, w in ((2, "skewed+300"), (2, "skewed-300"),
                                                 (16, "honest"))]

    results = run(redis_server, crawl_id, claim20, lease_ms=30_000)
    tokens = [t for res in results for t, _ in res.claims]
    r = redis_server.client(decode_responses=True)
    scores0 = lease_scores(r, keys)
    assert scores0 == {t: res.now_ms + 30_000 for res in results for t, _ in res.claims}
    assert len(tokens) == 20

    renewed: dict[int, tuple[int, int]] = {}
    for skew_s, mine in ((+300, tokens[0:2]), (-300, tokens[2:4])):
        worker = f"skewed{skew_s:+d}"
        out = run_skewed(redis_server, crawl_id, worker, skew_s, mine)
        assert abs(out["skew_ms"] - skew_s * 1000) < 60_000, out  # the child's clock IS off
        # +300 s: with the client's clock every 30 s lease would look expired
        assert out["recover"] == [0, 0, 0], out
        assert out["before_claim"] <= out["claim_now"] <= out["before"], out  # Redis TIME
        assert (out["claim_queued"], out["claim_leases"]) == (0, 20)
        assert out["lost"] == []
        for t in mine:
            renewed[t] = (out["before"], out["after"])
        # -300 s: a client-clock deadline would lie 270 s in the past
        scores = lease_scores(r, keys)
        assert set(scores) == set(tokens)
        for t in tokens:
            if t in renewed:
                lo, hi = renewed[t]
                assert lo + 30_000 <= scores[t] <= hi + 30_000, (t, scores[t], lo, hi)
            else:
                assert scores[t] == scores0[t]
        hb = int(r.zscore(keys.workers, worker))
        assert out["before"] <= hb <= out["after"]  # the renew's heartbeat, in Redis time
        assert queue_len(r, keys) == 0
        assert r.hlen(keys.inflight) == 20

    async def recover_now(f, r):
        return await f.recover()

    assert run(redis_server, crawl_id, recover_now) == (0, 0, 0)
    assert queue_len(r, keys) == 0 and r.zcard(keys.leases) == 20
    assert stats(r, keys) == {"enqueued": 20, "claimed": 20}


# ------------------------------------------------------------------ queue ordering


def test_priorities_higher_first_fifo_within_a_priority(redis_server, crawl_id):
    spec = [(0, "a0"), (5, "b0"), (-3, "c0"), (0, "a1"), (5, "b1"), (10, "d0"), (-3, "c1"),
            (0, "a2"), (5, "b2"), (-3, "c2")]

    async def body(f, r):
        for part in (spec[:4], spec[4:5], spec[5:]):
            assert await f.enqueue([NewRequest(p, pr) for pr, p in part]) == [True] * len(part)
        order = []
        for _ in spec:
            res = await f.claim(1, "w")
            assert len(res.claims) == 1
            order.append(res.claims[0][1])
        assert (await f.claim(1, "w")).claims == []
        return order

    order = run(redis_server, crawl_id, body)
    assert [e.payload for e in order] == ["d0", "b0", "b1", "b2", "a0", "a1", "a2",
                                          "c0", "c1", "c2"]
    assert [e.priority for e in order] == [10, 5, 5, 5, 0, 0, 0, -3, -3, -3]
    # rids in the order each call sends its requests: by (lane, priority, order) group,
    # groups in the order they first appear (calls.py enqueue_args)
    assert [e.rid for e in order] == [6, 3, 5, 10, 1, 2, 9, 4, 7, 8]


def test_priorities_randomized_exact_order(redis_server, crawl_id):
    rng = random.Random(1234)
    spec = [(rng.randint(-5, 5), f"r{i}") for i in range(600)]

    async def body(f, r):
        i = 0
        while i < len(spec):
            part = spec[i:i + rng.randint(1, 40)]
            await f.enqueue([NewRequest(p, pr) for pr, p in part])
            i += len(part)
        got = []
        while True:
            res = await f.claim(rng.randint(1, 9), "w")
            if not res.claims:
                return got
            got += [e.payload for _, e in res.claims]

    got = run(redis_server, crawl_id, body)
    expected = [p for _, (pr, p) in sorted(enumerate(spec), key=lambda x: (-x[1][0], x[0]))]
    assert got == expected


def test_identical_payloads_without_dedupe_are_all_kept(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    dedup = url_request("http://example.com/x")

    async def body(f, r):
        assert await f.enqueue([NewRequest("same"), NewRequest("same")]) == [True, True]
        assert await f.enqueue([NewRequest("same")]) == [True]
        assert await f.enqueue([dedup, dedup]) == [True, False]  # contrast: with a bucket
        assert await f.enqueue([dedup]) == [False]
        return await f.claim(10, "w")

    res = run(redis_server, crawl_id, body)
    assert [(e.rid, e.payload) for _, e in res.claims] == [
        (1, "same"), (2, "same"), (3, "same"), (4, "http://example.com/x")]
    r = redis_server.client(decode_responses=True)
    assert stats(r, keys) == {"enqueued": 4, "duplicates": 2, "claimed": 4}
    assert r.smembers(keys.seen_bucket(dedup.bucket)) == {str(dedup.member)}


# --------------------------------------------------------------------------- ack


def test_ack_once_twice_and_stale(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    st_caller: list[str] = []

    async def body(f, r):
        st_caller.append(f.caller)
        short = new_frontier(redis_server.url, crawl_id, lease_ms=100)
        try:
            await f.enqueue([NewRequest(p) for p in ("A", "B", "C", "D")])
            # a plain ack: lease held (bit 1) + newly done (bit 2)
            (ta, ea), = (await f.claim(1, "w1")).claims
            assert ea.payload == "A"
            assert await f.ack(ta, ea.rid) == 3
            assert r.zscore(keys.leases, ta) is None
            assert not r.hexists(keys.inflight, ta)
            assert r.getbit(keys.done, ea.rid) == 1
            assert stats(r, keys) == {"enqueued": 4, "claimed": 1, "acked": 1, "done": 1}

            # the same ack again: nothing held, nothing new, nothing changes
            before = snapshot(r, keys)
            assert await f.ack(ta, ea.rid) == 0
            assert snapshot(r, keys) == before

            # stale ack: B's lease expires and is recovered before its worker acks
            (tb, eb), = (await short.claim(1, "slow")).claims
            assert eb.payload == "B"
            wait_redis_past(r, int(r.zscore(keys.leases, tb)))
            assert await f.recover() == (1, 0, 0)
            q = queue_envelopes(r, keys)
            assert [(e.payload, e.attempts, e.expiries) for e in q] == [
                ("C", 0, 0), ("D", 0, 0), ("B", 1, 1)]
            assert await f.ack(tb, eb.rid) == 2  # lease gone, but newly done
            assert stats(r, keys)["done"] == 2
            # claim skips the requeued copy of B (already done)
            res = await f.claim(5, "w2")
            assert [e.payload for _, e in res.claims] == ["C", "D"]
            assert (res.queued, res.leases) == (0, 2)
            (tc, ec), (td, ed) = res.claims
            assert stats(r, keys)["skipped_done"] == 1

            # stale ack after the requeued copy was claimed again by another worker
            await f.ack(tc, ec.rid)
            await f.release("w2", [td])
            (td1, ed1), = (await short.claim(1, "slow")).claims
            assert ed1.rid == ed.rid
            wait_redis_past(r, int(r.zscore(keys.leases, td1)))
            assert await f.recover() == (1, 0, 0)
            (td2, ed2), = (await f.claim(1, "w3")).claims
            assert (ed2.rid, ed2.attempts) == (ed.rid, 1)
            assert await f.ack(td1, ed.rid) == 2  # the stale worker: counted done
            assert await f.ack(td2, ed.rid) == 1  # the current holder: lease freed, not again
        finally:
            await short.client.aclose()

    run(redis_server, crawl_id, body)
    r = redis_server.client(decode_responses=True)
    st = stats(r, keys)
    assert st["done"] == 4  # A, B, C, D: each exactly once
    assert st["acked"] == 3  # A, C and D's second lease were held when acked
    # each worker's count (status: live per-worker acks): only f's acks held their lease
    assert r.hgetall(keys.worker_acked) == {st_caller[0]: "3"}
    assert st["skipped_done"] == 1
    assert r.bitcount(keys.done) == 4
    assert queue_len(r, keys) == r.zcard(keys.leases) == r.hlen(keys.inflight) == 0


# -------------------------------------------------------------------------- fail


def test_fail_requeues_at_back_then_dead_letters(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    reason = "0123456789" * 70  # 700 chars

    async def body(f, r):
        await f.enqueue([NewRequest(p) for p in ("A", "B", "C")] + [NewRequest("L", -1)])
        (ta, ea), = (await f.claim(1, "w")).claims
        assert await f.fail(ta, "boom") == 1
        # back of priority 0 (behind B, C), still ahead of the lower priority L
        assert [(e.payload, e.attempts, e.expiries, e.rid) for e in queue_envelopes(r, keys)] \
            == [("B", 0, 0, 2), ("C", 0, 0, 3), ("A", 1, 0, 1), ("L", 0, 0, 4)]
        assert r.zcard(keys.leases) == 0 and r.hlen(keys.inflight) == 0

        res = await f.claim(3, "w")
        assert [(e.payload, e.attempts) for _, e in res.claims] == [("B", 0), ("C", 0), ("A", 1)]
        (tb, eb), (tc, ec), (ta2, ea2) = res.claims
        await f.ack(tb, eb.rid)
        await f.ack(tc, ec.rid)
        assert await f.fail(ta2, "boom again") == 1
        (ta3, ea3), = (await f.claim(1, "w")).claims
        assert (ea3.payload, ea3.attempts) == ("A", 2)
        t0 = redis_ms(r)
        assert await f.fail(ta3, reason) == 2  # 3rd attempt = max_attempts: dead
        t1 = redis_ms(r)
        letter = json.loads(r.hget(keys.dead, str(ea.rid)))
        assert t0 <= letter.pop("t") <= t1
        assert letter == {"reason": reason[:500], "attempts": 3, "envelope": "1|0|0|0||A"}
        assert [e.payload for e in queue_envelopes(r, keys)] == ["L"]

        # a fail on a token that is no longer held (or never was): 0, nothing changes
        before = snapshot(r, keys)
        assert await f.fail(ta3, "late") == 0
        assert await f.fail(ta, "older") == 0
        assert await f.fail(10**9, "never issued") == 0
        assert snapshot(r, keys) == before

        # permanent: dead at once, after 1 attempt
        (tl, el), = (await f.claim(1, "w")).claims
        assert await f.fail(tl, "404 forever", permanent=True) == 2
        letter = json.loads(r.hget(keys.dead, str(el.rid)))
        assert (letter["reason"], letter["attempts"], letter["envelope"]) == (
            "404 forever", 1, "4|0|0|-1||L")

    run(redis_server, crawl_id, body, max_attempts=3)
    r = redis_server.client(decode_responses=True)
    assert stats(r, keys) == {"enqueued": 4, "claimed": 6, "acked": 2, "done": 2,
                              "failed": 4, "dead": 2}
    assert r.hlen(keys.dead) == 2
    assert queue_len(r, keys) == r.zcard(keys.leases) == r.hlen(keys.inflight) == 0


def test_commit_batch_fails_and_acks_together(redis_server, crawl_id):
    """One commit: enqueue children, ack one claim, fail two (one permanent)."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest(p) for p in ("P", "Q", "S")])
        (tp, ep), (tq, eq), (ts, es) = (await f.claim(3, "w")).claims
        out = await f.commit(enqueue=[NewRequest("child", 2), url_request("http://c/")],
                             acks=[(tp, ep.rid)],
                             fails=[Failure(tq, "flaky"), Failure(ts, "gone", permanent=True)])
        assert (out.queued, out.acks, out.fails) == ([True, True], [3], [1, 2])
        return [(e.payload, e.attempts) for e in queue_envelopes(r, keys)]

    assert run(redis_server, crawl_id, body) == [("child", 0), ("http://c/", 0), ("Q", 1)]



def test_stats_riding_along_with_a_commit_are_applied_once_per_call_id(redis_server,
                                                                     crawl_id):
    """A commit carries the worker's stats deltas (writer.py stats_delta): applied with
    the ack, and not again when the same commit is sent again (a lost reply)."""
    keys = CrawlKeys(crawl_id)
    stats = ["i", "item_scraped_count", "3", "f", "response_bytes_avg", "1.5",
             "max", "memusage/max", "100", "min", "start_time", "1000.5"]

    async def body(f, r):
        await f.enqueue([NewRequest("P")])
        ((token, env),) = (await f.claim(1, "w")).claims
        call = f.new_call_id()
        first = await f.commit(acks=[(token, env.rid)], call_id=call, stats=stats)
        again = await f.commit(acks=[(token, env.rid)], call_id=call, stats=stats)
        assert first.acks == again.acks == [3]
        assert r.hgetall(keys.worker_acked) == {f.caller: "1"}  # counted once too
        await f.commit(stats=["i", "item_scraped_count", "2", "max", "memusage/max", "50",
                              "min", "start_time", "999"])
        return r.hgetall(keys.fleet_stats)

    assert run(redis_server, crawl_id, body) == {
        "item_scraped_count": "5", "response_bytes_avg": "1.5", "memusage/max": "100",
        "start_time": "999"}


def test_fail_reason_truncated_to_500_characters_non_ascii(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    reason = "a" + "é" * 600  # an exception message quoting a non-ASCII URL, say

    async def body(f, r):
        await f.enqueue([NewRequest("U")])
        (t, e), = (await f.claim(1, "w")).claims
        assert await f.fail(t, reason, permanent=True) == 2
        return e.rid

    rid = run(redis_server, crawl_id, body)
    raw = redis_server.client().hget(keys.dead, str(rid))
    assert json.loads(raw)["reason"] == reason[:500]


# ----------------------------------------------------------------------- recover


def test_recover_counts_attempts_and_dead_letters_after_max_expiries(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest("X", 3)])
        for i, expected in enumerate([(1, 0, 0), (1, 0, 0), (0, 1, 0)]):
            res = await f.claim(1, "dies")
            (t, e), = res.claims
            assert (e.payload, e.attempts, e.expiries) == ("X", i, i)
            assert await f.recover() == (0, 0, 0)  # still live
            wait_redis_past(r, res.now_ms + 100)
            assert await f.recover() == expected
        assert (await f.claim(1, "dies")).claims == []
        return e.rid

    rid = run(redis_server, crawl_id, body, lease_ms=100, max_attempts=3)
    r = redis_server.client(decode_responses=True)
    letter = json.loads(r.hget(keys.dead, str(rid)))
    assert (letter["reason"], letter["attempts"], letter["envelope"]) == (
        "lease expired: its worker died or stalled", 3, f"{rid}|0|0|3||X")
    assert stats(r, keys) == {"enqueued": 1, "claimed": 3, "recovered": 2, "dead": 1}
    assert queue_len(r, keys) == r.zcard(keys.leases) == r.hlen(keys.inflight) == 0


def test_recover_batch_limit_and_expired_left(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest(f"e{i}") for i in range(12)])
        res = await f.claim(12, "dies")
        wait_redis_past(r, res.now_ms + 100)
        return [await f.recover() for _ in range(4)]

    got = run(redis_server, crawl_id, body, lease_ms=100, recover_batch=5)
    assert got == [(5, 0, 7), (5, 0, 2), (2, 0, 0), (0, 0, 0)]
    r = redis_server.client(decode_responses=True)
    q = queue_envelopes(r, keys)
    assert sorted(e.payload for e in q) == sorted(f"e{i}" for i in range(12))
    assert all((e.attempts, e.expiries) == (1, 1) for e in q)
    assert r.zcard(keys.leases) == 0 and r.hlen(keys.inflight) == 0


# ------------------------------------------------------------------------- renew


def test_renew_extends_held_never_resurrects_and_heartbeats(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        short = new_frontier(redis_server.url, crawl_id, lease_ms=100)
        try:
            await f.enqueue([NewRequest(f"n{i}") for i in range(4)])
            res = await f.claim(3, "w1")
            t1, t2, t3 = (t for t, _ in res.claims)
            (t4, _), = (await short.claim(1, "w1")).claims
            scores0 = lease_scores(r, keys)
            assert scores0[t1] == res.now_ms + 60_000
            wait_redis_past(r, scores0[t4])
            assert await f.recover() == (1, 0, 0)  # t4 reaped

            before = redis_ms(r)
            lost = await f.renew("w1", [t1, t2, t4, 10**9])
            after = redis_ms(r)
            assert lost == [t4, 10**9]
            scores1 = lease_scores(r, keys)
            assert set(scores1) == {t1, t2, t3}  # t4 NOT recreated
            for t in (t1, t2):
                assert before + 60_000 <= scores1[t] <= after + 60_000
                assert scores1[t] > scores0[t]
            assert scores1[t3] == scores0[t3]
            assert before <= int(r.zscore(keys.workers, "w1")) <= after

            # a renew with no tokens is a pure heartbeat
            before = redis_ms(r)
            assert await f.renew("w2", []) == []
            assert before <= int(r.zscore(keys.workers, "w2")) <= redis_ms(r)
            assert lease_scores(r, keys) == scores1
            # the reaped request is back in the queue, once, unharmed by the renew
            assert [(e.payload, e.attempts) for e in queue_envelopes(r, keys)] == [("n3", 1)]
        finally:
            await short.client.aclose()

    run(redis_server, crawl_id, body)


# ----------------------------------------------------------------------- release


def test_release_puts_claims_back_at_the_front_without_an_attempt(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest(p) for p in ("A", "B", "C")])
        res = await f.claim(2, "w1")
        (ta, ea), (tb, eb) = res.claims
        await f.claim(0, "w2")  # another live worker
        await f.enqueue([NewRequest("H", 5), NewRequest("Z", -1)])
        assert set(r.zrange(keys.workers, 0, -1)) == {"w1", "w2"}

        assert await f.release("w1", [ta, tb]) == 2
        q = queue_envelopes(r, keys)
        assert [(e.payload, e.rid, e.attempts, e.expiries) for e in q] == [
            ("H", 4, 0, 0), ("A", 1, 0, 0), ("B", 2, 0, 0), ("C", 3, 0, 0), ("Z", 5, 0, 0)]
        assert r.zcard(keys.leases) == 0 and r.hlen(keys.inflight) == 0
        assert r.zrange(keys.workers, 0, -1) == ["w2"]
        assert stats(r, keys)["released"] == 2

        before = snapshot(r, keys)
        assert await f.release("w2", [ta, 10**9]) == 0  # not held: nothing released
        after = snapshot(r, keys)
        assert after == before
        assert r.zcard(keys.workers) == 0  # but w2 left the registry

        res = await f.claim(10, "w3")
        return [e.payload for _, e in res.claims]

    assert run(redis_server, crawl_id, body) == ["H", "A", "B", "C", "Z"]
    r = redis_server.client(decode_responses=True)
    assert stats(r, keys) == {"enqueued": 5, "claimed": 7, "released": 2}


def test_release_keeps_the_claim_order_of_released_requests(redis_server, crawl_id):
    async def body(f, r):
        await f.enqueue([NewRequest(f"q{i}") for i in range(1, 11)])  # rids 1..10
        for t, e in (await f.claim(8, "w")).claims:
            await f.ack(t, e.rid)
        res = await f.claim(2, "w")
        assert [e.rid for _, e in res.claims] == [9, 10]
        await f.release("w", [t for t, _ in res.claims])
        return [e.rid for _, e in (await f.claim(2, "w")).claims]

    assert run(redis_server, crawl_id, body) == [9, 10]


def test_release_in_any_token_order_puts_each_priority_back_in_rid_order(redis_server, crawl_id):
    async def body(f, r):
        await f.enqueue([NewRequest(p, pr) for pr, p in [(0, "a1"), (2, "h1"), (0, "a2"),
                                                         (2, "h2"), (0, "a3"), (-1, "z1")]])
        claimed = (await f.claim(6, "w")).claims
        assert [e.payload for _, e in claimed] == ["h1", "h2", "a1", "a2", "a3", "z1"]
        await f.enqueue([NewRequest("a4"), NewRequest("h3", 2)])  # queued while held
        by_payload = {e.payload: t for t, e in claimed}
        back = [by_payload[p] for p in ("a3", "z1", "h2", "a1", "h1", "a2")]
        assert await f.release("w", back) == 6
        return [e.payload for _, e in (await f.claim(10, "w")).claims]

    assert run(redis_server, crawl_id, body) == ["h1", "h2", "h3", "a1", "a2", "a3", "a4", "z1"]


# ------------------------------------------------------------------------ owners


def owners(r: redis.Redis, keys: CrawlKeys) -> dict[int, str]:
    return {int(t): w for t, w in r.hgetall(keys.owners).items()}


def assert_owners_match_leases(r: redis.Redis, keys: CrawlKeys) -> None:
    """Every lease has its owner, and the owners HASH holds nothing else (no leak)."""
    assert set(owners(r, keys)) == set(lease_scores(r, keys)), (
        owners(r, keys), lease_scores(r, keys))


def test_only_the_claiming_worker_renews_or_releases_its_claims(redis_server, crawl_id):
    """Worker B cannot renew nor release worker A's claims (nor a lease with no owner):
    they are left as they are, reported lost to B's renewal, not counted released."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest(f"o{i}") for i in range(4)])
        ta1, ta2 = (t for t, _ in (await f.claim(2, "A")).claims)
        tb1, tb2 = (t for t, _ in (await f.claim(2, "B")).claims)
        assert owners(r, keys) == {ta1: "A", ta2: "A", tb1: "B", tb2: "B"}
        # a lease nobody owns (made by hand: no script makes one)
        r.zadd(keys.leases, {"77": redis_ms(r) + 60_000})
        r.hset(keys.inflight, "77", r.hget(keys.inflight, str(tb2)))
        wait_redis_past(r, redis_ms(r) + 2)  # so a renewal really moves the scores

        scores0 = lease_scores(r, keys)
        assert await f.renew("B", [ta1, tb1, 77]) == [ta1, 77]
        scores1 = lease_scores(r, keys)
        assert scores1[tb1] > scores0[tb1]
        assert {t: scores1[t] for t in (ta1, ta2, tb2, 77)} == {
            t: scores0[t] for t in (ta1, ta2, tb2, 77)}

        before = snapshot(r, keys)
        assert await f.release("B", [ta1, ta2, 77]) == 0  # none of them B's
        assert snapshot(r, keys) == before
        r.zadd(keys.workers, {"B": redis_ms(r)})  # (release took B out of the registry)
        assert await f.release("B", [ta1, tb1, 77]) == 1  # only tb1
        assert owners(r, keys) == {ta1: "A", ta2: "A", tb2: "B"}
        assert set(lease_scores(r, keys)) == {ta1, ta2, tb2, 77}
        assert set(r.hkeys(keys.inflight)) == {str(t) for t in (ta1, ta2, tb2, 77)}
        assert stats(r, keys)["released"] == 1
        assert await f.release("", [ta1, tb2]) == 0  # no caller: nothing released

        # A's own calls still work on A's claims
        assert await f.renew("A", [ta1, ta2]) == []
        assert await f.release("A", [ta1, ta2]) == 2
        assert owners(r, keys) == {tb2: "B"}
        r.zrem(keys.leases, "77")
        r.hdel(keys.inflight, "77")
        assert_owners_match_leases(r, keys)

    run(redis_server, crawl_id, body)


def test_owners_hash_is_empty_once_every_claim_ended(redis_server, crawl_id):
    """Each way a lease ends (ack, fail and requeue, fail to the dead letters, a stale
    ack of a lease without its envelope, release, recovery of an expired lease, and
    dead-lettering at the last expiry) removes its owner: the owners HASH never holds
    more than the leases, and nothing once the crawl is drained."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        short = new_frontier(redis_server.url, crawl_id, lease_ms=100, max_attempts=2)
        try:
            await f.enqueue([NewRequest(f"d{i}") for i in range(8)])
            c = (await f.claim(5, "w1")).claims
            assert_owners_match_leases(r, keys)
            assert set(owners(r, keys).values()) == {"w1"}
            (t0, e0), (t1, e1), (t2, e2), (t3, e3), (t4, e4) = c
            res = await f.commit(acks=[(t0, e0.rid)],
                                 fails=[Failure(t1, "retry"), Failure(t2, "bad", True)])
            assert (res.acks, res.fails) == ([3], [1, 2])
            assert_owners_match_leases(r, keys)
            r.hdel(keys.inflight, t3)  # a lease whose envelope is gone: the ack ends it
            assert await f.ack(t3, e3.rid) == 3
            assert_owners_match_leases(r, keys)
            assert await f.release("w1", [t4]) == 1
            assert owners(r, keys) == {} and r.zcard(keys.leases) == 0

            # the rest (d4 released, d1 requeued, d5, d6, d7) expires under "dies" ...
            assert len((await short.claim(10, "dies")).claims) == 5
            assert set(owners(r, keys).values()) == {"dies"}
            assert_owners_match_leases(r, keys)
            wait_redis_past(r, max(lease_scores(r, keys).values()))
            assert await f.recover() == (5, 0, 0)
            assert owners(r, keys) == {} and r.zcard(keys.leases) == 0
            # ... and again, each alone now (suspects): d1 reaches max_attempts (3)
            for _ in range(5):
                assert len((await short.claim(10, "dies")).claims) == 1
                assert_owners_match_leases(r, keys)
            wait_redis_past(r, max(lease_scores(r, keys).values()))
            assert await f.recover() == (4, 1, 0)
            assert owners(r, keys) == {} and r.zcard(keys.leases) == 0
            # claim what is left one by one and ack it
            while True:
                got = (await f.claim(1, "w2")).claims
                if not got:
                    break
                assert_owners_match_leases(r, keys)
                (t, e), = got
                await f.ack(t, e.rid)
            assert r.zcard(keys.leases) == r.hlen(keys.inflight) == 0
            assert r.exists(keys.owners) == 0
        finally:
            await short.client.aclose()

    run(redis_server, crawl_id, body)


def test_plain_requests_queue_in_the_lanes_list_and_others_in_a_list_per_tier(
        redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([NewRequest(f"p{i}", lane="h") for i in range(3)]
                        + [NewRequest("up", 1, lane="h"), NewRequest("down", -1, lane="h"),
                           NewRequest("start", 0, lane="h", order="S")])
        assert tier_lists(r, keys, "h") == {
            "p0": [f"{i + 1}|0|0|0|h|p{i}" for i in range(3)], "p1": ["4|0|0|1|h|up"],
            "s0": ["6|0|0|0|h|start"], "p-1": ["5|0|0|-1|h|down"]}
        assert tiers(r, keys, "h") == [("p1", -1.0), ("s0", 0.5), ("p-1", 1.0)]
        assert r.lrange(keys.lane_tier("h", "p1"), 0, -1) == ["4|0|0|1|h|up"]
        assert int(r.get(keys.todo)) == 6
        got = (await f.claim(10, "w", [("h", NO_BUDGET)])).claims
        assert queue_keys(r, keys, "h") == [] and r.exists(keys.lanes) == 0
        assert [k for k in r.scan_iter(f"{keys.prefix}tier*")] == []
        return [e.payload for _, e in got]

    assert run(redis_server, crawl_id, body) == ["up", "p0", "p1", "p2", "start", "down"]


def test_a_crawl_queued_by_the_earlier_layout_is_refused_unless_nothing_is_in_its_zsets(
        redis_server, crawl_id):
    """Layout 1 (every priority but 0 in one ZSET per lane, members "<12-char
    prefix><envelope>") had no layout recorded: such a crawl with requests in those
    ZSETs is refused with what to do; one with only priority-0 requests (LISTs, the
    same in both) or nothing queued takes the current layout."""
    r = redis_server.client(decode_responses=True)

    async def open_(crawl: str) -> Any:
        f = new_frontier(redis_server.url, crawl)
        try:
            await f.check_layout(SEEN_BUCKET_BITS)
            return await f.claim(5, "w", [("h", NO_BUDGET)])
        finally:
            await f.client.aclose()

    def old_crawl(crawl: str) -> CrawlKeys:
        keys = CrawlKeys(crawl)
        r.hset(keys.meta, mapping={"seen_bucket_bits": SEEN_BUCKET_BITS, "seen_ttl_ms": 0})
        return keys

    old = old_crawl(crawl_id + "-zset")
    r.rpush(old.lane_fifo("h"), "1|0|0|0|h|zero")
    r.zadd(old.lane_queue("h"), {f"{2:012x}2|0|0|3|h|three": -3})
    r.zadd(old.lanes, {"h": 0})
    with pytest.raises(ValueError, match="another layout of its queues") as exc:
        asyncio.run(open_(crawl_id + "-zset"))
    assert "layout 1; this version uses 2" in str(exc.value)
    assert "scrapy leased reset" in str(exc.value)
    assert r.hget(old.meta, "queue_layout") is None  # still refused next time

    plain = old_crawl(crawl_id + "-plain")
    r.rpush(plain.lane_fifo("h"), "1|0|0|0|h|zero")
    r.zadd(plain.lanes, {"h": 0})
    res = asyncio.run(open_(crawl_id + "-plain"))
    assert [e.payload for _, e in res.claims] == ["zero"]
    assert r.hget(plain.meta, "queue_layout") == "2"

    empty = old_crawl(crawl_id + "-empty")
    asyncio.run(open_(crawl_id + "-empty"))
    assert r.hget(empty.meta, "queue_layout") == "2"

    newer = CrawlKeys(crawl_id + "-newer")
    r.hset(newer.meta, mapping={"seen_bucket_bits": SEEN_BUCKET_BITS, "seen_ttl_ms": 0,
                                "queue_layout": 3})
    with pytest.raises(ValueError, match="layout 3; this version uses 2"):
        asyncio.run(open_(crawl_id + "-newer"))


def test_claim_names_the_lanes_with_nothing_to_enforce(redis_server, crawl_id):
    """free_lanes: lanes claimed from without a budget, a Crawl-delay or a block."""
    lanes = [("plain", NO_BUDGET), ("budget", Budget(100, 5)), ("delay", NO_BUDGET),
             ("idle", NO_BUDGET)]

    async def body(f, r):
        await f.enqueue([NewRequest(f"{lane}-{i}", lane=lane)
                         for lane in ("plain", "budget", "delay") for i in range(2)])
        await f.penalize("delay", crawl_delay_ms=60_000)  # not ready again in this test
        first = await f.claim(10, "w", lanes)
        await f.enqueue([NewRequest("plain-2", lane="plain")])
        await f.penalize("plain", block_ms=60_000)
        blocked = await f.claim(10, "w", lanes)
        return first, blocked

    first, blocked = run(redis_server, crawl_id, body)
    assert {e.lane for _, e in first.claims} == {"plain", "budget", "delay"}
    assert first.free_lanes == {"plain"}
    assert (blocked.claims, blocked.free_lanes) == ([], frozenset())


# ----------------------------------------------------------------- garbage in queue


def test_claim_dead_letters_garbage_members_and_returns_the_good(redis_server, crawl_id):
    """Members pushed by hand that are no envelopes (in a tier, in p0) are dead-lettered;
    a tier listed in the index without a LIST is dropped from it."""
    keys = CrawlKeys(crawl_id)
    garbage = ["garbage", "000000000000not|an|envelope"]

    async def body(f, r):
        await f.enqueue([NewRequest(p) for p in ("G1", "G2", "G3")])
        r.rpush(keys.lane_tier("", "p1"), garbage[0])
        r.zadd(keys.queue, {"p1": -1, "p9": -9})  # p9: no LIST
        r.rpush(keys.lane_fifo(""), garbage[1])
        t0 = redis_ms(r)
        res = await f.claim(10, "w")
        return t0, res

    t0, res = run(redis_server, crawl_id, body)
    assert [e.payload for _, e in res.claims] == ["G1", "G2", "G3"]
    assert (res.queued, res.leases) == (0, 3)
    r = redis_server.client(decode_responses=True)
    dead = r.hgetall(keys.dead)
    assert set(dead) == {"malformed:" + hashlib.sha1(m.encode()).hexdigest() for m in garbage}
    for member in garbage:
        letter = json.loads(dead["malformed:" + hashlib.sha1(member.encode()).hexdigest()])
        assert t0 <= letter.pop("t") <= res.now_ms
        assert letter == {"reason": "malformed envelope: queue member is not an envelope",
                          "attempts": 0, "envelope": member}
    assert stats(r, keys) == {"enqueued": 3, "claimed": 3, "dead": 2}
    assert queue_keys(r, keys) == []


def test_claim_never_loses_requests_when_rids_pass_2_to_the_32(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    r.set(keys.rids, 2**32 - 2)

    async def body(f, r):
        await f.enqueue([NewRequest(p) for p in ("big1", "big2", "big3")])
        res = await f.claim(3, "w")
        assert [e.rid for _, e in res.claims] == [2**32 - 1, 2**32, 2**32 + 1]
        return [await f.ack(t, e.rid) for t, e in res.claims]

    # beyond the bitmap's range a held ack still counts done once
    assert run(redis_server, crawl_id, body) == [3, 3, 3]
    assert queue_len(r, keys) + r.zcard(keys.leases) == 0
    assert int(r.hget(keys.stats, "done")) == 3


# ------------------------------------------------------------ cost: O(1) per token


GUARD = {"hmget": 1, "get": 2}  # lib_guard.lua: epoch, tokens, rids (and INFO server)
CALL_ID = {"get": 1, "set": 1}  # a call with an id: its recorded reply read, its own kept


def assert_guard_called(r: redis.Redis) -> None:
    assert int(r.info("commandstats")["cmdstat_info"]["calls"]) >= 1


def test_no_operation_scans_the_processing_set():
    """With 20,000 live leases, recover (nothing expired), renew (5 tokens), claim (empty
    queue) and ack run a fixed, small number of O(log N) commands inside Redis: counted
    exactly by INFO commandstats (commands called by a script are counted there)."""
    with RedisServer() as srv:  # private: CONFIG RESETSTAT must not disturb other tests
        keys = CrawlKeys("cost")

        async def body(f, r):
            for start in range(0, 20_000, 1000):
                await f.enqueue([NewRequest(f"c{i}") for i in range(start, start + 1000)])
            claims = []
            for _ in range(4):
                res = await f.claim(5000, "w")
                claims += res.claims
            assert len(claims) == 20_000 and r.zcard(keys.leases) == 20_000
            tokens = [t for t, _ in claims]
            # load every script once (no NOSCRIPT + SCRIPT LOAD in the counts below)
            assert await f.recover() == (0, 0, 0)
            await f.renew("w", [])
            await f.release("", [])
            await f.commit()
            wait_redis_past(r, res.now_ms + 2)  # so a renewal really moves the scores

            r.config_resetstat()
            assert await f.recover() == (0, 0, 0)
            st = commandstats(r)
            # (fewer expired than the batch: none left, no zcount)
            assert st == {"evalsha": 1, "time": 1, "zrangebyscore": 1}, st

            scores0 = lease_scores(r, keys)
            r.config_resetstat()
            assert await f.renew("w", tokens[:5]) == []
            st = commandstats(r)
            # heartbeat (zadd) + the 5 leases read at once, checked to be the caller's
            # (owners: hmget) and held (zmscore), extended at once (zadd), the control
            # state (hget, once its type is checked: type), and the guard (lib_guard.lua:
            # INFO, not counted here)
            assert st == {"evalsha": 1, "time": 1, "zadd": 2, "hget": 1, "zmscore": 1,
                          "type": 1, **GUARD, "hmget": GUARD["hmget"] + 1}, st
            assert_guard_called(r)
            scores1 = lease_scores(r, keys)
            assert {t for t in tokens if scores1[t] != scores0[t]} == set(tokens[:5])

            r.config_resetstat()
            res = await f.claim(5, "w")
            assert (res.claims, res.queued, res.leases) == ([], 0, 20_000)
            st = commandstats(r)
            # (+ the fleet's control state and first claim: hmget, its type checked
            # first: type; the feed: llen, hlen)
            assert st == {"evalsha": 1, "time": 1, "zadd": 1, "zscore": 1, "zrangebyscore": 1,
                          "zrange": 1, "zcard": 1, **GUARD, "hmget": GUARD["hmget"] + 1,
                          "llen": 1, "hlen": 1, "type": 1,
                          **CALL_ID,
                          "get": 1 + GUARD["get"] + CALL_ID["get"]}, st

            r.config_resetstat()
            t, e = claims[-1]
            assert await f.ack(t, e.rid) == 3
            st = commandstats(r)
            # + the throughput bucket: time, hincrby, hlen (a new bucket: old buckets
            # pruned past 7); the claim is checked: hmget of its envelope; the commit's
            # reply is kept: set; its lease, envelope and owner deleted: zrem (its reply:
            # was it held), hdel 2; done: setbit; the fleet's acked and done and the
            # caller's count of acks (worker_acked): hincrby 3 with the bucket's
            assert st == {"evalsha": 1, "zrem": 1, "hdel": 2, "setbit": 1, "hincrby": 4,
                          "time": 1, "hlen": 1, **GUARD, **CALL_ID,
                          "hmget": GUARD["hmget"] + 1,
                          "get": GUARD["get"] + CALL_ID["get"]}, st

            r.config_resetstat()
            assert await f.release("w", tokens[:3]) == 3
            st = commandstats(r)
            # the claims' envelopes read first (hmget: their lanes and tiers); priority 0:
            # back to the head of the lane's LIST (+ the lanes ZSET, NX); each token's
            # owner checked (hget) and deleted (hdel) with its envelope; the worker leaves
            # the registry (zrem, hdel of its info and of its count of acks)
            assert st == {"evalsha": 1, "hmget": 1, "zrem": 4, "hget": 6, "hdel": 8,
                          "lpush": 3, "zadd": 3, "incr": 3, "hincrby": 1}, st

        r = srv.client(decode_responses=True)

        async def main():
            fr = new_frontier(srv.url, "cost", lease_ms=600_000)
            try:
                await body(fr, r)
            finally:
                await fr.client.aclose()

        asyncio.run(main())


def test_claims_and_acks_write_once_per_call_not_per_request():
    """A claim of 16 requests from 2 lanes and a commit acking 16 claims run the same
    bookkeeping commands as a claim and an ack of one: only taking a request off its
    queue (lpop) and checking it is not done (getbit) are per request; the head of its
    lane's tier index (zrange), whether its lane's queue is now empty (exists) and its
    time and rate state (zscore; exists of the rate HASH of a lane without a budget, an
    hmget when it has one) per lane served; marking an ack's request done
    (setbit) per ack. Before, each claimed request ran get + decr todo, set tokens,
    zadd leases, hset inflight, hset owners, exists + zadd lanes, zrange; each ack hget,
    zrem, hdel 2 and setbit (now hmget, zmscore, zrem and hdel 2 for all the acks of a
    call, and a setbit each)."""
    with RedisServer() as srv:  # private: CONFIG RESETSTAT must not disturb other tests
        keys = CrawlKeys("percall")
        lanes = [("a", NO_BUDGET), ("b", NO_BUDGET)]

        async def body(f, r):
            await f.enqueue([NewRequest(f"{lane}{i}", lane=lane) for i in range(40)
                             for lane in ("a", "b")])
            first = (await f.claim(1, "w", lanes)).claims  # loads the script (no SCRIPT LOAD)
            counts = {}
            for n in (1, 16):
                r.config_resetstat()
                res = await f.claim(n, "w", lanes)
                assert len(res.claims) == n
                counts[n] = (commandstats(r), res.claims)
            one, many = counts[1][0], counts[16][0]
            per_request = {"lpop", "getbit"}
            per_lane = {"exists", "zscore", "hmget", "zrange"}
            assert {c: v for c, v in one.items() if c not in per_request | per_lane} \
                == {c: v for c, v in many.items() if c not in per_request | per_lane}, \
                (one, many)
            for c in per_request:
                assert (one[c], many[c]) == (1, 16), (c, one, many)
            # per lane served: its rate HASH (none: no budget, nothing else to read), and
            # whether its queue is empty now
            assert (one["exists"], many["exists"]) == (2, 4)
            # a lane is looked at (its time, its rate state) when the round robin reaches
            # it: the claim of 1 never reaches lane b
            assert (one["zscore"], many["zscore"]) == (1, 2)
            assert (one["zrange"], many["zrange"]) == (1, 2)  # its tier index's head
            assert many["hmget"] == one["hmget"]  # (control, epoch) no rate HASH read
            assert many["zadd"] == 1 + 1 + 1  # heartbeat, leases, both lanes' times
            assert many["hset"] == 2 and many["set"] == 2  # inflight, owners; tokens, reply
            # what the calls left behind, as before: leases, envelopes, owners, todo
            claims = first + counts[1][1] + counts[16][1]
            assert r.zcard(keys.leases) == 18 and int(r.get(keys.todo)) == 80 - 18
            assert r.hgetall(keys.owners) == {str(t): "w" for t, _ in claims}
            assert int(r.get(keys.tokens)) == max(t for t, _ in claims)
            assert r.hget(keys.stats, "claimed") == "18"
            assert [r.zscore(keys.lanes, lane) for lane in "ab"] == [res.now_ms] * 2

            acks = {}
            for batch in (claims[1:2], claims[2:18]):
                r.config_resetstat()
                out = await f.commit(acks=[(t, e.rid) for t, e in batch])
                assert out.acks == [3] * len(batch)
                acks[len(batch)] = commandstats(r)
            acks[1].pop("hlen", None)  # the first done of a bucket only: old ones pruned
            acks[16].pop("hlen", None)
            # one ack: its zrem tells whether it was held; several: zmscore first. Done
            # bits: one setbit per ack
            assert acks[16].pop("zmscore") == 1
            assert (acks[1].pop("setbit"), acks[16].pop("setbit")) == (1, 16)
            assert acks[1] == acks[16], acks
            assert r.zcard(keys.leases) == 1 and r.hlen(keys.inflight) == 1
            assert r.hget(keys.stats, "done") == "17"
            # the caller's count of acks (status's live per-worker acked): one HINCRBY
            # per call, with the fleet's acked and done and the throughput bucket
            assert acks[1]["hincrby"] == acks[16]["hincrby"] == 4, acks
            assert r.hgetall(keys.worker_acked) == {f.caller: "17"}

        run(srv, "percall", body)


def test_a_url_named_twice_in_one_call_is_queued_as_first_named(redis_server, crawl_id):
    """A call sends its new requests grouped by lane, priority and order (calls.py
    enqueue_args); the same URL named again later in the call, in another group, is
    still the duplicate, and the first one is queued with its own lane, priority and
    payload, as Scrapy's dupefilter keeps the first of two requests."""
    def req(url: str, lane: str, priority: int, payload: str) -> NewRequest:
        bucket, member = split_fingerprint(hashlib.sha1(url.encode()).digest(),
                                           SEEN_BUCKET_BITS)
        return NewRequest(payload, priority, bucket, member, lane)

    async def body(f, r):
        out = await f.enqueue([req("http://b/x", "b", 0, "y"), req("http://a/x", "a", 0, "a0"),
                               req("http://a/x", "b", 5, "a1"), req("http://a/x", "a", 0, "a2")])
        assert out == [True, True, False, False]
        held = (await f.claim(4, "w", [("a", NO_BUDGET), ("b", NO_BUDGET)])).claims
        return sorted((e.lane, e.priority, e.payload) for _, e in held)

    assert run(redis_server, crawl_id, body) == [("a", 0, "a0"), ("b", 0, "y")]


def test_new_requests_queue_once_per_call_not_per_request():
    """A commit queueing 12 new requests over 3 lanes runs one SADD per request (its
    seen bucket) but one push per LIST, one ZADD NX of the lanes, one INCRBY of todo
    and one SET of the rids key for all of them, as a commit of one does (lib_enqueue.lua;
    before, each new request ran INCR rids, RPUSH, ZADD NX lanes and INCR todo); the
    rids are dense and in the order sent (by lane: calls.py enqueue_args), each lane's
    queue in FIFO order."""
    with RedisServer() as srv:  # private: CONFIG RESETSTAT must not disturb other tests
        keys = CrawlKeys("percall-enqueue")

        def reqs(tag: str, n: int) -> list[NewRequest]:
            out = []
            for i in range(n):
                lane = "abc"[i % 3]
                url = f"http://{lane}/{tag}{i}"
                bucket, member = split_fingerprint(hashlib.sha1(url.encode()).digest(),
                                                   SEEN_BUCKET_BITS)
                out.append(NewRequest(url, 0, bucket, member, lane))
            return out

        async def body(f, r):
            await f.commit(enqueue=reqs("warm", 1))  # loads the script
            counts = {}
            for tag, n in (("one", 1), ("many", 12)):
                r.config_resetstat()
                out = await f.commit(enqueue=reqs(tag, n))
                assert out.queued == [True] * n
                counts[n] = commandstats(r)
            one, many = counts[1], counts[12]
            assert (one["sadd"], many["sadd"]) == (1, 12)
            assert (one["rpush"], many["rpush"]) == (1, 3)  # one per lane's LIST
            for c in ("zadd", "incrby"):
                assert (one[c], many[c]) == (1, 1), (c, one, many)
            assert (one["set"], many["set"]) == (2, 2)  # the rids key; the reply (guard)
            assert "incr" not in many
            assert int(r.get(keys.rids)) == 1 + 1 + 12 and int(r.get(keys.todo)) == 14
            assert sorted(r.zrange(keys.lanes, 0, -1)) == ["a", "b", "c"]
            for k, lane in enumerate("abc"):
                envs = queued_envelopes(r, keys, lane)
                assert [e.payload for e in envs[-4:]] == \
                    [f"http://{lane}/many{i}" for i in range(k, 12, 3)]
                assert [e.rid for e in envs[-4:]] == [3 + 4 * k + i for i in range(4)]
            # a duplicate of each: nothing queued, no rid taken
            r.config_resetstat()
            out = await f.commit(enqueue=reqs("many", 12))
            assert out.queued == [False] * 12
            assert int(r.get(keys.rids)) == 14 and int(r.get(keys.todo)) == 14
            assert "rpush" not in commandstats(r)

        run(srv, "percall-enqueue", body)


# ------------------------------------------------------------------------ seen set


def test_seen_buckets_stay_intset_at_100k_fingerprints(redis_server, crawl_id):
    keys = CrawlKeys(crawl_id)
    assert SEEN_BUCKET_BITS == 14
    reqs = [url_request(f"http://example.com/p/{i}") for i in range(100_000)]
    buckets = Counter(q.bucket for q in reqs)

    async def body(f, r):
        for start in range(0, len(reqs), 1000):
            assert await f.enqueue(reqs[start:start + 1000]) == [True] * 1000

    run(redis_server, crawl_id, body)
    r = redis_server.client(decode_responses=True)
    p = r.pipeline(transaction=False)
    for b in range(2 ** SEEN_BUCKET_BITS):
        p.object("encoding", keys.seen_bucket(b))
        p.scard(keys.seen_bucket(b))
    out = p.execute()
    encodings, sizes = out[0::2], out[1::2]
    present = {b for b, enc in enumerate(encodings) if enc is not None}
    assert present == set(buckets)
    assert Counter(e for e in encodings if e is not None) == {"intset": len(buckets)}
    assert {b: sizes[b] for b in present} == dict(buckets)
    assert sum(sizes) == 100_000
    assert max(sizes) < 512  # set-max-intset-entries


def test_a_continued_claim_leaves_a_request_whose_lease_expired_for_a_call_of_its_own(
        redis_server, crawl_id):
    """A claim that continues one of the caller's (the scheduler's second claim of a
    round, the stale-tier continuation) takes no request whose lease expired before: it
    goes alone, in a call that claims nothing else."""

    async def body(f, r):
        await f.enqueue([NewRequest("S")])
        res = await f.claim(1, "dies")
        wait_redis_past(r, res.now_ms + 100)
        assert await f.recover() == (1, 0, 0)
        await f.enqueue([NewRequest("a"), NewRequest("b")])
        continued = await f.claim(2, "w", continues=True)
        alone = await f.claim(2, "w")
        rest = await f.claim(2, "w")
        return ([e.payload for _, e in continued.claims], [e.payload for _, e in alone.claims],
                [e.payload for _, e in rest.claims])

    continued, alone, rest = run(redis_server, crawl_id, body, lease_ms=100)
    assert "S" not in continued
    assert alone == ["S"]
    assert sorted(continued + rest) == ["a", "b"]
