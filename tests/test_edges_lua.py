"""Issue #24, the Lua scripts' edges: no script writes and then fails on the same inputs.

Each symptom is caused for real (a real redis-server, real ``scrapy crawl`` workers
against the local site where it is about a crawl):

- a feed key of the wrong type (a producer's XADD or SET): claim.lua, feed_take.lua,
  feed_commit.lua and run_flush.lua refuse before any write, naming the key and its type
  (frontier/scripts.py WrongKeyType); the first worker that meets the feed key of the
  wrong type moves it aside whole (lua/key_aside.lua), says so once, and the crawl ends;
  the same for a control key SET by hand, which no longer stops the renewals;
- a NaN / inf / huge stat: the worker does not send it (one warning per stat), commit.lua
  skips such values before writing anything (defence in depth), the crawl finishes with
  every stat counted once;
- ``Retry-After: nan`` (and other values that are no delay): the lane is blocked for
  LEASED_RATE_BACKOFF and the 429 reaches RetryMiddleware;
- LEASED_FLUSH_ON_START keeps the feed, and hands back the batches taken off it and not
  queued.

Plus Hypothesis properties (bounded, deadline=None) for stat values and for the headers
and statuses the rate middleware reads.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from scrapy_leased._redis.connection import make_client
from scrapy_leased.fleet.stats import StatsFlusher, decode_fleet_stats
from scrapy_leased.frontier import Budget
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.model import NewRequest
from scrapy_leased.frontier.run import RunMarker
from scrapy_leased.frontier.scripts import as_str
from scrapy_leased.ratelimit import LeasedRateMiddleware
from scrapy_leased.ratelimit import middleware as rate_mw
from tests.support.lua_edges import GOOD, HOSTILE
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_for
from tests.test_crawl import assert_each_once, stat
from tests.test_frontier import new_frontier, run, url_request

WAIT = 120  # hang guard, not a check
FAST = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5}
HOSTILE_EXT = {"EXTENSIONS": {"testproject.extensions.FleetBarrier": 0,
                              "tests.support.lua_edges.HostileStats": 500}}


def crawl_keys_state(r: redis.Redis, keys: CrawlKeys, skip: tuple[str, ...] = ()) -> dict:
    """Every key of the crawl with its type and serialized value (DUMP): two equal
    states mean that nothing at all was written in between."""
    out = {}
    for key in sorted(r.scan_iter(match=keys.prefix + "*", count=1000)):
        name = key.decode() if isinstance(key, bytes) else key
        if name in skip:
            continue
        out[name] = (r.type(key), r.dump(key))
    return out


def wrongtype_replies(r: redis.Redis) -> int:
    """How many WRONGTYPE errors Redis replied so far (INFO errorstats: the script's own
    refusal, KEYTYPE, or a command's inside a script, WRONGTYPE)."""
    stats = r.info("errorstats")
    return sum(int(stats.get(f"errorstat_{kind}", {}).get("count", 0))
               for kind in ("KEYTYPE", "WRONGTYPE"))


# -- a feed key of the wrong type ------------------------------------------------------

def _wrong_type(r: redis.Redis, key: str, kind: str) -> None:
    if kind == "stream":
        r.xadd(key, {"url": "http://example.com/"})
    elif kind == "string":
        r.set(key, "http://example.com/")
    else:
        r.sadd(key, "x")


@pytest.mark.parametrize("kind", ["stream", "string"])
def test_claim_goes_on_past_a_feed_key_of_the_wrong_type(redis_server, crawl_id, kind):
    """Before: claim.lua read LLEN of the feed after it had popped requests and written
    their leases; WRONGTYPE left those writes, and each retry of the claim orphaned
    another batch. Now the feed is read first and a wrong type cannot fail the claim:
    the queued requests are claimed as usual, and the feed is reported as holding work
    (1), so that the worker goes to drain it and feed_take.lua names the key (below).
    The same for the batches key a worker keeps (hand-written)."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([url_request(f"http://example.com/{i}") for i in range(6)])
        _wrong_type(r, keys.feed, kind)
        result = await f.claim(4, "w1")
        assert len(result.claims) == 4 and result.feed == 1
        assert r.zcard(keys.leases) == 4 and int(r.get(keys.todo)) == 2
        with pytest.raises(redis.exceptions.ResponseError) as info:
            await f.take_feed(10)
        text = str(info.value)
        assert keys.feed in text and f"is a {kind}, not a list" in text, text
        r.delete(keys.feed)
        r.set(keys.feed_taken, "x")
        result = await f.claim(4, "w1")
        assert len(result.claims) == 2 and result.feed == 1
        r.delete(keys.feed_taken)
        assert (await f.claim(4, "w1")).feed == 0

    run(redis_server, crawl_id, body)


def test_claim_refuses_non_numeric_arguments_before_any_write(redis_server, crawl_id):
    """A lease length of nan reached claim.lua's ZADD of the leases only after it had
    popped the requests: the pops stayed and the requests were lost. Now the numbers
    used after the pops are checked first and nothing is written."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([url_request(f"http://example.com/{i}") for i in range(3)])
        before = crawl_keys_state(r, keys)
        f.lease_ms = float("nan")
        with pytest.raises(redis.exceptions.ResponseError) as info:
            await f.claim(2, "w1")
        f.claims.pending = None
        assert crawl_keys_state(r, keys) == before
        assert "must be finite numbers" in str(info.value)
        f.lease_ms = 60_000
        # a lane budget of nan claims nothing from the lane (and pops nothing)
        got = await f.claim(2, "w1", lanes=[("", Budget(interval_ms=float("nan")))])
        assert got.claims == [] and int(r.get(keys.todo)) == 3
        assert len((await f.claim(2, "w1")).claims) == 2

    run(redis_server, crawl_id, body)


def test_commit_refuses_request_groups_that_do_not_add_up_before_any_write(redis_server,
                                                                             crawl_id):
    """The new requests are sent in groups with a count each (lib_enqueue.lua): counts
    that do not add up to the number of requests, or seen buckets beyond KEYS, would
    shift every argument after them, and a seen bucket named past KEYS would stop the
    script after the SADDs before it (URLs marked seen, never queued). Both are refused
    before any write, and the same commit sent right goes through."""
    from scrapy_leased.frontier.calls import CommitCall

    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([url_request("http://example.com/0")])
        before = crawl_keys_state(r, keys)
        new = [url_request(f"http://example.com/{i}") for i in (1, 2, 3)]
        call = CommitCall(keys, f.guard, "", f.max_attempts, 0, new)
        kk, args = call.build(None)
        # one group, its queue (priority 0's LIST alone) right after the 13 fixed KEYS
        # and its seen buckets right after it; its lane and spec (3 requests x 4 + the
        # FIFO order's 0)
        assert args[9:14] == [1, 14, 15, "", 3 * 4]
        assert kk[14:17] == [keys.seen_bucket(r.bucket) for r in new]
        for at, value in ((13, 2 * 4), (13, 4 * 4), (13, "x"), (13, -4), (13, "12 x"),
                          (13, 3 * 4 + 2), (13, "12 5"), (11, 16), (10, len(kk) - 1),
                          (9, "nan")):
            bad = list(args)
            bad[at] = value
            with pytest.raises(redis.exceptions.ResponseError) as info:
                await f._s["commit"](keys=kk, args=bad)
            assert "commit: " in str(info.value)
            assert crawl_keys_state(r, keys) == before, (at, value)
        assert call.parse(f.guard.seen(await f._s["commit"](keys=kk, args=args))).queued == \
            [True] * 3
        # requests not deduplicated among them (no seen bucket): with a seen bucket
        # missing from KEYS, a count of those deduplicated is refused as well
        mixed = [url_request("http://example.com/4"), NewRequest("not-deduplicated"),
                 url_request("http://example.com/5"), priority_request(7)]
        call = CommitCall(keys, f.guard, "", f.max_attempts, 0, mixed)
        kk, args = call.build(None)
        before = crawl_keys_state(r, keys)
        with pytest.raises(redis.exceptions.ResponseError, match="seen buckets of 3"):
            await f._s["commit"](keys=kk[:-5] + kk[-4:], args=args)
        assert crawl_keys_state(r, keys) == before
        assert call.parse(f.guard.seen(await f._s["commit"](keys=kk, args=args))).queued == \
            [True] * 4

    run(redis_server, crawl_id, body)


def priority_request(priority: int) -> NewRequest:
    """A deduplicated request of another priority than 0 (its group's spec carries it)."""
    r = url_request(f"http://example.com/p{priority}")
    return NewRequest(r.payload, priority, r.bucket, r.member)


@pytest.mark.parametrize("which", ["feed", "feed_taken", "feed_deadlines"])
def test_feed_take_and_commit_refuse_wrong_types_before_any_write(redis_server, crawl_id,
                                                                  which):
    """feed_take.lua (which gives batches past their deadline back to the feed, then
    takes one) and feed_commit.lua (which queues a batch, then drops it from
    feed_taken/feed_deadlines) check their keys' types first: a wrong one changes
    nothing and is named."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        r.rpush(keys.feed, *[json.dumps({"url": f"http://example.com/{i}"}) for i in range(5)])
        batch = await f.take_feed(3)
        assert len(batch.entries) == 3
        key = getattr(keys, which)
        saved = r.dump(key)
        r.delete(key)
        _wrong_type(r, key, "set")
        before = crawl_keys_state(r, keys)
        with pytest.raises(redis.exceptions.ResponseError, match="is a set, not a"):
            await f.take_feed(3)
        assert crawl_keys_state(r, keys) == before
        if which != "feed":  # feed_commit does not touch the feed
            with pytest.raises(redis.exceptions.ResponseError) as info:
                await f.commit_feed(batch.id, [url_request("http://example.com/0")], [])
            assert key in str(info.value)
            assert crawl_keys_state(r, keys) == before
        r.delete(key)
        r.restore(key, 0, saved)
        assert await f.commit_feed(batch.id, [url_request(f"http://example.com/{i}")
                                              for i in range(3)], []) == [True] * 3
        assert stat(r, crawl_id, "enqueued") == 3 and r.llen(keys.feed) == 2

    run(redis_server, crawl_id, body)


def test_feed_aside_moves_only_a_wrong_type_feed_whole(redis_server, crawl_id):
    """lua/key_aside.lua (Frontier.set_aside): a feed key of another type than a
    LIST is renamed, whole, to ``feed:wrongtype:<ms>``, and nothing else changes; a LIST
    feed, or none, is left alone; an existing key of that name is never overwritten.
    The feed then takes RPUSH entries again, and a fresh run keeps the key moved aside."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        assert await f.set_aside("feed") is None  # no feed
        r.rpush(keys.feed, json.dumps({"url": "http://example.com/0"}))
        before = crawl_keys_state(r, keys)
        assert await f.set_aside("feed") is None  # a list: untouched
        assert crawl_keys_state(r, keys) == before
        r.delete(keys.feed)
        r.xadd(keys.feed, {"url": "http://example.com/1"})
        r.xadd(keys.feed, {"url": "http://example.com/2"})
        stream = r.dump(keys.feed)
        before = crawl_keys_state(r, keys, skip={keys.feed})
        kind, aside = await f.set_aside("feed")
        assert kind == "stream" and keys.is_wrongtype(aside), (kind, aside)
        assert aside.startswith(keys.feed + ":wrongtype:") and r.exists(keys.feed) == 0
        assert r.dump(aside) == stream and r.xlen(aside) == 2  # whole, as written
        assert crawl_keys_state(r, keys, skip={aside}) == before
        assert keys.kept_by_flush(aside)
        assert await f.set_aside("feed") is None  # moved already (another worker's call)
        # a name in use is never overwritten: the script refuses, changing nothing
        r.set(keys.feed, "http://example.com/3")
        script = f._s["key_aside"]
        assert [as_str(x) if isinstance(x, bytes) else x
                for x in await script(keys=[keys.feed, aside], args=["list"])] == ["string", -1]
        assert r.dump(aside) == stream and r.get(keys.feed) == "http://example.com/3"
        kind, second = await f.set_aside("feed")
        assert kind == "string" and second != aside and r.get(second) == "http://example.com/3"
        r.rpush(keys.feed, json.dumps({"url": "http://example.com/4"}))
        assert len((await f.take_feed(10)).entries) == 1

    run(redis_server, crawl_id, body)


@pytest.mark.parametrize("kind", ["stream", "string"])
def test_a_wrong_type_feed_before_the_fleet_starts_is_moved_aside_and_the_crawl_ends(
        redis_server, make_site, start_worker, crawl_id, kind):
    """A producer XADDs (or SETs) the crawl's feed before the worker starts. On b7e0046
    each claim orphaned a batch; then the worker logged one ERROR and stayed up until
    someone deleted the key: the crawl never finished by itself. Now the worker moves
    the key aside at its start (before a fresh run reads the feed: the plugin's default,
    LEASED_RESUME unset, whose run_flush.lua refuses a feed of the wrong type), logs one
    ERROR naming both keys, counts it, crawls everything once and finishes; what the
    producer wrote is kept whole."""
    site = make_site(pages=40)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    _wrong_type(r, keys.feed, kind)
    written = r.dump(keys.feed)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=FAST,
                     env={"TESTPROJECT_DEFAULT_RESUME": "1"})
    assert w.wait(WAIT) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    asides = [k.decode() for k in r.scan_iter(match=keys.feed + ":wrongtype:*")]
    assert len(asides) == 1 and r.dump(asides[0]) == written, asides
    said = [line for line in w.log_text().splitlines() if "was a " + kind in line]
    assert len(said) == 1 and "ERROR" in said[0], said
    assert keys.feed in said[0] and asides[0] in said[0] and "RPUSH" in said[0], said[0]
    assert w.stats().get("leased/feed_set_aside") == 1, w.stats()
    assert stat(r, crawl_id, "done") == 40 and r.hlen(keys.dead) == 0
    assert_each_once(Counter(e["path"] for e in site.entries()),
                     {f"/p/{i}" for i in range(40)})


