"""Self-tests of the test infrastructure (tests/support, tests/project).

None of these need scrapy_leased to work: the crawl test runs the project
with the add-on disabled (``-s ADDONS={}``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
import redis

from scrapy_leased.testing.pages import page_links
from scrapy_leased.testing.process import read_log
from tests.support.redis_server import RedisServer
from tests.support.workers import REPO_ROOT


def fetch(url: str, headers: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


HREF = re.compile(r'href="(/p/\d+)"')


# -- site ------------------------------------------------------------------

def test_site_pages_links_and_log(make_site, tmp_path):
    log_path = tmp_path / "site.jsonl"
    site = make_site(pages=100, log_path=log_path)
    status, body = fetch(site.url + "/p/3?x=1", headers={"User-Agent": "ua-test"})
    assert status == 200
    assert "<title>page 3</title>" in body
    assert HREF.findall(body) == [f"/p/{j}" for j in page_links(3, 100)]
    # children 31..40 plus cross links 4 and 24
    assert HREF.findall(body) == [f"/p/{j}" for j in list(range(31, 41)) + [4, 24]]
    # leaf pages: only cross links
    assert HREF.findall(fetch(site.url + "/p/99")[1]) == ["/p/96"]  # (99+1)%100 == 0 is dropped
    assert fetch(site.url + "/p/100")[0] == 404
    assert fetch(site.url + "/nope")[0] == 404
    assert fetch(site.url + "/status/503")[0] == 503
    assert fetch(site.url + "/status/204")[0] == 204

    assert len(site.log) == 6
    e = site.log[0]
    assert e["method"] == "GET" and e["path"] == "/p/3?x=1" and e["status"] == 200
    assert e["user_agent"] == "ua-test"
    assert e["host"] == f"127.0.0.1:{site.port}" and e["port"] == site.port
    assert abs(e["t"] - time.time()) < 10
    assert site.count_by_path()["/p/3?x=1"] == 1
    assert site.count_by_path(include_query=False)["/p/3"] == 1
    # the file is written line by line while serving
    assert read_log(log_path) == site.entries()


def test_site_tree_covers_all_pages():
    for n in (1, 7, 50, 200, 5000):
        seen, todo = {0}, [0]
        while todo:
            for j in page_links(todo.pop(), n):
                assert 0 < j < n
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        assert seen == set(range(n))


def test_site_slow(site):
    t0 = time.monotonic()
    status, body = fetch(site.url + "/slow/5?s=0.3")
    assert status == 200 and "<title>page 5</title>" in body
    assert HREF.findall(body) == [f"/p/{j}" for j in page_links(5, site.pages)]
    assert time.monotonic() - t0 >= 0.3
    assert site.log[-1]["path"] == "/slow/5?s=0.3"


def test_site_multi_port_logs_port(make_site):
    site = make_site(pages=20, ports=3)
    assert len(site.urls) == len(set(site.urls)) == 3
    for k, url in enumerate(site.urls):
        for _ in range(k + 1):
            assert fetch(url + "/p/1")[0] == 200
    assert Counter(e["port"] for e in site.log) == {site.ports[0]: 1, site.ports[1]: 2, site.ports[2]: 3}
    assert {e["host"] for e in site.log} == {u.split("//")[1] for u in site.urls}
    assert site.count_by_path(port=site.ports[2]) == {"/p/1": 3}


def test_site_distinct_hosts(make_site):
    site = make_site(pages=5, ports=2, distinct_hosts=True)
    assert [u.split("//")[1].split(":")[0] for u in site.urls] == ["127.0.0.1", "127.0.0.2"]
    assert fetch(site.urls[1] + "/p/0")[0] == 200
    assert site.log[0]["server_host"] == "127.0.0.2"


def test_site_concurrent_throughput(make_site):
    site = make_site(pages=1000)
    errors = []

    def hammer(k):
        try:
            for i in range(k, 1000, 8):
                assert fetch(f"{site.url}/p/{i}")[0] == 200
        except Exception as e:  # pragma: no cover
            errors.append(e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(site.count_by_path()) == 1000
    assert time.monotonic() - t0 < 10  # ~well over 300 pages/s


def test_site_subprocess(make_site_process, tmp_path):
    sp = make_site_process(pages=30, ports=2)
    assert len(sp.urls) == 2
    status, body = fetch(sp.urls[1] + "/p/2", headers={"User-Agent": "sub"})
    assert status == 200 and "<title>page 2</title>" in body
    entries = sp.entries()
    assert len(entries) == 1 and entries[0]["user_agent"] == "sub"
    assert entries[0]["port"] == int(sp.urls[1].rsplit(":", 1)[1])


def test_site_cli_help():
    r = subprocess.run([sys.executable, "-m", "scrapy_leased.testing.site", "--help"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--pages" in r.stdout


# -- redis -----------------------------------------------------------------

def test_redis_server_fixture(redis_server):
    assert redis_server.port != 6379
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    c = redis_server.client()
    assert c.ping()
    assert c.config_get("appendonly")["appendonly"] == "no"
    assert c.config_get("save")["save"] == ""
    # url works with from_url too
    c2 = redis.Redis.from_url(redis_server.url)
    assert c2.ping()
    c2.close()


def test_redis_aof_restart_keeps_data(redis_aof):
    c = redis_aof.client()
    assert c.config_get("appendonly")["appendonly"] == "yes"
    assert c.config_get("appendfsync")["appendfsync"] == "always"
    c.set("k", "v")
    port = redis_aof.port
    redis_aof.restart()  # clean SHUTDOWN NOSAVE
    assert redis_aof.port == port
    c = redis_aof.client()
    assert c.get("k") == b"v"
    c.set("k2", "v2")
    redis_aof.restart(crash=True)  # SIGKILL; appendfsync always keeps it
    assert redis_aof.client().get("k2") == b"v2"


def test_redis_kill_and_start():
    srv = RedisServer().start()
    try:
        c = srv.client()
        c.set("x", 1)
        pid = srv.proc.pid
        srv.kill()
        assert not srv.running
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(srv.url, socket_connect_timeout=1).ping()
        srv.start()  # no AOF: data gone, same port
        assert srv.proc.pid != pid
        assert srv.client().get("x") is None
    finally:
        srv.close()
    assert not srv.dir.exists()


def test_redis_bad_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("LEASED_TEST_REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="LEASED_TEST_REDIS_SERVER"):
        RedisServer()


# -- scrapy project, no add-on -----------------------------------------------

def test_plain_crawl_every_page_once(make_site, start_worker, crawl_id):
    site = make_site(pages=50)
    w = start_worker(None, crawl_id, site.url + "/p/0", settings={"ADDONS": {}}, name="plain")
    assert w.wait(60) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    counts = site.count_by_path()
    assert set(counts) == site.all_page_paths()
    assert max(counts.values()) == 1
    items = w.items()
    assert len(items) == 50
    assert {it["url"] for it in items} == {site.url + p for p in site.all_page_paths()}
    assert all(it["worker"] == "plain" and it["pid"] == w.pid for it in items)
    assert {it["title"] for it in items} == {f"page {i}" for i in range(50)}
    assert w.stats()["item_scraped_count"] == 50
    assert w.stats()["finish_reason"] == "finished"
    assert "Scrapy" in site.log[0]["user_agent"]


def test_plain_crawl_env_switch_and_behaviour_args(make_site, start_worker, tmp_path):
    site = make_site(pages=30)
    w = start_worker(
        None, None, site.url + "/p/0",
        settings={"RECORD_DELAY": 0.2, "RECORD_DELAY_PATH": "/p/2"},
        args={"raise_path": "/p/9", "slow_path": "/p/3", "slow_seconds": "0.2"},
        env={"TESTPROJECT_NO_ADDON": "1"},
        name="plain2",
    )
    assert w.wait(60) == 0, w.log_tail()
    assert w.close_reason() == "finished"
    # paths are substrings: "/p/9" matches only /p/9 on a 30-page site (a leaf)
    urls = {it["url"] for it in w.items()}
    assert urls == {site.url + p for p in site.all_page_paths() - {"/p/9"}}
    assert "boom " + site.url + "/p/9" in w.log_text()
    assert w.stats().get("spider_exceptions/RuntimeError") == 1


def test_exit_path_kills_worker(make_site, start_worker, crawl_id):
    site = make_site(pages=30)
    w = start_worker(None, crawl_id, site.url + "/p/0", settings={"ADDONS": {}},
                     args={"exit_path": "/p/0"})
    assert w.wait(60) == 3
    assert w.close_reason() is None
    assert w.items() == []


def test_worker_sigterm_and_record_delay(make_site, start_worker, crawl_id):
    site = make_site(pages=30)
    w = start_worker(None, crawl_id, site.url + "/p/0", settings={"ADDONS": {}, "RECORD_DELAY": 30})
    w.wait_until(lambda: len(site.log) >= 1, timeout=30, what="first request")
    time.sleep(0.5)
    assert w.items() == []  # every item is held in the pipeline
    w.sigterm()
    # a second SIGTERM forces an unclean shutdown, but only once the first was
    # handled (two signals sent back to back can coalesce into one)
    w.wait_log("Received SIGTERM, shutting down gracefully", timeout=30)
    w.sigterm()
    w.wait(30)
    assert w.items() == []
    assert "forcing unclean shutdown" in w.log_text()


def test_worker_sigstop_sigcont_and_kill9(make_site, start_worker, crawl_id):
    site = make_site(pages=30)
    w = start_worker(None, crawl_id, site.url + "/p/0", settings={"ADDONS": {}},
                     args={"slow_path": "/p/", "slow_seconds": "0.5"})
    w.wait_items(1, timeout=30)
    w.sigstop()
    time.sleep(0.3)
    n = len(w.items())
    time.sleep(0.7)
    assert len(w.items()) == n  # frozen
    w.sigcont()
    w.wait_items(n + 1, timeout=30)
    w.kill9()
    assert w.returncode == -9
    assert w.close_reason() is None
