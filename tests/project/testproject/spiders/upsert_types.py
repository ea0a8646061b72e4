"""For tests/test_upsert_crawl.py: one page yields an item of every kind (each with
its own way of choosing the upsert key) and one item without a key; a request to a
dead port has an errback that yields an item (written unfenced: errbacks of download
errors skip spider middlewares)."""

from urllib.parse import urlsplit

import scrapy


class UpsertTypesSpider(scrapy.Spider):
    name = "upsert_types"

    def __init__(self, base, dead_url, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base.rstrip("/")
        self.dead_url = dead_url.rstrip("/")
        self.worker = worker

    async def start(self):
        yield scrapy.Request(f"{self.base}/p/1", self.parse_types)
        yield scrapy.Request(f"{self.dead_url}/x", self.parse_types, errback=self.on_error)

    def parse_types(self, response):
        # imported here: every worker loads every spider module, and the other tests'
        # workers need neither attrs nor pydantic
        from testproject.items import AttrsPage, DataPage, PageItem, PydanticPage

        url, w = response.url, self.worker
        parts = urlsplit(url)
        yield {"url": url, "kind": "dict", "worker": w}
        yield PageItem(url=url, title=response.css("title::text").get(), worker=w)
        yield DataPage(path=parts.path, url=url, worker=w)
        yield AttrsPage(site=parts.netloc, path=parts.path, worker=w)
        yield PydanticPage(url=url, n=1, worker=w)
        yield {"title": "an item without its key"}

    def on_error(self, failure):
        yield {"url": failure.request.url, "kind": "errback", "worker": self.worker}
