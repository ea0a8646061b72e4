"""Feeding a crawl from outside its workers: the Python API (crawl.py), the feed LIST
for producers in any language and its JSON format (format.py), the workers' drain
(drain.py)."""

from .crawl import AsyncCrawl, Crawl
from .format import FeedEntryError, parse_entry

__all__ = ["AsyncCrawl", "Crawl", "FeedEntryError", "parse_entry"]
