"""Running a spider again (#25 item 1), with Scrapy's user in mind: a new ``scrapy
crawl`` of a crawl that *finished* starts afresh by default (its seen set, queue and
dead letters cleared, UpsertPipeline's records kept), as a plain Scrapy crawl does;
``LEASED_RESUME = True`` continues it instead (only what is new is crawled); a crawl
with work left (a fleet killed or stopped mid-crawl, URLs seeded or fed ahead) is always
continued, so nothing is lost. The first lines say which at WARNING, and how to get the
other. Real ``scrapy crawl`` workers, a real redis-server, the local test site.

tests/project's settings keep ``LEASED_RESUME = True`` for the fault tests, which restart
crawls on purpose; here ``TESTPROJECT_DEFAULT_RESUME=1`` leaves the setting unset, so
the worker runs with the plugin's default."""

from __future__ import annotations

import redis

from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for

DEFAULT = {"TESTPROJECT_DEFAULT_RESUME": "1"}  # LEASED_RESUME unset: the default
FAST = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5, "LEASED_WORKER_TTL": 2}
PAGES = 30
WAIT = 120


def finished(w) -> None:
    assert w.wait(WAIT) == 0, w.log_tail(60)
    assert w.close_reason() == "finished", w.log_tail(60)
    assert "Traceback" not in w.log_text(), w.log_tail(80)


def warnings(w) -> list[str]:
    return [line for line in w.log_text().splitlines() if "WARNING" in line and
            "scrapy_leased" in line and "crawl" in line.lower()]


def test_a_finished_crawl_runs_again_in_full_by_default(redis_server, make_site,
                                                        start_worker, crawl_id):
    site = make_site(pages=PAGES)
    first = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="first",
                         settings=FAST, env=DEFAULT)
    finished(first)
    assert len({it["url"] for it in first.items()}) == PAGES
    site.clear_log()
    again = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="again",
                         settings=FAST, env=DEFAULT)
    finished(again)
    assert len({it["url"] for it in again.items()}) == PAGES  # all of it, not 1
    assert sum(site.count_by_path().values()) == PAGES  # each page fetched once
    said = warnings(again)
    assert any("afresh" in line and "LEASED_RESUME" in line for line in said), said
    r = redis.Redis.from_url(redis_server.url)
    assert int(r.hget(CrawlKeys(crawl_id).stats, "done") or 0) == PAGES  # this run's


def test_leased_resume_crawls_only_what_is_new(redis_server, make_site, start_worker,
                                               crawl_id):
    site = make_site(pages=PAGES)
    resume = {**FAST, "LEASED_RESUME": True}
    finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="first",
                          settings=resume, env=DEFAULT))
    site.clear_log()
    again = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="again",
                         settings=resume, env=DEFAULT)
    finished(again)
    # the start request keeps Scrapy's dont_filter=True; every link was seen before
    assert site.count_by_path() == {"/p/0": 1}, site.count_by_path()
    said = warnings(again)
    assert any("LEASED_RESUME" in line and "seen before" in line for line in said), said


def test_a_crawl_with_work_left_is_continued(redis_server, make_site, start_worker,
                                             crawl_id):
    """A fleet killed mid-crawl: the next worker continues it (by default, without
    LEASED_RESUME), nothing lost, and says so at WARNING."""
    site = make_site(pages=200, delay=0.05)
    r = redis.Redis.from_url(redis_server.url)
    k = CrawlKeys(crawl_id)
    first = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="first",
                         settings=FAST, env=DEFAULT)
    wait_for(lambda: int(r.hget(k.stats, "done") or 0) >= 20, WAIT, "20 pages done", [first])
    first.kill9()

    def gone() -> bool:  # its heartbeat older than the worker TTL: no worker alive
        now_s, now_us = r.time()
        beats = r.zrange(k.workers, 0, -1, withscores=True)
        return all(now_s * 1000 + now_us // 1000 - beat > 2000 for _, beat in beats)

    wait_for(gone, WAIT, "the killed worker's heartbeat older than its TTL")
    again = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="again",
                         settings=FAST, env=DEFAULT)
    finished(again)
    # every page done (the start request once more if the new worker seeded again)
    assert int(r.hget(k.stats, "done") or 0) in (200, 201)
    assert set(site.count_by_path()) == {f"/p/{i}" for i in range(200)}
    assert int(r.hget(k.stats, "dead") or 0) == 0
    said = warnings(again)
    assert any("continuing" in line for line in said), said


def test_a_crawl_seeded_ahead_is_continued_not_flushed(redis_server, make_site,
                                                       start_worker, crawl_id):
    """URLs seeded into a finished crawl before its next run are that run's work."""
    from tests.test_commands import leased, ok

    site = make_site(pages=PAGES)
    finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="first",
                          settings=FAST, env=DEFAULT))
    extra = f"{site.url}/p/0?again=1"
    ok(leased("seed", crawl_id, extra, "--redis-url", redis_server.url))
    site.clear_log()
    again = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="again",
                         settings=FAST, env=DEFAULT)
    finished(again)
    assert site.count_by_path()["/p/0?again=1"] == 1, site.count_by_path()
    said = warnings(again)
    assert any("work left" in line and "LEASED_FLUSH_ON_START" in line for line in said), said