def test_a_feed_key_overwritten_while_the_fleet_runs_is_moved_aside(
        redis_server, make_site, start_worker, crawl_id):
    """A producer SETs the feed key while a worker runs (LEASED_KEEP_ALIVE: up and
    polling, the crawl's own pages done). Its next claim reports the feed, the drain
    meets the wrong type and moves the key aside (one ERROR, the value kept); entries
    RPUSHed after that are fetched once each."""
    site = make_site(pages=20)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={**FAST, "LEASED_KEEP_ALIVE": True})
    wait_for(lambda: stat(r, crawl_id, "done") == 20, WAIT, "the 20 pages done", [w])
    r.set(keys.feed, "http://example.com/not-a-json-request")
    w.wait_log("was a string, not a list", timeout=WAIT)
    r.rpush(keys.feed, *[json.dumps({"url": f"{site.url}/p/{i}?fed=1"}) for i in range(3)])
    wait_for(lambda: stat(r, crawl_id, "done") == 23, WAIT, "the 3 fed pages done", [w])
    assert w.running
    w.sigterm()
    assert w.wait(WAIT) == 0, w.log_tail()
    asides = [k.decode() for k in r.scan_iter(match=keys.feed + ":wrongtype:*")]
    assert len(asides) == 1 and r.get(asides[0]) == b"http://example.com/not-a-json-request"
    said = [line for line in w.log_text().splitlines() if "was a string" in line]
    assert len(said) == 1 and "ERROR" in said[0], said
    assert r.hlen(keys.dead) == 0
    assert_each_once(Counter(e["path"] for e in site.entries()),
                     {f"/p/{i}" for i in range(20)} | {f"/p/{i}?fed=1" for i in range(3)})


