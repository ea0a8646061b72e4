"""Groups upserts into store round trips: everything that arrives while one write is
in flight goes into the next one (up to LEASED_UPSERT_BATCH_SIZE records). Each
caller awaits the durable write of its own record, and gets the store's error when
its batch failed: the request fails and the frontier retries it later. A batch that
failed because of its data (not the store) is written again one record at a time,
so a bad item fails alone instead of taking its batch-mates with it.

The batcher's task is supervised (_supervise.py): an unexpected exception in it (a bug,
not the store's error) fails every write waiting in it, so that no item waits for ever,
and calls ``on_bug``, which stops the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .._supervise import OnBug, supervise
from .records import Record
from .stores.base import Store, StoreError

logger = logging.getLogger(__name__)

# After a failed write the next one waits, so a store that is down fails requests at
# a bounded rate instead of burning every request's attempts within a second.
BACKOFF_START_SECONDS = 0.1
BACKOFF_CAP_SECONDS = 2.0


class WriteBatcher:
    def __init__(self, store: Store, batch_size: int,
                 on_batch: Callable[[int, bool], None] | None = None,
                 on_bug: OnBug | None = None) -> None:
        self.store = store
        self.batch_size = batch_size
        self.on_batch = on_batch  # (records in the batch, succeeded)
        self.on_bug = on_bug
        self._pending: list[tuple[Record, asyncio.Future[bool]]] = []
        self._writing: list[tuple[Record, asyncio.Future[bool]]] = []  # the batch in flight
        self._task: asyncio.Task[None] | None = None
        self._delay = 0.0
        self._failing = False

    async def write(self, record: Record) -> bool:
        """Upsert one record; True when written, False when rejected as stale.
        Raises StoreError when its batch could not be written."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((record, future))
        if self._task is None or self._task.done():
            self._task = supervise("the item writer of UpsertPipeline", self._run(),
                                   self._stopped)
        return await future

    def _stopped(self, name: str, exc: BaseException) -> None:
        """The task ended on a bug: every write waiting fails (its request is retried)."""
        waiting, self._writing, self._pending = self._writing + self._pending, [], []
        for _, future in waiting:
            if not future.done():
                error = StoreError(f"cannot write the item to {self.store.description}: "
                                   f"{name} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                future.set_exception(error)
        if self.on_bug is not None:
            self.on_bug(name, exc)

    async def _run(self) -> None:
        while self._pending:
            if self._delay:
                await asyncio.sleep(self._delay)
            batch = self._writing = self._pending[:self.batch_size]
            del self._pending[:self.batch_size]
            try:
                results = await self.store.write([r for r, _ in batch])
            except Exception as exc:
                if len(batch) > 1 and not self.store.is_store_error(exc):
                    await self._one_by_one(batch)
                else:
                    self._fail(batch, exc)
                continue
            self._succeeded(batch, results)
        self._writing = []

    async def _one_by_one(self, batch: list[tuple[Record, asyncio.Future[bool]]]) -> None:
        for entry in batch:
            try:
                results = await self.store.write([entry[0]])
            except Exception as exc:
                self._fail([entry], exc)
            else:
                self._succeeded([entry], results)

    def _succeeded(self, batch: list[tuple[Record, asyncio.Future[bool]]],
                   results: list[bool]) -> None:
        if self._failing:
            logger.info("Writing items to %(store)s again", {"store": self.store.description})
            self._failing = False
        self._delay = 0.0
        if self.on_batch is not None:
            self.on_batch(len(batch), True)
        for (_, future), written in zip(batch, results):
            if not future.done():
                future.set_result(written)

    def _fail(self, batch: list[tuple[Record, asyncio.Future[bool]]], exc: Exception) -> None:
        message = (f"cannot write {len(batch)} items to {self.store.description}: "
                   f"{type(exc).__name__}: {exc}")
        if not self.store.is_store_error(exc):  # this record's data: no backoff
            logger.error("%(message)s", {"message": message})
        else:
            if not self._failing:
                logger.error("%(message)s; their requests fail and are retried later",
                             {"message": message})
                self._failing = True
            self._delay = min(max(self._delay * 2, BACKOFF_START_SECONDS),
                              BACKOFF_CAP_SECONDS)
        if self.on_batch is not None:
            self.on_batch(len(batch), False)
        for _, future in batch:
            if not future.done():
                error = StoreError(message)
                error.__cause__ = exc
                future.set_exception(error)

    async def close(self) -> None:
        """Wait for the writes in flight (process_item awaits them anyway)."""
        if self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)
