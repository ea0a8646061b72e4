"""Feed exports (FEEDS, ``-o``/``-O``) in a fleet (issue #25, item 5; worker/feedexports.py).

Real ``scrapy crawl`` workers (tests/project) against a private redis-server and the
local test site:

- kill -9 of 1 of 2 workers writing ``-O items-%(worker)s.jsonl``: every page of the
  site is done and its item is in the union of the feed files (the feeds are flushed
  before each commit that acks pages; before, the killed worker's buffered items of
  acked pages were lost and never fetched again);
- two workers with one fixed FEEDS path: the second stops at open with one error
  naming FEEDS and the file, leaves nothing in the registry, and the first finishes the
  crawl with every item in its file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for

LEASE = 2.0
BASE = {"LEASED_LEASE_SECONDS": LEASE, "LEASED_SWEEP_INTERVAL": 0.5}


def feed_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON-lines feed, each parsed (a torn last line, written when the
    worker was killed, is the only one allowed not to parse)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            assert i == len(lines) - 1, f"{path}: line {i + 1} is not JSON: {line[:80]!r}"
    return out


def test_kill9_of_one_of_two_workers_loses_no_item_of_an_acked_page(
        redis_server, crawl_id, make_site, start_worker, tmp_path):
    n_pages = 300
    site = make_site(pages=n_pages)
    r = redis_server.client(decode_responses=True)
    keys = CrawlKeys(crawl_id)
    feeds = tmp_path / "feeds"
    hold = tmp_path / "go"
    cli = ["-O", str(feeds / "items-%(worker)s.jsonl")]
    barrier = start_worker.barrier(2)
    # The victim crawls slowly (100 ms per item, 2 at a time); the survivor's items wait
    # in its pipeline until `hold` exists, so until the kill every ack is the victim's.
    victim = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="victim",
                          settings={**BASE, **barrier, "CONCURRENT_REQUESTS": 2,
                                    "RECORD_DELAY": 0.1}, cli=cli)
    survivor = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="survivor",
                            settings={**BASE, **barrier, "CONCURRENT_REQUESTS": 2,
                                      "RECORD_HOLD_FILE": str(hold)}, cli=cli)
    wait_for(lambda: int(r.hget(keys.stats, "acked") or 0) >= 10, 60,
             "10 pages acked by the victim", [victim, survivor])
    victim.kill9()
    assert victim.returncode == -9
    acked_by_victim = int(r.hget(keys.stats, "acked") or 0)
    scraped_by_victim = len(victim.items())  # its RecordPipeline flushes every line
    # a JSON line is ~100 bytes and Scrapy's file buffer 8 KiB: without a flush before
    # the ack, none of these items would have left the victim's buffer
    assert 10 <= acked_by_victim <= scraped_by_victim < 50
    hold.touch()
    assert survivor.wait(120) == 0, survivor.log_tail()

    assert int(r.hget(keys.stats, "done") or 0) == n_pages
    files = sorted(feeds.glob("items-*.jsonl"))
    assert len(files) == 2  # one per worker, named by %(worker)s (host-pid-random)
    victim_file = next(f for f in files if f"-{victim.pid}-" in f.name)
    per_file = {f: feed_lines(f) for f in files}
    urls = [it["url"] for items in per_file.values() for it in items]
    expected = {f"{site.url}/p/{i}" for i in range(n_pages)}
    missing = expected - set(urls)
    in_victim_file = len(per_file[victim_file])
    print(f"\nvictim: {acked_by_victim} pages acked, {scraped_by_victim} items scraped, "
          f"{in_victim_file} in its feed; union of the feeds: {len(urls)} lines, "
          f"{len(set(urls))} pages of {n_pages}, {len(urls) - len(set(urls))} duplicates, "
          f"{len(missing)} missing")
    # every page the victim acked has its item in the victim's file
    assert in_victim_file >= acked_by_victim
    assert missing == set()
    assert set(urls) == expected
    # at-least-once: pages the victim processed but had not acked were processed again
    # by the survivor; their items may be in both files, nothing more
    assert len(urls) - n_pages <= scraped_by_victim - acked_by_victim


def test_two_workers_with_one_fixed_feed_path_second_stops_at_open(
        redis_server, crawl_id, make_site, start_worker, tmp_path):
    n_pages = 150
    path = tmp_path / "out" / "items.jsonl"
    hold = tmp_path / "go"
    site = make_site(pages=n_pages)
    r = redis_server.client(decode_responses=True)
    keys = CrawlKeys(crawl_id)
    # overwrite (-O): a second worker opening the file would truncate it
    settings = {**BASE, "CONCURRENT_REQUESTS": 4, "RECORD_HOLD_FILE": str(hold),
                "FEEDS": {str(path): {"format": "jsonlines", "overwrite": True}}}
    # the first one's items wait in its pipeline until `hold` exists: it is alive and
    # crawling while the second opens
    first = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                         name="first")
    first.wait_until(lambda: int(r.hget(keys.stats, "claimed") or 0) >= 1, 60,
                     what="a claim")
    second = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                          name="second")
    assert second.wait(60) == 1
    hold.touch()
    log = second.log_text()
    assert (f"FEEDS: the feed file {path} is written by worker " in log), second.log_tail()
    assert "%(worker)s" in log
    assert second.items() == []  # it crawled nothing
    assert first.running  # it was alive when the second opened: still crawling
    assert first.wait(120) == 0, first.log_tail()
    # the second left nothing in the registry; the first finished the crawl, every item
    # in its file, each line JSON
    assert r.zcard(keys.workers) == 0 or all(
        json.loads(v).get("pid") != second.pid for v in r.hvals(keys.worker_info))
    assert int(r.hget(keys.stats, "done") or 0) == n_pages
    items = feed_lines(path)
    assert len(items) == n_pages
    assert {it["url"] for it in items} == {f"{site.url}/p/{i}" for i in range(n_pages)}


def test_worker_param_wraps_the_projects_feed_uri_params(
        redis_server, crawl_id, make_site, start_worker, tmp_path):
    n_pages = 20
    site = make_site(pages=n_pages)
    template = str(tmp_path / "%(tag)s" / "items-%(worker)s.jsonl")
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0", name="w",
                     settings={"FEED_URI_PARAMS": "testproject.feedparams.params",
                               "FEEDS": {template: {"format": "jsonlines"}}})
    assert w.wait(60) == 0, w.log_tail()
    files = list(tmp_path.glob("tagged-*/items-*.jsonl"))
    assert len(files) == 1, sorted(p.name for p in tmp_path.rglob("*"))
    # host-pid-random: the worker id, file-name safe
    assert f"-{w.pid}-" in files[0].name and ":" not in files[0].name
    assert files[0].parent.name == f"tagged-{files[0].name[len('items-'):][:3]}"
    assert len(feed_lines(files[0])) == n_pages
