"""One request per completion scenario; the test checks which are acked (done) and
which are failed (dead letters with LEASED_MAX_ATTEMPTS=1)."""

import scrapy

from testproject.middlewares import RecoverableError


class OutcomesSpider(scrapy.Spider):
    name = "outcomes"
    allowed_domains = ["127.0.0.1"]
    custom_settings = {
        "ITEM_PIPELINES": {
            "testproject.pipelines.FaultPipeline": 400,
            "testproject.pipelines.RecordPipeline": 500,
        },
        "SPIDER_MIDDLEWARES": {"testproject.middlewares.RecoverMiddleware": 100},
        "RETRY_TIMES": 2,
    }

    def __init__(self, base, dead_url, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = base.rstrip("/")
        self.dead_url = dead_url.rstrip("/")

    async def start(self):
        b, d = self.base, self.dead_url
        yield scrapy.Request(f"{b}/p/1", self.parse_ok)  # acked
        yield scrapy.Request(f"{b}/p/2", self.parse_raise)  # callback error
        yield scrapy.Request(f"{b}/p/3", self.parse_item, cb_kwargs={"fault": "raise"})  # pipeline error
        yield scrapy.Request(f"{b}/p/4", self.parse_item, cb_kwargs={"fault": "drop"})  # DropItem: acked
        yield scrapy.Request(f"{b}/p/5", self.parse_offsite)  # offsite child: parent acked
        yield scrapy.Request(f"{b}/status/404", self.parse_ok)  # ignored 404: acked
        yield scrapy.Request(f"{b}/status/410", self.parse_ok, errback=self.on_error)  # errback: acked
        yield scrapy.Request(f"{b}/p/6", self.parse_recoverable)  # recovered exception: acked
        yield scrapy.Request(f"{b}/flaky/a?fail=2", self.parse_ok)  # 2 retries then 200: acked
        yield scrapy.Request(f"{b}/redirect/7", self.parse_ok)  # redirect: acked
        yield scrapy.Request(f"{b}/flaky/b?fail=99", self.parse_ok)  # 503 after retries: acked
        yield scrapy.Request(f"{d}/x", self.parse_ok)  # connection refused, no errback: dead letter
        yield scrapy.Request(f"{d}/y", self.parse_ok, errback=self.on_error)  # same, handled by the errback: acked

    def parse_ok(self, response):
        yield {"url": response.url}

    def parse_raise(self, response):
        raise RuntimeError(f"boom {response.url}")

    def parse_item(self, response, fault):
        yield {"url": response.url, "fault": fault}

    def parse_offsite(self, response):
        yield scrapy.Request("http://offsite.invalid/z", self.parse_ok)
        yield {"url": response.url}

    def parse_recoverable(self, response):
        raise RecoverableError(response.url)
        yield  # a generator

    def on_error(self, failure):
        yield {"url": failure.request.url, "error": repr(failure.value)}