def test_renew_and_claim_past_a_control_key_of_the_wrong_type(redis_server, crawl_id):
    """A control key SET by hand: renew.lua extends the caller's leases and reads the
    state as absent (running), where it wrote the heartbeat and then failed (no lease
    extended); claim.lua refuses before any write, naming the key (WrongKeyType);
    once moved aside (key_aside.lua) both work as before."""
    from scrapy_leased.frontier.scripts import WrongKeyType

    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        await f.enqueue([url_request(f"http://example.com/{i}") for i in range(3)])
        token = (await f.claim(1, "w1")).claims[0][0]
        r.delete(keys.control)
        r.set(keys.control, "stopping")
        before = r.zscore(keys.leases, token)
        f.lease_ms = 600_000
        assert await f.renew("w1", [token]) == []
        assert r.zscore(keys.leases, token) > before + 500_000  # extended
        state = crawl_keys_state(r, keys)
        with pytest.raises(WrongKeyType) as info:
            await f.claim(1, "w1")
        f.claims.pending = None
        assert info.value.key == keys.control and "is a string, not a hash" in str(info.value)
        assert crawl_keys_state(r, keys) == state
        kind, aside = await f.set_aside("control")
        assert kind == "string" and r.get(aside) == "stopping" and keys.kept_by_flush(aside)
        assert len((await f.claim(2, "w1")).claims) == 2

    run(redis_server, crawl_id, body)


