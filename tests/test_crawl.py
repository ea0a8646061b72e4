"""End-to-end crawls: real ``scrapy crawl`` worker processes (tests/project, spider
``site``) against a REAL private redis-server and the local test site.

Every test asserts exact outcomes: the site's own request log says which pages were
fetched and how often, the crawl's Redis keys say what was queued, leased, acked and
dead-lettered, and each worker's exit code and close reason say how it ended. Nothing
is mocked; nothing touches the Redis on 6379 (see tests/support/redis_server.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from scrapy import Request

from scrapy_leased.codec import encode_request
from scrapy_leased.frontier import NO_BUDGET, Envelope, Frontier, NewRequest, as_str
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.frontier import run_frontier as run_support_frontier
from tests.support.queue import queue_len, queued
from tests.support.redis_server import RedisServer, free_port
from tests.support.workers import wait_for

LANE = "127.0.0.1"  # the lane (host) of every request to the test site

# Short leases wherever a lease matters, so nothing in these tests waits 30 s.
FAST = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5}
WAIT = 90  # hang guard for a whole crawl, not a check


# --------------------------------------------------------------------------- helpers


def crawl_state(r: redis.Redis, crawl_id: str) -> dict[str, Any]:
    """A snapshot of every key of the crawl (decoded)."""
    k = CrawlKeys(crawl_id)
    stats = {as_str(a): int(b) for a, b in r.hgetall(k.stats).items()}
    dead = {as_str(a): json.loads(b) for a, b in r.hgetall(k.dead).items()}
    return {
        "stats": stats,
        "queue": sum(queue_len(r, k, as_str(lane)) for lane in r.zrange(k.lanes, 0, -1)),
        "leases": r.zcard(k.leases),
        "inflight": r.hlen(k.inflight),
        "owners": r.hlen(k.owners),
        "dead": dead,
        "done_bits": r.bitcount(k.done),
        "workers": {as_str(m) for m in r.zrange(k.workers, 0, -1)},
    }


def stat(r: redis.Redis, crawl_id: str, name: str) -> int:
    return int(r.hget(CrawlKeys(crawl_id).stats, name) or 0)


def assert_drained(st: dict[str, Any], done: int) -> None:
    """The crawl is complete: exactly ``done`` requests done, nothing left anywhere."""
    assert st["stats"].get("done") == done, st
    assert st["done_bits"] == done, st
    assert st["queue"] == 0, st
    assert st["leases"] == 0, st
    assert st["inflight"] == 0, st
    assert st["owners"] == 0, st  # every lease's owner went with it: no leak
    assert st["dead"] == {}, st


def page_paths(pages: int, skip: tuple[int, ...] = ()) -> set[str]:
    return {f"/p/{i}" for i in range(pages) if i not in skip}


def assert_each_once(counts: Counter, expected: set[str]) -> None:
    """The site saw exactly the pages ``expected``, each exactly once."""
    missing = expected - set(counts)
    extra = set(counts) - expected
    twice = {p: n for p, n in counts.items() if n > 1}
    assert not missing and not extra and not twice, (
        f"missing {sorted(missing)[:20]} ({len(missing)}), extra {sorted(extra)[:20]}, "
        f"fetched more than once {dict(list(twice.items())[:20])} ({len(twice)})")


def assert_exit(w, reason: str, rc: int = 0, timeout: float = WAIT) -> None:
    got = w.wait(timeout)
    assert got == rc, f"worker {w.name} rc={got}\n{w.log_tail(60)}"
    assert w.close_reason() == reason, f"worker {w.name}\n{w.log_tail(60)}"
    text = w.log_text()
    assert "Traceback" not in text, f"worker {w.name} logged a traceback:\n{w.log_tail(80)}"


def run_frontier(url: str, crawl_id: str, body: Callable[[Frontier], Any]) -> Any:
    """asyncio.run(body(frontier)) with a Frontier built like the scheduler builds it."""
    return run_support_frontier(url, crawl_id, body, lease_ms=30_000, max_attempts=4)


def payload(url: str) -> str:
    # no callback: the spider's default parse(); encode_request needs the spider only
    # to name a callback
    return encode_request(Request(url), None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 1. fleet


def test_three_workers_crawl_every_page_exactly_once(redis_server, make_site, start_worker,
                                                     crawl_id):
    """3 workers started at once on a 500-page site: the start URL is queued once, all 3
    exit by themselves with 'finished', the site saw every page once."""
    pages = 500
    site = make_site(pages=pages)
    together = start_worker.barrier(3)
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                       settings=together) for i in range(3)]
    for w in ws:
        assert_exit(w, "finished")

    assert_each_once(site.count_by_path(), page_paths(pages))
    r = redis_server.client()
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages)
    s = st["stats"]
    # the start URL queued once however many workers start at once; each page enqueued,
    # claimed and acked exactly once
    assert s["enqueued"] == pages, s
    assert s["claimed"] == pages, s
    assert s["acked"] == pages, s
    assert s.get("failed", 0) == s.get("recovered", 0) == s.get("dead", 0) == 0, s
    assert s.get("skipped_done", 0) == 0, s
    assert st["workers"] == set(), st  # each worker left the registry when it closed

    items = start_worker.all_items()
    assert sorted(it["url"] for it in items) == sorted(site.url + p for p in page_paths(pages))
    per_worker = {w.name: w.stats() for w in ws}
    assert sum(v.get("leased/acked", 0) for v in per_worker.values()) == pages
    assert sum(v.get("leased/enqueued", 0) for v in per_worker.values()) == pages
    # links to pages a worker already knew were in the seen set never went to Redis;
    # every duplicate (there or here) was filtered and logged like Scrapy's own
    total = {name: sum(v.get(name, 0) for v in per_worker.values())
             for name in ("leased/enqueue_sent", "leased/seen_cached", "dupefilter/filtered")}
    assert total["leased/seen_cached"] > 0, total
    assert total["leased/enqueue_sent"] == pages + s["duplicates"], (total, s)
    assert total["dupefilter/filtered"] == total["leased/seen_cached"] + s["duplicates"], total
    print("pages per worker:", {n: v.get("leased/acked", 0) for n, v in per_worker.items()})
    print("links filtered by the workers' caches / by Redis:", total["leased/seen_cached"],
          s["duplicates"])


# --------------------------------------------------------------------------- 2. idle pickup


def test_idle_worker_picks_up_pushed_work_within_1s(redis_server, make_site, start_worker,
                                                    crawl_id):
    """An idle worker with free capacity starts work pushed by someone else within 1 s
    (Scrapy's own heartbeat would take 5 s)."""
    site = make_site(pages=1)  # /p/0 links nowhere: the crawl drains after one page
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_KEEP_ALIVE": True})
    r = redis_server.client()
    wait_for(lambda: stat(r, crawl_id, "done") == 1, 60, "first page done", [w])
    time.sleep(1.0)  # well idle now
    assert w.running

    delays = []
    for n in range(6):
        url = f"{site.url}/p/0?push={n}"
        path = url[len(site.url):]
        t_push = time.time()
        queued = run_frontier(redis_server.url, crawl_id,
                              lambda f: f.enqueue([NewRequest(payload(url))]))
        assert queued == [True]
        wait_for(lambda: site.count_by_path()[path] == 1, 30, f"fetch of {path}", [w])
        t_fetch = next(e["t"] for e in site.entries() if e["path"] == path)
        delays.append(t_fetch - t_push)
        # push at varied phases of the idle poll
        time.sleep(0.35 + 0.13 * n)
    print("idle pickup delays (s):", [round(d, 3) for d in delays],
          "max", round(max(delays), 3))
    assert max(delays) < 1.0, delays
    wait_for(lambda: stat(r, crawl_id, "done") == 7, 30, "all pushed pages done", [w])
    assert w.running  # LEASED_KEEP_ALIVE: still waiting for more
    w.sigterm()
    assert_exit(w, "shutdown", timeout=30)
    assert_each_once(site.count_by_path(),
                     {"/p/0"} | {f"/p/0?push={n}" for n in range(6)})
    st = crawl_state(r, crawl_id)
    assert_drained(st, 7)
    assert st["workers"] == set()


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_idle_worker_polls_instead_of_spinning(make_site, start_worker, crawl_id):
    """An idle worker looks for new work every LEASED_IDLE_POLL (0.2 s): about 5 claim
    calls a second, plus a renewal and sweeps. It must not hammer Redis in a loop."""
    srv = RedisServer().start()  # private: every script call counted is this worker's
    try:
        site = make_site(pages=1)
        w = start_worker(srv.url, crawl_id, site.url + "/p/0",
                         settings={"LEASED_KEEP_ALIVE": True})
        r = srv.client()
        wait_for(lambda: stat(r, crawl_id, "done") == 1, 60, "the page done", [w])
        time.sleep(0.5)
        calls0, cpu0, t0 = _evalsha_calls(r), _cpu_seconds(w.pid), time.monotonic()
        time.sleep(3)
        calls1, cpu1, t1 = _evalsha_calls(r), _cpu_seconds(w.pid), time.monotonic()
        rate = (calls1 - calls0) / (t1 - t0)
        cpu = 100 * (cpu1 - cpu0) / (t1 - t0)
        print(f"idle worker: {rate:.0f} script calls/s to Redis, {cpu:.0f}% CPU")
        w.sigterm()
        assert_exit(w, "shutdown", timeout=30)
    finally:
        srv.close()
    assert rate < 50, f"idle worker spins: {rate:.0f} Redis script calls/s, {cpu:.0f}% CPU"


# --------------------------------------------------------------------------- 3. crawl end


def test_no_worker_closes_while_another_holds_a_live_lease(redis_server, make_site,
                                                           start_worker, crawl_id):
    """A worker with nothing to do does not close while another worker's in-flight
    request may still yield links; both close with 'finished' once the frontier is
    drained fleet-wide, and every page is fetched once."""
    pages = 200
    slow_s = 5
    site = make_site(pages=pages)
    # page 0 served slowly: its links (1..10, then the whole tree) exist only once
    # that response is processed. Both workers seed it; one claims it, the other has
    # nothing to do meanwhile.
    slow = f"/slow/0?s={slow_s}"
    ws = [start_worker(redis_server.url, crawl_id, site.url + slow, name=n) for n in "AB"]
    r = redis_server.client()
    wait_for(lambda: stat(r, crawl_id, "claimed") == 1, 60, "the slow page claimed", ws)
    for w in ws:
        wait_for(lambda: "Leased frontier" in w.log_text(), 60, f"{w.name} opened", ws)
    opened = time.time()
    assert site.count_by_path()[slow] == 0, "a worker started too late for this test"
    # until the slow page is served, the crawl is not drained: nobody may close
    while site.count_by_path()[slow] == 0:
        for w in ws:
            assert w.running, f"{w.name} closed while a lease was live:\n{w.log_tail()}"
        time.sleep(0.02)
    idle_for = time.time() - opened
    for w in ws:
        assert_exit(w, "finished")

    assert_each_once(site.count_by_path(), {slow} | page_paths(pages, skip=(0,)))
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages)
    assert st["stats"]["enqueued"] == pages  # the slow start URL queued once
    holder = [it["worker"] for it in start_worker.all_items() if slow in it["url"]]
    assert len(holder) == 1
    by_worker = Counter(it["worker"] for it in start_worker.all_items())
    print(f"slow page held by {holder[0]}; the other waited {idle_for:.1f}s without closing;"
          f" pages per worker {dict(by_worker)}")


