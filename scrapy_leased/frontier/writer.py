"""Batches a worker's writes (new requests, acks, failures) into commit calls.

Everything buffered while one commit is in flight goes into the next one, so under
load many pages share a round trip. Writes are applied in order, and within a commit
new requests land before the acks: a claim is acked only once the requests its
callback yielded are in Redis. A commit that fails (Redis down, a lost reply) is sent
again with backoff, the same batch under the same call id, so that Redis applies it once
even when the first one ran (lua/lib_guard.lua); nothing buffered is dropped.

With ``linger`` (seconds; the scheduler's default, ``LINGER_SECONDS``), a batch waits
before it is sent: until the worker claims again (``flush``, called by the claim loop
right before each claim, so a commit rides along with the claim and most pages share
both), until it holds ``LINGER_PAGES`` acks and failures or ``MAX_BATCH`` requests, until
``drain`` is called, or at most ``linger`` seconds. A waiting ack is a lease held a
little longer and a waiting child is seen by other workers a little later; no guarantee
changes (a worker killed meanwhile returns those claims through their leases, as any
claim not acked yet).

Before each send of a batch that acks claims, ``before_acks`` (when set) is awaited: the
scheduler flushes the feed files there (worker/feedexports.py), so that the items of an acked
page are in the operating system before Redis hears of the ack.

An unexpected exception while a batch is sent (a bug: not a RedisError or OSError) does
not lose the batch: it is held, with its call id, and sent first and unchanged by the
next try, so that Redis applies it once even if the first try ran (lua/lib_guard.lua).
The writer then stops (``broken``; its task is supervised, _supervise.py: the worker
stops) and adds nothing new to Redis until ``drain(final=True)``, called once when the
worker closes, tries once more to write everything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from redis.exceptions import RedisError

from .._supervise import OnBug, supervise
from .machine import Frontier
from .model import CommitResult, Failure, NewRequest, Revisit
from .scripts import safe_text

logger = logging.getLogger(__name__)

MAX_BATCH = 500  # requests per commit call
RETRY_CAP_SECONDS = 2.0
#: How long a batch waits at most for the next claim to ride along with (seconds).
LINGER_SECONDS = 0.05
#: Acks and failures that send a batch at once, without waiting for the next claim.
LINGER_PAGES = 16


@dataclass
class Batch:
    enqueue: list[NewRequest]
    tags: list[object]  # one per enqueue, handed back with the results
    acks: list[tuple[int, int]]
    fails: list[Failure]
    revisits: dict[int, Revisit] = field(default_factory=dict)  # token -> (Frontier.commit)
    #: Scrapy stats deltas riding along (Frontier.commit ``stats``), taken once per batch
    stats: list[Any] = field(default_factory=list)
    #: Requests that could not be stored, as dead letters (Frontier.commit ``drops``)
    drops: list[tuple[str, str]] = field(default_factory=list)


class CommitWriter:
    def __init__(self, frontier: Frontier,
                 on_result: Callable[[Batch, CommitResult], None],
                 linger: float = 0.0, on_bug: OnBug | None = None) -> None:
        self.frontier = frontier
        self.on_result = on_result
        self.linger = linger
        #: Called when the writer stopped on an unexpected exception (a bug)
        self.on_bug = on_bug
        #: The unexpected exception the writer stopped on (None: it runs)
        self.broken: BaseException | None = None
        #: A batch taken and its call id, not known to be applied: sent first, unchanged
        self._held: tuple[Batch, str] | None = None
        self._go = asyncio.Event()  # send what is buffered now (flush, drain, a full batch)
        self._batch = Batch([], [], [], [])
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.generation = 0  # completed commits, to tell fresh observations from stale
        self._warned = False
        #: Called once for each batch that acks or fails claims, when it is taken: the
        #: worker's Scrapy stats deltas since the last ones taken (observe/stats.py), sent
        #: in the same commit (so a claim is never settled before the stats of its
        #: processing are in Redis, and no call of their own is needed), and sent again
        #: unchanged with it.
        self.stats_delta: Callable[[], list[Any]] | None = None
        #: Awaited before each send of a batch that acks claims (its retries too): the
        #: feed files are flushed (worker/feedexports.py), so that what the items of an acked
        #: page wrote survives a kill -9. An exception stops the writer, as a bug does.
        self.before_acks: Callable[[], Awaitable[None]] | None = None

    @property
    def pending(self) -> bool:
        return not self._idle.is_set()

    def add_request(self, request: NewRequest, tag: object) -> None:
        self._batch.enqueue.append(request)
        self._batch.tags.append(tag)
        if len(self._batch.enqueue) >= MAX_BATCH:
            self._go.set()
        self._kick()

    def add_ack(self, token: int, rid: int, revisit: Revisit | None = None) -> None:
        """Ack a claim; ``revisit``: its request is queued again that long after the
        ack."""
        self._batch.acks.append((token, rid))
        if revisit is not None:
            self._batch.revisits[token] = revisit
        self._settles_added()

    def add_fail(self, failure: Failure) -> None:
        """Fail a claim; its reason (an exception's text: any str) is stored with each
        lone surrogate escaped (scripts.safe_text), so that no reason stops the commit."""
        if not failure.reason.isascii():
            failure = replace(failure, reason=safe_text(failure.reason))
        self._batch.fails.append(failure)
        self._settles_added()

    def add_drop(self, field: str, letter: str) -> None:
        """Dead-letter a request that could not be stored: ``letter`` (a JSON object,
        dropped.py) at ``field`` of the dead letters, with the next batch."""
        self._batch.drops.append((field, letter))
        if len(self._batch.drops) >= LINGER_PAGES:
            self._go.set()
        self._kick()

    def _settles_added(self) -> None:
        if len(self._batch.acks) + len(self._batch.fails) >= LINGER_PAGES:
            self._go.set()
        self._kick()

    def flush(self) -> None:
        """Send what is buffered now, without waiting for the linger (a claim is about
        to be sent: the commit rides along)."""
        if self.pending:
            self._go.set()

    def _kick(self) -> None:
        self._idle.clear()
        if self.broken is not None:
            return  # stopped on a bug: drain(final=True) tries once more
        if self._task is None or self._task.done():
            self._task = supervise("the commit writer", self._run(), self._stopped)

    def _stopped(self, name: str, exc: BaseException) -> None:
        self.broken = exc
        if self.on_bug is not None:
            self.on_bug(name, exc)

    def _has_work(self) -> bool:
        b = self._batch
        return self._held is not None or bool(b.enqueue or b.acks or b.fails or b.drops)

    def _take(self) -> Batch:
        b = self._batch
        n = MAX_BATCH
        if len(b.enqueue) <= n:
            self._batch = Batch([], [], [], [])
            return b
        # Oversized: send requests first, acks only with the last slice of requests.
        head = Batch(b.enqueue[:n], b.tags[:n], [], [], drops=b.drops)
        self._batch = Batch(b.enqueue[n:], b.tags[n:], b.acks, b.fails, b.revisits)
        return head

    async def _linger(self) -> None:
        """Wait until the buffered batch is to be sent (see the module's docstring)."""
        if self.linger > 0 and not self._go.is_set():
            try:
                await asyncio.wait_for(self._go.wait(), self.linger)
            except asyncio.TimeoutError:
                pass
        self._go.clear()

    async def _run(self) -> None:
        while self._has_work():
            if self._held is None:
                await self._linger()
                batch = self._take()
                # held from now on: whatever happens next, it is sent again unchanged,
                # under this id, before anything else
                self._held = (batch, self.frontier.new_call_id())
                if self.stats_delta is not None and (batch.acks or batch.fails):
                    batch.stats = self.stats_delta()
            batch, call_id = self._held
            if batch.acks and self.before_acks is not None:
                await self.before_acks()
            result = await self._send(batch, call_id)
            self._held = None
            self.generation += 1
            self.on_result(batch, result)
        self._idle.set()

    async def _send(self, batch: Batch, call_id: str) -> CommitResult:
        """Commit ``batch`` under ``call_id`` until Redis answers (RedisError and OSError
        retried with backoff; anything else raised)."""
        delay = 0.05
        while True:  # the same batch, the same id, until Redis answers
            try:
                result = await self.frontier.commit(batch.enqueue, batch.acks, batch.fails,
                                                    call_id=call_id,
                                                    revisits=batch.revisits,
                                                    stats=batch.stats,
                                                    drops=batch.drops)
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
        return result

    async def drain(self, timeout: float | None = None, final: bool = False) -> bool:
        """Wait until everything buffered is written; False on timeout, or when the
        writer stopped on a bug (``broken``). ``final`` (the worker closes): a writer
        stopped on a bug tries once more, the held batch first."""
        if self.broken is not None:
            if not final or not self._has_work():
                return not self._has_work()
            try:
                await asyncio.wait_for(self._run(), timeout)
            except asyncio.TimeoutError:
                return False
            except Exception as exc:
                logger.error("The commit writer failed again while closing (%(exc)r): what "
                             "it holds is not written; the claims concerned return to the "
                             "queue when their leases expire", {"exc": exc})
                return False
            return True
        self.flush()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
