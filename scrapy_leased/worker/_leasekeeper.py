"""The lease keeper: a worker's background loops that keep its leases and the crawl's.

``renew_loop`` is the heartbeat: it renews the leases of the claims the worker holds
(and refreshes its run), and marks the claims whose lease was lost. ``sweep_loop``
requeues the expired leases of any worker (recovery). Both retry through a Redis outage,
warning once; any other exception ends them, and the scheduler, which runs them
supervised (_supervise.py), stops the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from ..frontier import Frontier
from ..frontier.run import RunMarker
from ..frontier.scripts import WrongKeyType
from ._claimbook import ClaimBook

logger = logging.getLogger(__name__)


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


class WarnOnce:
    """Warn about a kind of trouble once, until it is over (``clear``)."""

    def __init__(self) -> None:
        self._kinds: set[str] = set()

    def __call__(self, kind: str, msg: str, exc: BaseException) -> None:
        if kind not in self._kinds:
            self._kinds.add(kind)
            # a key of the wrong type waits for a person to fix it: an error
            logger.log(logging.ERROR if isinstance(exc, WrongKeyType) else logging.WARNING,
                       msg, exc)

    def once(self, kind: str) -> bool:
        """True the first time ``kind`` is asked for (then False until ``clear``)."""
        if kind in self._kinds:
            return False
        self._kinds.add(kind)
        return True

    def clear(self, kind: str) -> None:
        self._kinds.discard(kind)


def running(closing: Callable[[], bool]) -> bool:
    """Whether a background loop should go on: not closing, and its task not being
    cancelled (a cancellation can be swallowed by a Redis call in flight; Python 3.11+
    tells, and the loop then ends at its next turn)."""
    if closing():
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return not (cancelling is not None and cancelling())


@dataclass
class LeaseKeeper:
    frontier: Frontier
    run: RunMarker
    book: ClaimBook
    stats: Any
    worker_id: str
    renew_interval: float
    sweep_interval: float
    closing: Callable[[], bool]
    worker_info: Callable[[], str]  # the JSON each heartbeat records
    on_lost: Callable[[set[int]], None]  # tokens whose lease is gone (before they are marked)
    on_recovered: Callable[[], None]  # expired leases were requeued
    warn: WarnOnce
    renew_now: Kick = field(default_factory=Kick)  # set: renew at once (a new epoch)

    async def renew_loop(self) -> None:
        while running(self.closing):
            await self.renew_now.wait(self.renew_interval)
            self.renew_now.clear()
            try:
                lost = await self.frontier.renew(self.worker_id, self.book.held_tokens(),
                                                 self.worker_info())
                await self.run.refresh()
            except (RedisError, OSError) as exc:
                self.warn("renew", "Cannot renew leases in Redis, retrying: %s", exc)
                continue
            self.warn.clear("renew")
            self.stats.inc_value("leased/renewals")
            self.on_lost(set(lost))
            for token in lost:
                claim = self.book.claims.get(token)
                if claim is not None and not claim.lost:
                    claim.lost = True
                    self.stats.inc_value("leased/lease_lost")
                    logger.warning("Lost the lease of claim %(token)d (this worker was too slow "
                                   "or paused, or Redis went back in time); another worker may "
                                   "process it again",
                                   {"token": token})

    async def revisit(self) -> int:
        """Queue again the requests whose revisit is due (keys.py: revisit); returns how
        many. Raises RedisError or OSError."""
        queued = await self.frontier.revisit()
        if queued:
            self.stats.inc_value("leased/revisited", queued)
            logger.debug("Queued %(n)d requests again for their revisit", {"n": queued})
            self.on_recovered()
        return queued

    async def sweep_loop(self) -> None:
        while running(self.closing):
            try:
                requeued, dead, left = await self.frontier.recover()
                await self.revisit()
            except (RedisError, OSError) as exc:
                self.warn("sweep", "Cannot recover expired leases, retrying: %s", exc)
                await asyncio.sleep(self.sweep_interval)
                continue
            self.warn.clear("sweep")
            try:  # the busiest keys as hashtables (lua/hot_keys.lua): speed, not safety
                await self.frontier.hash_hot_keys()
            except (RedisError, OSError) as exc:
                self.warn("hot_keys", "Cannot check the encodings of the crawl's busiest "
                          "keys, retrying: %s", exc)
            else:
                self.warn.clear("hot_keys")
            if requeued or dead:
                self.stats.inc_value("leased/recovered", requeued)
                self.stats.inc_value("leased/recovered_dead", dead)
                logger.info("Recovered %(n)d expired leases (%(dead)d to dead letters)",
                            {"n": requeued + dead, "dead": dead})
                self.on_recovered()
            if not left:
                await asyncio.sleep(self.sweep_interval)