def test_keep_alive_worker_waits_for_new_seeds(redis_server, make_site, start_worker, crawl_id):
    """LEASED_KEEP_ALIVE keeps a worker up after the crawl drained; it takes new seeds
    (pushed as `scrapy leased seed` does) and stops cleanly on SIGTERM. A worker joining
    the live run skips start() (the run is seeded) and ends 'finished' once drained."""
    site = make_site(pages=30)
    site2 = make_site(pages=20)
    r = redis_server.client()
    keeper = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="keeper",
                          settings={"LEASED_KEEP_ALIVE": True})
    wait_for(lambda: stat(r, crawl_id, "done") == 30, 60, "30 pages done", [keeper])
    time.sleep(3)  # a worker without keep-alive closes within an idle poll or two
    assert keeper.running
    assert keeper.close_reason() is None
    st = crawl_state(r, crawl_id)
    assert_drained(st, 30)
    assert len(st["workers"]) == 1  # its heartbeat is alive

    # a new seed pushed into the running crawl; a worker joins the run meanwhile
    queued = run_frontier(redis_server.url, crawl_id,
                          lambda f: f.enqueue([NewRequest(payload(site2.url + "/p/0"))]))
    assert queued == [True]
    joiner = start_worker(redis_server.url, crawl_id, site.url + "/p/1", name="joiner")
    assert_exit(joiner, "finished")
    assert joiner.stats().get("leased/start_skipped") == 1  # its start URL was not sent
    assert keeper.running
    assert_each_once(site.count_by_path(), page_paths(30))
    assert_each_once(site2.count_by_path(), page_paths(20))
    assert stat(r, crawl_id, "done") == 50
    by_worker = Counter(it["worker"] for it in start_worker.all_items())
    print("pages per worker:", dict(by_worker))

    keeper.sigterm()
    assert_exit(keeper, "shutdown", timeout=30)
    st = crawl_state(r, crawl_id)
    assert_drained(st, 50)
    assert st["workers"] == set()


