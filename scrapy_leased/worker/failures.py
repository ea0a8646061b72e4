"""Signals into failures: a callback or errback that raised, an item pipeline that
raised, a download that failed for good (``leased_signals.request_failed``, from
LeasedFailureMiddleware) mark the claim of the request failed; it settles as a
failure (settle.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.http import Response
from twisted.python.failure import Failure as TwistedFailure

from .. import signals as leased_signals
from ..meta import claim_token
from .middleware import describe

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..settings import LeasedConfig
    from ._claimbook import ClaimBook


class Failures:
    def __init__(self, book: ClaimBook, config: LeasedConfig) -> None:
        self.book = book
        self.config = config

    def connect(self, crawler: Crawler) -> None:
        sig = crawler.signals
        sig.connect(self.on_spider_error, signals.spider_error)
        sig.connect(self.on_item_error, signals.item_error)
        sig.connect(self.on_request_failed, leased_signals.request_failed)

    def mark_failed(self, request: Request | None, reason: str, permanent: bool = False) -> None:
        if request is not None:
            self.book.mark_failed(claim_token(request), reason, permanent)

    def on_request_failed(self, request: Request, reason: str, permanent: bool = False) -> None:
        self.mark_failed(request, reason, permanent)

    def on_spider_error(self, failure: TwistedFailure, response: Any, spider: Spider) -> None:
        # Scrapy processes such a request once: parked in the dead letters, unless
        # LEASED_RETRY_ERRORS requeues it (its items until the error come again then)
        self.mark_failed(_request_of(response), f"callback error: {_error(failure)}",
                         permanent=not self.config.retry_errors)

    def on_item_error(self, item: Any, response: Any, spider: Spider,
                      failure: TwistedFailure) -> None:
        from ..upsert.stores.base import StoreError  # (upsert imports this module)

        # UpsertPipeline's store being down is transient: always retried
        transient = isinstance(failure.value, StoreError)
        self.mark_failed(_request_of(response), f"item pipeline error: {_error(failure)}",
                         permanent=not (transient or self.config.retry_errors))


def _request_of(response: Any) -> Request | None:
    if isinstance(response, Response):
        return response.request
    return getattr(response, "request", None)  # a Failure from a download error


def _error(failure: TwistedFailure) -> str:
    return describe(failure.value) if failure.value is not None else repr(failure)
