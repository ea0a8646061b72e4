"""scrapy-poet: page objects, callbacks made by ``callback_for`` (sync ``parse`` and
async ``async_parse``), and a ``web_poet.Retry`` when a page is not ready yet (the site
serves some item pages "loading" on their first fetch): raised from the callback
(``ItemPage.to_item``: scrapy-poet's spider middleware) or while the page object is built
(``CheckedItemPage``: scrapy-poet's downloader middleware)."""

import attr
import scrapy
from scrapy_poet import callback_for
from web_poet import WebPage
from web_poet.exceptions import Retry


class ListPage(WebPage):
    def to_item(self):
        return {"url": str(self.url), "kind": "list",
                "title": self.css("h1::text").get()}


class ItemPage(WebPage):
    async def to_item(self):
        if self.css("#state::text").get() != "ready":
            raise Retry()
        return {"url": str(self.url), "kind": "item", "title": self.css("h1::text").get()}


@attr.s(auto_attribs=True)
class CheckedItemPage(WebPage):
    def __attrs_post_init__(self):
        if self.css("#state::text").get() != "ready":
            raise Retry()

    def to_item(self):
        return {"url": str(self.url), "kind": "item", "title": self.css("h1::text").get()}


class PoetSpider(scrapy.Spider):
    name = "poet"

    parse_list_item = callback_for(ListPage)  # __name__ "parse"
    parse_item = callback_for(ItemPage)  # __name__ "async_parse"
    parse_checked_item = callback_for(CheckedItemPage)

    async def start(self):
        yield scrapy.Request(self.start_url, callback=self.parse)

    def parse(self, response, page: ListPage):
        yield scrapy.Request(response.url + "?as=item", callback=self.parse_list_item)
        for href in response.css("a.item::attr(href)").getall():
            checked = int(href.rsplit("/", 1)[1]) % 3 == 1
            yield response.follow(href, callback=self.parse_checked_item if checked
                                  else self.parse_item)
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
