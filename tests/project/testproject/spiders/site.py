import asyncio
import os

import scrapy


class SiteSpider(scrapy.Spider):
    """Crawls the test site (scrapy_leased/testing/site.py) by following every link.

    Spider args (all optional except start_url):

    - ``start_url``: one URL or several comma-separated.
    - ``worker``: worker name, copied into every item.
    - ``slow_path`` / ``slow_seconds``: for URLs containing slow_path, the
      callback awaits ``asyncio.sleep(slow_seconds)`` (default 1) before yielding.
    - ``raise_path``: the callback raises ``RuntimeError("boom <url>")``.
    - ``exit_path``: the callback calls ``os._exit(3)`` (hard worker crash).
    - ``claim_field``: items get this field with the claim token of their request.
    - ``start_filter``: ``1``: the start requests are deduplicated (no ``dont_filter``).
    - ``revisit_path``, ``revisit_after``: links whose URL contains ``revisit_path`` get
      ``meta["leased_revisit_after"] = float(revisit_after)``.
    - ``hold_log`` / ``hold_count``: the callback waits (at most 60 s) until the file
      ``hold_log`` (a site's request log) has ``hold_count`` lines, and its item gets
      ``held_until`` = whether it had them: other downloads went on meanwhile.
    """

    name = "site"

    def __init__(self, start_url=None, worker=None, slow_path=None, slow_seconds="1",
                 raise_path=None, exit_path=None, claim_field=None, start_filter="0",
                 revisit_path=None, revisit_after="0", hold_log=None, hold_count="0",
                 *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("spider 'site' needs -a start_url=URL[,URL...]")
        self.start_urls = [u.strip() for u in start_url.split(",") if u.strip()]
        self.worker = worker
        self.slow_path = slow_path or None
        self.slow_seconds = float(slow_seconds)
        self.raise_path = raise_path or None
        self.exit_path = exit_path or None
        self.claim_field = claim_field or None
        self.start_filter = start_filter == "1"
        self.revisit_path = revisit_path or None
        self.revisit_after = float(revisit_after)
        self.hold_log = hold_log or None
        self.hold_count = int(hold_count)

    async def start(self):
        # Scrapy's default (Request(url, dont_filter=True) per start_urls entry), or
        # deduplicated start requests with start_filter=1
        for url in self.start_urls:
            yield scrapy.Request(url, dont_filter=not self.start_filter)

    async def parse(self, response):
        url = response.url
        if self.exit_path and self.exit_path in url:
            os._exit(3)
        if self.raise_path and self.raise_path in url:
            raise RuntimeError(f"boom {url}")
        if self.slow_path and self.slow_path in url:
            await asyncio.sleep(self.slow_seconds)
        held = await self._hold() if self.hold_log else None
        item = {
            "url": url,
            "title": response.css("title::text").get(),
            "worker": self.worker,
        }
        if held is not None:
            item["held_until"] = held
        if self.claim_field:
            item[self.claim_field] = response.meta.get("_leased_claim")
        yield item
        for href in response.css("a::attr(href)").getall():
            meta = {}
            if self.revisit_path and self.revisit_path in response.urljoin(href):
                meta["leased_revisit_after"] = self.revisit_after
            yield response.follow(href, callback=self.parse, meta=meta)

    async def _hold(self) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while loop.time() < deadline:
            try:
                with open(self.hold_log, "rb") as f:
                    if sum(1 for _ in f) >= self.hold_count:
                        return True
            except FileNotFoundError:
                pass
            await asyncio.sleep(0.05)
        return False
