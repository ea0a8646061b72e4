"""Fleet control (``scrapy leased pause | resume | stop``) and the fleet-wide limits
(``LEASED_CLOSE_*``), with real ``scrapy crawl`` worker processes against a real
redis-server and the local test site (slowed down, so that a crawl is still running when
it is paused or stopped).

No check depends on a few milliseconds: a worker says in its log when it has seen the
pause and has nothing in progress any more, and the tests wait for that; the only fixed
wait is the span over which nothing may happen (longer than a lease, so that a lease
that was not renewed would expire and be recovered)."""

from __future__ import annotations

import json
import time

import redis

from scrapy_leased.frontier import as_str
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for
from tests.test_commands import leased, ok
from tests.test_crawl import (
    assert_drained,
    assert_each_once,
    assert_exit,
    crawl_state,
    page_paths,
    stat,
)

LEASE = 2  # seconds: short, so that a lease not renewed while paused would expire
FAST = {"LEASED_LEASE_SECONDS": LEASE, "LEASED_SWEEP_INTERVAL": 0.5}
CONCURRENCY = 4
PREFETCH = 4
SLOW = {**FAST, "CONCURRENT_REQUESTS": CONCURRENCY, "LEASED_PREFETCH": PREFETCH}
WAIT = 120  # hang guard for a crawl, not a check
PAUSED_IDLE = "Crawl paused: nothing in progress on this worker"
STOPPING = "is stopping"


def control(url: str, crawl_id: str, sub: str) -> str:
    return ok(leased(sub, crawl_id, "--redis-url", url))


def status(url: str, crawl_id: str) -> dict:
    return json.loads(ok(leased("status", crawl_id, "--json", "--sample", "0",
                                "--redis-url", url)))


def leases(r: redis.Redis, crawl_id: str) -> dict[str, float]:
    return {as_str(t): float(d) for t, d in
            r.zrange(CrawlKeys(crawl_id).leases, 0, -1, withscores=True)}


def start_fleet(start_worker, redis_server, crawl_id, site, n=3, settings=None):
    together = start_worker.barrier(n)
    return [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                         settings={**SLOW, **together, **(settings or {})})
            for i in range(n)]


def fleet_under_way(start_worker, redis_server, make_site, crawl_id, pages):
    """A 3-worker fleet crawling a site of ``pages`` slow pages, once 60 are done (the
    crawl is well under way): the site, the workers and a Redis client."""
    site = make_site(pages=pages, delay=0.2)
    ws = start_fleet(start_worker, redis_server, crawl_id, site)
    r = redis_server.client()
    wait_for(lambda: stat(r, crawl_id, "done") >= 60, WAIT, "60 pages done", ws)
    return site, ws, r


def test_pause_stops_fetching_keeps_leases_and_resume_finishes(redis_server, make_site,
                                                                start_worker, crawl_id):
    """``pause`` during a 3-worker crawl: once every worker has seen it and finished what
    it had started, no fetch starts (for 3 leases' time), the claims they hold keep their
    leases (renewed, never recovered), ``status`` shows the pause and the workers stay up;
    a worker started while paused obeys it from its first claim;
    ``resume`` continues and the crawl finishes with every page fetched once."""
    pages = 1000
    site, ws, r = fleet_under_way(start_worker, redis_server, make_site, crawl_id, pages)

    out = control(redis_server.url, crawl_id, "pause")
    assert "paused (was running" in out, out
    for w in ws:  # each worker has seen the pause and has nothing in progress
        w.wait_log(PAUSED_IDLE, timeout=30)
    # a worker started while paused obeys it too (and joins the run: start() skipped)
    late = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="late",
                        settings=SLOW)
    late.wait_log(PAUSED_IDLE, timeout=60)
    ws.append(late)
    fetched = len(site.entries())
    held = leases(r, crawl_id)
    done = stat(r, crawl_id, "done")
    assert held, "the workers hold unstarted claims (LEASED_PREFETCH) while paused"
    time.sleep(3 * LEASE)  # what must not happen meanwhile: a fetch, a lease expiring
    assert len(site.entries()) == fetched, "a fetch started while the fleet was paused"
    assert stat(r, crawl_id, "done") == done
    later = leases(r, crawl_id)
    assert set(later) == set(held), (held, later)  # the same claims, still leased
    assert all(later[t] > held[t] for t in held), "leases renewed while paused"
    assert stat(r, crawl_id, "recovered") == 0
    assert all(w.running for w in ws)  # a paused crawl is not finished
    doc = status(redis_server.url, crawl_id)
    assert doc["control"]["state"] == "paused", doc["control"]
    assert doc["control"]["by"].startswith("scrapy leased pause"), doc["control"]
    assert {w["control"] for w in doc["workers"] if w["alive"]} == {"paused"}, doc["workers"]
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url))
    assert "paused" in text.split("todo")[0], text

    out = control(redis_server.url, crawl_id, "resume")
    assert "running (was paused" in out, out
    for w in ws:
        assert_exit(w, "finished", timeout=WAIT)
        assert "Crawl " + crawl_id + " resumed" in w.log_text()
    assert_each_once(site.count_by_path(), page_paths(pages))
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages)
    assert st["stats"].get("recovered", 0) == 0, st
    assert status(redis_server.url, crawl_id)["control"]["state"] == "running"


