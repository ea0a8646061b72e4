"""Fleet-wide duplicate filter (``DUPEFILTER_CLASS``).

The decision "seen before?" is taken in Redis by the scheduler's enqueue script, in
the same atomic step as the push, so ``request_seen`` has nothing to decide locally.
This class turns a request into its seen-set coordinates and logs filtered requests
the way Scrapy's ``RFPDupeFilter`` does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.dupefilters import BaseDupeFilter

from .config import LeasedConfig
from .fingerprints import split_fingerprint

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class LeasedDupeFilter(BaseDupeFilter):
    def __init__(self, crawler: Crawler, bits: int, debug: bool = False) -> None:
        self.crawler = crawler
        self.fingerprinter = crawler.request_fingerprinter
        self.bits = bits
        self.debug = debug
        self._logged = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = LeasedConfig.from_settings(crawler.settings)
        return cls(crawler, config.seen_bucket_bits, crawler.settings.getbool("DUPEFILTER_DEBUG"))

    def request_seen(self, request: Request) -> bool:
        return False  # decided atomically in Redis when the request is enqueued

    def seen_key(self, request: Request) -> tuple[int, int]:
        """(bucket, 64-bit member) of the request's fingerprint in the seen set."""
        return split_fingerprint(self.fingerprinter.fingerprint(request), self.bits)

    def log(self, request: Request, spider: Spider | None = None) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request},
                         extra={"spider": spider})
        elif not self._logged:
            logger.debug("Filtered duplicate request: %(request)s - no more duplicates will be "
                         "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                         {"request": request}, extra={"spider": spider})
            self._logged = True
        self.crawler.stats.inc_value("dupefilter/filtered")