# --------------------------------------------------------------------------- 4. resume


def test_stopped_fleet_resumes_without_refetching_acked_pages(redis_server, make_site,
                                                             start_worker, crawl_id):
    """SIGTERM a 2-worker fleet mid-crawl, start 2 new workers on the same crawl: the
    crawl completes, and nothing fetched (hence acked) before the stop is fetched again,
    except the start URL: the new fleet is a new run of the crawl and sends its start
    request (dont_filter=True) again, as Scrapy resumed from a JOBDIR does."""
    pages = 500
    site = make_site(pages=pages)
    r = redis_server.client()
    slow = {"CONCURRENT_REQUESTS": 4, "RECORD_DELAY": 0.1}
    first = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"a{i}",
                          settings=slow) for i in range(2)]
    wait_for(lambda: stat(r, crawl_id, "done") >= 120, WAIT, "120 pages done", first)
    for w in first:
        w.sigterm()
    for w in first:
        assert_exit(w, "shutdown", timeout=60)

    before = site.count_by_path()
    st = crawl_state(r, crawl_id)
    assert 0 < st["stats"]["done"] < pages, "the first fleet finished the crawl: too fast"
    # graceful stop: whatever was fetched was processed and acked; no lease is left
    assert st["stats"]["done"] == sum(before.values()) == len(before), (st, before)
    assert len(start_worker.all_items()) == len(before)
    assert st["leases"] == 0 and st["inflight"] == 0, st
    assert st["queue"] > 0, st
    assert st["workers"] == set(), st
    n_before = len(site.entries())

    together = start_worker.barrier(2)
    second = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"b{i}",
                           settings=together) for i in range(2)]
    for w in second:
        assert_exit(w, "finished")
    after = Counter(e["path"] for e in site.entries()[n_before:])
    refetched = set(before) & set(after)
    print(f"first fleet did {len(before)} pages; second fleet {len(after)};"
          f" refetched after resume: {len(refetched)}")
    assert refetched == {"/p/0"}, sorted(refetched)
    counts = site.count_by_path()
    assert counts.pop("/p/0") == 2
    assert_each_once(counts, page_paths(pages) - {"/p/0"})
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages + 1)
    assert st["stats"]["enqueued"] == pages + 1  # the new run's start request
    assert sum(w.stats().get("leased/seeded", 0) for w in first + second) == 2  # one a run
    assert st["stats"].get("recovered", 0) == 0