def test_a_control_key_set_by_hand_stops_no_renewal_and_is_moved_aside(
        redis_server, make_site, start_worker, crawl_id):
    """A person SETs the crawl's control key (``SET ...:control paused``, a string, not
    the hash ``scrapy leased pause`` writes) while a worker's page is held. Before:
    renew.lua wrote the heartbeat, then failed reading the control state, so the held
    lease was never extended: it expired and was recovered while its worker still held
    it (processed twice), and every claim failed with a WRONGTYPE naming no key. Now the
    renewals read the control state only when it is a hash (the lease stays), the
    claim refuses before any write, naming the key, and the worker moves the key aside
    (one ERROR, counted); the crawl finishes, every page once, nothing recovered."""
    site = make_site(pages=30)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    site.hold()
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_LEASE_SECONDS": 2, "LEASED_RENEW_INTERVAL": 0.3,
                               "LEASED_SWEEP_INTERVAL": 0.3})
    wait_for(lambda: r.zcard(keys.leases) == 1, WAIT, "the start page claimed (held)", [w])
    r.delete(keys.control)
    r.set(keys.control, "paused")
    w.wait_log("the fleet's control state, was a string", timeout=WAIT)
    asides = [k.decode() for k in r.scan_iter(match=keys.control + ":wrongtype:*")]
    assert len(asides) == 1 and r.get(asides[0]) == b"paused", asides
    # renewals go on: the held lease outlives LEASED_LEASE_SECONDS several times over
    (token, first), = r.zrange(keys.leases, 0, -1, withscores=True)
    wait_for(lambda: r.zscore(keys.leases, token) >= first + 2 * 2000, WAIT,
             "the held lease renewed past two lease lengths", [w])
    site.release()
    assert w.wait(WAIT) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    said = [line for line in w.log_text().splitlines() if "control state, was a" in line]
    assert len(said) == 1 and "ERROR" in said[0] and asides[0] in said[0], said
    assert w.stats().get("leased/control_set_aside") == 1
    assert stat(r, crawl_id, "recovered") == 0 and r.hlen(keys.dead) == 0
    assert stat(r, crawl_id, "done") == 30
    assert_each_once(Counter(e["path"] for e in site.entries()),
                     {f"/p/{i}" for i in range(30)})


