"""``scrapy leased status|dead|seed|reset`` against real crawls: real ``scrapy crawl``
workers (tests/project, spider ``site``), a real private redis-server, the local test
site. Every command runs as its own process (``python -m scrapy leased ...``), the way
an operator runs it, and its output is compared with what Redis and the site's
request log say.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from scrapy_leased.fleet import Snapshot, WorkerState, diagnose
from scrapy_leased.frontier import as_str
from scrapy_leased.frontier.keys import CrawlKeys
from tests.support.queue import queue_len
from tests.support.redis_server import free_port
from tests.support.workers import wait_for

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "project"
EXAMPLE = REPO / "example_project"
FAST = {"LEASED_LEASE_SECONDS": 2, "LEASED_SWEEP_INTERVAL": 0.5}
WAIT = 90  # hang guard for a whole crawl


# --------------------------------------------------------------------------- helpers


def leased(*args: str, cwd: Path = PROJECT, input: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy leased ARGS`` in a project directory, as an operator would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "scrapy", "leased", *args], cwd=cwd,
                          env=env, input=input, capture_output=True, text=True,
                          timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def one_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The command failed with exit status 1 and exactly one line on stderr."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def truth(r: redis.Redis, crawl_id: str) -> dict[str, Any]:
    """The crawl read straight from its keys, independently of its counters."""
    k = CrawlKeys(crawl_id)
    lanes = [as_str(lane) for lane in r.zrange(k.lanes, 0, -1)]
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    workers = {as_str(m): int(s) for m, s in r.zrange(k.workers, 0, -1, withscores=True)}
    return {
        "todo": sum(queue_len(r, k, as_str(lane)) for lane in lanes),
        "processing": r.zcard(k.leases),
        "done": r.bitcount(k.done),
        "dead": r.hlen(k.dead),
        "workers": {w for w, beat in workers.items() if now_ms - beat < 30_000},
        "owners": dict(sorted(Counter(as_str(w) for w in r.hvals(k.owners)).items())),
    }


def stat(r: redis.Redis, crawl_id: str, name: str) -> int:
    return int(r.hget(CrawlKeys(crawl_id).stats, name) or 0)


def assert_finished(w, timeout: float = WAIT) -> None:
    assert w.wait(timeout) == 0, w.log_tail(60)
    assert w.close_reason() == "finished", w.log_tail(60)
    assert "Traceback" not in w.log_text(), w.log_tail(80)


def status_json(url: str, crawl_id: str, *extra: str) -> dict[str, Any]:
    return json.loads(ok(leased("status", crawl_id, "--json", "--redis-url", url, *extra)))


def dead_json(url: str, crawl_id: str) -> dict[str, Any]:
    return json.loads(ok(leased("dead", crawl_id, "--json", "--limit", "0",
                                "--redis-url", url)))


def text_value(text: str, label: str) -> int:
    m = re.search(rf"^\s+{label}\s+([\d,]+)", text, re.M)
    assert m, (label, text)
    return int(m.group(1).replace(",", ""))


# --------------------------------------------------------------------------- status


def test_status_json_equals_redis_truth_during_a_running_crawl(
        redis_server, make_site_process, start_worker, crawl_id):
    """Mid-crawl, with the 3 workers frozen (SIGSTOP) so that nothing moves: every
    count of ``status --json`` (and of the text view) equals the keys read directly."""
    pages = 3000
    site = make_site_process(pages=pages)
    settings = {"CONCURRENT_REQUESTS": 4, "LEASED_RENEW_INTERVAL": 0.3}
    ws = [start_worker(redis_server.url, crawl_id, site.url + "/p/0", name=f"w{i}",
                       settings=settings) for i in range(3)]
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    wait_for(lambda: stat(r, crawl_id, "done") >= 300 and r.hlen(k.worker_info) == 3,
             WAIT, "300 pages done by 3 registered workers", ws)
    for w in ws:
        w.sigstop()
    try:
        time.sleep(0.5)  # writes already on the wire land (each one atomic script)
        before = truth(r, crawl_id)
        doc = status_json(redis_server.url, crawl_id)  # two samples, 2 s apart
        text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url))
        after = truth(r, crawl_id)
    finally:
        for w in ws:
            w.sigcont()
    assert before == after  # frozen: the same moment for the command and for us
    assert 0 < before["done"] < pages and before["todo"] > 0 and before["processing"] > 0
    assert doc["crawl"] == crawl_id
    for key in ("todo", "processing", "done", "dead"):
        assert doc[key] == before[key], (key, doc, before)
        assert text_value(text, key) == before[key], (key, text)
    assert doc["workers_alive"] == 3 == len(before["workers"])
    assert text_value(text, "workers alive") == 3
    assert {w["id"] for w in doc["workers"]} == before["workers"]
    # leases per worker, from the owners HASH: every live lease, under a live worker
    assert doc["leases_by_worker"] == before["owners"]
    assert sum(before["owners"].values()) == before["processing"]
    assert set(before["owners"]) <= before["workers"]
    assert re.search(r"^\s+worker\s+heartbeat\s+in flight\s+acked\s+leases$", text, re.M), text
    for wid, n in before["owners"].items():
        assert re.search(rf"^\s+{re.escape(wid)}\s.*\s{n}$", text, re.M), (wid, n, text)
    assert "not alive" not in text
    for w in doc["workers"]:
        # capacity: CONCURRENT_REQUESTS + the claim margin it measured (at most
        # max(2, 4 // 4)) + its claim batch - 1 (4 // 2 - 1); it holds at most
        # 2 x CONCURRENT_REQUESTS + margin + batch - 1 claims
        assert w["alive"] and 4 <= w["capacity"] <= 4 + 2 + 1 and w["inflight"] is not None, w
        assert w["inflight"] <= 2 * w["capacity"], w
        assert 0 <= w["heartbeat_age_s"] < 30, w
        assert w["id"] in text
    # the crawl is younger than the throughput window: every done page is in it
    assert doc["throughput"]["done_last_minute"] == before["done"]
    assert doc["throughput"]["pages_per_min"] > 0
    assert doc["sample_s"] >= 2.0 and doc["throughput"]["sample_pages_per_min"] == 0
    assert doc["redis_used_memory"] > 0 and "redis memory" in text
    # every page of the site is one host: one lane, whose queue is the todo
    assert doc["budget"]["lanes_total"] == 1
    (lane,) = doc["budget"]["lanes"]
    assert lane["lane"] == "127.0.0.1" and lane["queued"] == before["todo"], lane
    assert lane["budget"] == "none" and lane["blocked_s"] == 0 and lane["slowdown"] == 1
    assert "127.0.0.1" in text and "host (lane)" in text
    assert doc["totals"]["done"] == before["done"]

    for w in ws:
        assert_finished(w)
    end = status_json(redis_server.url, crawl_id, "--sample", "0")
    assert (end["todo"], end["processing"], end["done"], end["dead"], end["workers_alive"]) \
        == (0, 0, pages, 0, 0)
    assert end["leases_by_worker"] == {} and r.hlen(k.owners) == 0


def test_per_worker_acked_is_live_not_as_of_the_last_heartbeat(
        redis_server, make_site, start_worker, crawl_id):
    """#25 item 8: the `acked` column stayed 0 for 10 s while done was 158, because it
    came from the JSON each heartbeat writes. With the heartbeat 200 s away
    (LEASED_LEASE_SECONDS 600: one every 200 s, the first at open, with 0 acked), status,
    its --json and the dashboard's reading show the worker's acks as counted by its
    commits: between done read just before and just after the command."""
    pages = 400
    site = make_site(pages=pages, delay=0.05)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"CONCURRENT_REQUESTS": 2, "LEASED_LEASE_SECONDS": 600})
    r = redis_server.client(decode_responses=True)
    k = CrawlKeys(crawl_id)
    wait_for(lambda: stat(r, crawl_id, "done") >= 30, WAIT, "30 pages done", [w])
    (wid,) = r.zrange(k.workers, 0, -1)
    assert json.loads(r.hget(k.worker_info, wid))["acked"] == 0  # no heartbeat since open

    low = stat(r, crawl_id, "done")
    doc = status_json(redis_server.url, crawl_id, "--sample", "0")
    mid = stat(r, crawl_id, "done")
    text = ok(leased("status", crawl_id, "--sample", "0", "--redis-url", redis_server.url))
    dash = asyncio.run(_dashboard_reading(redis_server.url, crawl_id))
    high = stat(r, crawl_id, "done")
    assert json.loads(r.hget(k.worker_info, wid))["acked"] == 0  # still no heartbeat
    assert high < pages, "the crawl finished before status ran: make the site slower"

    (one,) = doc["workers"]
    assert one["id"] == wid and low <= doc["done"] <= one["acked"] <= mid, (low, mid, doc)
    m = re.search(rf"^\s+{re.escape(wid)}\s+\S+ s ago\s+\d+\s+([\d,]+)\s+\d+$", text, re.M)
    assert m, text
    assert mid <= int(m.group(1).replace(",", "")) <= high, (mid, high, text)
    (seen,) = dash["workers"]
    assert mid <= seen["acked"] <= high, (mid, high, seen)

    w.sigterm()  # leaving, it takes its count with it
    assert w.wait(WAIT) == 0, w.log_tail()
    assert r.hlen(k.worker_acked) == 0 and r.zcard(k.workers) == 0


async def _dashboard_reading(url: str, crawl_id: str) -> dict[str, Any]:
    """The snapshot `scrapy leased dashboard` serves for a crawl (observe/reader.py)."""
    from scrapy.settings import Settings

    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.observe.reader import FleetReader
    from scrapy_leased.settings import Budgets

    client = make_client(url)
    try:
        reader = FleetReader(client, url, Budgets.from_settings(Settings()),
                             worker_ttl_ms=30_000, lease_ms=600_000, max_attempts=4,
                             default_capacity=2, only=[crawl_id])
        return (await reader.read(crawl_id)).doc
    finally:
        await client.aclose()


def test_status_watch_redraws_in_place(redis_server, make_site, start_worker, crawl_id):
    site = make_site(pages=20)
    assert_finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0"))
    for extra, check in (([], lambda out: out.count("\x1b[H\x1b[2J") >= 3
                          and out.count(f"crawl {crawl_id}") >= 3),
                         (["--json"], lambda out: len([json.loads(ln) for ln in
                                                       out.splitlines()]) >= 3)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", "leased", "status", crawl_id, "--watch",
             "--interval", "0.3", "--redis-url", redis_server.url, *extra],
            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Interrupt only once the redraws are there (not after a fixed time: under load
        # the process may still be starting, before its handler of Ctrl-C exists).
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        wait_for(lambda: check("".join(lines)), WAIT, "three redraws", [])
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=WAIT)[1]
        reader.join(WAIT)
        out = "".join(lines)
        assert proc.returncode == 0, err
        assert check(out), out


def test_status_computes_slowdowns_with_the_workers_rate_recovery(
        redis_server, make_site, start_worker, crawl_id):
    """The workers run with LEASED_RATE_RECOVERY = 600 s; status runs where that setting
    is not set (another machine, Scrapy's defaults: 30 s): a lane slowed down 4x 30 s
    ago shows 4 * 0.5 ** (30 / 600) = 3.86x (the workers' half-life), not 2x (30 s)."""
    site = make_site(pages=5)
    assert_finished(start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                                 settings={"LEASED_RATE_RECOVERY": 600}))
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    assert int(r.hget(k.meta, "rate_half_life_ms")) == 600_000
    ok(leased("seed", crawl_id, "http://slow.example/x", "--redis-url", redis_server.url))
    secs, micros = r.time()
    now_ms = secs * 1000 + micros // 1000
    r.hset(k.rate("slow.example"), mapping={"pf": 4, "pt": now_ms - 30_000})
    doc = status_json(redis_server.url, crawl_id, "--sample", "0")
    (lane,) = [lane for lane in doc["budget"]["lanes"] if lane["lane"] == "slow.example"]
    # a few seconds between the HSET and the status: 3.86 at once, 3.61 a minute later
    assert 3.6 < lane["slowdown"] <= 3.87, lane


def test_status_warns_when_dead_letters_climb(redis_server, make_site, start_worker, crawl_id):
    """Every seeded page's callback raises and LEASED_MAX_ATTEMPTS is 1: the dead letters
    climb while the crawl runs, and status says so (its two samples, 2 s apart)."""
    site = make_site(pages=300)
    urls = [f"{site.url}/slow/{i}?s=0.2" for i in range(300)]
    ok(leased("seed", crawl_id, *urls, "--redis-url", redis_server.url))
    w = start_worker(redis_server.url, crawl_id, urls[0], args={"raise_path": "/slow/"},
                     settings={"LEASED_MAX_ATTEMPTS": 1, "CONCURRENT_REQUESTS": 4})
    r = redis_server.client()
    wait_for(lambda: r.hlen(CrawlKeys(crawl_id).dead) >= 5, WAIT, "5 dead letters", [w])
    doc = status_json(redis_server.url, crawl_id)
    assert w.running, "the crawl must still run while status samples it"
    codes = [x["code"] for x in doc["warnings"]]
    assert "dead_climbing" in codes, doc["warnings"]
    text = ok(leased("status", crawl_id, "--redis-url", redis_server.url))
    assert "WARNING: dead letters climbing" in text, text
    w.wait(WAIT)


def test_status_warns_when_todo_waits_and_done_is_flat(redis_server, make_site, start_worker,
                                                       crawl_id):
    """A rate budget of 1 request a minute: after the first page, todo waits, nothing is
    processed and done stays flat: the lesson's "workers are stuck (rate budget too
    tight)"."""
    site = make_site(pages=50)
    w = start_worker(redis_server.url, crawl_id, site.url + "/p/0",
                     settings={"LEASED_RATE": "1/min"})
    r = redis_server.client()
    wait_for(lambda: stat(r, crawl_id, "done") == 1 and stat(r, crawl_id, "enqueued") > 1,
             WAIT, "first page done", [w])
    doc = status_json(redis_server.url, crawl_id)
    assert doc["done"] == 1 and doc["todo"] > 0 and doc["processing"] <= 1, doc
    assert [x["code"] for x in doc["warnings"]] == ["stuck"], doc["warnings"]
    assert "rate budget too tight" in doc["warnings"][0]["message"]
    w.sigterm()
    w.wait(WAIT)


def _snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = dict(crawl="c", now_ms=0, todo=0, processing=0, done=0, dead=0,
                                workers_alive=1, totals={}, done_last_minute=0, window_s=60)
    base.update(kw)
    return Snapshot(**base)


def test_diagnoses():
    w = [WorkerState(f"h:{i}:x", 0, 0.0, True, capacity=16) for i in range(2)]
    assert diagnose(_snap(todo=5, processing=3, workers=w)) == []
    # todo growing while done is flat
    got = diagnose(_snap(now_ms=2000, todo=150, done=50, processing=4, workers=w),
                   _snap(todo=100, done=50, processing=4))
    assert [d.code for d in got] == ["stuck"] and "todo grew 100 -> 150" in got[0].message
    # todo waits, nothing processing, done flat
    got = diagnose(_snap(now_ms=2000, todo=100, done=50), _snap(todo=100, done=50))
    assert [d.code for d in got] == ["stuck"]
    # todo waits while the workers use few of their slots (requests waiting for budget)
    got = diagnose(_snap(now_ms=2000, todo=100, done=50, processing=2, workers=w),
                   _snap(todo=100, done=50, processing=2))
    assert [d.code for d in got] == ["stuck"] and "2 processing (capacity 32)" in got[0].message
    # every slot busy with slow pages: a flat done is no sign of trouble
    assert diagnose(_snap(now_ms=2000, todo=100, done=50, processing=32, workers=w),
                    _snap(todo=100, done=50, processing=32)) == []
    # done moves, or slow pages in flight with todo not growing: not stuck
    assert diagnose(_snap(now_ms=2000, todo=150, done=51), _snap(todo=100, done=50)) == []
    assert diagnose(_snap(now_ms=2000, todo=90, done=50, processing=32),
                    _snap(todo=100, done=50, processing=32)) == []
    # too close in time for a trend
    assert diagnose(_snap(now_ms=100, todo=150, done=50), _snap(todo=100, done=50)) == []
    # processing much larger than the live workers' capacity (2 x 16)
    got = diagnose(_snap(processing=200, workers=w, workers_alive=2))
    assert [d.code for d in got] == ["orphaned"]
    assert diagnose(_snap(processing=40, workers=w, workers_alive=2)) == []
    # capacity unknown in worker info: the project's CONCURRENT_REQUESTS per live worker
    w0 = [WorkerState("h:1:x", 0, 0.0, True)]
    assert [d.code for d in diagnose(_snap(processing=100, workers=w0), None, 16)] == \
        ["orphaned"]
    # nobody alive with work waiting
    got = diagnose(_snap(todo=10, workers_alive=0))
    assert [d.code for d in got] == ["no_workers"]
    # dead climbing: a share of what settled in the window
    got = diagnose(_snap(now_ms=2000, done=110, totals={"dead": 10}),
                   _snap(done=100, totals={"dead": 0}))
    assert [d.code for d in got] == ["dead_climbing"]
    assert diagnose(_snap(now_ms=2000, done=1100, totals={"dead": 12}),
                    _snap(done=100, totals={"dead": 10})) == []  # 2 of 1002: noise


# --------------------------------------------------------------------------- dead letters


def test_a_worker_is_gone_by_what_it_recorded_not_by_its_id():
    """reset's check: a worker whose recorded process (host, pid in worker_info) no
    longer exists is gone; without a record nothing is read from its id."""
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    wid = f"{host}:{dead.pid}:ab"
    assert WorkerState(wid, 0, 0.0, True, host=host, pid=dead.pid).process_gone()
    assert not WorkerState(wid, 0, 0.0, True).process_gone()
    assert not WorkerState(wid, 0, 0.0, True, host=host, pid=os.getpid()).process_gone()


def test_dead_letters_list_requeue_purge(redis_server, make_site, start_worker, crawl_id):
    site = make_site(pages=1)  # /p/0 links nowhere
    url = redis_server.url
    bad = {k: f"{site.url}/status/500?k={k}" for k in "abcd"}
    ok(leased("seed", crawl_id, *bad.values(), "--redis-url", url))
    failing = {"LEASED_FAIL_HTTP_CODES": "500", "RETRY_ENABLED": False}

    # run 1: every /status/500 page fails once and is dead at once
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", name="run1",
                                 settings={**failing, "LEASED_MAX_ATTEMPTS": 1}))
    doc = dead_json(url, crawl_id)
    assert doc["dead"] == 4
    assert {d["url"] for d in doc["letters"]} == set(bad.values())
    for d in doc["letters"]:
        assert d["attempts"] == 1 and d["reason"] == "HTTP 500 (in LEASED_FAIL_HTTP_CODES)", d
    text = ok(leased("dead", crawl_id, "--redis-url", url))
    assert f"crawl {crawl_id}: 4 dead letters" in text
    assert all(f"GET {u}" in text for u in bad.values()) and "attempts 1" in text
    limited = json.loads(ok(leased("dead", crawl_id, "--json", "--limit", "1",
                                   "--redis-url", url)))
    assert limited["dead"] == 4 and len(limited["letters"]) == 1

    # requeue one by URL (and one that is not dead: reported, exit status 1)
    res = leased("dead", crawl_id, "--requeue", bad["a"], f"{site.url}/p/nope",
                 "--redis-url", url)
    one_error(res, "not in the dead letters", f"{site.url}/p/nope")
    assert "requeued 1 dead letter" in res.stdout
    ok(leased("dead", crawl_id, "--purge", bad["b"], "--redis-url", url))
    # nothing of it dead: one error line, no "purged 0" on stdout
    res = leased("dead", crawl_id, "--purge", f"{site.url}/p/nope", "--redis-url", url)
    one_error(res, "not in the dead letters", f"{site.url}/p/nope")
    assert res.stdout == ""
    assert {d["url"] for d in dead_json(url, crawl_id)["letters"]} == {bad["c"], bad["d"]}
    st = status_json(url, crawl_id, "--sample", "0")
    assert (st["todo"], st["dead"]) == (1, 2)
    assert st["totals"]["requeued_dead"] == 1 and st["totals"]["purged_dead"] == 1

    # run 2, two attempts allowed: the requeued page is fetched twice, so its attempts
    # were reset to 0 (with its old count of 1 it would be dead after one fetch)
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", name="run2",
                                 settings={**failing, "LEASED_MAX_ATTEMPTS": 2}))
    counts = site.count_by_path()
    assert counts[bad["a"][len(site.url):]] == 3  # run 1 + two attempts in run 2
    assert counts[bad["b"][len(site.url):]] == 1  # purged: never again
    letters = {d["url"]: d for d in dead_json(url, crawl_id)["letters"]}
    assert set(letters) == {bad["a"], bad["c"], bad["d"]}
    assert letters[bad["a"]]["attempts"] == 2

    # requeue them all; this time the 500s are not failures: all done, none dead
    out = ok(leased("dead", crawl_id, "--requeue", "--redis-url", url))
    assert "requeued 3 dead letters" in out
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", name="run3"))
    st = status_json(url, crawl_id, "--sample", "0")
    # a c d, and the start URL /p/0 once per run (each worker here is a new run of the
    # crawl, whose start request keeps Scrapy's dont_filter=True)
    assert (st["todo"], st["processing"], st["dead"], st["done"]) == (0, 0, 0, 6)
    assert ok(leased("dead", crawl_id, "--redis-url", url)).strip() == \
        f"crawl {crawl_id}: no dead letters"

    # purge everything: seed two failing pages again, they die, --purge deletes them
    again = [f"{site.url}/status/500?k=e", f"{site.url}/status/500?k=f"]
    ok(leased("seed", crawl_id, *again, "--redis-url", url))
    assert_finished(start_worker(url, crawl_id, site.url + "/p/0", name="run4",
                                 settings={**failing, "LEASED_MAX_ATTEMPTS": 1}))
    assert dead_json(url, crawl_id)["dead"] == 2
    assert "purged 2 dead letters" in ok(leased("dead", crawl_id, "--purge", "--redis-url", url))
    assert dead_json(url, crawl_id)["dead"] == 0
    res = leased("dead", crawl_id, "--requeue", "--purge", "--redis-url", url)
    assert res.returncode == 2  # usage error


