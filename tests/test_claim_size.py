"""How many requests a worker claims (scrapy_leased/_claimsize.py): what Scrapy's
downloader counts, plus a margin that adapts, never more than the bound."""

from __future__ import annotations

from pathlib import Path

from scrapy_leased.worker._claimsize import ClaimSizer
from tests.test_crawl import assert_exit


def test_the_margin_follows_claim_latency_over_hand_out_interval_within_bounds():
    s = ClaimSizer(16)
    assert s.margin == 0  # nothing measured yet: claim on demand
    for i in range(50):
        s.handed_out(i * 0.001)  # the engine takes a request every 1 ms
        s.claimed(0.0025)  # a claim takes 2.5 ms: 2.5 hand-outs meanwhile
    assert s.margin == 3
    s = ClaimSizer(16)
    for i in range(50):
        s.handed_out(i * 0.00625)  # 100 ms pages, 16 at a time
        s.claimed(0.002)
    assert s.margin == 1  # a slot would idle 2 % of the time without it
    s = ClaimSizer(16)
    for i in range(50):
        s.handed_out(i * 0.1)  # 1.6 s pages
        s.claimed(0.002)
    assert s.margin == 0  # 0.1 %: not worth a lease held unstarted
    s = ClaimSizer(64)
    for i in range(50):
        s.handed_out(i * 0.0001)
        s.claimed(0.01)
    assert s.margin == 16  # 64 // 4
    assert ClaimSizer(1).upper == 2


def test_a_set_prefetch_replaces_the_margin():
    s = ClaimSizer(16, fixed=0)
    for i in range(50):
        s.handed_out(i * 0.001)
        s.claimed(0.01)
    assert s.margin == 0
    assert ClaimSizer(4, fixed=20).capacity(downloading=0, unstarted=0, held=0) == 24


def test_capacity_counts_downloads_and_unstarted_claims_not_responses_being_processed():
    s = ClaimSizer(16, fixed=2)
    # 16 downloading: 2 more may wait unstarted
    assert s.capacity(downloading=16, unstarted=0, held=16) == 2
    # 10 downloads over, their callbacks running: 10 more may be claimed
    assert s.capacity(downloading=6, unstarted=2, held=18) == 10
    # never more than 2 * 16 + 2 held in all
    assert s.capacity(downloading=0, unstarted=0, held=30) == 4
    assert s.held_bound() == 34


def test_claims_go_in_batches_with_room_for_one_while_the_downloader_is_full():
    s = ClaimSizer(16)  # margin 0 (nothing measured), batch 8
    assert s.batch == 8
    # downloader full, nothing unstarted: room for a batch of 7 (batch - 1), claimed at
    # once since nothing waits to be started
    assert s.capacity(downloading=16, unstarted=0, held=16) == 7
    assert s.worth_claiming(7, unstarted=0)
    # two downloads over while 6 wait unstarted: room for 3, not a batch: wait
    assert s.capacity(downloading=14, unstarted=6, held=20) == 3
    assert not s.worth_claiming(3, unstarted=6)
    # four more taken by the engine: room for 8, a batch
    assert s.capacity(downloading=16, unstarted=0, held=23) == 7
    assert s.capacity(downloading=13, unstarted=2, held=23) == 8
    assert s.worth_claiming(8, unstarted=2)
    assert not s.worth_claiming(0, unstarted=0)
    # never more than 2 * 16 + margin + batch - 1 held
    assert s.held_bound() == 39
    assert s.capacity(downloading=0, unstarted=0, held=39) == 0
    # candidate lanes: as many as the claim asks for, and a few more
    assert s.candidates(8) == 12 and s.candidates(0) == 5
    # a set prefetch claims as before: no batch
    assert ClaimSizer(16, fixed=0).batch == 1
    assert ClaimSizer(1).batch == 1 and ClaimSizer(8).batch == 4


def test_downloads_go_on_while_a_callback_runs(redis_server, make_site, start_worker, crawl_id,
                                               tmp_path: Path):
    """CONCURRENT_REQUESTS = 1, two start pages, each callback waits until the site has
    served both: as under Scrapy's scheduler, the second page is downloaded while the
    first one's callback runs (its download is over, so it no longer counts against
    CONCURRENT_REQUESTS); counting it until its callback ended would never get there."""
    log = tmp_path / "site.jsonl"
    site = make_site(pages=2, log_path=log)
    w = start_worker(redis_server.url, crawl_id, f"{site.url}/p/0,{site.url}/p/1",
                     settings={"CONCURRENT_REQUESTS": 1},
                     args={"hold_log": str(log), "hold_count": 2})
    assert_exit(w, "finished")
    items = w.items()
    # /p/1 twice, as under Scrapy: as a start request (dont_filter, so not in the seen
    # set) and as /p/0's link
    assert sorted({it["url"].rsplit("/", 1)[1] for it in items}) == ["0", "1"], items
    assert all(it["held_until"] for it in items), items
