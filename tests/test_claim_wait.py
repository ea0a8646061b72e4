"""The claim loop's idle wait (``Kick``): woken by a kick or its timeout, and always
cancellable."""

from __future__ import annotations

import asyncio
import time

import pytest

from scrapy_leased.worker._leasekeeper import Kick


def test_a_cancel_in_the_turn_the_kick_is_set_is_not_swallowed():
    async def main() -> None:
        kick = Kick()
        task = asyncio.ensure_future(kick.wait(30))
        await asyncio.sleep(0)  # the task now waits for the kick
        kick.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())


def test_the_wait_ends_at_its_timeout_or_at_a_kick():
    async def main() -> tuple[float, float]:
        kick = Kick()
        t0 = time.monotonic()
        await kick.wait(0.05)
        timed_out = time.monotonic() - t0
        kick.clear()
        asyncio.get_running_loop().call_later(0.01, kick.set)
        t0 = time.monotonic()
        await kick.wait(30)
        return timed_out, time.monotonic() - t0

    timed_out, kicked = asyncio.run(main())
    assert 0.04 <= timed_out < 5
    assert kicked < 5
