"""Seeing the fleet: fleet-wide Scrapy stats in Redis (stats.py, flush.py), a Prometheus
exporter (metrics.py) and a live web dashboard (dashboard/), all reading the same
``admin.Snapshot`` as ``scrapy leased status``."""