# --------------------------------------------------------------------------- seeding


def test_seed_is_deduplicated_like_a_workers_requests(redis_server, make_site, start_worker,
                                                      crawl_id, tmp_path):
    pages = 30
    site = make_site(pages=pages)
    url = redis_server.url
    p = site.page_url
    out = ok(leased("seed", crawl_id, p(1), p(2), "--redis-url", url))
    assert out.strip() == f"seeded crawl '{crawl_id}': 2 URLs, 2 queued, 0 already seen"
    listing = tmp_path / "urls.txt"
    listing.write_text(f"# start pages\n{p(1)}\n\n{p(3)}\n   {p(4)}  \n")
    out = ok(leased("seed", crawl_id, "-f", str(listing), "--redis-url", url))
    assert "3 URLs, 2 queued, 1 already seen" in out
    out = ok(leased("seed", crawl_id, "-", "--redis-url", url,
                    input=f"{p(4)}\n{site.url}/p/5?b=2&a=1\n"))
    assert "2 URLs, 1 queued, 1 already seen" in out
    # Scrapy's fingerprint canonicalizes the URL: the same request, seen
    out = ok(leased("seed", crawl_id, f"{site.url}/p/5?a=1&b=2", "--redis-url", url))
    assert "1 URL, 0 queued, 1 already seen" in out
    one_error(leased("seed", crawl_id, "not-a-url", "--redis-url", url), "not a URL")
    one_error(leased("seed", crawl_id, p(6), "--redis-url", url,
                     "-s", "LEASED_SEEN_BUCKET_BITS=4"), "LEASED_SEEN_BUCKET_BITS")
    assert status_json(url, crawl_id, "--sample", "0")["todo"] == 5

    # a worker discovers the same pages as links: each page is fetched once
    assert_finished(start_worker(url, crawl_id, p(0)))
    counts = site.count_by_path()
    assert counts.pop("/p/5?b=2&a=1") == 1
    assert counts == {f"/p/{i}": 1 for i in range(pages)}, counts
    st = status_json(url, crawl_id, "--sample", "0")
    assert (st["done"], st["todo"], st["dead"]) == (pages + 1, 0, 0)


