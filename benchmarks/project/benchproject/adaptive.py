"""A benchmark-only prototype of issue #12's proposal, to measure it before it is built:
count against CONCURRENT_REQUESTS what Scrapy's downloader counts, not every claim.

``ClaimLoop.capacity`` (worker/claimloop.py) counts a claim from its claim until Scrapy
has fully processed it (callback, items, children written), so claims whose download is over
but whose response is still being processed hold slots the downloader would use.
This subclass claims up to

    CONCURRENT_REQUESTS + BENCH_CLAIM_MARGIN
        - requests in the downloader (``downloader.active``: what Scrapy counts)
        - claims and continuations not yet handed to the engine

so a worker keeps as many downloads going as plain Scrapy, while at most
CONCURRENT_REQUESTS + BENCH_CLAIM_MARGIN claims wait unstarted. Responses being
processed are bounded by Scrapy itself (the engine stops pulling requests when the
scraper holds more than SCRAPER_SLOT_MAX_ACTIVE_SIZE bytes, so downloads, then claims,
stop too). Everything else (suspects alone, shutdown, kicks) is LeasedScheduler's.

    scrapy crawl site -s SCHEDULER=benchproject.adaptive.AdaptiveScheduler \\
        -s BENCH_CLAIM_MARGIN=2

Not part of scrapy_leased: reads Scrapy's and the scheduler's private attributes.
"""

from __future__ import annotations

from scrapy_leased.worker.claimloop import ClaimLoop
from scrapy_leased.worker.scheduler import LeasedScheduler


class AdaptiveClaimLoop(ClaimLoop):
    def capacity(self) -> int:
        w = self.w
        if w.engine.closing():
            return 0
        if w.book.suspects or w.book.isolated is not None:
            return 0
        downloading = len(w.crawler.engine.downloader.active)
        waiting = len(w.book.ready) + len(w.book.local) + len(w.book.deferred)
        return w.concurrency + w.margin - downloading - waiting


class AdaptiveScheduler(LeasedScheduler):
    def __init__(self, crawler, *args, **kwargs) -> None:
        super().__init__(crawler, *args, **kwargs)
        self.margin = crawler.settings.getint("BENCH_CLAIM_MARGIN", 2)
        self.claims = AdaptiveClaimLoop(self)