# -- NaN, inf and huge stats -----------------------------------------------------------

def test_commit_skips_stat_values_redis_cannot_add_before_writing(redis_server, crawl_id):
    """commit.lua applied the stats with HINCRBYFLOAT after enqueue_new had queued the
    new requests: a 'nan' failed the script there, the writer sent the same commit again
    for ever, and the stats before the NaN were added once more each time. Now each
    value is checked first and one Redis cannot add is skipped (counted in
    stats_refused): the commit goes through once, with every good stat added once."""
    keys = CrawlKeys(crawl_id)
    bad = [("f", "a/nan", "nan"), ("f", "a/inf", "inf"), ("i", "a/minus_inf", "-inf"),
           ("f", "a/big", "1e400"), ("i", "a/huge", str(10 ** 30)), ("max", "a/max", "nan"),
           ("i", "a/text", "abc"), ("f", "a/space", " 5"), ("f", "a/hex", "0x10"),
           ("sum", "a/op", "1")]
    stats: list[Any] = ["i", "item_scraped_count", "3"]
    for op, name, value in bad:
        stats += [op, name, value]
    stats += ["f", "a/float", "2.5", "max", "a/top", "7"]

    async def body(f, r):
        r.hset(keys.fleet_stats, "a/hand", "not a number")  # set by hand: cannot add to it
        result = await f.commit(enqueue=[url_request("http://example.com/1")],
                                stats=[*stats, "i", "a/hand", "1"])
        assert result.queued == [True]
        fleet = r.hgetall(keys.fleet_stats)
        assert fleet == {"item_scraped_count": "3", "a/float": "2.5", "a/top": "7",
                         "a/hand": "not a number"}
        assert stat(r, crawl_id, "stats_refused") == len(bad) + 1
        assert stat(r, crawl_id, "enqueued") == 1 and int(r.get(keys.todo)) == 1

    run(redis_server, crawl_id, body)


def test_the_worker_does_not_send_non_finite_or_huge_stats(redis_server, caplog):
    """StatsFlusher (the deltas a commit carries, and each flush): a stat that is not a
    finite number within 2**63 is not sent, with one WARNING per stat name; its next
    value in range is sent as the change since the last value sent."""
    f = StatsFlusher(make_client(redis_server.url), CrawlKeys("c"), "w")  # never called
    with caplog.at_level("WARNING", logger="scrapy_leased.fleet.stats"):
        first = f.compose_ops({"ok": 1, **HOSTILE})
        again = f.compose_ops({"ok": 2, **HOSTILE})
        later = f.compose_ops({"ok": 2, "edges/nan": 4.5, "edges/huge_int": 7})
    assert first == ["i", "ok", "1"]
    assert again == ["i", "ok", "1"]
    assert later == ["f", "edges/nan", "4.5", "i", "edges/huge_int", "7"]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == len(HOSTILE), warned
    for name in HOSTILE:
        assert sum(repr(name) in m for m in warned) == 1, (name, warned)


