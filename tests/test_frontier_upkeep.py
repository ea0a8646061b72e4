"""What keeps a long crawl's frontier sound, against a real ``redis-server``: a crash
suspect does not starve its lane; a queue member that is not UTF-8 is dead-lettered, not
raised out of the claim loop; what would grow without bound does not (the worker
registry of killed workers, old throughput buckets). Each docstring says what the code
did before."""

from __future__ import annotations

import json

import redis

from scrapy_leased.fleet import FleetAdmin
from scrapy_leased.frontier import NO_BUDGET, Budget, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.frontier import run_frontier
from tests.support.workers import wait_for


def run(srv, crawl_id: str, body, **options):
    return run_frontier(srv.url, crawl_id, body, **options)


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


# -- a suspect starving its lane ---------------------------------------------------------

def test_a_suspect_is_claimed_while_lanes_with_earlier_names_have_work(redis_server, crawl_id):
    """Before: a suspect (a request whose worker died holding it) met after other claims
    of a call was put back and its lane's time set to now, like every lane served: the
    next call served the lanes with earlier names first again and met it again after
    other claims, for as long as those lanes had work; the lane behind it waited too."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)

    async def body(f):
        await f.enqueue([NewRequest(f"{lane}{i}", lane=lane) for lane in "ab" for i in range(30)])
        await f.enqueue([NewRequest("z-after", lane="z")])
        r.lpush(keys.lane_fifo("z"), "999999|1|1|0|z|suspect")  # lease expired once
        r.incr(keys.todo)
        lanes: list[tuple[str, Budget]] = []
        for call in range(1, 30):
            res = await f.claim(3, "w", lanes)
            lanes = [(lane, NO_BUDGET) for lane in res.ready_lanes]
            payloads = [e.payload for _, e in res.claims]
            for token, env in res.claims:
                await f.ack(token, env.rid)
            if "suspect" in payloads:
                return call, payloads, int(r.get(keys.todo))
        return None, [], int(r.get(keys.todo))

    call, payloads, left = run(redis_server, crawl_id, body)
    print(f"\nthe suspect was claimed by call {call}, alone: {payloads}, {left} requests still "
          f"queued")
    assert call is not None and call <= 3
    assert payloads == ["suspect"]
    assert left > 40  # lanes a and b still had most of their work


# -- a queue member that is not UTF-8 ------------------------------------------------------

def _claim_beside(redis_server, crawl_id, good: list[str], member: bytes):
    """Queue ``good`` (enqueue) and then ``member`` as it is (by hand, in the same lane),
    claim them all: (the payloads claimed, the dead letters' total, the letters)."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client()

    async def body(f):
        await f.enqueue([NewRequest(p) for p in good])
        r.rpush(keys.lane_fifo(""), member)
        r.incr(keys.todo)
        res = await f.claim(len(good) + 3, "w")
        total, letters = await FleetAdmin(f.client, keys).dead_letters()
        return [e.payload for _, e in res.claims], total, letters

    try:
        return run(redis_server, crawl_id, body)
    finally:
        r.close()


def test_a_queue_member_that_is_not_utf8_is_dead_lettered_and_readable(redis_server, crawl_id):
    """Before: claim.lua handed it out and Frontier.claim raised UnicodeDecodeError, which
    killed the worker's claim loop."""
    bad = b"999999|0|0|0||{\"u\": \"http://x/\xff\xfe\"}"
    claimed, total, letters = _claim_beside(redis_server, crawl_id, ["good1", "good2"], bad)
    assert claimed == ["good1", "good2"]
    assert total == 1
    (letter,) = letters
    assert letter.rid == "999999" and letter.reason == "queue member is not valid UTF-8"
    assert letter.url == "http://x/??"


def test_long_members_are_checked_whole_valid_utf8_or_not(redis_server, crawl_id):
    """claim.lua reads a member's bytes 4,000 at a time (lib_settle.lua utf8_valid): a
    byte that is not UTF-8 past the first 4,000 is found, and a long member of valid
    multi-byte UTF-8 (or of ASCII only, past 8,000 bytes) is handed out whole."""
    ascii_long = "a" * 9_000
    accented = "é" * 5_000  # 10,000 bytes, none of them ASCII
    bad = b"999998|0|0|0||{\"u\": \"http://x/" + b"b" * 6_000 + b"\xff\"}"
    claimed, total, letters = _claim_beside(redis_server, crawl_id, [ascii_long, accented],
                                            bad)
    assert claimed == [ascii_long, accented]
    assert total == 1
    (letter,) = letters
    assert letter.rid == "999998" and letter.reason == "queue member is not valid UTF-8"


def test_a_worker_dead_letters_a_member_that_is_not_utf8_and_finishes(
        redis_server, make_site, start_worker, crawl_id):
    keys = CrawlKeys(crawl_id)
    r = redis_server.client()
    site = make_site(pages=30)
    r.rpush(keys.lane_fifo("127.0.0.1"), b"999999|0|0|0|127.0.0.1|{\"u\": \"http://\xff/\"}")
    r.zadd(keys.lanes, {"127.0.0.1": 0})
    r.incr(keys.todo)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0")
    assert w.wait(60) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    assert int(r.hget(keys.stats, "done")) == 30 and r.hexists(keys.dead, "999999")
    assert "Traceback" not in w.log_text()


# -- the worker registry -----------------------------------------------------------------

def _dead_workers(r: redis.Redis, keys: CrawlKeys, n: int, age_ms: int) -> None:
    t = redis_ms(r) - age_ms
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.zadd(keys.workers, {f"dead:{i}": t})
        p.hset(keys.worker_info, f"dead:{i}", json.dumps({"inflight": 0, "pid": i}))
        p.hset(keys.worker_acked, f"dead:{i}", i)
    p.execute()


def test_renewals_prune_10000_dead_workers_and_keep_the_live_ones(redis_server, crawl_id):
    """Before: a worker killed without closing left its registry entry for good."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    prune_ms = 150_000  # 5 worker TTLs of 30 s
    _dead_workers(r, keys, 10_000, age_ms=prune_ms + 60_000)
    r.zadd(keys.workers, {"recent": redis_ms(r) - prune_ms // 2})  # silent, not for long

    async def body(f):
        for _ in range(12):
            await f.renew("live", [], info=json.dumps({"inflight": 0}))

    run(redis_server, crawl_id, body, prune_ms=prune_ms)
    assert set(r.zrange(keys.workers, 0, -1)) == {"live", "recent"}
    assert set(r.hkeys(keys.worker_info)) == {"live"}
    assert r.hlen(keys.worker_acked) == 0  # pruned with the registry entries


def test_a_crawl_leaves_no_registry_entry_of_10000_dead_workers(
        redis_server, make_site, start_worker, crawl_id):
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    _dead_workers(r, keys, 10_000, age_ms=10 * 60_000)  # dead for 20 worker TTLs
    site = make_site(pages=150, delay=0.05)
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_RENEW_INTERVAL": 0.2}
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                       name=f"w{i}") for i in (1, 2)]
    wait_for(lambda: r.zcard(keys.workers) == 2, 60, "only the 2 live workers registered", ws)
    assert r.hlen(keys.worker_info) == 2
    for w in ws:
        assert w.wait(60) == 0, w.log_tail()
        assert w.close_reason() == "finished"
    assert r.zcard(keys.workers) == 0 and r.hlen(keys.worker_info) == 0
    assert r.hlen(keys.worker_acked) == 0  # each worker's count left with it


# -- throughput buckets --------------------------------------------------------------------

def test_old_throughput_buckets_are_dropped(redis_server, crawl_id):
    """Before: each commit deleted the buckets 7 to 11 behind the current one only, so a
    crawl that paused for more than two minutes kept its older buckets for good."""
    keys = CrawlKeys(crawl_id)
    r = redis_server.client(decode_responses=True)
    now_bucket = redis_ms(r) // 10_000
    r.hset(keys.throughput, mapping={str(now_bucket - 100 - i): 1 for i in range(50)})

    async def body(f):
        await f.enqueue([NewRequest("a")])
        (token, env), = (await f.claim(1, "w")).claims
        return await f.ack(token, env.rid)

    assert run(redis_server, crawl_id, body) == 3
    buckets = {int(b) for b in r.hkeys(keys.throughput)}
    assert buckets <= set(range(now_bucket - 6, now_bucket + 2)) and len(buckets) >= 1