# --------------------------------------------------------------------------- reset


def test_reset_deletes_exactly_one_crawls_keys(redis_server, make_site, start_worker,
                                              crawl_id):
    site = make_site(pages=20)
    url = redis_server.url
    r = redis_server.client()
    glob = crawl_id + "*"  # a crawl id with a glob character: the pattern must be escaped
    other = crawl_id + "2"  # a crawl whose id starts with ours
    for c in (crawl_id, other):
        assert_finished(start_worker(url, c, site.url + "/p/0", name=c[-8:]))
    ok(leased("seed", glob, site.page_url(3), "--redis-url", url))
    r.set("unrelated", 1)
    r.set(f"leased:{{{crawl_id}}}", 1)  # not under the crawl's prefix "leased:{id}:"

    def keys(c: str) -> set[str]:
        return {as_str(k) for k in r.scan_iter(match=f"leased:{{{c}}}:*")
                if as_str(k).startswith(f"leased:{{{c}}}:")}

    mine, theirs, globs = keys(crawl_id), keys(other), keys(glob)
    assert len(mine) > 10 and len(theirs) > 10 and globs
    total = r.dbsize()

    res = leased("reset", glob, "--redis-url", url)
    one_error(res, "add --yes", f"{len(globs)} keys")
    assert r.dbsize() == total
    assert f"deleted {len(globs)} keys" in ok(leased("reset", glob, "--yes", "--redis-url", url))
    assert keys(glob) == set() and keys(crawl_id) == mine and keys(other) == theirs
    assert f"deleted {len(mine)} keys" in ok(leased("reset", crawl_id, "--yes",
                                                    "--redis-url", url))
    assert keys(crawl_id) == set() and keys(other) == theirs
    assert r.get("unrelated") == b"1" and r.get(f"leased:{{{crawl_id}}}") == b"1"
    assert r.dbsize() == total - len(globs) - len(mine)
    one_error(leased("status", crawl_id, "--redis-url", url), "unknown crawl")

    # a crawl with a live worker is not reset
    w = start_worker(url, other, site.url + "/p/0", name="keep",
                     settings={"LEASED_KEEP_ALIVE": True})
    wait_for(lambda: r.zcard(CrawlKeys(other).workers) == 1, WAIT, "worker registered", [w])
    one_error(leased("reset", other, "--yes", "--redis-url", url), "alive", "stop them first")
    # (a worker opening deletes closed_by, which says who ran the fleet-wide checks)
    assert keys(other) >= theirs - {CrawlKeys(other).closed_by}
    w.sigterm()
    assert w.wait(WAIT) == 0
    ok(leased("reset", other, "--yes", "--redis-url", url))
    assert keys(other) == set()


