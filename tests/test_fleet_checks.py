"""Close-time checks of the whole fleet (issue #27): ``signals.fleet_closed``, sent once
per run on its last worker with the fleet's stats (observe/stats.py, lua/fleet_open.lua,
lua/fleet_close.lua), and ``scrapy_leased.FleetSpidermon`` running Spidermon's close
monitors there.

Real redis-server, real ``scrapy crawl`` workers (tests/project, checks in
testproject/fleetchecks.py) against the local site, Spidermon installed from PyPI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.observe.stats import SCRIPTS
from tests.test_crawl import WAIT, assert_exit

pytest.importorskip("spidermon")

PAGES = 50
EXTENSIONS = {
    "testproject.extensions.FleetBarrier": 0,  # the project's own, kept
    "scrapy_leased.FleetSpidermon": 500,
    "testproject.fleetchecks.FleetClosedRecorder": 600,
}


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spidermon_settings(tmp_path: Path, min_items: int) -> dict[str, Any]:
    return {
        "EXTENSIONS": EXTENSIONS,
        "SPIDERMON_ENABLED": True,
        "SPIDERMON_SPIDER_CLOSE_MONITORS": "testproject.fleetchecks.FleetCloseSuite",  # -s: a str
        "SPIDERMON_MIN_ITEMS": min_items,
        "SPIDERMON_ADD_FIELD_COVERAGE": True,
        "SPIDERMON_FIELD_COVERAGE_RULES": {"dict/url": 1.0, "dict/title": 1.0},
        "TEST_MONITOR_FILE": str(tmp_path / "monitors.jsonl"),
        "TEST_FLEET_CLOSED_FILE": str(tmp_path / "fleet_closed.jsonl"),
        "CONCURRENT_REQUESTS": 4,
    }


def crawl_two(start_worker, redis_server, crawl_id, site, settings, *,
              failing: bool = False) -> list[Any]:
    together = start_worker.barrier(2)
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                       settings={**settings, **together}) for i in range(2)]
    for w in ws:
        if failing:  # a failed monitor logs its AssertionError's traceback
            assert w.wait(WAIT) == 0 and w.close_reason() == "finished", w.log_tail(60)
        else:
            assert_exit(w, "finished")
    return ws


def monitor_log_lines(ws: list[Any]) -> list[str]:
    """Spidermon's result lines for the ItemCountMonitor, from every worker's log."""
    return [line for w in ws for line in w.log_text().splitlines()
            if "[Spidermon] Extracted Items Monitor/test_stat_monitor..." in line]


def test_item_count_on_the_fleet_stats_passes_once(make_site, start_worker, redis_server,
                                                   crawl_id, tmp_path):
    """2 workers started together crawl 50 pages (one item each): ItemCountMonitor with
    SPIDERMON_MIN_ITEMS=50 runs once, on the last worker, sees the fleet's 50 items and
    passes (with FinishReasonMonitor and FieldCoverageMonitor); neither worker runs it on
    its own share. A project's own extension on
    ``fleet_closed`` (plain Scrapy signal API) gets the fleet's stats, once."""
    site = make_site(pages=PAGES, delay=0.02)
    settings = spidermon_settings(tmp_path, PAGES)
    ws = crawl_two(start_worker, redis_server, crawl_id, site, settings)
    assert sum(w.stats().get("item_scraped_count", 0) for w in ws) == PAGES
    assert len(start_worker.all_items()) == PAGES

    runs = lines(tmp_path / "monitors.jsonl")
    assert len(runs) == 1, runs
    assert runs[0]["passed"] is True and runs[0]["items"] == PAGES, runs
    assert runs[0]["finish_reason"] == "finished"
    # Spidermon's field coverage on the fleet's counts (added up), not added up itself
    assert runs[0]["url_coverage"] == 1.0
    assert runs[0]["pid"] in {w.pid for w in ws}
    # Spidermon's own log lines: one OK line, on one worker, none on the other
    result = monitor_log_lines(ws)
    assert len(result) == 1 and result[0].rstrip().endswith("OK"), result
    last = next(w for w in ws if w.pid == runs[0]["pid"])
    assert "Last worker of this run of the crawl: sending fleet_closed" in last.log_text()

    signal = lines(tmp_path / "fleet_closed.jsonl")
    assert len(signal) == 1, signal
    got = signal[0]
    assert got["pid"] == runs[0]["pid"] and got["reason"] == "finished"
    assert got["spider"] == "site" and got["items"] == PAGES
    assert got["responses"] == sum(w.stats()["response_received_count"] for w in ws)
    assert got["finish_reason"] == "finished" and got["start_time_is_datetime"] is True
    assert got["elapsed"] >= 0
    # the run is over: nothing of it left behind
    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    assert r.exists(keys.stats_open) == 0
    assert r.get(keys.closed_by) is not None


