"""Coming from scrapy-redis (#27 item 6): a stopped scrapy-redis crawl moved into a
leased crawl with ``scrapy leased from-scrapy-redis``.

scrapy-redis is the real one from PyPI: a small test project crawls the local test site
with plain scrapy-redis settings (its scheduler, dupefilter, pickled priority queue,
SCHEDULER_PERSIST) against a test redis-server and stops midway (CLOSESPIDER_PAGECOUNT),
leaving its queue and dupefilter; then the add-on's worker and ``status`` warn about
them, the command refuses the pickled queue without ``--pickle``, moves it with it (and
marks the URLs the first crawl fetched seen), and a crawl with the add-on crawls every
request that was pending and none of the URLs fetched before.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from scrapy_leased.feed.format import FeedEntryError, parse_scrapy_redis_entry
from tests.support.redis_server import RedisServer

pytest.importorskip("scrapy_redis")

REPO = Path(__file__).resolve().parents[1]
SPIDER = "pages"

SETTINGS = '''
import os

BOT_NAME = "srproj"
SPIDER_MODULES = ["srproj.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 2
if os.environ["SRPROJ_MODE"] == "scrapy-redis":  # as scrapy-redis's README sets it up
    SCHEDULER = "scrapy_redis.scheduler.Scheduler"
    DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
    SCHEDULER_PERSIST = True
    REDIS_URL = os.environ["SRPROJ_REDIS"]
else:
    ADDONS = {"scrapy_leased.Addon": 100}
    LEASED_REDIS_URL = os.environ["SRPROJ_REDIS"]
'''

SPIDER_CODE = '''
import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, start=None, **kwargs):
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self):
        if self.start_url:
            yield scrapy.Request(self.start_url, callback=self.parse_page)

    def parse_page(self, response):
        yield {"url": response.url, "via": response.meta.get("via")}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page,
                                  meta={"via": response.url})
'''


# A JSON serializer for scrapy-redis (SCHEDULER_SERIALIZER names a module with loads and
# dumps): a request dict holds bytes (body, headers), which plain json does not take.
JSONSER = '''
import base64
import json


def _enc(o):
    if isinstance(o, bytes):
        return {"__bytes__": base64.b64encode(o).decode()}
    if isinstance(o, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _enc(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_enc(v) for v in o]
    return o


def _dec(o):
    if isinstance(o, dict):
        if set(o) == {"__bytes__"}:
            return base64.b64decode(o["__bytes__"])
        return {k: _dec(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_dec(v) for v in o]
    return o


def dumps(obj):
    return json.dumps(_enc(obj))


def loads(s):
    return _dec(json.loads(s))
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "srproj"
    (root / "srproj" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = srproj.settings\n")
    (root / "srproj" / "__init__.py").write_text("")
    (root / "srproj" / "settings.py").write_text(textwrap.dedent(SETTINGS))
    (root / "srproj" / "jsonser.py").write_text(textwrap.dedent(JSONSER))
    (root / "srproj" / "spiders" / "__init__.py").write_text("")
    (root / "srproj" / "spiders" / "pages.py").write_text(textwrap.dedent(SPIDER_CODE))
    return root


def run(project: Path, redis_url: str, mode: str, *args: str,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(project),
                                                      env.get("PYTHONPATH")]))
    env.update(SRPROJ_MODE=mode, SRPROJ_REDIS=redis_url)
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=project, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def paths(entries: list[dict[str, Any]]) -> list[str]:
    return [e["path"] for e in entries]


def stopped_scrapy_redis_crawl(project: Path, redis_fresh: RedisServer,
                               site: Any) -> tuple[list[str], list[str]]:
    """Run the scrapy-redis crawl until CLOSESPIDER_PAGECOUNT stops it; the paths it
    fetched and the URLs left in its (pickled, priority) queue."""
    r = run(project, redis_fresh.url, "scrapy-redis", "crawl", SPIDER, "-a",
            f"start={site.url}/p/0", "-s", "CLOSESPIDER_PAGECOUNT=8")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "closespider_pagecount" in r.stderr, r.stderr[-3000:]
    client = redis_fresh.client()
    assert client.type(f"{SPIDER}:requests") == b"zset"
    assert client.scard(f"{SPIDER}:dupefilter") > 0
    pending = [pickle.loads(m)["url"] for m in client.zrange(f"{SPIDER}:requests", 0, -1)]
    assert pending, "the scrapy-redis crawl left nothing pending"
    fetched = paths(site.entries())
    assert fetched
    return fetched, pending


def test_scrapy_redis_crawl_moved(project: Path, redis_fresh: RedisServer, make_site,
                                  tmp_path: Path) -> None:
    site = make_site(pages=60)
    fetched, pending = stopped_scrapy_redis_crawl(project, redis_fresh, site)
    # a URL fetched before that is pending in the queue too (linked again): the seen list
    # wins, it is not fetched again
    pending_paths = {urlsplit(u).path for u in pending}

    # status names the keys and the command (the crawl does not exist yet)
    r = run(project, redis_fresh.url, "leased", "leased", "status", SPIDER, "--sample", "0")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"{SPIDER}:requests (zset" in r.stderr and f"{SPIDER}:dupefilter (set" in r.stderr
    assert f"scrapy leased from-scrapy-redis {SPIDER} --pickle" in r.stderr

    # without --pickle: refused, the flag named, nothing moved
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "--pickle" in r.stderr and "nothing done" in r.stderr
    client = redis_fresh.client()
    assert client.zcard(f"{SPIDER}:requests") == len(pending)

    seen_file = tmp_path / "crawled.txt"
    seen_urls = sorted({site.url + p for p in fetched})
    seen_file.write_text("# exported from the item store\n" + "\n".join(seen_urls) + "\n")
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER,
            "--pickle", "--seen-urls", str(seen_file))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "unpickling runs" in r.stderr
    assert f"marked {len(seen_urls)} URLs seen" in r.stdout, r.stdout
    assert f"moved {len(pending)} queued request" in r.stdout, r.stdout
    assert f"kept {SPIDER}:dupefilter" in r.stdout
    assert not client.exists(f"{SPIDER}:requests")  # moved: the source is emptied
    assert client.exists(f"{SPIDER}:dupefilter")  # left alone

    # a re-run finds nothing left to move and changes nothing
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER,
            "--pickle", "--seen-urls", str(seen_file))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "(0 new" in r.stdout and "nothing pending" in r.stdout, r.stdout

    # status: no warning any more (the crawl exists, nothing pending in scrapy-redis)
    r = run(project, redis_fresh.url, "leased", "leased", "status", SPIDER, "--sample", "0")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "scrapy-redis" not in r.stderr

    site.clear_log()
    r = run(project, redis_fresh.url, "leased", "crawl", SPIDER, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Spider closed (finished)" in r.stderr, r.stderr[-3000:]
    assert "scrapy-redis state" not in r.stderr
    again = paths(site.entries())
    assert again, "nothing crawled after the migration"
    # every pending request crawled, except those the seen list says were fetched
    assert pending_paths - set(fetched) <= set(again), sorted(pending_paths - set(again))
    # none of the URLs crawled before fetched again
    assert not set(again) & set(fetched), sorted(set(again) & set(fetched))
    assert len(again) == len(set(again))
    # the moved requests kept their callback (parse_page: one item a page; the spider
    # has no parse, which would fail every response)
    assert f"'item_scraped_count': {len(again)}," in r.stderr, r.stderr[-3000:]
    assert "NotImplementedError" not in r.stderr


def test_worker_warns_of_a_scrapy_redis_queue(project: Path, redis_fresh: RedisServer,
                                              make_site) -> None:
    """The issue's case: the add-on on a spider with a scrapy-redis queue in its Redis
    crawled nothing without a word; now a WARNING names the keys and the command."""
    site = make_site(pages=40)
    stopped_scrapy_redis_crawl(project, redis_fresh, site)
    r = run(project, redis_fresh.url, "leased", "crawl", SPIDER)
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines()
                if "WARNING" in line and "scrapy-redis state" in line]
    assert len(warnings) == 1, r.stderr[-3000:]
    assert f"{SPIDER}:requests (zset" in warnings[0]
    assert f"scrapy leased from-scrapy-redis {SPIDER} --pickle" in warnings[0]


def test_json_serializer_needs_no_pickle(project: Path, redis_fresh: RedisServer,
                                         make_site) -> None:
    """A JSON SCHEDULER_SERIALIZER (a module with loads and dumps, as scrapy-redis takes
    it): read without --pickle; RedisSpider start entries are moved too."""
    site = make_site(pages=30)
    r = run(project, redis_fresh.url, "scrapy-redis", "crawl", SPIDER, "-a",
            f"start={site.url}/p/0", "-s", "CLOSESPIDER_PAGECOUNT=4",
            "-s", "SCHEDULER_SERIALIZER=srproj.jsonser")
    assert r.returncode == 0, r.stderr[-3000:]
    client = redis_fresh.client()
    n = client.zcard(f"{SPIDER}:requests")
    assert n > 0
    entry = json.dumps({"url": f"{site.url}/p/28", "meta": {"job": "1"}, "q": "x"})
    client.rpush(f"{SPIDER}:start_urls", f"{site.url}/p/29", entry)
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER,
            "-s", "SCHEDULER_SERIALIZER=srproj.jsonser")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "unpickling" not in r.stderr
    assert f"moved {n} queued request" in r.stdout and "moved 2 start URLs" in r.stdout
    assert not client.exists(f"{SPIDER}:requests", f"{SPIDER}:start_urls")


def test_scrapy_redis_start_entries() -> None:
    """RedisSpider's JSON start entries, as scrapy-redis's make_request_from_data reads
    them: url, method, meta, every other key a form field; a bare URL."""
    get = parse_scrapy_redis_entry(b'{"url": "https://example.com/s", "meta": {"job": "1"},'
                                   b' "q": "shoes", "page": ["1", "2"]}').request
    assert get.method == "GET" and get.dont_filter
    assert get.url == "https://example.com/s?q=shoes&page=1&page=2"
    assert get.meta == {"job": "1"}
    post = parse_scrapy_redis_entry('{"url": "https://example.com/login", "method": "post",'
                                    ' "user": "a b"}').request
    assert post.method == "POST" and post.body == b"user=a+b"
    assert post.headers[b"Content-Type"] == b"application/x-www-form-urlencoded"
    bare = parse_scrapy_redis_entry("https://example.com/x").request
    assert bare.url == "https://example.com/x" and bare.dont_filter
    for bad, words in (('{"meta": {}}', "no 'url'"), ('{"url": "https://e.com", "n": 3}',
                       "form field 'n'"), ('{"url": "https://e.com", "meta": []}', "'meta'"),
                       ('["x"]', "not a URL Scrapy takes"), ('{"url": 3}', "'url' must be")):
        with pytest.raises(FeedEntryError, match=words):
            parse_scrapy_redis_entry(bad)


def test_seed_takes_scrapy_redis_entries(project: Path, redis_fresh: RedisServer) -> None:
    """``seed --scrapy-redis`` reads RedisSpider entries; without it, their form fields
    are refused (unknown fields of the feed's format)."""
    entry = '{"url": "http://127.0.0.1:9/search", "method": "POST", "q": "x"}'
    r = run(project, redis_fresh.url, "leased", "leased", "seed", SPIDER, entry)
    assert r.returncode == 1 and "unknown field 'q'" in r.stderr, r.stderr
    r = run(project, redis_fresh.url, "leased", "leased", "seed", SPIDER, "--scrapy-redis",
            entry)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "1 queued" in r.stdout


@pytest.mark.parametrize("seen_ttl", [0, 3600])
def test_mark_seen(redis_fresh: RedisServer, seen_ttl: int) -> None:
    """``--seen-urls`` marks fingerprints seen without queueing (lua/mark_seen.lua), as a
    worker's new request would be recorded: with LEASED_SEEN_TTL too (generations)."""
    import asyncio

    from scrapy import Request
    from scrapy.settings import Settings

    from scrapy_leased._redis.connection import make_client
    from scrapy_leased.feed.packer import RequestPacker
    from scrapy_leased.fleet import FleetAdmin
    from scrapy_leased.fleet.seen import mark_seen
    from scrapy_leased.frontier import CrawlKeys
    from scrapy_leased.settings import LeasedConfig

    settings = Settings({"LEASED_REDIS_URL": redis_fresh.url, "LEASED_SEEN_TTL": seen_ttl})
    config = LeasedConfig.from_settings(settings)
    packer = RequestPacker.from_settings(settings, config)
    old, new = (packer.pack(Request(f"https://example.com/{p}")) for p in ("old", "new"))

    async def go() -> tuple[list[bool], list[bool], list[bool], int]:
        client = make_client(redis_fresh.url)
        try:
            admin = FleetAdmin(client, CrawlKeys(f"marks{seen_ttl}"))
            assert old.bucket is not None
            first = await mark_seen(admin, [(old.bucket, old.member)],
                                    config.seen_bucket_bits, config.seen_ttl_ms)
            again = await mark_seen(admin, [(old.bucket, old.member)],
                                    config.seen_bucket_bits, config.seen_ttl_ms)
            queued = await admin.seed([old, new], config.seen_bucket_bits, config.seen_ttl_ms)
            snap = await admin.snapshot(memory=False)
            return first, again, queued, snap.todo
        finally:
            await client.aclose()

    first, again, queued, todo = asyncio.run(go())
    assert (first, again, queued, todo) == ([True], [False], [False, True], 1)
    assert redis_fresh.client().hget(f"leased:{{marks{seen_ttl}}}:stats", "marked_seen") == b"1"


def test_feed_in_scrapy_redis_format(project: Path, redis_fresh: RedisServer, make_site) -> None:
    """LEASED_FEED_FORMAT = "scrapy-redis": a producer written for RedisSpider's start
    URLs pushes the same entries to the crawl's feed; the worker sends their form fields
    as FormRequest does (a GET's in the query, a POST's as an urlencoded body), and an
    entry the format refuses is a dead letter."""
    site = make_site(pages=5)
    feed = f"leased:{{{SPIDER}}}:feed"
    client = redis_fresh.client()
    client.rpush(feed, f"{site.url}/p/1",
                 json.dumps({"url": f"{site.url}/p/2", "q": "shoes", "meta": {"job": "7"}}),
                 json.dumps({"url": f"{site.url}/p/3", "method": "POST", "user": "a b"}),
                 json.dumps({"url": f"{site.url}/p/4", "n": 3}))
    r = run(project, redis_fresh.url, "leased", "crawl", SPIDER,
            "-s", "LEASED_FEED_FORMAT=scrapy-redis")
    assert r.returncode == 0, r.stderr[-3000:]
    got = {(e["method"], e["path"], e.get("body")) for e in site.entries()}
    assert {("GET", "/p/1", None), ("GET", "/p/2?q=shoes", None),
            ("POST", "/p/3", "user=a+b")} <= got, got
    assert not any(path.startswith("/p/4") for _, path, _ in got)
    r = run(project, redis_fresh.url, "leased", "leased", "dead", SPIDER)
    assert r.returncode == 0 and "form field 'n'" in r.stdout, (r.stdout, r.stderr)

    r = run(project, redis_fresh.url, "leased", "crawl", SPIDER,
            "-s", "LEASED_FEED_FORMAT=redis")
    assert r.returncode == 1 and "LEASED_FEED_FORMAT ('redis') must be one of" in r.stderr, \
        r.stderr[-3000:]


def test_a_big_fifo_queue_and_an_unreadable_entry(project: Path,
                                                  redis_fresh: RedisServer) -> None:
    """A FifoQueue (a LIST) of more entries than one batch moves whole; an entry that
    cannot be read (a callback the spider has not) stops the command before anything is
    written, naming it."""
    from scrapy import Request

    class PagesSpider:  # what request_to_dict needs: the callback found on the spider
        name = SPIDER

        def parse_page(self, response: Any) -> None:
            pass

    spider = PagesSpider()
    client = redis_fresh.client()
    key = f"{SPIDER}:requests"
    entries = [pickle.dumps(  # as scrapy-redis's queue encodes a request
        Request(f"http://127.0.0.1:9/p/{i}", callback=spider.parse_page, priority=i % 3)
        .to_dict(spider=spider)) for i in range(1200)]
    client.lpush(key, *entries)  # as FifoQueue.push does
    bad = Request("http://127.0.0.1:9/bad").to_dict()
    bad["callback"] = "no_such_method"
    client.lpush(key, pickle.dumps(bad))
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER, "--pickle")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no_such_method" in r.stderr and "nothing done" in r.stderr, r.stderr
    assert client.llen(key) == 1201 and not client.keys("leased:*")

    client.lrem(key, 1, pickle.dumps(bad))
    r = run(project, redis_fresh.url, "leased", "leased", "from-scrapy-redis", SPIDER, "--pickle")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "moved 1,200 queued requests" in r.stdout and "(1,200 queued" in r.stdout, r.stdout
    assert not client.exists(key)
    assert int(client.get(f"leased:{{{SPIDER}}}:todo")) == 1200
