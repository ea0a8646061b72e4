"""Replies lost after Redis ran the script, caused for real: a TCP proxy
(tests/support/proxy.py, in a subprocess) between the clients and a private
``redis-server`` closes the client's connection instead of forwarding the reply to a
script call, every k-th time. redis-py then connects again and sends the same EVALSHA:
without a guard, the script would run twice.

What must hold (lua/lib_guard.lua): a claim or a commit sent again has its effect once
(it is answered from the reply it recorded), whether redis-py resends it or the caller
does after redis-py gave up; no lease is left that nobody holds.
"""

from __future__ import annotations

import hashlib

import pytest
import redis

from scrapy_leased.frontier import NO_BUDGET, NO_LIMITS, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.frontier.scripts import script_source
from tests.support.frontier import run_frontier
from tests.support.proxy import ProxyProcess
from tests.support.redis_server import RedisServer


def sha(name: str) -> str:
    return hashlib.sha1(script_source(name).encode()).hexdigest()


def stats(r: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall(keys.stats).items()}


def run(url: str, crawl_id: str, body):
    return run_frontier(url, crawl_id, body)


@pytest.fixture
def server():
    with RedisServer() as srv:
        yield srv


def five_queued(server: RedisServer, crawl_id: str) -> tuple[CrawlKeys, redis.Redis]:
    """Requests r0..r4 queued; the crawl's keys, and a client of the server for checks."""
    run(server.url, crawl_id, lambda f: f.enqueue([NewRequest(f"r{i}") for i in range(5)]))
    return CrawlKeys(crawl_id), server.client(decode_responses=True)


def proxy_for(server, tmp_path, drops: int, every: int = 1, scripts=("claim", "commit")):
    return ProxyProcess(server.port, drops=drops, every=every, shas=[sha(s) for s in scripts],
                        status_path=tmp_path / "proxy.json").start()


# -- the state machine -----------------------------------------------------------------

def test_a_claim_whose_reply_was_lost_is_answered_once(server, tmp_path, crawl_id):
    """Before: redis-py's retry ran the claim again, so the first run's claims were
    leases nobody held (they expired later, charging a crash to healthy requests) and
    the caller got the second run's claims (here: none, the queue was empty)."""
    keys, r = five_queued(server, crawl_id)
    with proxy_for(server, tmp_path, drops=1) as proxy:
        res = run(proxy.url, crawl_id, lambda f: f.claim(5, "w"))
        assert proxy.status()["dropped"] == 1
    assert sorted(e.payload for _, e in res.claims) == [f"r{i}" for i in range(5)]
    assert set(map(int, r.zrange(keys.leases, 0, -1))) == {t for t, _ in res.claims}
    assert stats(r, keys)["claimed"] == 5


def test_a_claim_sent_again_by_the_caller_after_redis_py_gave_up(server, tmp_path, crawl_id):
    """Four replies lost in a row: redis-py's three retries are spent and the claim
    raises; the next claim call sends the same call again and gets those claims."""
    keys, r = five_queued(server, crawl_id)
    with proxy_for(server, tmp_path, drops=4) as proxy:
        async def body(f):
            with pytest.raises(redis.ConnectionError):
                await f.claim(3, "w")
            assert proxy.status()["dropped"] == 4
            again = await f.claim(5, "w")  # the pending call, as it was: 3 claims
            more = await f.claim(5, "w")  # a new call
            return again, more

        again, more = run(proxy.url, crawl_id, body)
    assert [e.payload for _, e in again.claims] == ["r0", "r1", "r2"]
    assert [e.payload for _, e in more.claims] == ["r3", "r4"]
    assert stats(r, keys)["claimed"] == 5 and r.zcard(keys.leases) == 5


def test_a_claim_sent_again_hands_out_only_the_claims_still_held(server, tmp_path, crawl_id):
    """A claim's record is the tokens it issued (lua/claim.lua): sent again after one of
    its leases ended meanwhile (released here; a recovery ends it the same way), it
    hands out the claims still held, not the request that went back to the queue."""
    keys, r = five_queued(server, crawl_id)
    with proxy_for(server, tmp_path, drops=4) as proxy:
        async def body(f):
            with pytest.raises(redis.ConnectionError):
                await f.claim(3, "w")
            tokens = sorted(int(t) for t in r.zrange(keys.leases, 0, -1))
            assert len(tokens) == 3
            assert await f.release("w", tokens[:1]) == 1  # r0 back at the head
            again = await f.claim(5, "w")  # the pending call, answered from its record
            more = await f.claim(5, "w")  # a new call
            return tokens, again, more

        tokens, again, more = run(proxy.url, crawl_id, body)
    assert [t for t, _ in again.claims] == tokens[1:]
    assert [e.payload for _, e in again.claims] == ["r1", "r2"]
    assert [e.payload for _, e in more.claims] == ["r0", "r3", "r4"]
    assert stats(r, keys)["claimed"] == 6 and r.zcard(keys.leases) == 5


