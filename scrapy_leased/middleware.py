"""Downloader middleware that reports final download failures to the scheduler.

It sits next to the engine (order 10): retries and redirects have already been
decided by the middlewares behind it, so an exception reaching it is final.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from . import signals
from .config import LeasedConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


def describe(exc: BaseException) -> str:
    """The reason stored with a failure: exception type and message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LeasedFailureMiddleware:
    def __init__(self, crawler: Crawler, fail_codes: frozenset[int]) -> None:
        self.crawler = crawler
        self.fail_codes = fail_codes

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, LeasedConfig.from_settings(crawler.settings).fail_http_codes)

    def _report(self, request: Request, reason: str) -> None:
        self.crawler.signals.send_catch_log(signals.request_failed, request=request,
                                            reason=reason)

    def process_response(self, request: Request, response: Response) -> Response:
        if response.status in self.fail_codes:
            self._report(request, f"HTTP {response.status} (in LEASED_FAIL_HTTP_CODES)")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if not isinstance(exception, IgnoreRequest):
            self._report(request, f"download error: {describe(exception)}")
