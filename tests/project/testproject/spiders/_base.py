"""What several test spiders share: ``-a start_url=URL -a worker=NAME``."""

from __future__ import annotations

from typing import Any

import scrapy


class StartUrlSpider(scrapy.Spider):
    """Starts from ``start_url``; its items name the ``worker`` that scraped them."""

    def __init__(self, start_url: str = "", worker: str | None = None, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [start_url]
        self.worker = worker
