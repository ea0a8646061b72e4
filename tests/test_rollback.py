"""Redis going back in time, caused for real: a private ``redis-server`` (no AOF) saves an
RDB snapshot (``RedisServer.snapshot``: BGSAVE, so exactly that moment), writes go on,
then it is killed with SIGKILL and started again on the same port from that older file
(``RedisServer.rollback``): what a crash with ``appendfsync everysec``, a restart from an
older RDB or a failover to a replica that lagged do.

What must hold (lua/lib_guard.lua): a token is never issued twice, so a stale ack or fail
can never settle another worker's claim; a rid of an earlier epoch is not marked done
(it may name another request now); the workers notice the new epoch and forget the
seen URLs they cached; leases that Redis brought back but nobody holds any more come back
to the queue without an attempt charged; the fenced item store keeps the newest record.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter, defaultdict
from urllib.parse import urlsplit

import redis

from scrapy_leased._redis.connection import make_client
from scrapy_leased.frontier import Frontier, NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_for

LANE = "127.0.0.1"


def frontier(url: str, crawl_id: str, caller: str, lease_ms: int = 60_000) -> Frontier:
    return Frontier(make_client(url), CrawlKeys(crawl_id), lease_ms=lease_ms, max_attempts=3,
                    caller=caller)


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def stats(r: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall(keys.stats).items()}


# -- the state machine -----------------------------------------------------------------

def test_after_a_rollback_no_token_is_reissued_and_stale_acks_settle_nothing_else():
    """Before: the tokens and rids counters went back with Redis, so the new claims got
    the tokens of the lost ones and a new request the rid of a lost one; the stale acks
    of the worker that had processed the lost claims then deleted the new claims and
    marked the new request done: it was never processed."""
    keys = CrawlKeys("rb")
    with RedisServer() as srv:
        r = srv.client(decode_responses=True)

        async def main():
            w1 = frontier(srv.url, "rb", "w1")
            w2 = frontier(srv.url, "rb", "w2")
            epochs: list[tuple[int, int]] = []
            w1.on_epoch = lambda old, new: epochs.append((old, new))
            try:
                await w1.enqueue([NewRequest("a"), NewRequest("b")])
                srv.snapshot()
                await w1.enqueue([NewRequest("x")])  # rid 3, lost with the rollback
                lost = await w1.claim(3, "w1")  # a, b, x: claims Redis will forget
                assert [e.payload for _, e in lost.claims] == ["a", "b", "x"]
                first_epoch = w1.epoch
                srv.rollback()
                # a worker that saw nothing of the lost writes queues a new request: it
                # gets rid 3 again (rids stay dense), then claims a, b and it
                await w2.enqueue([NewRequest("y")])
                new = await w2.claim(3, "w2")
                assert [e.payload for _, e in new.claims] == ["a", "b", "y"]
                assert [e.rid for _, e in new.claims] == [e.rid for _, e in lost.claims]
                assert w2.epoch > first_epoch
                assert min(t for t, _ in new.claims) > max(t for t, _ in lost.claims)
                # the first worker finished its lost claims: its acks come late
                acks = [await w1.ack(t, e.rid) for t, e in lost.claims]
                assert acks == [0, 0, 0]  # no lease held, nothing newly done
                assert epochs == [(first_epoch, w2.epoch)] and w1.epoch == w2.epoch
                # the new claims are intact, no rid was marked done
                assert set(map(int, r.zrange(keys.leases, 0, -1))) == {t for t, _ in new.claims}
                assert {int(t) for t in r.hkeys(keys.inflight)} == {t for t, _ in new.claims}
                assert all(r.getbit(keys.done, e.rid) == 0 for _, e in new.claims)
                # y is processed by the worker that holds it, and counted done once
                assert [await w2.ack(t, e.rid) for t, e in new.claims] == [3, 3, 3]
            finally:
                await w1.client.aclose()
                await w2.client.aclose()

        asyncio.run(main())
        st = stats(r, keys)
        assert st["done"] == 3 and st["acked"] == 3 and st["acked_earlier_epoch"] == 3
        assert r.zcard(keys.leases) == r.hlen(keys.inflight) == r.hlen(keys.owners) == 0


def test_leases_brought_back_by_a_rollback_are_requeued_without_an_attempt():
    """Redis forgot the ack of a finished claim: its lease comes back and expires. That
    is Redis's loss, not a crash of the worker: no attempt, no expiry charged. A claim
    of the new epoch that expires is still charged."""
    keys = CrawlKeys("rb2")
    with RedisServer() as srv:
        r = srv.client(decode_responses=True)

        async def main():
            w = frontier(srv.url, "rb2", "w", lease_ms=300)
            epochs: list[tuple[int, int]] = []
            w.on_epoch = lambda old, new: epochs.append((old, new))
            try:
                await w.enqueue([NewRequest("a"), NewRequest("b")])
                (ta, ea), = (await w.claim(1, "w")).claims
                srv.snapshot()
                assert await w.ack(ta, ea.rid) == 3  # lost: after the snapshot
                srv.rollback()
                # only acks since the snapshot: the new run id tells the new epoch
                assert await w.renew("w", []) == []
                assert len(epochs) == 1
                (tb, eb), = (await w.claim(1, "w")).claims
                assert eb.payload == "b" and tb > ta
                last = max(int(s) for _, s in r.zrange(keys.leases, 0, -1, withscores=True))
                while redis_ms(r) <= last:  # both leases expired, by Redis's clock
                    await asyncio.sleep(0.02)
                assert await w.recover() == (1, 0, 0)  # b charged, a not
                queued = [await w.claim(1, "w") for _ in range(2)]
                return {e.payload: (e.attempts, e.expiries) for q in queued for _, e in q.claims}
            finally:
                await w.client.aclose()

        got = asyncio.run(main())
        assert got == {"a": (0, 0), "b": (1, 1)}
        st = stats(r, keys)
        assert st["recovered_epoch"] == 1 and st["recovered"] == 1


# -- a crawl with five rollbacks ---------------------------------------------------------

def _store_records(path) -> dict[str, dict]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT key, item, fence_token FROM records_dict").fetchall()
    finally:
        conn.close()
    return {k: {"item": json.loads(item), "fence": int(fence)} for k, item, fence in rows}


def test_five_rollbacks_during_a_three_worker_crawl_lose_nothing(
        make_site, start_worker, tmp_path, crawl_id):
    """3 workers, 2,000 pages; five times, Redis goes back 1.5 s (snapshot, 1.5 s of
    writes, kill -9, restart from the snapshot). Every page is fetched, nothing is
    dead-lettered, every worker ends 'finished', and the fenced store (SQLite: a Redis
    store would go back with Redis) holds, for every page, the record of its newest claim."""
    pages, rollbacks, back_s = 2000, 5, 1.5
    site = make_site(pages=pages, delay=0.1)
    store = tmp_path / "records.db"
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_LEASE_SECONDS": 3, "LEASED_RENEW_INTERVAL": 0.5,
                "LEASED_SWEEP_INTERVAL": 0.5, "LEASED_UPSERT_URL": f"sqlite:///{store}",
                "LEASED_LOGSTATS_INTERVAL": 0}
    with RedisServer() as srv:
        workers = [start_worker(srv.url, crawl_id, site.url + "/p/0", settings=settings,
                                args={"claim_field": "claim"}, name=f"w{i}") for i in (1, 2, 3)]
        fetched = lambda: len(site.entries())  # noqa: E731 (the site's log never goes back)
        marks = []
        for k in range(rollbacks):
            wait_for(lambda: fetched() >= 150 + 300 * k, 120, f"rollback {k + 1}'s moment",
                     workers)
            srv.snapshot()
            at = fetched()
            time.sleep(back_s)
            lost_fetches = fetched() - at
            srv.rollback()
            marks.append(lost_fetches)
        for w in workers:
            assert w.wait(240) == 0, w.log_tail()
        r = srv.client(decode_responses=True)
        keys = CrawlKeys(crawl_id)
        st = stats(r, keys)
        dead = r.hlen(keys.dead)
        leases, inflight = r.zcard(keys.leases), r.hlen(keys.inflight)
        owners = r.hlen(keys.owners)

    counts = site.count_by_path(include_query=False)
    missing = site.all_page_paths() - set(counts)
    wstats = [w.stats() for w in workers]
    twice = sum(1 for c in counts.values() if c > 1)
    print(f"\nfetches during each 1.5 s lost: {marks}; pages never fetched: {len(missing)}; "
          f"dead letters: {dead}; pages fetched twice or more: {twice}; "
          f"fetches {sum(counts.values())} for {pages} pages; stats: "
          f"recovered_epoch={st.get('recovered_epoch', 0)} recovered={st.get('recovered', 0)} "
          f"acked_earlier_epoch={st.get('acked_earlier_epoch', 0)}; epoch changes seen by the "
          f"workers {[s.get('leased/epoch_changes', 0) for s in wstats]}, unstarted lost "
          f"claims dropped {[s.get('leased/dropped_lost', 0) for s in wstats]}")
    assert all(m > 0 for m in marks), marks  # each rollback really lost writes
    assert not missing, sorted(missing)[:20]
    assert dead == 0 and "dead" not in st
    assert leases == inflight == owners == 0
    for w in workers:
        assert w.close_reason() == "finished", w.log_tail()
        assert "Traceback" not in w.log_text(), w.log_tail(80)
        assert w.stats().get("leased/epoch_changes", 0) >= 1
    # the newest record of every page: the one of the highest claim that processed it
    tokens: dict[str, list[int]] = defaultdict(list)
    for item in start_worker.all_items():
        tokens[item["url"]].append(int(item["claim"]))
    records = _store_records(store)
    assert set(records) == set(tokens) and len(records) == pages
    stale = {url: (rec["fence"], max(tokens[url])) for url, rec in records.items()
             if rec["fence"] != max(tokens[url]) or rec["item"]["claim"] != max(tokens[url])}
    assert not stale, list(stale.items())[:10]
    processed_twice = sum(1 for ts in tokens.values() if len(ts) > 1)
    print(f"pages processed more than once: {processed_twice}; each stored record is the "
          f"one of its newest claim")
    assert processed_twice > 0  # the rollbacks made pages run again: the fence was needed
    assert Counter(urlsplit(u).path for u in tokens) == Counter(site.all_page_paths())


def test_a_worker_drops_the_unstarted_claims_a_rollback_made_redis_forget(
        make_site, start_worker, crawl_id):
    """A worker holding claims it has not started yet (LEASED_PREFETCH) learns the new
    epoch, renews at once, and drops those Redis no longer has: their requests are in
    Redis's queue again (or will be found again), so it does not fetch them a second time
    for nothing."""
    pages = 120
    site = make_site(pages=pages, delay=0.2)
    settings = {"CONCURRENT_REQUESTS": 2, "LEASED_PREFETCH": 12, "LEASED_LEASE_SECONDS": 3,
                "LEASED_RENEW_INTERVAL": 1, "LEASED_LOGSTATS_INTERVAL": 0}
    keys = CrawlKeys(crawl_id)
    with RedisServer() as srv:
        r = srv.client(decode_responses=True)
        w = start_worker(srv.url, crawl_id, site.url + "/p/0", settings=settings)
        wait_for(lambda: len(site.entries()) >= 20 and r.zcard(keys.leases) >= 10, 60,
                 "a worker with prefetched claims", [w])
        srv.snapshot()
        claimed = int(r.hget(keys.stats, "claimed"))
        wait_for(lambda: int(r.hget(keys.stats, "claimed")) >= claimed + 4, 30,
                 "claims after the snapshot", [w])
        srv.rollback()
        assert w.wait(120) == 0, w.log_tail()
        st = stats(srv.client(decode_responses=True), keys)
    ws = w.stats()
    counts = site.count_by_path(include_query=False)
    print(f"\nunstarted claims dropped after the rollback: {ws.get('leased/dropped_lost', 0)}; "
          f"pages fetched twice: {sum(1 for c in counts.values() if c > 1)}")
    assert ws.get("leased/epoch_changes") == 1
    assert ws.get("leased/dropped_lost", 0) >= 1
    assert w.close_reason() == "finished"
    assert set(counts) == site.all_page_paths()
    assert st["done"] == pages and "dead" not in st
