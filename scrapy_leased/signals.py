"""Signals of scrapy_leased (send with ``crawler.signals``)."""

#: A request's processing failed in a way Scrapy itself does not report through a
#: signal (final download error, a response status in LEASED_FAIL_HTTP_CODES).
#: Arguments: ``request``, ``reason`` (str).
request_failed = object()
