"""Supervision of a worker's background tasks: none of them ends silently.

Each background task of the add-on (the claim loop, the commit writer, the lease
renewals, the recovery sweep, the fleet stats flush, the penalty watch, the fleet log
line) runs through ``supervise``; the feed drain runs inside the claim loop, and a bug
there is reported as one in "the feed drain" (``PartFailed``). The task handles what it
expects itself (Redis unreachable: retried; one bad input: refused alone, the loop goes
on). An exception that reaches the supervisor is a bug: it is logged at CRITICAL with
its traceback and ``on_bug`` is called, which stops the worker with the close reason
``BUG_REASON`` (``LeasedScheduler.task_failed``): requests in progress finish, the
claims not started are given back to the queue, and the process ends, instead of staying up renewing
leases and doing nothing. A cancellation (the worker closing) is never taken for a bug,
and never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: The close reason of a worker stopped by an unexpected exception in one of its
#: background tasks.
BUG_REASON = "leased_error"

OnBug = Callable[[str, BaseException], None]

_closers: set[asyncio.Future[None]] = set()  # referenced until done (asyncio keeps weak ones)


class PartFailed(Exception):
    """A bug in one part of a task, raised out of the task so that the supervisor
    reports it under the part's name: the feed drain runs inside the claim loop, and a
    bug there is said to be in "the feed drain". ``error`` is the exception itself."""

    def __init__(self, part: str, error: Exception) -> None:
        super().__init__(part, error)
        self.part = part
        self.error = error


def supervise(name: str, coro: Coroutine[Any, Any, None], on_bug: OnBug) -> asyncio.Task[None]:
    """Run ``coro`` as a task named ``name`` (said in the log: "the claim loop"); an
    exception other than a cancellation ending it is logged with its traceback and
    passed to ``on_bug(name, exc)`` (a ``PartFailed``: under its part's name, with the
    exception it carries)."""
    return asyncio.ensure_future(_guarded(name, coro, on_bug))


async def _guarded(name: str, coro: Coroutine[Any, Any, None], on_bug: OnBug) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, PartFailed):  # in one part of the task: named after it
            name, exc = exc.part, exc.error
        logger.critical("Unexpected error in %(task)s of this worker (a bug): the worker "
                        "stops (close reason %(reason)s); the requests it has not started "
                        "go back to the queue", {"task": name, "reason": BUG_REASON},
                        exc_info=exc)
        try:
            on_bug(name, exc)
        except Exception:
            logger.exception("Could not stop the worker after the error in %(task)s",
                             {"task": name})


async def close_crawl(crawler: Crawler, reason: str,
                      closing: Callable[[], bool] = lambda: False) -> None:
    """Close the crawl's spider with ``reason``, as Scrapy's CloseSpider does (the
    requests in progress finish; then the scheduler closes). Waits for an engine still
    opening; does nothing once ``closing()`` or the engine is closing already."""
    engine = getattr(crawler, "engine", None)
    while engine is not None and not getattr(engine, "running", False) and not closing():
        await asyncio.sleep(0.05)  # opening: the engine cannot close before it runs
    if engine is None or closing():
        return
    slot = getattr(engine, "_slot", None)
    if slot is not None and getattr(slot, "closing", None) is not None:
        return  # closing already (with another reason)
    close = getattr(engine, "close_spider_async", None)  # Scrapy 2.14+
    try:
        if close is not None:
            await close(reason=reason)
        else:
            from scrapy.utils.defer import maybe_deferred_to_future

            await maybe_deferred_to_future(engine.close_spider(engine.spider, reason))
    except Exception:
        logger.exception("Could not close the spider (%(reason)s)", {"reason": reason})