def test_item_count_above_the_fleet_total_fails_once(make_site, start_worker, redis_server,
                                                     crawl_id, tmp_path):
    """The same crawl with SPIDERMON_MIN_ITEMS=51: the monitor fails, once."""
    site = make_site(pages=PAGES, delay=0.02)
    ws = crawl_two(start_worker, redis_server, crawl_id, site,
                   spidermon_settings(tmp_path, PAGES + 1), failing=True)
    runs = lines(tmp_path / "monitors.jsonl")
    assert len(runs) == 1, runs
    assert runs[0]["passed"] is False and runs[0]["items"] == PAGES, runs
    result = monitor_log_lines(ws)
    assert len(result) == 1 and result[0].rstrip().endswith("FAIL"), result


def test_a_worker_killed_while_crawling_the_survivor_checks_the_fleet_once(
        make_site, start_worker, redis_server, crawl_id, tmp_path):
    """w1 is killed (kill -9) while it holds leases: w0 takes them over once they expire,
    finishes the crawl and, w1's heartbeat as old as its leases by then, is the last
    worker: the monitors run once, on w0, on the fleet's stats (w1's share included as far
    as it sent it)."""
    site = make_site(pages=PAGES, delay=0.1)
    settings = {**spidermon_settings(tmp_path, PAGES), "LEASED_LEASE_SECONDS": 2,
                "LEASED_WORKER_TTL": 2}
    together = start_worker.barrier(2)
    w0, w1 = (start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                           settings={**settings, **together}) for i in range(2))
    r = redis_server.client()
    owners = CrawlKeys(crawl_id).owners

    def w1_holds_leases() -> bool:
        w1.sigstop()  # frozen: it acks nothing while its leases are looked at
        if any(f":{w1.pid}:" in v.decode() for v in r.hvals(owners)):
            return True
        w1.sigcont()
        return False

    w1.wait_until(lambda: len(w1.items()) >= 3 and w1_holds_leases(), timeout=WAIT,
                  what="3 items and leases held")
    w1.kill9()
    assert_exit(w0, "finished")
    runs = lines(tmp_path / "monitors.jsonl")
    assert len(runs) == 1, runs
    assert runs[0]["pid"] == w0.pid and runs[0]["passed"] is True, runs
    assert runs[0]["items"] >= PAGES  # w1's items of unacked pages may count twice
    assert len(lines(tmp_path / "fleet_closed.jsonl")) == 1


def test_without_the_add_on_the_monitors_run_at_spider_closed(make_site, start_worker,
                                                               tmp_path):
    """Plain Scrapy (the add-on off): FleetSpidermon is Spidermon, the close monitors run
    on the worker's own stats at spider_closed; fleet_closed is not sent."""
    site = make_site(pages=5)
    w = start_worker(None, None, site.url + "/p/0", env={"TESTPROJECT_NO_ADDON": "1"},
                     settings=spidermon_settings(tmp_path, 5))
    assert_exit(w, "finished")
    runs = lines(tmp_path / "monitors.jsonl")
    assert len(runs) == 1 and runs[0]["passed"] is True and runs[0]["items"] == 5, runs
    assert lines(tmp_path / "fleet_closed.jsonl") == []


def test_fleet_stats_off_the_monitors_run_on_the_worker_with_a_warning(
        make_site, start_worker, redis_server, crawl_id, tmp_path):
    """LEASED_FLEET_STATS = False: no fleet_closed; FleetSpidermon runs the close monitors
    on the worker's own stats and says why."""
    site = make_site(pages=5)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={**spidermon_settings(tmp_path, 5), "LEASED_FLEET_STATS": False})
    assert w.wait(WAIT) == 0 and w.close_reason() == "finished", w.log_tail(60)
    assert "The fleet stats are off (LEASED_FLEET_STATS = False" in w.log_text()
    runs = lines(tmp_path / "monitors.jsonl")
    assert len(runs) == 1 and runs[0]["passed"] is True and runs[0]["items"] == 5, runs
    assert lines(tmp_path / "fleet_closed.jsonl") == []


def test_spidermon_and_fleet_spidermon_both_enabled_warns(make_site, start_worker,
                                                          redis_server, crawl_id, tmp_path):
    """Spidermon's extension left on beside FleetSpidermon: a warning naming it; its close
    monitors run on the worker's own stats too (here: twice in all, one worker)."""
    site = make_site(pages=5)
    settings = spidermon_settings(tmp_path, 5)
    settings["EXTENSIONS"] = {**EXTENSIONS,
                              "spidermon.contrib.scrapy.extensions.Spidermon": 400}
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings)
    assert w.wait(WAIT) == 0 and w.close_reason() == "finished", w.log_tail(60)
    assert "Both spidermon.contrib.scrapy.extensions.Spidermon and " \
           "scrapy_leased.FleetSpidermon are in EXTENSIONS" in w.log_text()
    assert len(lines(tmp_path / "monitors.jsonl")) == 2


