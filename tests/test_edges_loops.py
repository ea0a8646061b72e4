"""No background task of a worker ends silently (issue #24, "What to build" 2).

Each test runs a real ``scrapy crawl`` worker (tests/project) against a private
``redis-server`` and the local test site, with a bug injected in one of its background
loops (tests/support/bugs.py: one real method patched to raise ``InjectedBug`` once;
everything else is the real code). The worker must stop with the close reason
``leased_error`` and a CRITICAL traceback naming the loop, its process must end, and
nothing may be lost: a second worker started afterwards finishes the crawl, every page
done once. Leases are long (60 s) where the worker must give back what it holds when it
stops: a claim left held would keep the second worker from finishing within the test's
time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_leased.fleet.stats import decode_fleet_stats
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.bugs import BUG_LANE, InjectedBug
from tests.support.upsert import make_target
from tests.support.workers import wait_for
from tests.test_faults import CrawlState, assert_every_page_fetched, site_counts
from tests.test_frontier import run

N_PAGES = 60
LONG_LEASE = 60.0
BUG_EXT = {"EXTENSIONS": {"testproject.extensions.FleetBarrier": 0,
                          "tests.support.bugs.InjectBug": 0}}
# slow callbacks (0.25 s, 4 at a time): the bug hits while most of the crawl is left
SLOW = {"slow_path": "/p/", "slow_seconds": "0.25", "start_filter": "1"}
BASE = {"LEASED_RENEW_INTERVAL": 0.3, "LEASED_SWEEP_INTERVAL": 0.3, "CONCURRENT_REQUESTS": 4}

# bug -> (the task named in the log, the patched call that raises, lease seconds)
CASES = {
    "claim": ("the claim loop", 3, LONG_LEASE),
    "writer_before": ("the commit writer", 3, LONG_LEASE),
    "writer_after": ("the commit writer", 3, LONG_LEASE),
    "renew": ("the lease renewals", 3, LONG_LEASE),
    "sweep": ("the recovery of expired leases", 3, LONG_LEASE),
    "stats": ("the fleet stats flush", 2, LONG_LEASE),
    "logstats": ("the fleet log line", 2, LONG_LEASE),
    "watch": ("the penalty watch", 1, LONG_LEASE),
    # the items of the batch in flight fail (their requests are retried by the rerun)
    "upsert": ("the item writer of UpsertPipeline", 2, LONG_LEASE),
    # the feed batch taken goes back to the feed after its lease (no script gives it
    # back sooner): a short lease
    "feed": ("the feed drain", 1, 2.0),
}


def _publish_until_stopped(redis_server, crawl_id: str, worker) -> None:
    """Publish ``BUG_LANE`` on the crawl's penalty channel until the worker stops (its
    penalty watch subscribes once it starts downloading)."""
    r = redis_server.client()
    channel = CrawlKeys(crawl_id).penalties
    deadline = time.monotonic() + 25
    while worker.running and time.monotonic() < deadline:
        r.publish(channel, BUG_LANE)
        time.sleep(0.1)


@pytest.mark.parametrize("bug", list(CASES))
def test_a_bug_in_a_loop_stops_the_worker_and_loses_nothing(
        bug, redis_server, crawl_id, make_site, start_worker, tmp_path):
    task, nth, lease = CASES[bug]
    site = make_site(pages=N_PAGES)
    st = CrawlState(redis_server, crawl_id)
    common = {**BASE, "LEASED_LEASE_SECONDS": lease}
    target = None
    if bug == "upsert":
        target = make_target("redis", redis_server=redis_server, crawl_id=crawl_id,
                             tmp_path=tmp_path)
        common.update(target.settings)
    settings = {**common, **BUG_EXT, "TEST_BUG": bug, "TEST_BUG_CALL": nth}
    if bug == "logstats":
        settings["LEASED_LOGSTATS_INTERVAL"] = 0.2
    if bug == "feed":  # every page pushed to the feed before the worker starts
        st.r.rpush(st.k.feed, *[json.dumps({"url": site.page_url(i)})
                                for i in range(N_PAGES)])
    a = start_worker(redis_server.url, crawl_id, site.url + "/p/0", settings=settings,
                     args=SLOW, name="buggy")
    if bug == "watch":
        _publish_until_stopped(redis_server, crawl_id, a)
    assert a.wait(30) == 0, a.log_tail(80)  # the process ends: it does not hang
    log = a.log_text()
    assert a.close_reason() == "leased_error", a.log_tail(80)
    assert f"CRITICAL: Unexpected error in {task} of this worker (a bug)" in log, log[-4000:]
    assert "Traceback (most recent call last)" in log
    assert "tests.support.bugs.InjectedBug: injected bug in" in log
    assert a.stats()["leased/task_errors"] == 1
    assert st.stat("done") < N_PAGES, "the bug came after the crawl was done"
    # what it held and had not started went back at once (leases of 60 s otherwise)
    if lease == LONG_LEASE:
        assert st.r.zcard(st.k.leases) == 0

    b = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings=common,
                     args={"start_filter": "1"}, name="rerun")
    assert b.wait(30) == 0, b.log_tail(80)
    assert b.close_reason() == "finished", b.log_tail(80)
    assert "Traceback" not in b.log_text(), b.log_tail(80)
    stats = st.stats()
    assert stats["done"] == N_PAGES
    assert stats["acked"] == N_PAGES  # nothing acked twice (writer_after: the same call id)
    assert stats["enqueued"] == N_PAGES
    assert "recovered" not in stats  # nothing waited for its lease to expire
    assert st.dead() == {}
    st.assert_drained()
    counts = site_counts(site)
    assert_every_page_fetched(site, counts)
    again = {p for p, c in counts.items() if c > 1}
    items = [i["url"] for i in a.items() + b.items()]
    if target is None:
        assert not again, again
        assert len(items) == len(set(items)) == N_PAGES
    else:  # the requests of the items that failed with the batch were processed again
        assert again and set(counts.values()) == {1, 2}
        assert stats["failed"] == len(again)
        assert set(target.records()) == {site.page_url(i) for i in range(N_PAGES)}


# -- hostile input to the loops (no bug injected) --------------------------------------

#: Messages anyone can publish on a crawl's penalty channel that cannot be a lane (a
#: lane is UTF-8 text, lower case, without "|": Budgets.lane_of): skipped and counted
NOT_LANES = [
    b"\xff\xfe\x00\x80",  # not UTF-8
    b"\xed\xa0\xbd",  # a lone surrogate, UTF-8-encoded (not valid UTF-8)
    b"NaN", b"Infinity", b"-Infinity",
    b"a|b",  # "|" separates an envelope's fields: lane_of never makes one
    b'{"Lane": null}',
    b"X" * 100_000,  # huge: the log line shows its start only
]
#: Messages that can be lanes (unknown to the crawl, or its own): noted, harmless
MAYBE_LANES = [b"", b"nan", b"1e999999", b"-0", b"null", b"[]", b'{"lane": [1, 2.5e308]}',
               b"unknown-lane.invalid", b"127.0.0.1"]


def test_hostile_messages_on_the_penalty_channel_are_skipped_and_counted(
        redis_server, crawl_id, make_site, start_worker):
    """Anyone can PUBLISH on a crawl's penalty channel. While a worker's pages are held
    (its penalty watch subscribed, the crawl unable to end), messages that cannot be a
    lane (not UTF-8, a lone surrogate, NaN, "|", upper case, 100,000 bytes) and text
    that can be one (an unknown lane, "nan", a huge number, JSON of any shape, the
    crawl's own lane) are published. The watch keeps listening: each message that
    cannot be a lane is counted in leased/penalty_skipped (in the fleet stats while the
    crawl runs) and logged once, shortened; the others only cost a check at download
    time. The crawl then finishes, every page once, nothing dead, no traceback."""
    pages = 30
    site = make_site(pages=pages)
    cs = CrawlState(redis_server, crawl_id)
    channel = cs.k.penalties
    site.hold()
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_RENEW_INTERVAL": 0.3})
    wait_for(lambda: cs.r.pubsub_numsub(channel)[0][1] >= 1, 60,
             "the worker's penalty watch subscribed", [w])
    for message in NOT_LANES + MAYBE_LANES + NOT_LANES[:2]:
        assert cs.r.publish(channel, message) == 1  # the worker's watch heard it
    skipped = len(NOT_LANES) + 2

    def counted() -> int:
        return int(decode_fleet_stats(cs.r.hgetall(cs.k.fleet_stats).items())
                   .get("leased/penalty_skipped", 0))

    wait_for(lambda: counted() == skipped, 60, f"{skipped} messages skipped, counted", [w])
    assert w.running
    site.release()
    assert w.wait(60) == 0, w.log_tail(80)
    assert w.close_reason() == "finished", w.log_tail(80)
    log = w.log_text()
    assert "Traceback" not in log and "CRITICAL" not in log, w.log_tail(80)
    said = [line for line in log.splitlines() if "Skipped a message on the penalty" in line]
    assert len(said) == 1 and "WARNING" in said[0] and len(said[0]) < 600, said
    assert w.stats()["leased/penalty_skipped"] == skipped
    assert cs.stat("done") == pages and cs.dead() == {}
    cs.assert_drained()
    assert_every_page_fetched(site, site_counts(site))
    assert max(site_counts(site).values()) == 1


@given(st.text(max_size=50))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_every_lane_lane_of_makes_is_a_lane_name_of_the_watch(text):
    """lane_name accepts every lane Budgets.lane_of can make (from meta leased_lane,
    any text), so a real penalty is never skipped as hostile."""
    from scrapy import Request
    from scrapy.settings import Settings

    from scrapy_leased.ratelimit.watch import lane_name
    from scrapy_leased.settings import Budgets

    lane = Budgets.from_settings(Settings()).lane_of(
        Request("http://example.com/", meta={"leased_lane": text}))
    assert lane_name(lane.encode()) == lane and lane_name(lane) == lane


# -- the pieces, in one process (real redis-server, real Frontier) --------------------

@pytest.mark.parametrize("applied", [False, True], ids=["before_send", "after_send"])
def test_the_writer_holds_a_batch_a_bug_hit_and_resends_it_once_under_its_call_id(
        applied, redis_server, crawl_id):
    """A bug in the middle of a commit (before it was sent, or after Redis applied it:
    its reply lost to the bug): the writer stops, holds the batch, sends nothing new;
    the final drain sends it again unchanged under the same call id (applied once: its
    acks and the stats riding along counted once), then what came meanwhile."""
    keys = CrawlKeys(crawl_id)

    async def body(f, r):
        from scrapy_leased.frontier import NewRequest
        from scrapy_leased.frontier.writer import CommitWriter

        await f.enqueue([NewRequest(f"p{i}") for i in range(6)])
        claims = (await f.claim(6, "w")).claims
        sent: list[str] = []
        original = f.commit

        async def commit(*args, call_id=None, **kwargs):
            sent.append(call_id)
            if len(sent) == 1:
                if applied:
                    await original(*args, call_id=call_id, **kwargs)
                raise InjectedBug("injected")
            return await original(*args, call_id=call_id, **kwargs)

        f.commit = commit
        bugs: list[tuple[str, BaseException]] = []
        results: list[object] = []
        writer = CommitWriter(f, lambda batch, result: results.append(result),
                              on_bug=lambda name, exc: bugs.append((name, exc)))
        writer.stats_delta = lambda: ["i", "loops/x", "1"]
        for token, env in claims[:3]:
            writer.add_ack(token, env.rid)
        writer.add_request(NewRequest("child"), "child")
        writer.flush()
        while not bugs:
            await asyncio.sleep(0.01)
        assert bugs[0][0] == "the commit writer" and isinstance(bugs[0][1], InjectedBug)
        assert writer.broken is bugs[0][1]
        for token, env in claims[3:]:  # nothing new is sent by a broken writer
            writer.add_ack(token, env.rid)
        assert not await writer.drain(timeout=0.5)
        assert len(sent) == 1 and results == []
        assert await writer.drain(timeout=10, final=True)
        assert sent[1] == sent[0] and sent[2] != sent[0]  # held batch first, its own id
        assert len(results) == 2 and len(bugs) == 1
        stats = r.hgetall(keys.stats)
        assert int(stats["acked"]) == 6 and int(stats["enqueued"]) == 7
        assert r.hget(keys.fleet_stats, "loops/x") == "2"  # once per batch, not per try
        assert r.zcard(keys.leases) == 0

    run(redis_server, crawl_id, body)


def test_supervise_reports_a_bug_and_never_swallows_a_cancellation(caplog):
    from scrapy_leased._supervise import supervise

    async def main() -> None:
        bugs: list[tuple[str, BaseException]] = []

        async def forever() -> None:
            await asyncio.sleep(3600)

        async def buggy() -> None:
            await asyncio.sleep(0)
            raise InjectedBug("boom")

        task = supervise("a loop", forever(), lambda n, e: bugs.append((n, e)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and bugs == []
        task = supervise("the other loop", buggy(), lambda n, e: bugs.append((n, e)))
        await task  # ended (the exception went to on_bug, logged)
        assert [(n, type(e)) for n, e in bugs] == [("the other loop", InjectedBug)]

    with caplog.at_level(logging.CRITICAL, logger="scrapy_leased._supervise"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if r.name == "scrapy_leased._supervise"]
    assert record.levelname == "CRITICAL" and record.exc_info is not None
    assert "Unexpected error in the other loop of this worker" in record.getMessage()
