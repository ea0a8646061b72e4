"""Downloader middleware that reports final download failures to the scheduler.

It sits next to the engine (order 10): retries and redirects have already been
decided by the middlewares behind it, so an exception reaching it is final, as in
Scrapy. What happens to the request then is what Scrapy does with it:

- with an errback, the errback runs (once) and decides: the request counts as done
  unless the errback itself raises (then it fails like a callback error);
- without one, Scrapy logs the error and moves on; the request is parked in the dead
  letters with that error (``scrapy leased dead`` shows it, ``--requeue`` retries it),
  never downloaded again by itself;
- ``IgnoreRequest`` (robots.txt, offsite, a ``stop_download``...) is a normal end.

A final response whose status is in ``LEASED_FAIL_HTTP_CODES`` fails the request
(attempt +1, requeued, dead letters at ``LEASED_MAX_ATTEMPTS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from .. import signals
from ..settings import config_for

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
        return cls(crawler, config_for(crawler).fail_http_codes)

    def _report(self, request: Request, reason: str, permanent: bool) -> None:
        self.crawler.signals.send_catch_log(signals.request_failed, request=request,
                                            reason=reason, permanent=permanent)

    def process_response(self, request: Request, response: Response,
                         spider: object = None) -> Response:
        if response.status in self.fail_codes:
            self._report(request, f"HTTP {response.status} (in LEASED_FAIL_HTTP_CODES)",
                         permanent=False)
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: object = None) -> None:
        if not isinstance(exception, IgnoreRequest) and request.errback is None:
            self._report(request, f"download error: {describe(exception)}", permanent=True)
