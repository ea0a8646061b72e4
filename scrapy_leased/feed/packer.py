"""Requests made outside a worker's spider, turned into what the frontier queues.

The feed (drain.py), ``Crawl.push`` (crawl.py) and ``scrapy leased seed`` queue requests
as a worker does: the project's request fingerprinter (``REQUEST_FINGERPRINTER_CLASS``)
and seen-set layout for the fleet-wide dedupe (``dont_filter`` skips it), the codec for
the payload, the rate settings for the lane. They are queued FIFO within their
priority, in the order given.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.request import RequestFingerprinter

from ..codec import Codec
from ..frontier import NewRequest
from ..frontier.fingerprints import split_fingerprint
from ..order import FIFO
from ..settings import Budgets, LeasedConfig, LeasedConfigError


def fingerprinter_for(settings: Settings) -> Any:
    """The project's request fingerprinter, without a running crawl; LeasedConfigError
    naming REQUEST_FINGERPRINTER_CLASS when it cannot be loaded."""
    path = settings["REQUEST_FINGERPRINTER_CLASS"]
    try:
        cls = load_object(path)
    except (ImportError, NameError, TypeError, ValueError, AttributeError) as exc:
        raise LeasedConfigError(f"REQUEST_FINGERPRINTER_CLASS ({path!r}) cannot be loaded: "
                                f"{type(exc).__name__}: {exc}") from None
    if cls is RequestFingerprinter:
        return RequestFingerprinter()
    from scrapy.crawler import Crawler

    return build_from_crawler(cls, Crawler(Spider, settings))


class RequestPacker:
    def __init__(self, fingerprinter: Any, seen_bucket_bits: int, codec: Codec,
                 budgets: Budgets) -> None:
        self.fingerprinter = fingerprinter
        self.bits = seen_bucket_bits
        self.codec = codec
        self.budgets = budgets

    @classmethod
    def from_settings(cls, settings: Settings, config: LeasedConfig | None = None,
                      fingerprinter: Any = None) -> RequestPacker:
        config = config or LeasedConfig.from_settings(settings)
        return cls(fingerprinter or fingerprinter_for(settings), config.seen_bucket_bits,
                   Codec.from_settings(settings), config.budgets)

    def pack(self, request: Request, names: tuple[str | None, str | None] | None = None,
             spider: Spider | None = None) -> NewRequest:
        """The request as the frontier queues it; ``names``: its callback's and errback's
        method names when it was made without the spider (codec.Codec.encode). Raises
        codec.PayloadError when the request cannot be stored."""
        payload = self.codec.encode(request, spider, names)
        lane = self.budgets.lane_of(request)
        priority = int(request.priority)  # an int subclass (IntEnum): redis-py sends repr()
        if request.dont_filter:
            return NewRequest(payload, priority, lane=lane, order=FIFO)
        bucket, member = split_fingerprint(self.fingerprinter.fingerprint(request), self.bits)
        return NewRequest(payload, priority, bucket, member, lane, FIFO)