def test_nan_stats_are_counted_once_and_the_crawl_finishes(redis_server, make_site,
                                                          start_worker, crawl_id):
    """Two workers whose spider sets stats to nan, inf, -inf, 10**30 and 1e300 on every
    response (tests/support/lua_edges.py). Before: the first commit carrying them failed
    in commit.lua after queueing its requests, the writer retried it for ever (the crawl
    hung) and re-added the stats ahead of the NaN each time. Now both finish, the fleet's
    counts are exact (each response, item and good stat counted once) and none of the
    hostile values is in the fleet stats."""
    n = 60
    site = make_site(pages=n)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    workers = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                            settings={**FAST, **HOSTILE_EXT}) for i in (1, 2)]
    for w in workers:
        assert w.wait(WAIT) == 0, w.log_tail()
        assert w.close_reason() == "finished"
    fleet = decode_fleet_stats(r.hgetall(keys.fleet_stats).items())
    assert stat(r, crawl_id, "done") == n
    assert fleet["response_received_count"] == n
    assert fleet["item_scraped_count"] == n
    assert fleet[GOOD] == n == sum(w.stats().get(GOOD, 0) for w in workers)
    assert not set(HOSTILE) & set(fleet) and "edges/max_nan" not in fleet
    assert all(math.isfinite(v) for v in fleet.values())
    for w in workers:
        text = w.log_text()
        for name in HOSTILE:
            assert text.count(f"Stat {name!r} is") <= 1, (name, w.log_tail())
    assert sum(f"Stat {'edges/nan'!r} is" in w.log_text() for w in workers) >= 1


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(
    st.sampled_from(["s/a", "s/b", "s/c", "s/d_max", "item_scraped_count"]),
    st.one_of(st.floats(), st.integers(min_value=-(10 ** 40), max_value=10 ** 40),
              st.integers(min_value=-(2 ** 63), max_value=2 ** 63), st.booleans(),
              st.text(max_size=5), st.none()),
    max_size=5), more=st.lists(st.floats(allow_nan=False), max_size=3))
def test_property_any_stat_values_commit_once_and_stay_finite(redis_server, values, more):
    """Any stat values (floats with nan and inf, ints far beyond 2**63, bools, text) go
    through the worker's StatsFlusher into a real commit: the commit never fails, the
    fleet stats stay finite numbers, and each stat equals the sum of its deltas sent."""
    crawl = f"prop-{time.monotonic_ns()}"
    keys = CrawlKeys(crawl)
    snapshots = [values] + [{**values, "s/a": v} for v in more]

    async def body(f, r):
        flusher = StatsFlusher(f.client, keys, "w")
        expect: dict[str, float] = {}
        scale: dict[str, float] = {}  # floats beyond 2**53 add up inexactly
        for i, snap in enumerate(snapshots):
            ops = flusher.compose_ops(snap)
            for j in range(0, len(ops), 3):
                op, name, value = ops[j:j + 3]
                assert math.isfinite(float(value)) and abs(float(value)) <= 2 ** 63
                scale[name] = max(scale.get(name, 0), abs(float(value)))
                if op in ("i", "f"):
                    expect[name] = expect.get(name, 0) + float(value)
                else:
                    expect[name] = max(expect.get(name, float(value)), float(value))
            await f.commit(enqueue=[url_request(f"http://example.com/{i}")], stats=ops)
        fleet = {k: float(v) for k, v in r.hgetall(keys.fleet_stats).items()}
        assert all(math.isfinite(v) for v in fleet.values())
        assert set(fleet) == {k for k, v in expect.items() if v != 0 or k in fleet}
        for name, v in fleet.items():
            assert v == pytest.approx(expect[name], abs=1e-6 + scale[name] * 1e-12), name
        assert stat(r, crawl, "stats_refused") == 0  # the worker sent nothing bad

    run(redis_server, crawl, body)


# -- Retry-After --------------------------------------------------------------------------

