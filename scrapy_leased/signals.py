"""Signals of scrapy_leased (send with ``crawler.signals``)."""

#: A request's processing failed in a way Scrapy itself does not report through a
#: signal: a final download error with no errback to handle it (``permanent=True``: the
#: request is parked in the dead letters, as Scrapy would not download it again), or a
#: response status in LEASED_FAIL_HTTP_CODES (``permanent=False``: attempt +1).
#: Arguments: ``request``, ``reason`` (str), ``permanent`` (bool).
request_failed = object()
