"""Records in a SQLite file: one table ``<prefix>_<type>`` per item type.

sqlite3 is blocking, so every call runs in one dedicated thread (never on the
reactor's). The file is in WAL mode with ``synchronous=FULL``: a committed batch
survives a crash of the worker and of the machine. Several workers may share the
file; a writer waits up to BUSY_TIMEOUT_SECONDS for the others' write lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..records import Record
from .base import Store, StoreError

T = TypeVar("T")
BUSY_TIMEOUT_SECONDS = 30.0

_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"


def create_sql(table: str) -> str:
    return (f'CREATE TABLE IF NOT EXISTS "{table}" (key TEXT PRIMARY KEY, item TEXT NOT NULL, '
            "item_type TEXT NOT NULL, crawl TEXT NOT NULL, updated TEXT NOT NULL, "
            "fence_token INTEGER NOT NULL DEFAULT 0)")


def upsert_sql(table: str) -> str:
    """One record; changes no row when stale. See postgres_store.upsert_sql."""
    return (
        f'INSERT INTO "{table}" (key, item, item_type, crawl, updated, fence_token) '
        f"VALUES (?, ?, ?, ?, {_NOW}, ?) "
        "ON CONFLICT (key) DO UPDATE SET item = excluded.item, item_type = excluded.item_type, "
        "crawl = excluded.crawl, updated = excluded.updated, "
        f'fence_token = CASE WHEN "{table}".crawl = excluded.crawl '
        f'THEN max("{table}".fence_token, excluded.fence_token) ELSE excluded.fence_token END '
        f'WHERE "{table}".fence_token <= excluded.fence_token OR excluded.fence_token = 0 '
        f'OR "{table}".crawl <> excluded.crawl'
    )


class SQLiteStore(Store):
    def __init__(self, path: Path, prefix: str, crawl_id: str) -> None:
        self.path = Path(path)
        self.prefix = prefix
        self.crawl_id = crawl_id
        self.description = f"SQLite {self.path}"
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tables: set[str] = set()

    def table_name(self, table: str) -> str:
        return f"{self.prefix}_{table}"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError(f"{self.description} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="leased-sqlite")
        try:
            await self._call(self._open)
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise StoreError(f"cannot open the SQLite file {self.path} (LEASED_UPSERT_URL): "
                             f"{type(exc).__name__}: {exc}") from None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        self._conn = conn

    async def write(self, records: Sequence[Record]) -> list[bool]:
        return await self._call(self._write, list(records))

    def _write(self, records: list[Record]) -> list[bool]:
        conn = self._conn
        assert conn is not None
        for table in {r.table for r in records} - self._tables:
            conn.execute(create_sql(self.table_name(table)))
            self._tables.add(table)
        out = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for r in records:
                cur = conn.execute(upsert_sql(self.table_name(r.table)),
                                   (r.key, r.data, r.type_name, self.crawl_id, r.fence))
                out.append(cur.rowcount == 1)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return out

    def is_store_error(self, exc: Exception) -> bool:
        return not isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError,
                                    sqlite3.InterfaceError))

    async def count(self, table: str) -> int:
        return await self._call(self._count, table)

    def _count(self, table: str) -> int:
        assert self._conn is not None
        try:
            row = self._conn.execute(f'SELECT count(*) FROM "{self.table_name(table)}"').fetchone()
        except sqlite3.OperationalError:  # no such table
            return 0
        return int(row[0])

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._conn is not None:
            try:
                await self._call(self._conn.close)
            except sqlite3.Error:
                pass
            self._conn = None
        executor, self._executor = self._executor, None
        executor.shutdown(wait=False)
