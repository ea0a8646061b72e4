"""Feed a crawl from any Python program: ``Crawl`` (blocking) and ``AsyncCrawl``.

::

    from scrapy_leased import Crawl

    with Crawl("redis://redis:6379/0", "books") as crawl:
        crawl.push([
            "https://example.com/",                      # a URL
            {"url": "https://example.com/api", "method": "POST", "body": "{}",
             "priority": 5, "callback": "parse_api", "meta": {"page": 1}},
            scrapy.Request("https://example.com/x", callback=BooksSpider.parse_item),
        ])

Requests are queued at once, through the same fleet-wide dedupe and lanes as the
workers' own (packer.py), FIFO within their priority; ``push`` returns, for each,
whether it was queued (False: seen before). What cannot be queued (a bad entry, a
callback that is not a method, a value meta cannot store) raises before anything of the
call is queued. The crawl's settings (seen-set layout, fingerprinter, rate lanes, item
modules) come from the Scrapy project (``get_project_settings``) unless given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.project import get_project_settings

from ..bootstrap import connect_crawl
from ..codec import PayloadError
from ..fleet import FleetAdmin
from ..frontier import CrawlKeys, NewRequest
from ..settings import LeasedConfig, LeasedConfigError, check_crawl_id, check_redis_url
from .format import FeedEntryError, FeedRequest, parse_entry
from .packer import RequestPacker

Pushable = Request | Mapping[str, Any] | str


def _settings(settings: Settings | Mapping[str, Any] | None, redis_url: str | None,
              crawl_id: str | None) -> Settings:
    if isinstance(settings, Settings):
        out = settings.copy()
    else:
        out = get_project_settings()
        out.setdict(dict(settings or {}), priority="cmdline")
    if redis_url is not None:
        out.set("LEASED_REDIS_URL", check_redis_url(redis_url, "redis_url"), "cmdline")
    if crawl_id is not None:
        out.set("LEASED_CRAWL_ID", check_crawl_id(crawl_id, "crawl_id"), "cmdline")
    return out


def _name(func: Any, what: str, i: int) -> str | None:
    if func is None:
        return None
    name = getattr(func, "__name__", None)
    if not callable(func) or not isinstance(name, str) or not name.isidentifier():
        raise FeedEntryError(f"request {i}: the {what} {func!r} is not a spider method "
                             "(give the method, e.g. MySpider.parse_item, or its name in "
                             f"a dict's {what!r})")
    return name


def to_feed_request(request: Pushable, i: int = 0) -> FeedRequest:
    """A request given to ``push``: a Request (its callback and errback are taken by
    name: methods of the spider class), a dict in the feed's format, or a URL."""
    if isinstance(request, Request):
        names = (_name(request.callback, "callback", i), _name(request.errback, "errback", i))
        return FeedRequest(request.replace(callback=None, errback=None), *names)
    if isinstance(request, (str, Mapping)):
        try:
            return parse_entry(request)
        except FeedEntryError as exc:
            raise FeedEntryError(f"request {i}: {exc}") from None
    raise FeedEntryError(f"request {i}: {request!r} is not a Request, a dict or a URL")


class AsyncCrawl:
    """A crawl (by its Redis and crawl id) that requests can be pushed to from outside
    its workers. ``redis_url``, ``crawl_id``: as LEASED_REDIS_URL and LEASED_CRAWL_ID
    (the spider's name when the workers do not set one); without them, the settings'."""

    def __init__(self, redis_url: str | None = None, crawl_id: str | None = None, *,
                 settings: Settings | Mapping[str, Any] | None = None) -> None:
        self.settings = _settings(settings, redis_url, crawl_id)
        self.config = LeasedConfig.from_settings(self.settings)
        if self.config.crawl_id is None:
            raise LeasedConfigError("no crawl id: give crawl_id (the workers' "
                                    "LEASED_CRAWL_ID, or their spider's name when they set "
                                    "none)")
        self.keys = CrawlKeys(self.config.crawl_id)
        self.packer = RequestPacker.from_settings(self.settings, self.config)
        self._admin: FleetAdmin | None = None
        # one push at a time: a commit sent again after a lost reply is matched to the
        # last one of this caller (lua/lib_guard.lua)
        self._pushing = asyncio.Lock()

    @property
    def feed_key(self) -> str:
        """The Redis LIST producers in any language push JSON entries to (docs/feed.md)."""
        return self.keys.feed

    async def _connected(self) -> FleetAdmin:
        if self._admin is None:
            client, _url = await connect_crawl(self.config)
            self._admin = FleetAdmin(client, self.keys, lease_ms=self.config.lease_ms,
                                     max_attempts=self.config.max_attempts)
        return self._admin

    def pack(self, requests: Iterable[Pushable]) -> list[NewRequest]:
        """The requests as queued; raises FeedEntryError (a ValueError) naming the first
        that cannot be, by its index."""
        out = []
        for i, request in enumerate(requests):
            fed = to_feed_request(request, i)
            try:
                out.append(self.packer.pack(fed.request, fed.names))
            except PayloadError as exc:
                raise FeedEntryError(f"request {i}: {exc}") from None
            except RecursionError:
                raise FeedEntryError(f"request {i}: nested too deeply") from None
        return out

    async def push(self, requests: Iterable[Pushable]) -> list[bool]:
        """Queue requests now; for each, whether it was queued (False: seen before)."""
        packed = self.pack(requests)
        async with self._pushing:
            admin = await self._connected()
            return await admin.seed(packed, self.config.seen_bucket_bits,
                                    self.config.seen_ttl_ms)

    async def aclose(self) -> None:
        if self._admin is not None:
            await self._admin.client.aclose()
            self._admin = None

    async def __aenter__(self) -> AsyncCrawl:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Crawl:
    """``AsyncCrawl`` for programs without an event loop (not to be used inside one:
    use AsyncCrawl there)."""

    def __init__(self, redis_url: str | None = None, crawl_id: str | None = None, *,
                 settings: Settings | Mapping[str, Any] | None = None) -> None:
        self._crawl = AsyncCrawl(redis_url, crawl_id, settings=settings)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def feed_key(self) -> str:
        return self._crawl.feed_key

    def _run(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Crawl blocks: inside an event loop, use AsyncCrawl")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def push(self, requests: Iterable[Pushable]) -> list[bool]:
        """Queue requests now; for each, whether it was queued (False: seen before)."""
        return list(self._run(self._crawl.push(requests)))

    def close(self) -> None:
        if self._loop is not None:
            self._run(self._crawl.aclose())
            self._loop.close()
            self._loop = None

    def __enter__(self) -> Crawl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
