"""A closing worker ends its background tasks even when one swallows its cancellation
(scrapy_leased/_cancel.py): Scrapy's own test_raise_closespider hung in reactorless mode
when the penalty watch (ratelimit/watch.py) went on listening after the scheduler had
cancelled it, and the scheduler's close waited for it for ever."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy_leased._cancel import cancel_and_wait
from scrapy_leased.ratelimit.watch import PenaltyWatch
from tests.test_frontier import run


def test_a_task_that_swallows_its_cancellation_is_cancelled_again() -> None:
    async def main() -> None:
        swallowed = 0

        async def stubborn() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed += 1  # as asyncio.wait_for could before Python 3.12

        async def failing() -> None:
            raise RuntimeError("ended with an error")

        tasks = [asyncio.ensure_future(stubborn()), asyncio.ensure_future(failing())]
        await asyncio.sleep(0)
        assert await cancel_and_wait(tasks) == []
        assert swallowed == 1
        assert all(task.done() for task in tasks)

    asyncio.run(main())


def test_a_task_that_never_ends_is_returned_not_awaited_for_ever(monkeypatch: Any) -> None:
    import scrapy_leased._cancel as cancel

    monkeypatch.setattr(cancel, "AGAIN_AFTER_SECONDS", 0.01)

    async def main() -> None:
        release = asyncio.Event()

        async def immortal() -> None:
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass

        task = asyncio.ensure_future(immortal())
        await asyncio.sleep(0)
        assert await cancel_and_wait([task]) == [task]
        release.set()
        await task

    asyncio.run(main())


def test_the_penalty_watch_ends_when_cancelled_while_listening(redis_server: Any,
                                                               crawl_id: str) -> None:
    async def body(f: Any, r: Any) -> None:
        heard: list[str] = []
        watch = PenaltyWatch(f.client, f.keys.penalties, heard.append)
        task = asyncio.ensure_future(watch.run())
        while watch.listening_since is None:
            await asyncio.sleep(0.01)
        await f.client.publish(f.keys.penalties, "example.com")
        while not heard:
            await asyncio.sleep(0.01)
        assert await cancel_and_wait([task]) == []
        assert task.cancelled()
        assert watch.listening_since is None
        assert heard == ["example.com"]

    run(redis_server, crawl_id, body)
