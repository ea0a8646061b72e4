"""Sessions across the fleet (issue #25, 3): cookies set by a response are sent by every
worker of the crawl (LeasedCookiesMiddleware, scrapy_leased/cookies.py), per
``meta['cookiejar']``; with LEASED_SHARED_COOKIES = False they stay per worker and the
first Set-Cookie is a WARNING.

Real redis-server, real ``scrapy crawl`` workers (tests/project, spider ``login``), a
local site with a login form (tests/support/login_site.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from http.cookiejar import Cookie
from typing import Any

import pytest
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.http import Request, Response
from scrapy.http.cookies import CookieJar
from scrapy.settings import Settings

from scrapy_leased._redis.connection import make_client
from scrapy_leased.addon import Addon
from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.worker.cookies import (
    SCRIPTS,
    CookieStore,
    LeasedCookiesMiddleware,
    cookie_field,
    cookie_from_json,
    cookie_to_json,
    jar_name,
)
from tests.support.login_site import LoginSite
from tests.support.redis_server import RedisServer

WAIT = 120  # hang guard for a whole crawl, not a check
OPT_OUT_WARNING = "sessions are per worker"


@pytest.fixture
def login_site():
    site = LoginSite(pages=100, delay=0.02).start()
    yield site
    site.stop()


def _crawl(start_worker, redis_url: str, crawl_id: str, site: LoginSite, n: int,
           settings: dict[str, Any] | None = None, args: dict[str, Any] | None = None
           ) -> list[Any]:
    together = start_worker.barrier(n) if n > 1 else {}
    ws = [start_worker(redis_url, crawl_id, site.url + "/login", spider="login", name=f"w{i}",
                       settings={"CONCURRENT_REQUESTS": 4, **together, **(settings or {})},
                       args=args) for i in range(n)]
    for w in ws:
        assert w.wait(WAIT) == 0, w.log_tail()
        assert w.close_reason() == "finished", w.log_tail()
    return ws


def test_two_workers_every_page_logged_in(redis_server, start_worker, crawl_id, login_site):
    """A FormRequest login from start(), 2 workers, 100 pages: every one of the 100 items
    is from a page the site served to the logged-in session, whichever worker fetched
    it; both workers fetched pages; one login; the jar is in Redis as JSON."""
    ws = _crawl(start_worker, redis_server.url, crawl_id, login_site, 2)
    items = start_worker.all_items()
    assert len(items) == 100
    assert len({it["url"] for it in items}) == 100
    not_logged = [it["url"] for it in items if not it["logged_in"]]
    assert not_logged == [], f"{len(not_logged)} of 100 pages without the session"
    assert {it["user"] for it in items} == {"alice"}
    per_worker = Counter(it["worker"] for it in items)
    assert set(per_worker) == {"w0", "w1"}, per_worker  # the other worker really fetched
    assert login_site.logins == ["alice"]
    assert Counter(user for _, user in login_site.requests) == {"alice": 100}

    r = redis_server.client()
    jar = r.hgetall(CrawlKeys(crawl_id).cookie_jar("null"))
    fields = {k.decode(): v for k, v in jar.items()}
    assert fields.pop("v") == b"1"  # one write: the login's Set-Cookie
    (field, text), = fields.items()
    assert field == "127.0.0.1\n/\nsession"
    doc = json.loads(text)
    assert doc["name"] == "session" and doc["domain"] == "127.0.0.1" and doc["path"] == "/"
    assert doc["expires"] is None and doc["rest"] == {"HttpOnly": None}
    stats = [w.stats() for w in ws]
    assert sum(s.get("leased/cookies_written", 0) for s in stats) == 1
    # a jar version is read only when a claim shows a new cookie mark: at most once per
    # mark ('' and the login's) and request in flight (CONCURRENT_REQUESTS 4), not per page
    assert [s.get("leased/cookies_checked", 0) <= 8 for s in stats] == [True, True], stats
    # the worker that did not log in loaded the jar (once: its version moved once)
    assert sorted(s.get("leased/cookies_loaded", 0) for s in stats) == [0, 1]


def test_two_sessions_kept_apart_by_cookiejar(redis_server, start_worker, crawl_id,
                                              login_site):
    """Two logins with meta['cookiejar'] 'alice' and 'bob', 2 workers: each session's
    100 pages are all served to its own user (the jars never mix), two HASHes in Redis."""
    _crawl(start_worker, redis_server.url, crawl_id, login_site, 2,
           args={"users": "alice,bob", "jars": "1"})
    items = start_worker.all_items()
    assert len(items) == 200
    assert Counter(it["session"] for it in items) == {"alice": 100, "bob": 100}
    wrong = [it for it in items if it["user"] != it["session"]]
    assert wrong == [], f"{len(wrong)} of 200 pages served to the other session or none"
    assert len({it["worker"] for it in items}) == 2
    r = redis_server.client()
    k = CrawlKeys(crawl_id)
    for user in ("alice", "bob"):
        jar = r.hgetall(k.cookie_jar(json.dumps(user)))
        assert len(jar) == 2, jar  # the session cookie and the version
    assert not r.exists(k.cookie_jar("null"))


def test_opting_out_keeps_sessions_per_worker_and_warns_once(redis_server, start_worker,
                                                              crawl_id, login_site):
    """LEASED_SHARED_COOKIES = False, one worker: the crawl is logged in (its own jar),
    the first Set-Cookie logs one WARNING naming the setting, nothing goes to Redis."""
    w, = _crawl(start_worker, redis_server.url, crawl_id, login_site, 1,
                settings={"LEASED_SHARED_COOKIES": False})
    items = w.items()
    assert len(items) == 100 and all(it["logged_in"] for it in items)
    warnings = [line for line in w.log_text().splitlines() if OPT_OUT_WARNING in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and "LEASED_SHARED_COOKIES = False" in warnings[0]
    r = redis_server.client()
    assert list(r.scan_iter(CrawlKeys(crawl_id).prefix + "cookies:*")) == []


def test_shared_cookies_log_no_opt_out_warning(redis_server, start_worker, crawl_id,
                                                login_site):
    """The default (shared): no per-worker warning."""
    w, = _crawl(start_worker, redis_server.url, crawl_id, login_site, 1)
    assert OPT_OUT_WARNING not in w.log_text()
    assert all(it["logged_in"] for it in w.items())


# -- the add-on's settings -------------------------------------------------------------


def _addon_middlewares(**values: Any) -> dict[Any, Any]:
    settings = Settings()
    settings.setdict(values, priority="project")
    Addon().update_settings(settings)
    return dict(settings.getdict("DOWNLOADER_MIDDLEWARES"))


def test_addon_replaces_scrapys_cookies_middleware_at_its_order() -> None:
    mws = _addon_middlewares()
    assert mws[CookiesMiddleware] is None
    assert mws[LeasedCookiesMiddleware] == 700
    # opted out: installed too (per-worker jars, the warning)
    assert _addon_middlewares(LEASED_SHARED_COOKIES=False)[LeasedCookiesMiddleware] == 700


def test_addon_leaves_cookies_alone_when_the_project_decided() -> None:
    assert LeasedCookiesMiddleware not in _addon_middlewares(COOKIES_ENABLED=False)
    path = "scrapy.downloadermiddlewares.cookies.CookiesMiddleware"
    mws = _addon_middlewares(DOWNLOADER_MIDDLEWARES={path: None})
    assert LeasedCookiesMiddleware not in mws and mws[path] is None


def test_bad_opt_out_value_names_the_setting() -> None:
    from scrapy_leased.settings import LeasedConfigError

    with pytest.raises(LeasedConfigError, match="LEASED_SHARED_COOKIES"):
        _addon_middlewares(LEASED_SHARED_COOKIES="perhaps")


# -- the jar's storage -----------------------------------------------------------------


def test_jar_names() -> None:
    assert jar_name(None) == "null"
    assert jar_name("a") == '"a"' and jar_name(1) == "1" and jar_name(1) != jar_name("1")
    assert jar_name(("a", 2)) == '["a",2]'
    assert jar_name(object()) is None and jar_name(("a", object())) is None
    assert jar_name("x" * 500).startswith("sha1:")


def test_cookie_json_round_trip() -> None:
    c = Cookie(0, "s", "v=1", None, False, ".example.com", True, True, "/a", True, True,
               2_000_000_000, False, None, None, {"HttpOnly": None, "SameSite": "Lax"})
    back = cookie_from_json(cookie_to_json(c))
    assert cookie_to_json(back) == cookie_to_json(c)
    assert cookie_field(back) == ".example.com\n/a\ns"
    for bad in ("[]", '{"name": 1, "domain": "d", "path": "/"}', "not json"):
        with pytest.raises((ValueError, TypeError)):
            cookie_from_json(bad)


def test_cookies_set_validates_before_writing_and_prunes_by_redis_time(redis_server,
                                                                       crawl_id) -> None:
    """lua/cookies_set.lua: one malformed entry and nothing is written; a cookie whose
    expiry (Redis time) is past is pruned; every write raises the version and sets a new
    cookie mark in the control HASH (returned by each claim); a control key of the wrong
    type refuses the write before anything is written."""
    r = redis_server.client()
    script = r.register_script(SCRIPTS.source("cookies_set"))  # a sync client
    keys = CrawlKeys(crawl_id)
    key, control = keys.cookie_jar("null"), keys.control
    now = int(r.time()[0])

    def doc(name: str, expires: int | None) -> tuple[str, str]:
        c = Cookie(0, name, "v", None, False, "h", False, False, "/", True, False, expires,
                   expires is None, None, None, {})
        return cookie_field(c), cookie_to_json(c)

    good, old = doc("a", None), doc("b", now + 3600)
    assert script(keys=[key, control], args=[2, *good, *old]) == [1, 0]
    first_mark = r.hget(control, "cookies")
    assert first_mark is not None and first_mark.endswith(b":1")
    for bad_args in ([1, "h\n/\nc", "{"], [1, "h\n/\nc", good[1]], [1, "h/c", good[1]],
                     [1, *good, "no-newlines"], [3, *good]):
        with pytest.raises(Exception, match="COOKIE_INVALID"):
            script(keys=[key, control], args=bad_args)
    assert r.hget(key, "v") == b"1" and r.hlen(key) == 3  # nothing written by the bad calls
    assert r.hget(control, "cookies") == first_mark
    # an expired one (Redis time) set, and one deleted: pruned, deleted, version 2
    gone = doc("c", now - 10)
    assert script(keys=[key, control], args=[1, *gone, old[0]]) == [2, 1]
    assert set(r.hkeys(key)) == {b"v", good[0].encode()}
    assert r.hget(control, "cookies") not in (None, first_mark)
    r.delete(control)
    r.set(control, "paused")  # by hand, of the wrong type
    with pytest.raises(Exception, match="KEYTYPE"):
        script(keys=[key, control], args=[1, *old])
    assert r.hget(key, "v") == b"2" and r.get(control) == b"paused"


def test_cookie_keys_are_frontier_state(crawl_id) -> None:
    """`scrapy leased reset` deletes every key of the crawl's prefix but the records, and
    a fresh run (LEASED_FLUSH_ON_START) every key but those it keeps: the jars go with
    both, like the queue."""
    k = CrawlKeys(crawl_id)
    key = k.cookie_jar('"alice"')
    assert key.startswith(k.prefix) and key.startswith(f"leased:{{{crawl_id}}}:")
    assert not k.kept_by_flush(key) and not k.is_records(key)


# -- a Redis hiccup, in one process ----------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.values: Counter[str] = Counter()

    def inc_value(self, key: str, count: int = 1) -> None:
        self.values[key] += count


@pytest.mark.integration
def test_redis_down_never_fails_a_request_and_the_write_is_retried(crawl_id) -> None:
    """Redis stopped: a response's cookie is kept (and sent) by this worker, its write
    fails with a WARNING (no exception); a request to the jar meanwhile goes on with the
    local jar; once Redis is back, the next request (after the retry delay) writes it,
    and another worker's store then loads it."""
    srv = RedisServer(appendonly=False).start()
    try:
        asyncio.run(_hiccup(srv, crawl_id))
    finally:
        srv.close()


