"""A request a spider yields that cannot be stored is never dropped in silence
(issue 27): it is a dead letter with its reason and what of it can be kept, counted per
worker and fleet-wide, shown by ``status`` (a warning), ``dead``, the metrics and the
dashboard's snapshot; ``dead --requeue`` refuses it clearly.

A real 2-worker crawl of the local test site with a real Redis, the spider
tests/project/testproject/spiders/dropped.py.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import ResponseError

from scrapy_leased.frontier import NewRequest
from scrapy_leased.frontier.keys import CrawlKeys
from tests.project.testproject.spiders.dropped import bad_requests
from tests.support.observe import LeasedServer
from tests.test_commands import WAIT, assert_finished, dead_json, leased, ok, stat, status_json
from tests.test_frontier import run

PAGES = 60


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        data: bytes = r.read()
        return data


def test_requests_that_cannot_be_stored_are_dead_letters(redis_server, make_site,
                                                          start_worker, crawl_id):
    letters, drops = bad_requests(PAGES)
    assert (len(letters), drops) == (13, 15)
    site = make_site(pages=PAGES)
    r = redis_server.client()
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_LOGSTATS_INTERVAL": 0,
                **start_worker.barrier(2)}
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", spider="dropped",
                       settings=settings, name=f"w{i}") for i in (1, 2)]
    for w in ws:
        assert_finished(w, WAIT)

    # every good page crawled once, no bad request fetched
    paths = Counter(e["path"] for e in site.entries())
    assert paths == Counter(f"/p/{i}" for i in range(PAGES)), paths
    items = [it["url"] for w in ws for it in w.items()]
    assert sorted(items) == sorted(site.url + f"/p/{i}" for i in range(PAGES))
    assert stat(r, crawl_id, "done") == PAGES

    # counted: per worker (Scrapy stats), fleet-wide (the crawl's counter, fleet stats)
    assert sum(w.stats().get("leased/dropped", 0) for w in ws) == drops
    assert stat(r, crawl_id, "dropped") == drops
    assert stat(r, crawl_id, "dead") == len(letters)
    fleet = r.hget(CrawlKeys(crawl_id).fleet_stats, "leased/dropped")
    assert fleet is not None and int(fleet) == drops

    # a WARNING at the spider for each drop, naming the URL, the key and the fix
    lines = [line for w in ws for line in w.log_text().splitlines()
             if "Dropped a request that cannot be stored" in line]
    assert len(lines) == drops, lines
    for line in lines:
        assert "WARNING" in line and "scrapy leased dead" in line, line
        path = next(p for p in letters if f"{site.url}{p}>" in line)
        assert letters[path] in line, line

    # status: not a clean "finished"
    doc = status_json(redis_server.url, crawl_id, "--sample", "0")
    assert doc["state"] == "finished" and doc["dead"] == len(letters)
    assert doc["totals"]["dropped"] == drops and doc["stats"]["leased/dropped"] == drops
    warned = [w for w in doc["warnings"] if w["code"] == "dropped"]
    assert len(warned) == 1 and warned[0]["message"].startswith(f"{drops} requests dropped")
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url))
    assert f"WARNING: {drops} requests dropped" in text, text

    # dead: each one, with its reason and what was kept of it
    dead = dead_json(redis_server.url, crawl_id)
    assert dead["dead"] == len(letters)
    by_path = {d["url"][len(site.url):]: d for d in dead["letters"]}
    assert set(by_path) == set(letters)
    for path, d in by_path.items():
        key = letters[path]
        assert d["dropped"] is True and d["attempts"] == 0 and d["method"] == "GET", d
        assert key in d["reason"] and f"{site.url}{path}" in d["reason"], d
        assert d["removed"] == [key], d
        kept = json.loads(d["request"])
        assert kept["u"] == site.url + path
        if path.startswith("/bad/kwargs/"):
            assert d["callback"] == "parse_detail" and kept["cb"] == "parse_detail", d
            assert "when" not in json.dumps(kept)
        else:
            assert d["callback"] == "parse"
            assert "obj" not in json.dumps(kept)
            if path.startswith("/bad/meta/"):  # the key that could be stored is kept
                assert f'"ok":{path.rsplit("/", 1)[1]}' in d["request"], d
    text = ok(leased("dead", crawl_id, "--limit", "0", "--redis-url", redis_server.url))
    assert text.count("dropped (never queued)") == len(letters), text
    assert text.count("cannot be requeued") == len(letters), text

    # requeue refuses them, clearly, and keeps them; purge removes them
    out = leased("dead", crawl_id, "--requeue", "--redis-url", redis_server.url)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert f"{len(letters)} dropped requests of crawl {crawl_id!r} not requeued" in out.stderr
    assert r.hlen(CrawlKeys(crawl_id).dead) == len(letters)
    assert int(r.get(CrawlKeys(crawl_id).todo) or 0) == 0
    assert stat(r, crawl_id, "requeued_dead") == 0

    # the metrics and the dashboard's snapshot show it
    with LeasedServer("metrics", crawl_id, "--redis-url", redis_server.url) as server:
        families = {f.name: f for f in
                    text_string_to_metric_families(_get(server.url + "metrics").decode())}
    samples = {(s.name, s.labels.get("code")): s.value
               for name in ("leased_dropped_requests", "leased_warning")
               for s in families[name].samples}
    assert samples[("leased_dropped_requests_total", None)] == drops
    assert samples[("leased_warning", "dropped")] == 1
    with LeasedServer("dashboard", crawl_id, "--redis-url", redis_server.url) as server:
        snap: dict[str, Any] = json.loads(_get(f"{server.url}api/snapshot?crawl={crawl_id}"))
    assert [w["code"] for w in snap["status"]["warnings"]].count("dropped") == 1
    assert sum(bool(d.get("dropped")) for d in snap["dead_letters"]) == min(
        len(letters), len(snap["dead_letters"]))

    purged = ok(leased("dead", crawl_id, "--purge", site.url + "/bad/shared",
                       "--redis-url", redis_server.url))
    assert "purged 1 dead letter" in purged
    assert r.hlen(CrawlKeys(crawl_id).dead) == len(letters) - 1


def test_commit_writes_dropped_requests_once_per_call_id(redis_server, crawl_id):
    """commit.lua's dropped section (frontier/machine.py ``drops``): the letter gets
    Redis time, attempts 0 and ``dropped``; a replayed call writes nothing again; the
    same request dropped again overwrites its letter (one letter, each drop counted); a
    letter that is not a JSON object is refused before anything is written."""
    keys = CrawlKeys(crawl_id)
    letter = json.dumps({"reason": "cannot store <GET http://a/x>: meta['obj'] ...",
                         "url": "http://a/x", "method": "GET", "callback": "parse",
                         "request": '{"u":"http://a/x"}', "removed": ["meta['obj']"]})

    async def body(f, r):
        await f.enqueue([NewRequest("P")])
        ((token, env),) = (await f.claim(1, "w")).claims
        call = f.new_call_id()
        stats = ["i", "leased/dropped", "1"]
        for _ in range(2):  # the same call twice (a lost reply): applied once
            await f.commit([NewRequest("child")], acks=[(token, env.rid)], call_id=call,
                           stats=stats, drops=[("dropped:x", letter)])
        first = json.loads(r.hget(keys.dead, "dropped:x"))
        t_redis = int(r.time()[0]) * 1000
        assert abs(first.pop("t") - t_redis) < 60_000
        assert first == {**json.loads(letter), "attempts": 0, "dropped": True}
        assert (stat(r, crawl_id, "dropped"), stat(r, crawl_id, "dead")) == (1, 1)
        assert r.hget(keys.fleet_stats, "leased/dropped") == "1"
        await f.commit(drops=[("dropped:x", letter), ("dropped:y", letter)])
        assert r.hlen(keys.dead) == 2
        assert (stat(r, crawl_id, "dropped"), stat(r, crawl_id, "dead")) == (3, 2)
        todo = r.get(keys.todo)
        assert todo == "1"  # the child
        with pytest.raises(ResponseError, match="not a JSON object"):
            await f.commit([NewRequest("other")], drops=[("dropped:z", "[1")])
        assert r.hlen(keys.dead) == 2 and r.get(keys.todo) == todo
        assert stat(r, crawl_id, "dropped") == 3

    run(redis_server, crawl_id, body)
