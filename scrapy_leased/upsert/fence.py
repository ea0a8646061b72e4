"""Which claim produced an item: the fencing token handed from the spider output to
the pipeline.

Scrapy's ``process_item`` receives only the item, so ``UpsertFenceMiddleware`` (a
spider middleware next to the engine) notes the claim token of the response's
request for every item the callback yields, and ``UpsertPipeline`` takes it back.
Entries leave when the pipeline takes them, when the item is scraped, dropped or
fails (signals), and, as a last resort, after ``ENTRY_TTL_SECONDS``: nothing leaks.

Items that never pass spider middlewares (those of an errback after a download
error, those yielded by ``start()``) have no token and are written unfenced.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from ..meta import claim_token
from ..settings import config_for

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

#: An entry the pipeline never took (an earlier pipeline replaced the item object)
#: is forgotten after this long; its item, if it ever arrives, is written unfenced.
ENTRY_TTL_SECONDS = 600.0
SWEEP_EVERY_SECONDS = 60.0

_registries: WeakKeyDictionary[Any, FenceRegistry] = WeakKeyDictionary()


class FenceRegistry:
    """id(item) -> [item, claim token, registrations, monotonic time], one per crawler.
    The entry holds the item itself, so its id cannot be reused while it is noted."""

    def __init__(self) -> None:
        self._entries: dict[int, list[Any]] = {}
        self._last_sweep = time.monotonic()

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> FenceRegistry:
        registry = _registries.get(crawler)
        if registry is None:
            registry = _registries[crawler] = cls()
            for sig in (signals.item_scraped, signals.item_dropped, signals.item_error):
                crawler.signals.connect(registry._on_item_done, sig, weak=False)
        return registry

    def __len__(self) -> int:
        return len(self._entries)

    def note(self, item: Any, token: int) -> None:
        now = time.monotonic()
        entry = self._entries.get(id(item))
        if entry is not None and entry[0] is item:
            entry[1] = max(entry[1], token)
            entry[2] += 1  # the same object yielded again
            entry[3] = now
        else:
            self._entries[id(item)] = [item, token, 1, now]
        if now - self._last_sweep > SWEEP_EVERY_SECONDS:
            self._sweep(now)

    def take(self, item: Any) -> int | None:
        """The token noted for this item object (None: unknown); forgets it."""
        entry = self._entries.get(id(item))
        if entry is None or entry[0] is not item:
            return None
        entry[2] -= 1
        if entry[2] <= 0:
            del self._entries[id(item)]
        return int(entry[1])

    def _on_item_done(self, item: Any, **kwargs: Any) -> None:
        entry = self._entries.get(id(item))
        if entry is not None and entry[0] is item:
            del self._entries[id(item)]

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        old = [k for k, e in self._entries.items() if now - e[3] > ENTRY_TTL_SECONDS]
        for k in old:
            del self._entries[k]


class UpsertFenceMiddleware(BaseSpiderMiddleware):
    """Spider middleware (sync and async spider output) that notes, for every item a
    callback yields, the claim token of the request being processed."""

    def __init__(self, crawler: Crawler) -> None:
        if not config_for(crawler).upsert.enabled:
            raise NotConfigured("LEASED_UPSERT_ENABLED is False")
        super().__init__(crawler)
        self.registry = FenceRegistry.for_crawler(crawler)

    def get_processed_item(self, item: Any, response: Response | None) -> Any:
        request = getattr(response, "request", None)
        if request is not None:
            token = claim_token(request)
            if token is not None:
                self.registry.note(item, token)
        return item