# --------------------------------------------------------------------------- 5. SIGTERM


def test_status_shows_a_killed_workers_leases_under_its_id_until_recovered(
        redis_server, make_site, start_worker, crawl_id):
    """2 workers; one, whose items never finish (60 s in its pipeline), is killed with
    kill -9 mid-crawl: ``status --json`` counts its leases under its id (from the owners
    HASH, not from its last heartbeat) while they wait to expire, the text view lists
    them under the workers not alive; they are recovered, the other worker finishes the
    crawl, and no owner is left behind."""
    from tests.test_commands import leased, ok

    pages = 200
    site = make_site(pages=pages)
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    victim = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="victim",
                          settings={"LEASED_LEASE_SECONDS": 15, "LEASED_RENEW_INTERVAL": 0.5,
                                    "LEASED_SWEEP_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 4,
                                    "RECORD_DELAY": 60})

    def worker_id(pid: int) -> str | None:
        for wid, info in r.hgetall(k.worker_info).items():
            if json.loads(info).get("pid") == pid:
                return as_str(wid)
        return None

    def owned() -> Counter:
        return Counter(as_str(w) for w in r.hvals(k.owners))

    wait_for(lambda: worker_id(victim.pid) is not None, WAIT, "the victim registered", [victim])
    vid = worker_id(victim.pid)
    assert vid is not None
    wait_for(lambda: owned()[vid] >= 4, WAIT, "the victim holding 4 claims", [victim])
    survivor = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="survivor",
                            settings={**FAST, "LEASED_RENEW_INTERVAL": 0.5, "RECORD_DELAY": 0.05})
    wait_for(lambda: worker_id(survivor.pid) is not None and stat(r, crawl_id, "done") >= 20,
             WAIT, "the survivor crawling", [victim, survivor])
    sid = worker_id(survivor.pid)
    assert sid is not None and sid != vid

    victim.kill9()
    assert victim.returncode == -9
    # Only a live worker recovers expired leases: with the survivor frozen, the victim's
    # leases stay in Redis (expired or not) however long the status commands take.
    survivor.sigstop()
    try:
        held = {int(t) for t, w in r.hgetall(k.owners).items() if as_str(w) == vid}
        assert len(held) >= 4
        assert all(r.hget(k.inflight, t) is not None for t in held)
        time.sleep(3.5)  # its heartbeat older than the status command's worker TTL (3 s)
        status = ("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url,
                  "-s", "LEASED_WORKER_TTL=3")
        doc = json.loads(ok(leased(*status, "--json")))
        text = ok(leased(*status))
    finally:
        survivor.sigcont()
    assert doc["leases_by_worker"][vid] == len(held), doc["leases_by_worker"]
    assert set(doc["leases_by_worker"]) <= {vid, sid}
    (dead_entry,) = [w for w in doc["workers"] if w["id"] == vid]
    assert not dead_entry["alive"] and dead_entry["pid"] == victim.pid
    assert "leases of workers not alive, waiting to expire" in text, text
    assert re.search(rf"^\s+{re.escape(vid)}\s+{len(held)}$", text, re.M), text

    # the leases expire and are recovered; the survivor does the rest
    assert_exit(survivor, "finished")
    assert stat(r, crawl_id, "recovered") >= len(held)
    doc = json.loads(ok(leased(*status, "--json")))
    assert doc["leases_by_worker"] == {} and doc["processing"] == 0
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages)