def test_stop_closes_every_worker_and_a_restart_continues(redis_server, make_site,
                                                           start_worker, crawl_id):
    """``stop``: every worker finishes what it started, gives back its other claims and
    exits 0 with close reason ``leased_stopped``, leaving no lease; a worker started while
    the crawl is stopping closes at once the same way, fetching nothing; after ``resume``
    a new start continues where the fleet stopped: no page is fetched twice, except the
    start request, which a new run of the crawl sends again (it is ``dont_filter``)."""
    pages = 1000
    site, ws, r = fleet_under_way(start_worker, redis_server, make_site, crawl_id, pages)

    out = control(redis_server.url, crawl_id, "stop")
    assert "stopping (was running" in out, out
    for w in ws:
        assert_exit(w, "leased_stopped", timeout=LEASE + 30)
        assert STOPPING in w.log_text()
    st = crawl_state(r, crawl_id)
    assert st["leases"] == st["inflight"] == st["owners"] == 0, st
    done = st["stats"]["done"]
    assert 60 <= done < pages, st
    assert st["stats"].get("released", 0) > 0 or st["queue"] > 0, st
    first = site.count_by_path()
    assert sum(first.values()) == done, (sum(first.values()), done)  # all fetched were acked
    assert status(redis_server.url, crawl_id)["control"]["state"] == "stopping"

    late = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="late",
                        settings=SLOW)
    assert_exit(late, "leased_stopped", timeout=60)
    assert "start() not run" in late.log_text()
    assert "WARNING: Crawl " + crawl_id + " is stopping" in late.log_text()  # not only INFO
    assert site.count_by_path() == first  # it fetched nothing
    assert crawl_state(r, crawl_id)["queue"] == st["queue"]

    out = control(redis_server.url, crawl_id, "resume")
    assert "running (was stopping" in out, out
    again = start_fleet(start_worker, redis_server, crawl_id, site)
    for w in again:
        assert_exit(w, "finished", timeout=WAIT)
    counts = site.count_by_path()
    assert counts["/p/0"] == 2, counts["/p/0"]  # the start request of the new run
    counts["/p/0"] = 1
    assert_each_once(counts, page_paths(pages))
    st = crawl_state(r, crawl_id)
    assert_drained(st, pages + 1)  # + the new run's start request
    assert st["stats"].get("recovered", 0) == 0, st


# --------------------------------------------------------------------------- limits


def test_close_limits_are_parsed_and_checked():
    from scrapy.settings import Settings

    from scrapy_leased.frontier import NO_LIMITS, CloseLimits
    from scrapy_leased.settings import LeasedConfig, LeasedConfigError, close_limits

    assert LeasedConfig.from_settings(Settings()).limits == NO_LIMITS
    got = close_limits(Settings({"LEASED_CLOSE_PAGECOUNT": "500", "LEASED_CLOSE_ITEMCOUNT": 7,
                                 "LEASED_CLOSE_ERRORCOUNT": 0, "LEASED_CLOSE_TIMEOUT": 1.5}))
    assert got == CloseLimits(pages=500, items=7, errors=0, timeout_ms=1500)
    for name, bad in [("LEASED_CLOSE_PAGECOUNT", -1), ("LEASED_CLOSE_ITEMCOUNT", 2.5),
                      ("LEASED_CLOSE_TIMEOUT", "soon"), ("LEASED_CLOSE_ERRORCOUNT", "x")]:
        try:
            close_limits(Settings({name: bad}))
        except LeasedConfigError as exc:
            assert name in str(exc)
        else:
            raise AssertionError(f"{name}={bad!r} accepted")
    try:
        close_limits(Settings({"LEASED_CLOSE_ITEMCOUNT": 5, "LEASED_FLEET_STATS": False}))
    except LeasedConfigError as exc:
        assert "LEASED_FLEET_STATS" in str(exc)
    else:
        raise AssertionError("an item limit without the fleet stats accepted")


