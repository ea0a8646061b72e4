"""The claim loop's idle wait: woken by a kick or its timeout, and always cancellable."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from scrapy_leased.scheduler import LeasedScheduler


def test_a_cancel_in_the_turn_the_kick_is_set_is_not_swallowed():
    async def main() -> None:
        owner = SimpleNamespace(_kick=asyncio.Event())
        task = asyncio.ensure_future(LeasedScheduler._until_kicked(owner, 30))
        await asyncio.sleep(0)  # the task now waits for the kick
        owner._kick.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())


def test_the_wait_ends_at_its_timeout_or_at_a_kick():
    async def main() -> tuple[float, float]:
        owner = SimpleNamespace(_kick=asyncio.Event())
        t0 = time.monotonic()
        await LeasedScheduler._until_kicked(owner, 0.05)
        timed_out = time.monotonic() - t0
        owner._kick.clear()
        asyncio.get_running_loop().call_later(0.01, owner._kick.set)
        t0 = time.monotonic()
        await LeasedScheduler._until_kicked(owner, 30)
        return timed_out, time.monotonic() - t0

    timed_out, kicked = asyncio.run(main())
    assert 0.04 <= timed_out < 5
    assert kicked < 5
