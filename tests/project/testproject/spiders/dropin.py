"""Spiders written the way existing Scrapy projects are, for tests/test_dropin.py: items
without a url, meta passed on with ``meta=response.meta``, a host that refuses
connections, rich meta (items, datetimes, bytes, nested requests)."""

import dataclasses
import datetime
import decimal
import re

import attrs
import scrapy

from testproject.items import PageItem


class PlainItemsSpider(scrapy.Spider):
    """Follows every link; its items are ``{"title", "n", "worker"}``: no ``url``.
    ``start_gate``: start() yields nothing until that file exists."""

    name = "plain_items"

    def __init__(self, start_url, worker=None, start_gate=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [start_url]
        self.worker = worker
        self.start_gate = start_gate

    async def start(self):
        import asyncio
        import os

        while self.start_gate and not os.path.exists(self.start_gate):
            await asyncio.sleep(0.05)
        for url in self.start_urls:
            yield scrapy.Request(url, dont_filter=True)

    def parse(self, response):
        title = response.css("title::text").get()
        yield {"title": title, "n": int(title.split()[-1]), "worker": self.worker}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


class MetaFollowSpider(scrapy.Spider):
    """Passes data on the way many projects do: ``response.follow(href,
    meta=response.meta)``, and ``response.request.replace(url=...)`` for every third
    link: every child carries its parent's meta (and so its claim token)."""

    name = "meta_follow"

    def __init__(self, start_url, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [start_url]
        self.worker = worker

    async def start(self):
        # not dont_filter: request.replace() would pass it on to every descendant
        yield scrapy.Request(self.start_urls[0], meta={"trail": "start"})

    def parse(self, response):
        yield {"url": response.url, "worker": self.worker, "trail": response.meta.get("trail")}
        for i, href in enumerate(response.css("a::attr(href)").getall()):
            if i % 3 == 2:
                yield response.request.replace(url=response.urljoin(href))
            else:
                yield response.follow(href, meta=response.meta)


class RefusingSpider(scrapy.Spider):
    """``pages`` pages of the site, and one URL whose host refuses connections, with an
    errback (``errback=1``) or without."""

    name = "refusing"

    def __init__(self, base, dead_url, pages="30", errback="0", worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base.rstrip("/")
        self.dead_url = dead_url
        self.pages = int(pages)
        self.use_errback = errback == "1"
        self.worker = worker

    async def start(self):
        yield scrapy.Request(self.dead_url, self.parse_page,
                             errback=self.on_error if self.use_errback else None)
        for i in range(1, self.pages + 1):
            yield scrapy.Request(f"{self.base}/p/{i}", self.parse_page)

    def parse_page(self, response):
        yield {"url": response.url, "worker": self.worker}

    def on_error(self, failure):
        yield {"url": failure.request.url, "worker": self.worker, "errback": True,
               "error": type(failure.value).__name__}


@dataclasses.dataclass
class Price:
    amount: decimal.Decimal
    currency: str = "EUR"
    tags: tuple = ()


@attrs.define
class Seen:
    at: datetime.datetime
    raw: bytes = b""


def rich_meta(n: int):
    """What the spider sends with request n; the callback compares what arrives with it."""
    return {
        "item": PageItem(url=f"/p/{n}", title=f"page {n}", worker=None),
        "price": Price(decimal.Decimal(f"{n}.10"), tags=("a", n)),
        "seen": Seen(datetime.datetime(2026, 1, 2, 3, 4, 5, n, tzinfo=datetime.timezone.utc),
                     bytes([0, 255, n])),
        "when": datetime.datetime(2026, 12, 1, 10, n % 60),
        "day": datetime.date(2026, 12, n % 28 + 1),
        "raw": b"\x00\xffraw" + bytes([n]),
        "pair": (n, "x"),
        "tags": {"a", "b", str(n)},
        "by_id": {1: "one", n: [n]},
        "plain": {"k": [1, 2.5, None, True, "s"]},
    }


class RichMetaSpider(scrapy.Spider):
    """start(): first ``hold_url`` (a slow page that keeps this worker's only slot busy),
    then ``n`` requests with rich meta and a nested Request in meta, and one request
    whose meta holds an item of a class outside the project (refused, naming the key).
    The callbacks record whether what arrived equals what was sent."""

    name = "rich_meta"
    custom_settings = {"CONCURRENT_REQUESTS": 1}

    def __init__(self, base, n="5", hold_url=None, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base.rstrip("/")
        self.n = int(n)
        self.hold_url = hold_url
        self.worker = worker

    async def start(self):
        from tests.support.outside import OutsideItem

        if self.hold_url:
            yield scrapy.Request(self.hold_url, self.parse_hold)
        yield scrapy.Request(f"{self.base}/p/100", self.parse_rich,
                             meta={"obj": OutsideItem(1)})  # refused: not the project's
        for i in range(1, self.n + 1):
            nested = scrapy.Request(f"{self.base}/p/{i + 50}", self.parse_nested,
                                    meta={"raw": bytes([i]), "when": rich_meta(i)["when"]},
                                    cb_kwargs={"pair": (i, "y")}, priority=3,
                                    dont_filter=True)
            yield scrapy.Request(f"{self.base}/p/{i}", self.parse_rich,
                                 meta={**rich_meta(i), "next": nested})

    def parse_hold(self, response):
        yield {"url": response.url, "worker": self.worker, "hold": True}

    def parse_rich(self, response):
        n = int(re.search(r"/p/(\d+)", response.url).group(1))
        want = rich_meta(n)
        got = {k: response.meta.get(k) for k in want}
        same = got == want and all(type(got[k]) is type(v) for k, v in want.items())
        nested = response.meta["next"]
        yield {"url": response.url, "worker": self.worker, "same": same,
               "got": repr(got) if not same else None,
               "nested": [nested.url, nested.callback == self.parse_nested, nested.priority,
                          nested.dont_filter, nested.meta.get("raw") == bytes([n]),
                          nested.cb_kwargs == {"pair": (n, "y")}]}
        yield nested

    def parse_nested(self, response, pair):
        n = pair[0]
        yield {"url": response.url, "worker": self.worker, "nested_same":
               response.meta.get("raw") == bytes([n]) and pair == (n, "y")
               and response.meta.get("when") == rich_meta(n)["when"]}


class ContinuationsSpider(scrapy.Spider):
    """Retries, redirects, a retry of a redirect, a redirect to a page also linked,
    meta copied into every child, request.replace()/copy() and get_retry_request() in
    callbacks: what reaches the site must be what Scrapy alone sends (the order may
    differ, so nothing here depends on it: no DEPTH_LIMIT, whose effect does)."""

    name = "continuations"
    custom_settings = {"RETRY_TIMES": 2}

    def __init__(self, base, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base.rstrip("/")
        self.worker = worker

    async def start(self):
        b = self.base
        yield scrapy.Request(f"{b}/p/1", meta={"from": "start"})
        yield scrapy.Request(f"{b}/flaky/a?fail=2", self.parse_leaf, meta={"from": "start"})
        yield scrapy.Request(f"{b}/flaky/gone?fail=99", self.parse_leaf)  # retries run out
        yield scrapy.Request(f"{b}/goto?to=/flaky/b%3Ffail%3D1", self.parse_leaf)  # retry of a redirect
        # to a page also linked: the same callback, so whichever comes first does the same
        yield scrapy.Request(f"{b}/redirect/2", self.parse)
        yield scrapy.Request(f"{b}/p/3", self.parse_retry_once)

    def parse(self, response):
        yield {"url": response.url, "worker": self.worker}
        for i, href in enumerate(response.css("a::attr(href)").getall()):
            url = response.urljoin(href)
            if i % 4 == 1:
                yield response.request.replace(url=url)
            elif i % 4 == 2:
                r = response.request.copy()  # the same URL: a duplicate, filtered
                yield r
            else:
                yield response.follow(href, meta=response.meta)

    def parse_leaf(self, response):
        yield {"url": response.url, "worker": self.worker, "status": response.status}

    def parse_retry_once(self, response):
        from scrapy.downloadermiddlewares.retry import get_retry_request

        yield {"url": response.url, "worker": self.worker, "retried": response.meta.get(
            "retry_times", 0)}
        if not response.meta.get("retry_times"):
            yield get_retry_request(response.request, spider=self, reason="once more")


class LazyStartSpider(scrapy.Spider):
    """Scrapy's example of lazy start requests (its docs, "start-requests-lazy"; its test
    TestRequestSendOrder.test_lazy): start() yields the next request only once the
    scheduler is empty, one request at a time. ``/slow/1`` yields ``/slow/3`` from its
    callback; Scrapy sends 1, 2, 3, 4."""

    name = "lazy_start"
    custom_settings = {"CONCURRENT_REQUESTS": 1}

    def __init__(self, base, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base

    async def start(self):
        for n in (1, 2, 4):
            if self.crawler.engine.needs_backout():
                await self.crawler.signals.wait_for(scrapy.signals.scheduler_empty)
            yield scrapy.Request(f"{self.base}/slow/{n}?s=0.2")

    def parse(self, response):
        if response.url.endswith("/slow/1?s=0.2"):
            yield scrapy.Request(f"{self.base}/slow/3?s=0.2")
