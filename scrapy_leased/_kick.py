"""``Kick``: an asyncio event a loop waits for, at most some time (the scheduler's claim
loop, the lease keeper, the commit writer's linger). No Scrapy, no Redis."""

from __future__ import annotations

import asyncio


class Kick:
    """An event a loop waits for, at most some time. Not ``asyncio.wait_for``: before
    Python 3.12 it can swallow a cancellation that arrives in the loop turn the event is
    set, and the cancelled loop would then run on."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float) -> None:
        """Until set, at most ``timeout`` seconds."""
        timer = asyncio.get_running_loop().call_later(timeout, self._event.set)
        try:
            await self._event.wait()
        finally:
            timer.cancel()
