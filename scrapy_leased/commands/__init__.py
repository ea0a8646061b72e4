"""Scrapy commands of scrapy_leased, registered through the ``scrapy.commands`` entry
point (``scrapy leased ...``)."""