def test_resolve_claim_gets_the_claims_of_a_lost_reply_and_changes_nothing_otherwise(
        server, tmp_path, crawl_id):
    keys, r = five_queued(server, crawl_id)
    with proxy_for(server, tmp_path, drops=4) as proxy:
        async def body(f):
            with pytest.raises(redis.ConnectionError):
                await f.claim(2, "w")
            got = await f.resolve_claim()
            assert await f.resolve_claim() == []  # nothing pending any more
            return got

        got = run(proxy.url, crawl_id, body)
    assert [e.payload for _, e in got] == ["r0", "r1"]

    before = r.zcard(keys.leases), r.get(keys.todo), r.hget(keys.stats, "claimed")

    async def replay_only(f):
        # the claim the lost one was, with a call id that asks for its reply only
        keys_, args = f.claims.build(2, 60_000, "w", [("", NO_BUDGET)], 30_000, 32,
                                     NO_LIMITS, False)
        args[-4] = "?99"
        return await f._s["claim"](keys=keys_, args=args)

    out = run(server.url, crawl_id, replay_only)
    assert len(out) == 3  # only the guard's {epoch, tokens, rids}: no reply, no claim
    assert (r.zcard(keys.leases), r.get(keys.todo), r.hget(keys.stats, "claimed")) == before


def test_a_commit_whose_reply_was_lost_queues_a_dont_filter_request_once(
        server, tmp_path, crawl_id):
    """Before: the commit ran twice: a dont_filter request was queued twice, and an ack
    sent again found its lease gone and looked stale."""
    keys = CrawlKeys(crawl_id)
    r = server.client(decode_responses=True)
    with proxy_for(server, tmp_path, drops=2, scripts=("commit",)) as proxy:
        async def body(f):
            queued = await f.enqueue([NewRequest("again")])  # no seen-set entry: dont_filter
            (token, env), = (await f.claim(1, "w")).claims
            return queued, await f.ack(token, env.rid)

        queued, ack = run(proxy.url, crawl_id, body)
        assert proxy.status()["dropped"] == 2
    assert queued == [True] and ack == 3  # the lease was held, newly done
    st = stats(r, keys)
    assert st["enqueued"] == 1 and st["acked"] == 1 and st["done"] == 1
    assert r.llen(keys.lane_fifo("")) == 0 and int(r.get(keys.todo)) == 0


# -- a crawl with 200 lost replies ---------------------------------------------------------

def test_200_lost_replies_during_a_three_worker_crawl(server, make_site, start_worker, tmp_path,
                                                      crawl_id):
    """3 workers talk to Redis through the proxy, which loses the reply of every third
    claim or commit, 200 times. Nothing is lost, nothing runs twice: every page is fetched
    exactly once, no dead letter, no lease recovered, and Redis counted as many claims as
    the workers received."""
    pages, drops = 2000, 200
    site = make_site(pages=pages, delay=0.01)
    settings = {"CONCURRENT_REQUESTS": 8, "LEASED_LOGSTATS_INTERVAL": 0,
                "LEASED_LEASE_SECONDS": 10}
    with proxy_for(server, tmp_path, drops=drops, every=3) as proxy:
        workers = [start_worker(proxy.url, crawl_id, site.url + "/p/0", settings=settings,
                                name=f"w{i}") for i in (1, 2, 3)]
        for w in workers:
            assert w.wait(240) == 0, w.log_tail()
    status = proxy.status()  # its last figures, written when it stopped
    r = server.client(decode_responses=True)
    keys = CrawlKeys(crawl_id)
    st = stats(r, keys)
    counts = site.count_by_path(include_query=False)
    received = sum(w.stats().get("leased/claimed", 0) + w.stats().get("leased/undecodable", 0)
                   for w in workers)
    by_script = {name: status["dropped_by_sha"].get(sha(name), 0) for name in ("claim", "commit")}
    print(f"\nreplies lost: {status['dropped']} of {status['matched']} claim/commit replies "
          f"({by_script}); claimed in Redis {st.get('claimed')}, received by the workers "
          f"{received}; recovered {st.get('recovered', 0)}; dead {r.hlen(keys.dead)}; pages "
          f"fetched more than once: {sum(1 for c in counts.values() if c > 1)}")
    assert status["dropped"] == drops
    assert by_script["claim"] > 0 and by_script["commit"] > 0
    assert set(counts) == site.all_page_paths() and set(counts.values()) == {1}
    assert st["done"] == st["enqueued"] == st["acked"] == pages
    assert st["claimed"] == received == pages
    assert "recovered" not in st and "dead" not in st and r.hlen(keys.dead) == 0
    assert r.zcard(keys.leases) == r.hlen(keys.inflight) == r.hlen(keys.owners) == 0
    for w in workers:
        assert w.close_reason() == "finished"
        assert "Traceback" not in w.log_text(), w.log_tail(80)
        ws = w.stats()
        assert "leased/acked_stale" not in ws and "leased/failed" not in ws