# -- the decision, script by script -------------------------------------------------------

class Fleet:
    """fleet_open / fleet_close called as the workers call them (observe/stats.py)."""

    def __init__(self, r: Any, crawl: str, worker_ttl_ms: int = 60_000) -> None:
        self.r = r
        self.k = CrawlKeys(crawl)
        self.ttl = worker_ttl_ms
        self._open = r.register_script(SCRIPTS.source("fleet_open"))
        self._close = r.register_script(SCRIPTS.source("fleet_close"))
        r.hset(self.k.fleet_stats, mapping={"item_scraped_count": 7})

    def open(self, worker: str) -> None:
        self._open(keys=[self.k.stats_open, self.k.closed_by], args=[worker, 3 * self.ttl])

    def close(self, worker: str) -> bool:
        out = self._close(keys=[self.k.stats_open, self.k.workers, self.k.fleet_stats,
                                self.k.closed_by], args=[worker, self.ttl, 3_600_000])
        if int(out[0]) == 1:
            assert dict(zip(out[1][::2], out[1][1::2])) == {b"item_scraped_count": b"7"}
            return True
        return False


def test_of_two_closing_together_only_the_second_is_last(redis_server, crawl_id):
    f = Fleet(redis_server.client(), crawl_id)
    f.open("a")
    f.open("b")
    assert f.close("a") is False  # b's final stats are still to come
    assert f.close("b") is True
    # each one's call sent again after a lost reply answers the same
    assert f.close("b") is True
    assert f.close("a") is False


def test_a_worker_still_crawling_is_waited_for(redis_server, crawl_id):
    """A worker whose scheduler is in the registry but whose stats extension has not
    opened yet (scheduler open comes before spider_opened) keeps the run open."""
    r = redis_server.client()
    f = Fleet(r, crawl_id)
    f.open("a")
    r.zadd(f.k.workers, {"b": int(r.time()[0]) * 1000})
    assert f.close("a") is False
    r.zrem(f.k.workers, "b")
    f.open("b")
    assert f.close("b") is True


def test_a_new_run_gets_its_own_fleet_closed(redis_server, crawl_id):
    f = Fleet(redis_server.client(), crawl_id)
    f.open("a")
    assert f.close("a") is True
    f.open("a")  # the same worker id, started again: a new run
    f.open("c")
    assert f.close("c") is False
    assert f.close("a") is True


def test_a_worker_killed_while_closing_holds_the_run_until_its_ttl(redis_server, crawl_id):
    """A worker killed after it left the registry, before its final stats flush, counts as
    live for the worker TTL since it was last seen: a worker closing within it is not the
    last; the first one closing after it is."""
    f = Fleet(redis_server.client(), crawl_id, worker_ttl_ms=300)
    f.open("killed")
    f.open("a")
    f.open("b")
    assert f.close("a") is False
    deadline = time.monotonic() + 30
    while f.r.zscore(f.k.stats_open, "killed") is not None and not f.close("b"):
        f.open("b")  # b is still crawling: its heartbeat
        time.sleep(0.02)
        assert time.monotonic() < deadline, "the killed worker never stopped counting"
    assert f.r.exists(f.k.stats_open) == 0


def test_eight_workers_closing_at_once_one_is_last(redis_server, crawl_id):
    """8 workers' final calls sent at the same moment, on 8 connections: one is last."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    workers = [f"w{i}" for i in range(8)]
    fleets = [Fleet(redis_server.client(), crawl_id) for _ in workers]
    for f, w in zip(fleets, workers):
        f.open(w)
    barrier = Barrier(len(workers))

    def close(i: int) -> bool:
        barrier.wait()
        return fleets[i].close(workers[i])

    with ThreadPoolExecutor(len(workers)) as pool:
        answers = list(pool.map(close, range(len(workers))))
    assert answers.count(True) == 1, answers


def test_a_worker_killed_while_crawling_is_not_waited_for(redis_server, crawl_id):
    """A worker in stats_open (seen a moment ago) but still in the registry with a
    heartbeat older than the worker TTL was killed while crawling: not waited for."""
    r = redis_server.client()
    f = Fleet(r, crawl_id, worker_ttl_ms=5_000)
    f.open("killed")
    f.open("a")
    sec, usec = r.time()
    now = int(sec) * 1000 + int(usec) // 1000
    r.zadd(f.k.workers, {"killed": now - 1_000})
    assert f.close("a") is False  # its heartbeat is young: maybe crawling
    f.open("a")
    r.zadd(f.k.workers, {"killed": now - 6_000})
    assert f.close("a") is True
