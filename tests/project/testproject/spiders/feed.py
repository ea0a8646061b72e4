import scrapy

#: Meta keys Scrapy and its middlewares set: not what the producer sent.
SCRAPY_META = {"depth", "download_timeout", "download_slot", "download_latency"}


class FeedSpider(scrapy.Spider):
    """A spider fed from outside (tests/test_feed.py): it has no start requests of its
    own unless ``-a start_url=...``, follows no links, and each callback records what
    the request that reached it carried: url, method, body, the producer's meta,
    priority and the callback's name."""

    name = "feed"

    def __init__(self, start_url=None, worker=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [u for u in (start_url or "").split(",") if u]
        self.worker = worker

    def _record(self, response, callback):
        request = response.request
        return {
            "url": request.url,
            "method": request.method,
            "body": request.body.decode("utf-8", "replace"),  # body_base64: any bytes
            "meta": {k: v for k, v in response.meta.items()
                     if k not in SCRAPY_META and not k.startswith("_")},
            "priority": request.priority,
            "callback": callback,
            "worker": self.worker,
        }

    def parse(self, response):
        yield self._record(response, "parse")

    def parse_feed(self, response):
        yield self._record(response, "parse_feed")

    def parse_other(self, response):
        yield self._record(response, "parse_other")
