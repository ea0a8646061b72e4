"""The worker of a crawl, as the add-on's other components see it.

The scheduler (the worker) attaches itself to its crawler when the engine opens it;
the rate middleware, the start middleware, the cookie jar, the feed exports, the fleet
stats and the log line find it with :func:`worker_of`, through the read-only
:class:`Worker` view, instead of importing the scheduler (which imports them). With
another scheduler in the project, :func:`worker_of` is None and they step aside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ._supervise import BUG_REASON, OnBug, close_crawl

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from .frontier import Frontier
    from .frontier.writer import CommitWriter

_ATTRIBUTE = "_leased_worker"
_closers: set[asyncio.Task[None]] = set()


class Worker(Protocol):
    """What the other components read of the worker, and the few things they ask of it."""

    @property
    def worker_id(self) -> str: ...

    @property
    def frontier(self) -> Frontier | None: ...

    @property
    def writer(self) -> CommitWriter | None: ...

    @property
    def seeds(self) -> bool:
        """Whether this worker seeds the current run (runs start())."""

    @property
    def closing(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    def run_beside(self, coro: Coroutine[Any, Any, None], name: str = ...) -> bool: ...

    def task_failed(self, name: str, exc: BaseException) -> None: ...

    def is_handed(self, request: Request) -> bool: ...

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to Scrapy's stat ``name``, passed on with the worker's per-request
        counts (worker/tally.py): for stats counted once per request."""

    def flush_counts(self) -> None:
        """Pass the per-request counts on to Scrapy's stats now."""

    async def start_request_sent(self) -> None: ...

    async def start_exhausted(self) -> None: ...

    async def wait_for_seeding(self) -> bool: ...


def attach(crawler: Crawler, worker: Worker) -> None:
    """Make ``worker`` the one :func:`worker_of` gives for ``crawler``."""
    setattr(crawler, _ATTRIBUTE, worker)


def worker_of(crawler: Crawler) -> Worker | None:
    """The crawl's worker, None when the project uses another scheduler (or before the
    engine opened the spider): the add-on's other components then step aside."""
    worker: Worker | None = getattr(crawler, _ATTRIBUTE, None)
    return worker


def crawl_stopper(crawler: Crawler) -> OnBug:
    """``on_bug`` for a task of the add-on outside the scheduler: the worker stops
    (``task_failed``); with another scheduler, the spider is closed."""

    def on_bug(name: str, exc: BaseException) -> None:
        worker = worker_of(crawler)
        if worker is not None:
            worker.task_failed(name, exc)
        else:
            task = asyncio.ensure_future(close_crawl(crawler, BUG_REASON))
            _closers.add(task)
            task.add_done_callback(_closers.discard)

    return on_bug
