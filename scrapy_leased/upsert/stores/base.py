"""What every record store does: write a batch of records atomically, with fencing."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..records import Record


class StoreError(RuntimeError):
    """A batch could not be written; its items fail (their requests are retried)."""


class Store(ABC):
    #: Where the records go, fit for logs (no password).
    description: str = ""

    @abstractmethod
    async def open(self) -> None:
        """Connect; raise with a message naming LEASED_UPSERT_URL when impossible."""

    @abstractmethod
    async def write(self, records: Sequence[Record]) -> list[bool]:
        """Upsert the records in order, as one atomic, durable step. Per record: True
        when written, False when rejected as stale (a newer claim wrote that key)."""

    def is_store_error(self, exc: Exception) -> bool:
        """True when ``exc`` concerns the store as a whole (unreachable, locked, out of
        memory), False when it may come from one record of the batch (bad data): the
        batch is then retried one record at a time, so one bad item fails alone."""
        return True

    @abstractmethod
    async def count(self, table: str) -> int:
        """How many records of this item type (slug) are stored."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connection (idempotent)."""