@pytest.mark.parametrize("after", ["nan", "-1"])
def test_retry_after_that_is_no_delay_blocks_for_the_backoff_and_is_retried(
        redis_server, make_site, start_worker, crawl_id, after):
    """A 429 with ``Retry-After: nan``. Before: int(nan * 1000) raised in the rate
    middleware before the lane was blocked, and the 429 never reached RetryMiddleware
    (the page was lost). Now a value that is no delay (nan, a negative number) blocks
    the lane for LEASED_RATE_BACKOFF (2 s here) for the whole fleet, and the request is
    retried after the block."""
    site = make_site(pages=5)
    r = redis_server.client()
    busy = f"/busy/a?after={after}&times=1"
    w = start_worker(redis_server.url, crawl_id, [site.url + busy, site.url + "/p/0"],
                     settings={**FAST, "LEASED_RATE_BACKOFF": 2, "CONCURRENT_REQUESTS": 2})
    assert w.wait(WAIT) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    hits = sorted((e["t"], e["status"]) for e in site.entries() if e["path"] == busy)
    assert [s for _, s in hits] == [429, 200], hits
    raw = r.hget(CrawlKeys(crawl_id).rate("127.0.0.1"), "blk")
    assert raw is not None, "the lane was not blocked"
    blk = int(raw) / 1000
    t429, t200 = hits[0][0], hits[1][0]
    assert 1.9 <= blk - t429 <= 2.0 + 5, (blk, t429)  # the backoff, set after the 429
    assert t200 >= blk - 0.001  # retried after the block (blk in whole ms)
    assert w.stats()["retry/count"] == 1
    assert "Traceback" not in w.log_text()


_DATES = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                      timezones=st.just(timezone.utc)).map(
    lambda d: email.utils.format_datetime(d, usegmt=True).encode())
RETRY_AFTER = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.floats().map(lambda v: repr(v).encode()),
    st.integers(min_value=-(10 ** 30), max_value=10 ** 400).map(lambda v: str(v).encode()),
    st.sampled_from([b"nan", b"NaN", b"inf", b"-inf", b"1e400", b"-0", b"  7 ", b"1_000",
                     b"0x10", b"\xff\xfe", b"Wed, 21 Oct 2015 07:28:00 GMT",
                     b"Fri, 31 Dec 9999 23:59:59 GMT", b"Mon, 01 Jan 0001 00:00:00 GMT",
                     b"Sun, 99 Foo 2026 99:99:99 GMT", b"\xef\xbf\xbd", b""]),
    _DATES)
MAX_MS = int(rate_mw.MAX_RETRY_AFTER_S * 1000)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(value=st.one_of(st.none(), RETRY_AFTER))
def test_property_any_retry_after_gives_a_bounded_block(value):
    """Whatever the Retry-After bytes (nan, inf, -1, 1e400, huge ints, garbage,
    non-UTF-8, dates far in the past or future), the block is an int between 0 and
    MAX_RETRY_AFTER_S, or the backoff given; nothing raises."""
    seconds = rate_mw.retry_after_seconds(value)
    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= 3600)
    block = rate_mw.block_ms_for(value, 5_000)
    assert isinstance(block, int) and 0 <= block <= MAX_MS
    if seconds is None:
        assert block == 5_000


@settings(max_examples=200, deadline=None, derandomize=True)
@given(delay=st.one_of(st.floats(), st.integers(), st.integers(min_value=10 ** 300),
                       st.text(max_size=8), st.none()))
def test_property_any_crawl_delay_gives_a_bounded_interval(delay):
    got = rate_mw.crawl_delay_ms(delay)
    assert got is None or (isinstance(got, int) and 0 < got <= MAX_MS)


