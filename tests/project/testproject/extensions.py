"""Test-only extension: a start barrier for workers started together.

With ``TEST_BARRIER_DIR`` and ``TEST_BARRIER_SIZE`` set, a worker waits at
``spider_opened`` (its scheduler has joined the crawl's run by then, and nothing has been
crawled yet) until ``TEST_BARRIER_SIZE`` workers have arrived in that directory. Workers a
test starts together so share one run of the crawl: without it, on a loaded machine, the
first one can finish a small crawl before the last one has started, and the late one
starts a new run (and sends its start requests again, as documented). The wait is a
condition, not a time; it gives up after ``TEST_BARRIER_TIMEOUT`` seconds (default 120)
with an error in the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from scrapy import signals
from scrapy.exceptions import NotConfigured

logger = logging.getLogger(__name__)


class FleetBarrier:
    def __init__(self, directory: Path, size: int, timeout: float, name: str) -> None:
        self.directory, self.size, self.timeout, self.name = directory, size, timeout, name

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        directory, size = s.get("TEST_BARRIER_DIR"), s.getint("TEST_BARRIER_SIZE")
        if not directory or size <= 0:
            raise NotConfigured
        ext = cls(Path(directory), size, s.getfloat("TEST_BARRIER_TIMEOUT", 120.0), str(os.getpid()))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        return ext

    async def spider_opened(self, spider) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / self.name).touch()
        deadline = time.monotonic() + self.timeout
        while len(list(self.directory.iterdir())) < self.size:
            if time.monotonic() > deadline:
                logger.error("Start barrier: %d of %d workers arrived in %.0f s",
                             len(list(self.directory.iterdir())), self.size, self.timeout)
                return
            await asyncio.sleep(0.05)
        logger.info("Start barrier: all %d workers arrived", self.size)