def test_sigterm_finishes_in_flight_and_releases_unstarted_claims(redis_server, make_site,
                                                                  start_worker, crawl_id):
    """SIGTERM: in-flight requests finish and are acked, unstarted (prefetched) claims
    go back to the queue, claimable at once; the exited worker holds no lease."""
    pages = 500
    site = make_site(pages=pages)
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={**FAST, "CONCURRENT_REQUESTS": 4, "LEASED_PREFETCH": 20,
                               # the downloader is the bottleneck, so prefetched claims
                               # wait unstarted in the scheduler; items take a while too
                               "DOWNLOAD_DELAY": 0.1, "RECORD_DELAY": 0.2,
                               # FIFO (breadth-first): claims take the oldest requests,
                               # so released ones are told apart by their rids below
                               "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"})
    wait_for(lambda: len(w.items()) >= 20, WAIT, "20 items", [w])
    w.sigterm()
    t0 = time.monotonic()
    assert_exit(w, "shutdown", timeout=60)
    print(f"graceful stop took {time.monotonic() - t0:.2f}s")

    # right after exit: nothing leased, in flight, or registered
    queue = queued(r, k, LANE)
    st = crawl_state(r, crawl_id)
    assert st["leases"] == 0 and st["inflight"] == 0, st
    assert st["workers"] == set(), st

    fetched = site.count_by_path()
    assert max(fetched.values()) == 1
    # in-flight requests finished: every fetched page was processed and acked
    assert len(w.items()) == len(fetched) == st["stats"]["done"] == st["stats"]["acked"], (
        len(w.items()), fetched, st)
    released = st["stats"].get("released", 0)
    ws = w.stats()
    assert released > 0, st
    assert ws.get("leased/released") == released, ws
    assert ws.get("leased/claimed") == st["stats"]["done"] + released, (ws, st)
    # released claims are back at the FRONT of the queue (whatever the member prefix),
    # in claim order, no attempt charged. Claims pop the oldest requests first, so the
    # released ones are the oldest requests still queued.
    envs = [Envelope.parse(m) for m in queue]
    front, rest = envs[:released], envs[released:]
    assert all(e.attempts == 0 and e.expiries == 0 for e in envs), queue[:30]
    assert max(e.rid for e in front) < min((e.rid for e in rest), default=1 << 62), queue[:30]
    assert [e.rid for e in front] == sorted(e.rid for e in front), queue[:30]
    assert len(queue) + st["stats"]["done"] == st["stats"]["enqueued"], st

    # ... and claimable at once (no lease to wait for)
    res = run_frontier(redis_server.url, crawl_id,
                       lambda f: f.claim(len(queue), "test", [(LANE, NO_BUDGET)]))
    assert len(res.claims) == len(queue)
    assert [env.rid for _, env in res.claims[:released]] == [e.rid for e in front]