def test_property_statuses_and_headers_through_the_middleware_with_real_redis(crawl_id):
    """The rate middleware with a real frontier (penalize.lua on a real redis-server):
    any status code and Retry-After value returns the response itself (so it reaches
    RetryMiddleware); a 429/503 blocks its lane until at most MAX_RETRY_AFTER_S ahead
    (LEASED_RATE_BACKOFF when the header gives no delay)."""
    crawler = get_crawler(settings_dict={"LEASED_RATE_BACKOFF": 3})
    mw = LeasedRateMiddleware.from_crawler(crawler)
    keys = CrawlKeys(crawl_id)

    with RedisServer() as srv:
        r = srv.client()

        @settings(max_examples=80, deadline=None, derandomize=True)
        @given(status=st.one_of(st.sampled_from([429, 503, 200, 500]),
                                st.integers(min_value=100, max_value=999)),
               header=st.one_of(st.none(), RETRY_AFTER))
        def check(status, header):
            lane = f"lane-{time.monotonic_ns()}"

            async def main():
                f = new_frontier(srv.url, crawl_id)
                mw._frontier = lambda: f
                try:
                    request = Request("http://h.example/p", meta={"leased_lane": lane})
                    headers = {} if header is None else {b"Retry-After": header}
                    response = Response(request.url, status=status, headers=headers,
                                        request=request)
                    assert await mw.process_response(request, response) is response
                finally:
                    await f.client.aclose()

            sec, usec = r.time()
            now_ms = int(sec) * 1000 + int(usec) // 1000
            asyncio.run(main())
            blk = r.hget(keys.rate(lane), "blk")
            if status in (429, 503):
                expect = rate_mw.block_ms_for(header, 3_000)
                if expect > 0:
                    assert blk is not None
                    assert now_ms + expect - 5 <= int(blk) <= now_ms + MAX_MS + 60_000
            else:
                assert blk is None

        check()


# -- LEASED_FLUSH_ON_START keeps the feed ------------------------------------------------

def test_a_fresh_run_keeps_the_feed_and_hands_back_taken_batches(redis_server, crawl_id):
    """run_flush.lua: the crawl's state is deleted, but the feed is kept (work pushed
    before the fleet started), and the batches taken off it by workers that are gone
    (not queued: the queues are deleted) go back to its head, oldest first, each in its
    order."""
    keys = CrawlKeys(crawl_id)
    feed = [json.dumps({"url": f"http://example.com/{i}"}) for i in range(12)]

    async def body(f, r):
        await f.enqueue([url_request(f"http://example.com/old/{i}") for i in range(3)])
        r.rpush(keys.feed, *feed)
        a = new_frontier(redis_server.url, crawl_id)
        b = new_frontier(redis_server.url, crawl_id)
        try:
            a.caller, b.caller = "gone-a", "gone-b"
            assert len((await a.take_feed(3)).entries) == 3  # entries 0-2, taken first
            assert len((await b.take_feed(4)).entries) == 4  # entries 3-6
        finally:
            await a.client.aclose()
            await b.client.aclose()
        marker = RunMarker(f.client, keys, "w-new", 60_000, 30_000)
        deleted, alive = await marker.flush("records")
        assert deleted is not None and alive == []
        assert r.lrange(keys.feed, 0, -1) == feed
        assert not r.exists(keys.feed_taken, keys.feed_deadlines, keys.lanes, keys.todo)
        # a feed key of the wrong type: refused before anything is deleted
        r.delete(keys.run)
        r.zrem(keys.workers, "w-new")
        r.delete(keys.feed)
        r.xadd(keys.feed, {"x": "1"})
        r.set(keys.todo, 5)
        with pytest.raises(redis.exceptions.ResponseError, match="is a stream, not a list"):
            await marker.flush("records")
        assert r.get(keys.todo) == "5"

    run(redis_server, crawl_id, body)


def test_flush_on_start_crawls_what_was_pushed_before_the_fleet_started(
        redis_server, make_site, start_worker, crawl_id):
    """docs/feed.md: work can be pushed to a crawl's feed before any worker started.
    Before: a worker with LEASED_FLUSH_ON_START deleted it (and the batch a dead worker
    had taken off it) as part of the fresh run. Now the fresh run fetches every entry
    pushed before it, each once, the taken batch too."""
    site = make_site(pages=40)
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    r.hset(keys.stats, "done", 99)  # a previous run's state: flushed
    r.rpush(keys.feed, *[json.dumps({"url": f"{site.url}/p/{i}"}) for i in range(30)])

    async def take(f, r):
        f.caller = "dead-worker"
        assert len((await f.take_feed(10)).entries) == 10

    run(redis_server, crawl_id, take)
    w = start_worker(redis_server.url, crawl_id, None, spider="feed",
                     settings={**FAST, "LEASED_FLUSH_ON_START": True})
    assert w.wait(WAIT) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    assert "LEASED_FLUSH_ON_START: flushed crawl" in w.log_text()
    assert_each_once(Counter(e["path"] for e in site.entries()),
                     {f"/p/{i}" for i in range(30)})
    assert stat(r, crawl_id, "done") == 30
    assert r.llen(keys.feed) == 0 and r.hlen(keys.feed_taken) == 0

