"""Helpers for the UpsertPipeline tests: the PostgreSQL to test against, a private
PostgreSQL server that a test may crash, and reading stored records back from each
backend (directly, not through the code under test).

    postgres_url()          URL of the machine's PostgreSQL (127.0.0.1:5432, database
                            ``test``, or $LEASED_TEST_POSTGRES_URL); skips the test with
                            the reason when unreachable, FAILS it when CI=true.
    PostgresServer()        .start() a private server (initdb + pg_ctl) on a free port;
                            .stop() (immediate: a crash), .start() again, .close()
    Target                  one backend as a worker sees it: .settings for
                            ``scrapy crawl -s``, .records(table) -> {key: record}
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.redis_server import free_port

PG_CANDIDATES = ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true, where the PostgreSQL tests must run", pytrace=False)
    pytest.skip(reason)


def postgres_url() -> str:
    try:
        import psycopg
    except ImportError:
        _unavailable("psycopg is not installed (pip install -e '.[test]')")
        raise
    env = os.environ.get("LEASED_TEST_POSTGRES_URL")
    errors = []
    for url in ([env] if env else PG_CANDIDATES):
        try:
            psycopg.connect(url, connect_timeout=3).close()
            return url
        except psycopg.Error as exc:
            errors.append(f"{url}: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}")
    _unavailable("PostgreSQL is not reachable (" + "; ".join(errors) + ")")
    raise AssertionError("unreachable")


def drop_tables(url: str, prefix: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND starts_with(tablename, %s)", (prefix + "_",)).fetchall()
        for (name,) in rows:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def pg_records(url: str, table: str) -> dict[str, dict[str, Any]]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, connect_timeout=5) as conn:
        try:
            rows = conn.execute(sql.SQL(
                "SELECT key, item, item_type, crawl, fence_token, updated FROM {}"
            ).format(sql.Identifier(table))).fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {k: {"item": item, "type": t, "crawl": c, "fence": f, "updated": u}
            for k, item, t, c, f, u in rows}


def sqlite_records(path: Path, table: str) -> dict[str, dict[str, Any]]:
    if not Path(path).exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(
            f'SELECT key, item, item_type, crawl, fence_token, updated FROM "{table}"').fetchall()
    except sqlite3.OperationalError:  # no such table (yet)
        return {}
    finally:
        conn.close()
    return {k: {"item": json.loads(item), "type": t, "crawl": c, "fence": f, "updated": u}
            for k, item, t, c, f, u in rows}


def redis_records(client: Any, hash_key: str) -> dict[str, dict[str, Any]]:
    out = {}
    for k, v in client.hgetall(hash_key).items():
        rec = json.loads(v)
        out[k.decode()] = {"item": rec["item"], "type": rec["type"], "fence": rec["fence"],
                           "updated": rec["updated"]}
    return out


@dataclass
class Target:
    """One backend for a test: ``settings`` for the workers (or a crawler),
    ``records(table)`` reads the stored records of one item type (slug)."""

    kind: str
    settings: dict[str, Any]
    read: Callable[[str], dict[str, dict[str, Any]]]
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def records(self, table: str = "dict") -> dict[str, dict[str, Any]]:
        return self.read(table)


def make_target(kind: str, *, redis_server: Any, crawl_id: str, tmp_path: Path) -> Target:
    """redis: the crawl's own Redis (LEASED_UPSERT_URL unset, LEASED_UPSERT_ENABLED);
    sqlite: a file in
    tmp_path; postgresql: the machine's server, tables with a unique prefix (dropped
    afterwards)."""
    from scrapy_leased.frontier.keys import CrawlKeys

    prefix = f"t{uuid.uuid4().hex[:10]}"
    if kind == "redis":
        client = redis_server.client()
        keys = CrawlKeys(crawl_id)
        return Target(kind, {"LEASED_UPSERT_ENABLED": True, "LEASED_UPSERT_PREFIX": prefix},
                      lambda table: redis_records(client, keys.records(table, prefix)))
    if kind == "sqlite":
        path = tmp_path / "records.db"
        return Target(kind, {"LEASED_UPSERT_URL": f"sqlite:///{path}",
                             "LEASED_UPSERT_PREFIX": prefix},
                      lambda table: sqlite_records(path, f"{prefix}_{table}"))
    if kind == "postgresql":
        url = postgres_url()
        return Target(kind, {"LEASED_UPSERT_URL": url, "LEASED_UPSERT_PREFIX": prefix},
                      lambda table: pg_records(url, f"{prefix}_{table}"),
                      [lambda: drop_tables(url, prefix)])
    raise ValueError(kind)


def find_pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


class PostgresServer:
    """A private PostgreSQL (initdb + pg_ctl) on a free 127.0.0.1 port, trust auth,
    fsync off. As root, the server runs as the ``postgres`` user (initdb refuses
    root)."""

    def __init__(self) -> None:
        bindir = find_pg_bin()
        if bindir is None:
            _unavailable("no PostgreSQL server binaries (initdb, pg_ctl) found")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="leased-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            shutil.chown(self.dir, self.user)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run([str(self.bindir / args[0]), *args[1:]], user=self.user,
                              cwd=self.dir, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except (FileNotFoundError, PermissionError):
            return ""

    def start(self) -> PostgresServer:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-sync")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
                  "-t", "60", "start")
        return self

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: the server dies at once, as in a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop()
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
