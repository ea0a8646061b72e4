"""Ending a worker's background tasks when it closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

#: Seconds to wait for cancelled tasks to end before cancelling them again.
AGAIN_AFTER_SECONDS = 1.0
ATTEMPTS = 10


def cancel_requested() -> bool:
    """Whether the running task has been asked to cancel and has not ended yet (always
    False on Python 3.10, which does not count cancellations)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling is not None and cancelling())


async def cancel_and_wait(tasks: Iterable[asyncio.Future[None]]) -> list[asyncio.Future[None]]:
    """Cancel ``tasks`` and wait until every one has ended; the ones still running after
    ``ATTEMPTS`` rounds are returned.

    A cancellation can be swallowed by code the task awaits, and the task then runs on:
    seen with the penalty watch in redis-py's ``PubSub.get_message``, and known of
    ``asyncio.wait_for`` before Python 3.12 (the reason for
    ``Kick`` in _leasekeeper.py). So a task that has not ended ``AGAIN_AFTER_SECONDS``
    after its cancellation is cancelled again, instead of being awaited for ever."""
    pending = {task for task in tasks if not task.done()}
    done: set[asyncio.Future[None]] = {task for task in tasks if task.done()}
    for _ in range(ATTEMPTS):
        if not pending:
            break
        for task in pending:
            task.cancel()
        ended, pending = await asyncio.wait(pending, timeout=AGAIN_AFTER_SECONDS)
        done |= ended
    for task in done:  # retrieved, so asyncio does not log "exception never retrieved"
        if not task.cancelled():
            with contextlib.suppress(BaseException):
                task.exception()
    return list(pending)
