import scrapy


class SiteSpider(scrapy.Spider):
    """Follows every link of the local test site (scrapy_leased/testing/site.py) and
    yields one small item per page, like tests/project's ``site`` spider.
    ``-a start_url=URL``; Scrapy's default ``start()`` (a ``dont_filter`` request)."""

    name = "site"

    def __init__(self, start_url=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("spider 'site' needs -a start_url=URL")
        self.start_urls = [start_url]

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
