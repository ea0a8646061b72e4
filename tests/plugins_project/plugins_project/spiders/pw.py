"""scrapy-playwright: every page is rendered in Chromium; its links exist only after its
script ran. Each request carries ``PageMethod``s in meta; the item holds the result of
one (so it shows the methods ran on the worker that downloaded the page).

Page 0 is also requested once more reusing its live page (``playwright_page``, as in
scrapy-playwright's README): plain Scrapy downloads it again (its callback yields
nothing); the add-on refuses it with an error naming the URL, the key and the fix.
"""

import scrapy
from scrapy_playwright.page import PageMethod


def page_methods():
    return [PageMethod("wait_for_selector", "#title"),
            PageMethod("evaluate", "document.querySelectorAll('a').length")]


class PlaywrightSpider(scrapy.Spider):
    name = "pw"
    custom_settings = {
        "DOWNLOAD_HANDLERS": {
            "http": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
            "https": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
        },
        "PLAYWRIGHT_BROWSER_TYPE": "chromium",
        "PLAYWRIGHT_LAUNCH_OPTIONS": {"executable_path": "/usr/bin/chromium"},
        "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": 4,
    }

    async def start(self):
        yield scrapy.Request(self.start_url, callback=self.parse,
                             meta={"playwright": True, "playwright_include_page": True,
                                   "playwright_page_methods": page_methods()})

    async def parse(self, response):
        page = response.meta.pop("playwright_page", None)
        links = response.meta["playwright_page_methods"][1].result
        yield {"url": response.url, "title": response.css("#title::text").get(),
               "links": links}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse,
                                  meta={"playwright": True,
                                        "playwright_page_methods": page_methods()})
        if page is not None:
            yield scrapy.Request(response.url, callback=self.parse_again, dont_filter=True,
                                 meta={"playwright": True, "playwright_page": page})

    def parse_again(self, response):
        return []
