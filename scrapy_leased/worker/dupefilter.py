"""Fleet-wide duplicate filter (``DUPEFILTER_CLASS``).

The decision "seen before?" is taken in Redis by the scheduler's enqueue script, in
the same atomic step as the push, so ``request_seen`` has nothing to decide locally.
This class turns a request into its seen-set coordinates, remembers the coordinates
Redis has confirmed (``LEASED_SEEN_CACHE`` of them: the seen set only grows while
workers run, so a request found there is a duplicate without asking Redis again; a URL
``scrapy leased forget`` removed meanwhile is still taken for seen by a worker that
remembers it), and logs filtered requests the way Scrapy's ``RFPDupeFilter`` does.

Used by another scheduler (a project that replaced ``SCHEDULER`` but not
``DUPEFILTER_CLASS``), it is Scrapy's ``RFPDupeFilter``: a local filter, as without the
add-on.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.job import job_dir

from ..frontier.fingerprints import split_fingerprint
from ..settings import config_for

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class KnownSeen:
    """At most ``size`` seen-set entries this worker knows are in Redis, the oldest
    forgotten first. Entries are added only once a commit has confirmed them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: set[int] = set()
        self._order: deque[int] = deque()

    @staticmethod
    def _key(bucket: int, member: int) -> int:
        return bucket << 64 | member & 0xFFFF_FFFF_FFFF_FFFF

    def __contains__(self, key: tuple[int, int]) -> bool:
        return self._key(*key) in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        """Forget everything (Redis went back in time: it may have forgotten entries)."""
        self._keys.clear()
        self._order.clear()

    def add(self, bucket: int, member: int) -> None:
        key = self._key(bucket, member)
        if self.size <= 0 or key in self._keys:
            return
        if len(self._order) >= self.size:
            self._keys.discard(self._order.popleft())
        self._keys.add(key)
        self._order.append(key)


class LeasedDupeFilter(RFPDupeFilter):
    def __init__(self, crawler: Crawler, bits: int, debug: bool = False,
                 cache_size: int = 0, path: str | None = None) -> None:
        super().__init__(path, debug, fingerprinter=crawler.request_fingerprinter)
        self.crawler = crawler
        self.bits = bits
        self.known = KnownSeen(cache_size)
        self._logged = False
        #: Set by LeasedScheduler: Redis decides what was seen. Otherwise (another
        #: scheduler uses this filter) it filters locally, as RFPDupeFilter.
        self.fleet_wide = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = config_for(crawler)
        return cls(crawler, config.seen_bucket_bits, crawler.settings.getbool("DUPEFILTER_DEBUG"),
                   config.seen_cache, job_dir(crawler.settings))

    def request_seen(self, request: Request) -> bool:
        if self.fleet_wide:
            return False  # decided atomically in Redis when the request is enqueued
        return super().request_seen(request)

    def seen_key(self, request: Request) -> tuple[int, int]:
        """(bucket, 64-bit member) of the request's fingerprint in the seen set."""
        return split_fingerprint(self.fingerprinter.fingerprint(request), self.bits)

    def log(self, request: Request, spider: Spider | None = None) -> None:
        if not self.fleet_wide:
            super().log(request, spider)  # type: ignore[arg-type]
            return
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request},
                         extra={"spider": spider})
        elif not self._logged:
            logger.debug("Filtered duplicate request: %(request)s - no more duplicates will be "
                         "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                         {"request": request}, extra={"spider": spider})
            self._logged = True
        self.crawler.stats.inc_value("dupefilter/filtered")
