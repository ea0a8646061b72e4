"""The spider whose callbacks the in-process benchmarks' requests name (it crawls nothing)."""

from __future__ import annotations

from typing import Any

import scrapy


class BenchSpider(scrapy.Spider):
    """``parse`` overrides Scrapy's, so a subclass's callbacks are its only new members
    (``Request.to_dict`` finds a callback's name among the spider's members)."""

    name = "bench"

    def parse(self, response: Any, **kwargs: Any) -> None:
        """The link requests' callback."""

    def parse_item(self, response: Any) -> None:
        """A second callback, for requests of another kind."""
