"""Feeding a crawl from outside its workers (scrapy_leased/feed/, docs/feed.md): a
producer pushing JSON requests to the crawl's feed LIST with plain redis-py while
workers run, ``Crawl.push`` from Python, ``scrapy leased seed`` with JSON lines; real
``scrapy crawl`` workers of the test project's ``feed`` spider (it records what each
request that reached a callback carried) against a real redis-server and the local
test site."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from scrapy import Request

from scrapy_leased import Crawl
from scrapy_leased.feed import FeedEntryError, parse_entry
from scrapy_leased.frontier import as_str
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.workers import wait_for
from tests.test_commands import leased, ok
from tests.test_crawl import assert_drained, assert_each_once, assert_exit, crawl_state, stat

FAST = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5, "LEASED_KEEP_ALIVE": True}
WAIT = 180  # hang guard, not a check


def entry(site_url: str, i: int) -> dict:
    """The i-th request a producer sends: GETs and POSTs, meta, priorities, callbacks."""
    url = f"{site_url}/p/{i}"
    kind = i % 4
    if kind == 0:
        return {"url": url}
    if kind == 1:
        return {"url": url, "method": "POST", "body": json.dumps({"i": i, "q": "é"}),
                "headers": {"Content-Type": "application/json"}, "callback": "parse_feed",
                "meta": {"i": i, "tags": ["a", "b"], "nested": {"x": i, "y": None}}}
    if kind == 2:
        return {"url": url, "priority": i % 7 - 3, "callback": "parse_other", "meta": {"i": i}}
    return {"url": url, "dont_filter": True, "callback": "parse_feed",
            "meta": {"i": i, "when": "2026-12-01"}}


def expected_item(e: dict) -> dict:
    return {"url": e["url"], "method": e.get("method", "GET"), "body": e.get("body", ""),
            "meta": e.get("meta", {}), "priority": e.get("priority", 0),
            "callback": e.get("callback", "parse")}


def malformed(site_url: str) -> dict[bytes, str]:
    """Ten unreadable entries, each with (part of) the reason it is dead-lettered for."""
    page = f"{site_url}/p/1050"
    return {
        b'{"url": "' + page.encode() + b'", ': "not valid JSON",
        b'["not", "an", "object"]': "not a URL",
        b'{"url": 5}': "'url' must be a JSON string",
        json.dumps({"href": page}).encode(): "unknown field 'href'",
        json.dumps({"url": "no-scheme/p/1"}).encode(): "not a URL",
        json.dumps({"url": page, "callback": "nope"}).encode():
            "callback 'nope' is not a method of spider 'feed'",
        json.dumps({"url": page, "encoding": "bogus"}).encode():
            "not a request Scrapy takes (LookupError",
        json.dumps({"url": page, "body": "a", "body_base64": "YQ=="}).encode():
            "both 'body' and 'body_base64'",
        # nested deeper than Python's json reads (RecursionError)
        b'{"url": "' + page.encode() + b'", "meta": {"a": ' + b"[" * 3000 + b"]" * 3000
        + b"}}": "nested too deeply",
        b"\xff\xfe" + page.encode(): "not UTF-8",
    }


def feed_left(r, crawl_id: str) -> int:
    k = CrawlKeys(crawl_id)
    return r.llen(k.feed) + r.hlen(k.feed_taken)


def items_by_url(start_worker) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for item in start_worker.all_items():
        out.setdefault(item["url"], []).append(item)
    return out


def stop_fleet(url: str, crawl_id: str, workers) -> None:
    ok(leased("stop", crawl_id, "--redis-url", url))
    for w in workers:
        assert_exit(w, "leased_stopped", timeout=WAIT)


def feed_workers(start_worker, redis_server, crawl_id, n=2, settings=None):
    workers = [start_worker(redis_server.url, crawl_id, None, name=f"w{i}", spider="feed",
                            settings={**FAST, **(settings or {})}) for i in range(n)]
    r = redis_server.client()
    wait_for(lambda: r.zcard(CrawlKeys(crawl_id).workers) == n, WAIT,
             f"{n} workers registered", workers)
    return workers


def test_a_producer_feeds_a_running_fleet_with_full_requests(redis_server, make_site,
                                                               start_worker, crawl_id):
    """1,000 JSON requests (GET and POST with bodies, meta, priorities, callbacks,
    dont_filter) pushed with plain redis-py RPUSH while 2 workers run, with 10 unreadable
    entries among them: each request fetched once and reaches its callback with what was
    sent; the 10 end in the dead letters with their reason; nothing is left in the feed."""
    site = make_site(pages=1100)
    r = redis_server.client()
    workers = feed_workers(start_worker, redis_server, crawl_id)
    keys = CrawlKeys(crawl_id)
    entries = [entry(site.url, i) for i in range(1000)]
    bad = malformed(site.url)
    raw = [json.dumps(e).encode() for e in entries]
    for chunk, bad_entry in zip(range(0, 1000, 100), bad):  # a bad entry in each chunk
        r.rpush(keys.feed, *raw[chunk:chunk + 50], bad_entry, *raw[chunk + 50:chunk + 100])
    wait_for(lambda: stat(r, crawl_id, "done") == 1000 and r.hlen(keys.dead) == 10
             and feed_left(r, crawl_id) == 0, WAIT, "1000 done and 10 dead letters", workers)
    stop_fleet(redis_server.url, crawl_id, workers)

    by_url = items_by_url(start_worker)
    assert set(by_url) == {e["url"] for e in entries}
    for e in entries:
        got = by_url[e["url"]]
        assert len(got) == 1, got
        item = {k: got[0][k] for k in ("url", "method", "body", "meta", "priority", "callback")}
        assert item == expected_item(e)
    log = site.entries()
    assert_each_once(Counter(x["path"] for x in log), {f"/p/{i}" for i in range(1000)})
    posts = {x["path"]: x["body"] for x in log if x["method"] == "POST"}
    assert posts == {f"/p/{i}": entries[i]["body"] for i in range(1, 1000, 4)}

    dead = {as_str(f): json.loads(v) for f, v in r.hgetall(keys.dead).items()}
    assert all(f.startswith("feed:") for f in dead)
    by_entry = {d["entry"]: d["reason"] for d in dead.values()}
    for bad_entry, why in bad.items():
        text = bad_entry.decode("utf-8", "replace").replace("\ufffd", "?")
        assert why in by_entry[text], (text, by_entry[text])
    st = crawl_state(r, crawl_id)
    assert st["stats"]["fed"] == 1010 and st["stats"]["feed_malformed"] == 10
    assert (st["queue"], st["leases"], st["inflight"], st["owners"]) == (0, 0, 0, 0)
    listed = json.loads(ok(leased("dead", crawl_id, "--json", "--redis-url",
                                  redis_server.url)))
    assert listed["dead"] == 10


def test_a_worker_killed_in_the_middle_of_draining_loses_no_entry(redis_server, make_site,
                                                                   start_worker, crawl_id,
                                                                   tmp_path: Path):
    """A worker that took a batch off the feed hangs before queueing it (its request
    fingerprinter blocks, tests/project/testproject/fingerprint.py) and is killed with
    kill -9: the batch goes back to the feed after its lease and the other worker queues
    it; every entry is fetched exactly once."""
    site = make_site(pages=400)
    r = redis_server.client()
    marker = tmp_path / "stalled"
    workers = feed_workers(start_worker, redis_server, crawl_id, settings={
        "REQUEST_FINGERPRINTER_CLASS": "testproject.fingerprint.StallingFingerprinter",
        "STALL_PATH": "?stall", "STALL_MARKER": str(marker)})
    keys = CrawlKeys(crawl_id)
    urls = [f"{site.url}/p/0?stall"] + [f"{site.url}/p/{i}" for i in range(1, 300)]
    r.rpush(keys.feed, *[json.dumps({"url": u}) for u in urls])
    wait_for(lambda: marker.exists() and marker.read_text(), WAIT,
             "a worker hanging with a batch it took", workers)
    victim = next(w for w in workers if marker.read_text() == str(w.pid))
    survivor = next(w for w in workers if w is not victim)
    victim.kill9()
    wait_for(lambda: stat(r, crawl_id, "done") == 300 and feed_left(r, crawl_id) == 0, WAIT,
             "300 done", [survivor])
    stop_fleet(redis_server.url, crawl_id, [survivor])
    assert_each_once(Counter(x["path"] for x in site.entries()),
                     {"/p/0?stall"} | {f"/p/{i}" for i in range(1, 300)})
    assert victim.items() == []  # it hung at its first batch, before claiming anything
    assert sorted(it["url"] for it in survivor.items()) == sorted(urls)
    assert survivor.stats()["leased/feed_returned"] == 100  # the victim's whole batch
    st = crawl_state(r, crawl_id)
    assert st["stats"]["fed"] == 300
    assert (st["queue"], st["leases"], st["inflight"], st["owners"]) == (0, 0, 0, 0)


def parse_other(response):  # named like the spider's method: callbacks go by name
    raise AssertionError("never called here")


def test_push_from_python_and_seed_json_lines(redis_server, make_site, start_worker, crawl_id,
                                              tmp_path: Path):
    """``Crawl.push`` queues Requests, dicts and URLs through the fleet-wide dedupe
    (a duplicate is reported, a bad request refused before anything is queued), and
    ``scrapy leased seed`` takes JSON lines of the feed's format; ``status`` counts what
    waits in the feed; a worker started then drains the feed before it finishes, and
    fetches each request with what was sent."""
    site = make_site(pages=50)
    r = redis_server.client()
    u = [f"{site.url}/p/{i}" for i in range(10)]
    with Crawl(redis_server.url, crawl_id, settings={}) as crawl:
        assert crawl.feed_key == CrawlKeys(crawl_id).feed
        with pytest.raises(FeedEntryError, match="request 1: unknown field 'uri'"):
            crawl.push([u[5], {"uri": u[6]}])
        assert stat(r, crawl_id, "enqueued") == 0  # nothing of the refused call
        got = crawl.push([
            Request(u[0], method="POST", body=b"x=1", meta={"k": [1, 2]}, priority=2,
                    callback=parse_other),
            {"url": u[1], "callback": "parse_feed", "meta": {"i": 1}},
            u[2],
            u[2],  # the same URL again: seen
        ])
    assert got == [True, True, True, False]
    lines = tmp_path / "seed.jsonl"
    lines.write_text("\n".join([
        json.dumps({"url": u[3], "method": "POST", "body": "b", "callback": "parse_feed"}),
        "# a comment",
        u[4],
        json.dumps({"url": u[2]}),  # pushed before: seen
    ]) + "\n")
    out = ok(leased("seed", crawl_id, "-f", str(lines), "--redis-url", redis_server.url))
    assert "3 URLs, 2 queued, 1 already seen" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"url": u[7], "priority": 1.5}) + "\n")
    res = leased("seed", crawl_id, "-f", str(bad), "--redis-url", redis_server.url)
    assert res.returncode != 0 and "'priority' must be a JSON integer" in res.stderr
    assert "nothing done" in res.stderr

    keys = CrawlKeys(crawl_id)
    r.rpush(keys.feed, u[5], json.dumps({"url": u[6], "callback": "parse_other"}))
    doc = json.loads(ok(leased("status", crawl_id, "--json", "--sample", "0", "--redis-url",
                               redis_server.url)))
    assert (doc["todo"], doc["feed"]) == (5, 2)
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url))
    assert "(+ 2 in the feed, not queued yet)" in text

    w = start_worker(redis_server.url, crawl_id, None, spider="feed")
    assert_exit(w, "finished", timeout=WAIT)  # the feed drained before it finished
    items = {it["url"]: it for it in w.items()}
    assert set(items) == set(u[:7])
    assert items[u[6]]["callback"] == "parse_other"
    pick = ("method", "body", "meta", "priority", "callback")
    assert {k: items[u[0]][k] for k in pick} == {
        "method": "POST", "body": "x=1", "meta": {"k": [1, 2]}, "priority": 2,
        "callback": "parse_other"}
    assert items[u[1]]["callback"] == "parse_feed" and items[u[1]]["meta"] == {"i": 1}
    assert items[u[2]]["callback"] == "parse"
    assert (items[u[3]]["method"], items[u[3]]["body"]) == ("POST", "b")
    assert_drained(crawl_state(r, crawl_id), 7)
    assert feed_left(r, crawl_id) == 0


@pytest.mark.parametrize("raw, why", [
    ("", "empty entry"),
    ("  https://example.com/a  ", None),
    ('{"url": "https://example.com/", "flags": [1]}', "'flags' must be a list of strings"),
    ('{"url": "https://example.com/", "headers": {"A": 1}}', "header 'A' must be a string"),
    ('{"url": "https://example.com/", "callback": "not-a-name"}', "is not a method name"),
    ('{"url": "https://example.com/", "dont_filter": 1}', "'dont_filter' must be a JSON boolean"),
    ('{"url": "https://example.com/", "priority": true}', "'priority' must be a JSON integer"),
    ('{"url": "https://example.com/", "priority": "high"}', "'priority' must be a JSON integer"),
    ('{"url": "https://example.com/", "body_base64": "***"}', "not base64"),
    ('{"url": "https://example.com/", "encoding": "bogus"}', "LookupError"),
    ('{"url": "https://example.com/", "meta": ' + "[" * 3000 + "]" * 3000 + "}",
     "nested too deeply"),
])
def test_feed_entries_are_read_or_refused_with_a_reason(raw, why):
    if why is None:
        assert parse_entry(raw).request.url == "https://example.com/a"
    else:
        with pytest.raises(FeedEntryError, match=why.replace("(", r"\(")):
            parse_entry(raw)


def test_a_batch_is_queued_only_by_the_commit_of_its_own_take(redis_server, crawl_id):
    """feed_commit.lua names the batch it queues (the id feed_take.lua gave it): a commit
    of another batch (a call delayed past the worker's next take) changes nothing, and
    the batch stays held until its own commit or its deadline."""
    from scrapy_leased.frontier import NewRequest
    from tests.test_crawl import payload, run_frontier

    r = redis_server.client()
    keys = CrawlKeys(crawl_id)
    r.rpush(keys.feed, "https://example.com/1", "https://example.com/2")

    async def body(f):
        await f.check_layout(14)
        batch = await f.take_feed(10)
        assert len(batch.entries) == 2 and batch.id != "0"
        again = await f.take_feed(10)  # its batch is held: the same one again
        assert (again.id, again.entries) == (batch.id, batch.entries)
        reqs = [NewRequest(payload(as_str(e)), bucket=1, member=i)
                for i, e in enumerate(batch.entries)]
        assert await f.commit_feed(str(int(batch.id) - 1), reqs, []) is None
        assert r.hlen(keys.feed_taken) == 1 and stat(r, crawl_id, "enqueued") == 0
        assert await f.commit_feed(batch.id, reqs, []) == [True, True]
        assert r.hlen(keys.feed_taken) == 0 and r.zcard(keys.feed_deadlines) == 0
        assert (await f.take_feed(10)).entries == []

    run_frontier(redis_server.url, crawl_id, body)
