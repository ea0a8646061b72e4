"""Records in PostgreSQL (psycopg 3, asynchronous): one table ``<prefix>_<type>`` per
item type, the item as JSONB. Needs ``pip install 'scrapy-leased[postgres]'``.

A batch is one transaction of pipelined upserts; the connection is re-made after a
connection error, so the writes after an outage resume once the server is back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..records import Record
from .base import Store, StoreError

CONNECT_TIMEOUT_SECONDS = 5


def redact_dsn(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def create_sql(table: Any) -> Any:
    from psycopg import sql

    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {t} (key text PRIMARY KEY, item jsonb NOT NULL, "
        "item_type text NOT NULL, crawl text NOT NULL, "
        "updated timestamptz NOT NULL DEFAULT now(), fence_token bigint NOT NULL DEFAULT 0)"
    ).format(t=table)


def upsert_sql(table: Any) -> Any:
    """One record. A row is returned when it was written; none when the stored
    record carries a newer fence token of the same crawl (a stale write). An unfenced
    write (token 0) always wins and keeps the stored token; a record of another
    crawl is overwritten (tokens of different crawls cannot be compared)."""
    from psycopg import sql

    return sql.SQL(
        "INSERT INTO {t} AS stored (key, item, item_type, crawl, updated, fence_token) "
        "VALUES (%s, %s::jsonb, %s, %s, now(), %s) "
        "ON CONFLICT (key) DO UPDATE SET item = EXCLUDED.item, item_type = EXCLUDED.item_type, "
        "crawl = EXCLUDED.crawl, updated = EXCLUDED.updated, "
        "fence_token = CASE WHEN stored.crawl = EXCLUDED.crawl "
        "THEN GREATEST(stored.fence_token, EXCLUDED.fence_token) ELSE EXCLUDED.fence_token END "
        "WHERE stored.fence_token <= EXCLUDED.fence_token OR EXCLUDED.fence_token = 0 "
        "OR stored.crawl <> EXCLUDED.crawl "
        "RETURNING 1"
    ).format(t=table)


class PostgresStore(Store):
    def __init__(self, url: str, prefix: str, crawl_id: str) -> None:
        self.url = url
        self.prefix = prefix
        self.crawl_id = crawl_id
        self.description = f"PostgreSQL {redact_dsn(url)}"
        self._conn: Any = None
        self._tables: set[str] = set()

    def table_name(self, table: str) -> str:
        return f"{self.prefix}_{table}"

    async def _connection(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        import psycopg

        await self._drop()
        self._conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
        return self._conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:
                pass

    async def open(self) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                f"LEASED_UPSERT_URL ({redact_dsn(self.url)}) needs psycopg 3: "
                "pip install 'scrapy-leased[postgres]' (or 'psycopg[binary]')") from None
        try:
            await self._connection()
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach PostgreSQL at {redact_dsn(self.url)} "
                             f"(LEASED_UPSERT_URL): {type(exc).__name__}: {exc}") from None

    async def _ensure_tables(self, conn: Any, tables: set[str]) -> None:
        import psycopg
        from psycopg import sql

        for table in tables - self._tables:
            try:
                await conn.execute(create_sql(sql.Identifier(self.table_name(table))))
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                pass  # another worker created it at the same moment
            self._tables.add(table)

    async def write(self, records: Sequence[Record]) -> list[bool]:
        import psycopg
        from psycopg import sql

        by_table: dict[str, list[int]] = {}
        for i, r in enumerate(records):
            by_table.setdefault(r.table, []).append(i)
        out = [False] * len(records)
        try:
            conn = await self._connection()
            await self._ensure_tables(conn, set(by_table))
            async with conn.transaction(), conn.cursor() as cur:
                for table, indexes in by_table.items():
                    query = upsert_sql(sql.Identifier(self.table_name(table)))
                    await cur.executemany(query, [
                        (records[i].key, records[i].data, records[i].type_name,
                         self.crawl_id, records[i].fence) for i in indexes], returning=True)
                    for n, i in enumerate(indexes):
                        if n:
                            cur.nextset()
                        out[i] = await cur.fetchone() is not None
        except (psycopg.OperationalError, psycopg.InterfaceError):
            await self._drop()  # reconnect on the next batch
            raise
        return out

    def is_store_error(self, exc: Exception) -> bool:
        import psycopg

        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, OSError))

    async def count(self, table: str) -> int:
        import psycopg
        from psycopg import sql

        conn = await self._connection()
        try:
            cur = await conn.execute(sql.SQL("SELECT count(*) FROM {t}").format(
                t=sql.Identifier(self.table_name(table))))
        except psycopg.errors.UndefinedTable:
            return 0
        row = await cur.fetchone()
        return int(row[0])

    async def close(self) -> None:
        await self._drop()