# --------------------------------------------------------------------------- 6. garbage


def test_garbage_in_the_queue_is_dead_lettered_with_a_reason(redis_server, make_site,
                                                            start_worker, crawl_id):
    pages = 50
    site = make_site(pages=pages)
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    # not an envelope at all, and well-formed envelopes whose payload is not JSON (one of
    # priority 0 in the lane's LIST, one of priority 1 in its tier's LIST)
    r.rpush(k.lane_fifo(LANE), "garbage", f"999|0|0|0|{LANE}|{{not json")
    r.rpush(k.lane_tier(LANE, "p1"), f"998|0|0|1|{LANE}|{{not json")
    r.zadd(k.lane_queue(LANE), {"p1": -1})
    r.zadd(k.lanes, {LANE: 0})
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=FAST)
    assert_exit(w, "finished")

    assert_each_once(site.count_by_path(), page_paths(pages))
    st = crawl_state(r, crawl_id)
    dead = st["dead"]
    assert len(dead) == 3, dead
    malformed = [v for key, v in dead.items() if key.startswith("malformed:")]
    assert len(malformed) == 1, dead
    assert "not an envelope" in malformed[0]["reason"], dead
    assert malformed[0]["envelope"] == "garbage", dead
    assert "999" in dead, dead
    assert "undecodable" in dead["999"]["reason"] and "JSON" in dead["999"]["reason"], dead
    assert dead["999"]["envelope"].endswith("{not json"), dead
    assert "undecodable" in dead["998"]["reason"], dead
    assert st["stats"]["dead"] == 3, st
    assert st["stats"]["done"] == st["done_bits"] == pages, st
    assert not r.getbit(k.done, 999)
    assert st["queue"] == st["leases"] == st["inflight"] == 0, st
    assert w.stats().get("leased/undecodable") == 2
    assert "Dead-lettering stored request 999" in w.log_text()


# --------------------------------------------------------------------------- 7. bad config


def test_unreachable_redis_gives_one_clear_error(make_site, start_worker, crawl_id):
    site = make_site(pages=5)
    port = free_port()  # nothing listens there
    url = f"redis://127.0.0.1:{port}/0"
    t0 = time.monotonic()
    # it waits LEASED_CONNECT_TIMEOUT for Redis (15 s by default), then gives up
    w = start_worker(url, crawl_id, site.url + "/p/0", settings={"LEASED_CONNECT_TIMEOUT": 2})
    rc = w.wait(60)
    took = time.monotonic() - t0
    text = w.log_text()
    print(f"exited rc={rc} after {took:.1f}s")
    assert rc != 0, text
    assert took < 30, took
    errors = [ln for ln in text.splitlines() if url in ln and "LEASED_REDIS_URL" in ln
              and "within 2 s (LEASED_CONNECT_TIMEOUT)" in ln]
    assert errors, text
    # one line (CRITICAL: scrapy crawl then exits 1, _command.py), no traceback
    assert len([ln for ln in text.splitlines() if " ERROR: " in ln or " CRITICAL: " in ln]) \
        == 1, text
    assert "Traceback" not in text, text
    assert len(site.entries()) == 0


@pytest.mark.parametrize("name,value,words", [
    ("LEASED_MAX_ATTEMPTS", "0", ["LEASED_MAX_ATTEMPTS", "'0'"]),
    ("LEASED_REDIS_URL", "http://x", ["LEASED_REDIS_URL", "http://x"]),
])
def test_bad_setting_stops_the_worker_naming_it(make_site, start_worker, crawl_id, name, value,
                                               words):
    site = make_site(pages=5)
    w = start_worker("redis://127.0.0.1:1/0", crawl_id, site.url + "/p/0",
                     settings={name: value})
    rc = w.wait(60)
    text = w.log_text()
    assert rc != 0, text
    lines = [ln for ln in text.splitlines() if all(word in ln for word in words)]
    assert lines, text
    # one line (CRITICAL: scrapy crawl then exits 1, _command.py), no traceback
    assert len([ln for ln in text.splitlines() if " ERROR: " in ln or " CRITICAL: " in ln]) \
        == 1, text
    assert "Traceback" not in text, text
    assert len(site.entries()) == 0