def test_pagecount_limit_stops_the_fleet_with_a_bounded_overshoot(redis_server, make_site,
                                                                  start_worker, crawl_id):
    """``LEASED_CLOSE_PAGECOUNT = 500`` with 3 workers on a 3,000-page site: the fleet
    stops as with ``stop`` (every worker exits 0 with ``leased_stopped``, no lease left),
    having done at least 500 requests and at most 500 + the in-flight bound. The bound:
    a worker holds at most CONCURRENT_REQUESTS + LEASED_PREFETCH claims, a page is
    fetched only under a claim, and no claim is made once 500 are done (a claim takes at
    most 500 - done - leases), so at most 3 x (4 + 4) = 24 pages past the limit. (With no
    lease lost, the cap makes it exactly 500; the bound is what the design promises.)"""
    pages, limit = 3000, 500
    bound = 3 * (CONCURRENCY + PREFETCH)
    site = make_site(pages=pages, delay=0.05)
    ws = start_fleet(start_worker, redis_server, crawl_id, site,
                     settings={"LEASED_CLOSE_PAGECOUNT": limit})
    for w in ws:
        assert_exit(w, "leased_stopped", timeout=WAIT)
    r = redis_server.client()
    st = crawl_state(r, crawl_id)
    assert st["leases"] == st["inflight"] == st["owners"] == 0, st
    done = st["stats"]["done"]
    assert limit <= done <= limit + bound, (done, limit, bound)
    counts = site.count_by_path()
    assert sum(counts.values()) == done, (sum(counts.values()), done)  # fetched = done
    assert max(counts.values()) == 1, "a page fetched twice"
    assert st["queue"] > 0, st  # the crawl was not over: stopped by the limit
    doc = status(redis_server.url, crawl_id)
    assert doc["control"]["state"] == "stopping", doc["control"]
    assert doc["control"]["reason"].startswith("LEASED_CLOSE_PAGECOUNT (500) reached"), doc
    assert any("LEASED_CLOSE_PAGECOUNT (500) reached" in w.log_text() for w in ws)

    # started as it is, a worker closes at once: the crawl is stopping until `resume`;
    # a fresh run on purpose (LEASED_FLUSH_ON_START) ends the stop the limit set, and its
    # own count stops it at the limit again
    again = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="again",
                         settings={**SLOW, "LEASED_CLOSE_PAGECOUNT": limit})
    assert_exit(again, "leased_stopped", timeout=WAIT)
    assert stat(r, crawl_id, "done") == done
    site.clear_log()
    fresh = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="fresh",
                         settings={**SLOW, "LEASED_CLOSE_PAGECOUNT": limit,
                                   "LEASED_FLUSH_ON_START": True})
    assert_exit(fresh, "leased_stopped", timeout=WAIT)
    assert fresh.stats().get("leased/flushed_keys", 0) > 0
    done = stat(r, crawl_id, "done")
    assert limit <= done <= limit + CONCURRENCY + PREFETCH, done
    assert max(site.count_by_path().values()) == 1


def test_timeout_and_itemcount_limits_stop_the_fleet(redis_server, make_site, start_worker,
                                                     crawl_id, tmp_path):
    """``LEASED_CLOSE_TIMEOUT`` counts from the crawl's first claim (Redis time), over
    the whole fleet: a worker started later stops at the same moment; an item limit
    counts the fleet's ``item_scraped_count`` (flushed every LEASED_RENEW_INTERVAL)."""
    site = make_site(pages=5000, delay=0.2)
    first = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="first",
                         settings={**SLOW, "LEASED_CLOSE_TIMEOUT": 4})
    r = redis_server.client()
    wait_for(lambda: stat(r, crawl_id, "done") >= 5, WAIT, "5 pages done", [first])
    second = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="second",
                          settings={**SLOW, "LEASED_CLOSE_TIMEOUT": 4})
    for w in (first, second):
        assert_exit(w, "leased_stopped", timeout=60)
    k = CrawlKeys(crawl_id)
    started, since, reason = r.hmget(k.control, "started", "since", "reason")
    assert as_str(reason).startswith("LEASED_CLOSE_TIMEOUT reached"), reason
    assert 4000 <= int(since) - int(started) < 4000 + 10_000, (started, since)

    items = f"{crawl_id}-items"
    w = start_worker(redis_server.url, items, site.url + "/p/0", name="items",
                     settings={**SLOW, "LEASED_CLOSE_ITEMCOUNT": 30})
    assert_exit(w, "leased_stopped", timeout=WAIT)
    scraped = int(r.hget(CrawlKeys(items).fleet_stats, "item_scraped_count"))
    assert scraped >= 30, scraped
    assert as_str(r.hget(CrawlKeys(items).control, "reason")).startswith(
        "LEASED_CLOSE_ITEMCOUNT (30) reached"), r.hgetall(CrawlKeys(items).control)


def test_a_paused_fleet_is_not_stuck():
    from scrapy_leased.fleet import diagnose
    from scrapy_leased.fleet.snapshot import ControlState, Snapshot

    def snap(**kw):
        base = dict(crawl="c", now_ms=0, todo=100, processing=0, done=50, dead=0,
                    workers_alive=1, totals={}, done_last_minute=0, window_s=60)
        return Snapshot(**{**base, **kw})

    assert [d.code for d in diagnose(snap(now_ms=2000), snap())] == ["stuck"]
    paused = ControlState("paused", 1, "scrapy leased pause (h:1)")
    assert diagnose(snap(now_ms=2000, control=paused), snap(control=paused)) == []
    assert ControlState.from_hash({b"state": b"paused", b"since": b"12", b"by": b"x"}) == \
        ControlState("paused", 12, "x", "")
    assert ControlState.from_hash({}).to_dict() == {"state": "running", "since": None,
                                                   "by": None, "reason": None}
