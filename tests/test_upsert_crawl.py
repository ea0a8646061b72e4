"""UpsertPipeline in real ``scrapy crawl`` workers (tests/project), in each backend:

- a request processed twice (its worker killed -9 after the upsert, before the ack)
  leaves one record per key, with the content of the latest processing;
- a worker SIGSTOPped past its lease while another re-processes its request, then
  SIGCONTinued, cannot overwrite the newer record: its write is counted as stale;
- PostgreSQL down mid-crawl: the affected requests fail and are retried; nothing is
  lost once it is back;
- every item kind through a real crawl, errback items unfenced, keyless items dropped.
"""

from __future__ import annotations

from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.redis_server import free_port
from tests.support.upsert import PostgresServer, pg_records

# Short leases so a dead or frozen worker's requests come back quickly.
FAST_LEASES = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5}




def fleet_stats(redis_server, crawl_id) -> dict[str, int]:
    raw = redis_server.client().hgetall(CrawlKeys(crawl_id).stats)
    return {k.decode(): int(v) for k, v in raw.items()}


def test_processed_twice_after_kill9_between_upsert_and_ack(target, redis_server, crawl_id,
                                                            make_site, start_worker):
    site = make_site(pages=30)
    slow = f"{site.url}/p/7"
    settings = {**target.settings, **FAST_LEASES}
    # Worker A stores /p/7's item (UpsertPipeline, 800), then waits in RecordPipeline
    # (moved to 900, after it) for 120 s: killed there, it never acks /p/7.
    a = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="A", settings={
        **settings, "ITEM_PIPELINES": {"testproject.pipelines.RecordPipeline": 900},
        "RECORD_DELAY": 120, "RECORD_DELAY_PATH": "/p/7"})
    a.wait_until(lambda: slow in target.records(), 90, what="the upsert of /p/7")
    first = target.records()[slow]
    assert first["item"]["worker"] == "A"
    a.kill9()
    assert fleet_stats(redis_server, crawl_id).get("done", 0) < 30

    b = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="B", settings=settings)
    assert b.wait(120) == 0, b.log_tail()
    assert b.close_reason() == "finished"

    records = target.records()
    assert set(records) == {f"{site.url}/p/{i}" for i in range(30)}  # one record per key
    again = records[slow]
    assert again["item"]["worker"] == "B"  # the latest processing
    assert again["fence"] > first["fence"]
    assert site.count_by_path()["/p/7"] == 2  # it was processed twice
    stats = fleet_stats(redis_server, crawl_id)
    assert stats["done"] == 30 and stats.get("dead", 0) == 0
    assert b.stats().get("leased/upsert/stale", 0) == 0


def test_a_worker_frozen_past_its_lease_cannot_overwrite_the_newer_record(
        target, redis_server, crawl_id, make_site, start_worker):
    site = make_site(pages=1)  # one page, no links
    url = site.url + "/p/0"
    settings = {**target.settings, **FAST_LEASES}
    # A downloads /p/0, then its callback waits 10 s before yielding the item: A is
    # frozen (SIGSTOP) in that wait and stays frozen well past its 2 s lease.
    a = start_worker(redis_server.url, crawl_id, url, name="A", settings=settings,
                     args={"slow_path": "/p/0", "slow_seconds": 10})
    a.wait_until(lambda: site.count_by_path().get("/p/0", 0) >= 1, 60, what="A fetching /p/0")
    # and done seeding (its start() exhausted, the run marked seeded): frozen before
    # that, A would look to B like a seeder that died, and B would run start() again,
    # a second (dont_filter) copy of /p/0, fetched a third time
    r, run_key = redis_server.client(), CrawlKeys(crawl_id).run
    a.wait_until(lambda: r.get(run_key) == b"seeded", 60, what="A marking the run seeded")
    a.sigstop()

    b = start_worker(redis_server.url, crawl_id, url, name="B", settings=settings)
    assert b.wait(120) == 0, b.log_tail()  # recovered A's lease, processed, acked
    assert b.close_reason() == "finished"
    newer = target.records()[url]
    assert newer["item"]["worker"] == "B"

    a.sigcont()  # A wakes up, yields its (stale) item and tries to store it
    assert a.wait(120) == 0, a.log_tail()
    assert a.stats().get("leased/upsert/stale") == 1, a.log_tail()
    assert "Rejected a stale write" in a.log_text()
    assert a.stats().get("leased/upsert/written", 0) == 0
    final = target.records()[url]
    assert final["item"]["worker"] == "B" and final["fence"] == newer["fence"]
    assert site.count_by_path()["/p/0"] == 2


def test_postgresql_down_mid_crawl_fails_requests_then_loses_nothing(
        redis_server, crawl_id, make_site, start_worker):
    pg = PostgresServer()  # a private server this test may crash
    try:
        pg.start()
        site = make_site(pages=60)
        w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings={
            "LEASED_UPSERT_URL": pg.url, "LEASED_MAX_ATTEMPTS": 1000, "DOWNLOAD_DELAY": 0.2,
            "CONCURRENT_REQUESTS": 2})
        w.wait_until(lambda: len(pg_records(pg.url, "records_dict")) >= 5, 90,
                     what="5 records in PostgreSQL")
        pg.stop()  # immediate shutdown: a crash under the crawl
        w.wait_until(lambda: fleet_stats(redis_server, crawl_id).get("failed", 0) >= 3, 90,
                     what="requests failing while PostgreSQL is down")
        assert w.running
        pg.start()
        assert w.wait(180) == 0, w.log_tail()
        assert w.close_reason() == "finished"

        records = pg_records(pg.url, "records_dict")
        assert set(records) == {f"{site.url}/p/{i}" for i in range(60)}
        stats = fleet_stats(redis_server, crawl_id)
        assert stats["done"] == 60 and stats.get("dead", 0) == 0 and stats["failed"] >= 3
        assert redis_server.client().hlen(CrawlKeys(crawl_id).dead) == 0
        ws = w.stats()
        assert ws["leased/upsert/errors"] >= 3 and ws["leased/failed"] >= 3
        assert "cannot write" in w.log_text() and "PostgreSQL" in w.log_text()
    finally:
        pg.close()


def test_every_item_kind_in_a_real_crawl(target, redis_server, crawl_id, site, start_worker):
    dead_url = f"http://127.0.0.1:{free_port()}"
    w = start_worker(redis_server.url, crawl_id, None, spider="upsert_types", settings={
        **target.settings, "LEASED_MAX_ATTEMPTS": 1, "RETRY_TIMES": 0},
        args={"base": site.url, "dead_url": dead_url})
    assert w.wait(120) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    page = f"{site.url}/p/1"
    dicts = target.records("dict")
    assert set(dicts) == {page, f"{dead_url}/x"}
    assert dicts[page]["fence"] > 0  # noted by the fence middleware
    assert dicts[f"{dead_url}/x"]["fence"] == 0  # from an errback: unfenced
    assert dicts[f"{dead_url}/x"]["item"]["kind"] == "errback"
    host = site.url.split("//", 1)[1]
    expected = {"page_item": page, "data_page": "/p/1", "attrs_page": f'["{host}","/p/1"]',
                "pydantic_page": page}
    for table, key in expected.items():
        records = target.records(table)
        assert list(records) == [key], (table, records)
        assert records[key]["fence"] == dicts[page]["fence"]
    stats = w.stats()
    assert stats["leased/upsert/written"] == 6
    assert stats["leased/upsert/missing_key"] == 1 and stats["leased/upsert/unfenced"] == 1
    assert "LEASED_UPSERT_KEY" in w.log_text()
