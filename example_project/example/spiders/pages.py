"""Crawls the test site (scrapy_leased/testing/site.py) by following every link."""

import scrapy


class PagesSpider(scrapy.Spider):
    """``scrapy crawl pages -a site=http://127.0.0.1:PORT``: starts at ``/p/0`` of that
    site and follows every link; one item per page (stored by the add-on's
    UpsertPipeline, keyed by ``url``)."""

    name = "pages"

    def __init__(self, site=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not site:
            raise ValueError("spider 'pages' needs -a site=URL: start the test site with "
                             "`python -m scrapy_leased.testing.site --pages 5000` and pass "
                             "the URL it prints")
        self.start_urls = [site.rstrip("/") + "/p/0"]

    async def parse(self, response):
        links = response.css("a::attr(href)").getall()
        yield {"url": response.url, "title": response.css("title::text").get(),
               "links": len(links)}
        for href in links:
            yield response.follow(href, callback=self.parse)