# --------------------------------------------------------------------------- errors


def test_errors_are_one_line_with_exit_status_1(redis_server, crawl_id, tmp_path):
    url = redis_server.url
    redis_server.client().hset(CrawlKeys(crawl_id).meta, "seen_bucket_bits", 14)
    line = one_error(leased("status", "no-such-crawl", "--redis-url", url), "unknown crawl",
                     "'no-such-crawl'")
    assert crawl_id in line  # the crawls that do exist are named
    for sub in ("dead", "reset"):
        one_error(leased(sub, "no-such-crawl", "--redis-url", url), "unknown crawl")
    port = free_port()
    one_error(leased("status", crawl_id, "--redis-url", f"redis://127.0.0.1:{port}/0"),
              "cannot reach Redis", str(port))
    one_error(leased("status", crawl_id, "-s", f"LEASED_REDIS_URL=redis://127.0.0.1:{port}/0"),
              "cannot reach Redis", "LEASED_REDIS_URL")
    one_error(leased("status", "--redis-url", url), "name the crawl", "site", crawl_id)
    one_error(leased("status", "-s", f"LEASED_EMBEDDED_DIR={tmp_path / 'none'}"),
              "no Redis to read", "LEASED_REDIS_URL is not set")
    one_error(leased("status", crawl_id, "--redis-url", "http://x"), "--redis-url")
    # in a project with one spider, the crawl is that spider's name
    one_error(leased("status", "--redis-url", url, cwd=EXAMPLE), "unknown crawl 'pages'")
    # LEASED_CRAWL_ID names it too
    doc = json.loads(ok(leased("status", "--json", "--sample", "0", "--redis-url", url,
                               "-s", f"LEASED_CRAWL_ID={crawl_id}")))
    assert doc["crawl"] == crawl_id
    # an option of another subcommand is a usage error, also one with a default value
    # (--interval, --limit and --bind were accepted anywhere once): argparse's, after
    # the usage line of that subcommand
    r = ["--redis-url", url]
    for args, said in (
            ([], "the following arguments are required: SUBCOMMAND"),
            (["nope", *r], "invalid choice: 'nope'"),
            (["status", "--yes", *r], "scrapy leased status: error: unrecognized arguments: --yes"),
            (["seed", crawl_id, "--watch", *r], "unrecognized arguments: --watch"),
            (["status", "a", "b", *r], "unrecognized arguments: b"),
            (["dead", crawl_id, "--interval", "1", *r], "unrecognized arguments: --interval 1"),
            (["status", crawl_id, "--limit", "3", *r], "unrecognized arguments: --limit 3"),
            (["status", crawl_id, "--bind", "::1", *r], "unrecognized arguments: --bind ::1"),
            (["embedded", "status", *r], "unrecognized arguments: --redis-url"),
            (["dead", crawl_id, "--limit", "-1", *r], "argument --limit: must be at least 0")):
        res = leased(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert said in res.stderr, (args, res.stderr)
    usage = leased("dead", crawl_id, "--yes", "--redis-url", url).stderr
    assert "scrapy leased dead [CRAWL] [--limit N]" in usage, usage
