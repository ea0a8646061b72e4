"""Batches a worker's writes (new requests, acks, failures) into commit calls.

Everything buffered while one commit is in flight goes into the next one, so under
load many pages share a round trip. Writes are applied in order, and within a commit
new requests land before the acks: a claim is acked only once the requests its
callback yielded are in Redis. A commit that fails (Redis down, a lost reply) is sent
again with backoff, the same batch under the same call id, so that Redis applies it once
even when the first one ran (lua/lib_guard.lua); nothing buffered is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from .machine import CommitResult, Failure, Frontier, NewRequest, Revisit

logger = logging.getLogger(__name__)

MAX_BATCH = 500  # requests per commit call
RETRY_CAP_SECONDS = 2.0


@dataclass
class Batch:
    enqueue: list[NewRequest]
    tags: list[object]  # one per enqueue, handed back with the results
    acks: list[tuple[int, int]]
    fails: list[Failure]
    revisits: dict[int, Revisit] = field(default_factory=dict)  # token -> (Frontier.commit)


class CommitWriter:
    def __init__(self, frontier: Frontier,
                 on_result: Callable[[Batch, CommitResult], None]) -> None:
        self.frontier = frontier
        self.on_result = on_result
        self._batch = Batch([], [], [], [])
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.generation = 0  # completed commits, to tell fresh observations from stale
        self._warned = False
        #: Awaited before each commit that acks or fails claims (again when it is sent
        #: again): the fleet stats flush (observe/stats.py), so a claim is acked only
        #: once the stats of its processing are in Redis.
        self.before_settle: Callable[[], Awaitable[None]] | None = None

    @property
    def pending(self) -> bool:
        return not self._idle.is_set()

    def add_request(self, request: NewRequest, tag: object) -> None:
        self._batch.enqueue.append(request)
        self._batch.tags.append(tag)
        self._kick()

    def add_ack(self, token: int, rid: int, revisit: Revisit | None = None) -> None:
        """Ack a claim; ``revisit``: its request is queued again that long after the
        ack."""
        self._batch.acks.append((token, rid))
        if revisit is not None:
            self._batch.revisits[token] = revisit
        self._kick()

    def add_fail(self, failure: Failure) -> None:
        self._batch.fails.append(failure)
        self._kick()

    def _kick(self) -> None:
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def _take(self) -> Batch:
        b = self._batch
        n = MAX_BATCH
        if len(b.enqueue) <= n:
            self._batch = Batch([], [], [], [])
            return b
        # Oversized: send requests first, acks only with the last slice of requests.
        head = Batch(b.enqueue[:n], b.tags[:n], [], [])
        self._batch = Batch(b.enqueue[n:], b.tags[n:], b.acks, b.fails, b.revisits)
        return head

    async def _run(self) -> None:
        delay = 0.05
        while self._batch.enqueue or self._batch.acks or self._batch.fails:
            batch = self._take()
            call_id = self.frontier.new_call_id()
            while True:  # the same batch, the same id, until Redis answers
                try:
                    if self.before_settle is not None and (batch.acks or batch.fails):
                        await self.before_settle()
                    result = await self.frontier.commit(batch.enqueue, batch.acks, batch.fails,
                                                        call_id=call_id,
                                                        revisits=batch.revisits)
                    break
                except (RedisError, OSError) as exc:
                    if not self._warned:
                        logger.warning("Cannot write to Redis, retrying (nothing is dropped): %s",
                                       exc)
                        self._warned = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_CAP_SECONDS)
            if self._warned:
                logger.info("Writing to Redis again")
                self._warned = False
            delay = 0.05
            self.generation += 1
            self.on_result(batch, result)
        self._idle.set()

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything buffered is written; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