async def _hiccup(srv: RedisServer, crawl_id: str) -> None:
    client = make_client(srv.url)
    keys = CrawlKeys(crawl_id)
    stats = _Stats()
    store = CookieStore(client, keys, stats)
    shared = store.of("null")
    jar = CookieJar()
    await store.sync(shared, jar)
    assert shared.version == 0

    srv.stop()
    req = Request("http://127.0.0.1/p/1")
    resp = Response(req.url, headers={"Set-Cookie": "session=t1; Path=/"}, request=req)
    from scrapy_leased.worker.cookies import snapshot

    before = snapshot(jar)
    jar.extract_cookies(resp, req)
    assert store.note_changes(shared, before, jar)
    await store.write(shared)  # fails: logged, kept pending
    assert stats.values["leased/cookies_write_errors"] == 1
    assert list(shared.pending) == ["127.0.0.1\n/\nsession"]
    await store.sync(shared, jar)  # the read fails too: the local jar stays
    probe = Request("http://127.0.0.1/p/2")
    jar.add_cookie_header(probe)
    assert probe.headers.get("Cookie") == b"session=t1"

    srv.start()
    await store.write(shared, retry=True)  # within the retry delay: not yet
    assert stats.values["leased/cookies_written"] == 0 and shared.pending
    shared.retry_at = time.monotonic()  # the retry delay passed
    await store.write(shared, retry=True)
    assert shared.pending == {} and stats.values["leased/cookies_written"] == 1

    other_jar = CookieJar()
    other = CookieStore(make_client(srv.url), keys, _Stats())
    await other.sync(other.of("null"), other_jar)
    probe = Request("http://127.0.0.1/p/3")
    other_jar.add_cookie_header(probe)
    assert probe.headers.get("Cookie") == b"session=t1"
    await client.aclose()
    await other.client.aclose()


