"""Signals of scrapy_leased (send with ``crawler.signals``)."""

#: A request's processing failed in a way Scrapy itself does not report through a
#: signal: a final download error with no errback to handle it (``permanent=True``: the
#: request is parked in the dead letters, as Scrapy would not download it again), or a
#: response status in LEASED_FAIL_HTTP_CODES (``permanent=False``: attempt +1).
#: Arguments: ``request``, ``reason`` (str), ``permanent`` (bool).
request_failed = object()

#: The run of the crawl ended: sent once per run, on its last worker, after that worker's
#: final stats flush (observe/stats.py; decided atomically in Redis by
#: lua/fleet_close.lua: no other worker of the run is live or still to flush its last
#: stats). Not sent when the last worker is killed, when Redis cannot be reached at its
#: close, or with LEASED_FLEET_STATS off. For close-time checks on the whole crawl
#: (``scrapy_leased.FleetSpidermon``). Arguments: ``stats`` (dict: the fleet's merged
#: Scrapy stats, as ``crawler.stats.get_stats()`` would have them for one process: numbers
#: added up, ``start_time``/``finish_time`` datetimes, ``finish_reason``), ``reason`` (the
#: last worker's close reason) and ``spider``.
fleet_closed = object()
