"""The engine hooks: where the worker reaches into Scrapy's engine (private parts of it,
checked once when the worker opens; supported: Scrapy 2.13.4-2.19).

``_FinishHook`` stands in for the engine's set of requests in progress, so the worker
hears when Scrapy has fully processed a request; the engine's ``nextcall`` wakes the
engine; the scraper's slot tells a continuation from a callback's request; the
downloader's slots are the throttled download slots (slots.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler


class _FinishHook(set):  # type: ignore[type-arg]
    """Stands in for the engine's set of in-progress requests: Scrapy removes a
    request from it exactly when it has fully processed it (download, callback,
    items through pipelines, child requests handed to the scheduler)."""

    def __init__(self, items: set[Request], on_remove: Any) -> None:
        super().__init__(items)
        self._on_remove = on_remove

    def remove(self, request: Request) -> None:
        super().remove(request)
        self._on_remove(request)


class EngineHooks:
    """The worker's hold on Scrapy's engine, its scraper and its downloader."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.nextcall: Any = None
        self.slot: Any = None  # the engine's slot
        self.scraper: Any = None
        self._downloader: Any = None  # the engine's, kept: it is looked up per request

    def install(self, on_finished: Callable[[Request], None]) -> None:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        scraper = getattr(engine, "scraper", None)
        if slot is None or not isinstance(getattr(slot, "inprogress", None), set) or not hasattr(
            slot, "nextcall"
        ) or not hasattr(scraper, "slot"):
            import scrapy

            raise RuntimeError(
                f"scrapy_leased cannot follow request completion in Scrapy {scrapy.__version__}"
                " (engine slot without 'inprogress'/'nextcall', or a scraper without 'slot');"
                " supported: Scrapy 2.13.4-2.19"
            )
        slot.inprogress = _FinishHook(slot.inprogress, on_finished)
        self.nextcall = slot.nextcall
        self.slot = slot
        self.scraper = scraper
        self._downloader = getattr(engine, "downloader", None)

    def wake(self) -> None:
        if self.nextcall is not None:
            self.nextcall.schedule()

    def closing(self) -> bool:
        """Whether the engine is shutting down."""
        return self.slot is not None and self.slot.closing is not None

    def downloading(self, handed: int) -> int:
        """Requests in Scrapy's downloader: what it counts against CONCURRENT_REQUESTS
        (``handed``, the requests handed to the engine, without a downloader)."""
        active = getattr(self.downloader(), "active", None)
        return len(active) if active is not None else handed

    def downloader(self) -> Any:
        if self._downloader is None:
            return getattr(self.crawler.engine, "downloader", None)
        return self._downloader

    def in_scraper(self, request: Request) -> bool:
        """Whether ``request``'s response or failure is in the scraper (its callback or
        errback runs, or waits to)."""
        slot = self.scraper.slot  # the scraper's (result, request) queue and active set
        return slot is not None and (request in slot.active
                                     or any(r is request for _, r, _ in slot.queue))

    def scraper_backs_out(self) -> bool:
        """Whether the engine takes nothing while responses pile up in the scraper."""
        slot = getattr(self.scraper, "slot", None)
        return slot is not None and bool(slot.needs_backout())