# --------------------------------------------------------------------------- 8. Redis restart


def test_redis_crash_and_restart_mid_crawl_loses_nothing(redis_aof, make_site, start_worker,
                                                        crawl_id):
    """SIGKILL the (AOF, fsync always) Redis mid-crawl, restart it on the same port: the
    workers reconnect, the crawl ends 'finished', nothing is lost."""
    pages = 500
    site = make_site(pages=pages)
    r = redis_aof.client()
    # leases long enough to outlive the outage (no expiry), short enough that a claim
    # whose reply was lost in the crash is recovered in seconds
    settings = {"LEASED_LEASE_SECONDS": 6, "LEASED_RENEW_INTERVAL": 1,
                "LEASED_SWEEP_INTERVAL": 0.5, "CONCURRENT_REQUESTS": 4, "RECORD_DELAY": 0.1}
    ws = [start_worker(redis_aof.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                       settings=settings) for i in range(2)]
    wait_for(lambda: stat(r, crawl_id, "done") >= 150, WAIT, "150 pages done", ws)
    redis_aof.kill()
    t_kill = time.time()
    n_at_kill = len(site.entries())
    time.sleep(1.5)
    redis_aof.start()
    t_up = time.time()
    r = redis_aof.client()
    done_after_restart = stat(r, crawl_id, "done")
    assert done_after_restart >= 150  # fsync always: nothing acknowledged was lost
    for w in ws:
        assert_exit_allow_warnings(w, "finished")

    counts = site.count_by_path()
    fetched_in_outage = sum(1 for e in site.entries() if t_kill <= e["t"] <= t_up)
    twice = {p: n for p, n in counts.items() if n > 1}
    st = crawl_state(r, crawl_id)
    print(f"outage {t_up - t_kill:.1f}s; done at restart {done_after_restart};"
          f" fetched during outage {fetched_in_outage}; pages fetched twice {len(twice)}"
          f" {sorted(twice)[:10]}; recovered {st['stats'].get('recovered', 0)};"
          f" acked {st['stats'].get('acked')}; stats {st['stats']}")
    assert set(counts) == page_paths(pages)
    assert_drained(st, pages)
    warned = [w.name for w in ws if "retrying" in w.log_text()]
    print("workers that logged a Redis retry warning:", warned)
    assert n_at_kill < sum(counts.values())  # the crawl really continued after the restart


def assert_exit_allow_warnings(w, reason: str, timeout: float = WAIT) -> None:
    got = w.wait(timeout)
    assert got == 0, f"worker {w.name} rc={got}\n{w.log_tail(60)}"
    assert w.close_reason() == reason, f"worker {w.name}\n{w.log_tail(60)}"


# --------------------------------------------------------------------------- 9. seeding


def test_shared_start_urls_are_fetched_once(redis_server, make_site, start_worker, crawl_id):
    """3 workers started at once whose start URLs include the same 3 start pages: one of
    them seeds the run, the others skip start(): each start URL is sent once, not 3
    times. /p/5 and /p/7 are also linked from /p/0; a start request keeps its
    dont_filter=True, so, as under Scrapy, those two are fetched twice."""
    pages = 100
    site = make_site(pages=pages)
    starts = [site.url + p for p in ("/p/0", "/p/5", "/p/7")]
    orders = [starts, starts[::-1], starts[1:] + starts[:1]]
    together = start_worker.barrier(3)  # one run: each start request sent once
    ws = [start_worker(redis_server.url, crawl_id, order, name=f"w{i}", settings=together)
          for i, order in enumerate(orders)]
    for w in ws:
        assert_exit(w, "finished")
    counts = site.count_by_path()
    assert (counts.pop("/p/5"), counts.pop("/p/7")) == (2, 2)
    assert_each_once(counts, page_paths(pages) - {"/p/5", "/p/7"})
    r = redis_server.client()
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages + 2)
    assert st["stats"]["enqueued"] == pages + 2, st
    assert sorted(w.stats().get("leased/seeded", 0) for w in ws) == [0, 0, 1]
    assert sorted(w.stats().get("leased/start_skipped", 0) for w in ws) == [0, 1, 1]
