"""A spider for tests/test_plain_commands.py: Scrapy's ``check``, ``parse`` and ``fetch``
commands with the add-on in settings.py (no arguments)."""

import scrapy


class PlainCommandsSpider(scrapy.Spider):
    name = "plain_commands"

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        for href in response.css("a::attr(href)").getall()[:3]:
            yield response.follow(href, self.parse)