def test_a_jar_is_read_again_only_when_a_claim_shows_a_cookie_write(redis_server,
                                                                     crawl_id) -> None:
    """A jar read at the cookie mark of the worker's last claim is not read again while
    the mark stays (no HGET: ``leased/cookies_checked`` does not move), even after
    another worker wrote, until a claim brings the mark that write set; then it is read
    and loaded with that cookie."""
    asyncio.run(_marks(redis_server, crawl_id))


async def _marks(redis_server: RedisServer, crawl_id: str) -> None:
    client = make_client(redis_server.url)
    keys = CrawlKeys(crawl_id)
    marks = {"claim": ""}  # what the last claim returned (no cookie written yet)
    stats = _Stats()
    store = CookieStore(client, keys, stats, lambda: marks["claim"])
    shared, jar = store.of("null"), CookieJar()
    for _ in range(3):
        await store.sync(shared, jar)
    assert stats.values["leased/cookies_checked"] == 1 and shared.version == 0

    other = CookieStore(make_client(redis_server.url), keys, _Stats())
    other_shared, other_jar = other.of("null"), CookieJar()
    req = Request("http://127.0.0.1/p/1")
    resp = Response(req.url, headers={"Set-Cookie": "session=t1; Path=/"}, request=req)
    other_jar.extract_cookies(resp, req)
    assert other.note_changes(other_shared, {}, other_jar)
    await other.write(other_shared)
    await store.sync(shared, jar)  # no claim since: the mark this worker knows is the same
    assert stats.values["leased/cookies_checked"] == 1

    marks["claim"] = (await client.hget(keys.control, "cookies")).decode()
    await store.sync(shared, jar)
    await store.sync(shared, jar)
    assert stats.values["leased/cookies_checked"] == 2
    assert stats.values["leased/cookies_loaded"] == 1 and shared.version == 1
    probe = Request("http://127.0.0.1/p/2")
    jar.add_cookie_header(probe)
    assert probe.headers.get("Cookie") == b"session=t1"
    await client.aclose()
    await other.client.aclose()
