"""Which Redis a crawl uses, read from its URL, and the redis-py client for each kind:
one server, the master of a Sentinel group, or a Redis Cluster.

``connection.make_client`` is the one entry point; this module parses and builds.

URL formats (README, "Sentinel and Cluster")::

    redis://[[user]:password@]host[:port][/db]     one server: redis-py's own format
    rediss://...                                   (TLS), unix:///path/redis.sock[?db=N]
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]
        [?sentinel_password=...&sentinel_username=...]
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]
    rediss+sentinel://..., rediss+cluster://...  (TLS)

The Sentinel form is the one of redis-sentinel-url, Prefect and RedisVL: the hosts are
the sentinels (port 26379 unless given), the path names the master and the database,
the user and password are those of the Redis servers, ``sentinel_password`` (and
``sentinel_username``) those of the sentinels. The Cluster form lists startup nodes
(port 6379 unless given); redis-py finds the others. Both also take the query options
``socket_timeout``, ``socket_connect_timeout``, ``socket_keepalive`` and
``health_check_interval`` and ``max_connections`` (the pool's size: past it a command
waits for a connection, POOL_WAIT_SECONDS at most). Every form but the Cluster one takes
``wait_replicas=N`` (scripts.py: WAIT N after the writes a worker acts on).

TLS: ``rediss+sentinel://`` and ``rediss+cluster://`` (to the sentinels and the
servers, to every cluster node), with redis-py's options of ``rediss://``:
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
import redis.sentinel
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.cluster import PRIMARY
from redis.exceptions import (
    AskError,
    ClusterError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry
from redis.sentinel import MasterNotFoundError

logger = logging.getLogger(__name__)

SERVER_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
#: the same over TLS (to the sentinels and the servers, to every cluster node)
TLS_SENTINEL_SCHEME = "rediss+sentinel"
TLS_CLUSTER_SCHEME = "rediss+cluster"
SCHEMES = SERVER_SCHEMES + (SENTINEL_SCHEME, CLUSTER_SCHEME, TLS_SENTINEL_SCHEME,
                            TLS_CLUSTER_SCHEME)
SENTINEL_PORT = 26379
CLUSTER_PORT = 6379

#: A command refused while the crawl's slot migrates (TRYAGAIN, or redis-py giving up
#: after 16 MOVED/ASK/TRYAGAIN redirections) did not run: it is sent again, with
#: backoff, for up to this long (a slot of a large crawl takes seconds to migrate).
MIGRATION_RETRY_SECONDS = 60.0
MIGRATION_BACKOFF_CAP_SECONDS = 0.5
#: redis-py's cluster client sends a command aimed at given nodes (``target_nodes``)
#: once, without retry, and gives up at once when it cannot learn the cluster's layout
#: (one startup node whose connection dropped): these are sent again, up to this many
#: times, with backoff (LOST_BACKOFF_SECONDS doubling up to 1 s). Only for commands
#: that did not run (no layout) or that only read (NODE_READS).
LOST_RETRIES = 3
LOST_BACKOFF_SECONDS = 0.05
#: The node-targeted commands of the plugin (``server_info``, ``scan_batches``): reads,
#: safe to send twice
NODE_READS = frozenset({"INFO", "SCAN", "PING"})

# Query options of a Sentinel or Cluster URL (redis-py's names and parsers).
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_OPTIONS: dict[str, Any] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "socket_keepalive": lambda v: _BOOL[v.lower()],
    "health_check_interval": int,
    "max_connections": int,
    # TLS (rediss+sentinel://, rediss+cluster://): redis-py's names, as rediss:// takes
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": lambda v: {"none": "none", "optional": "optional",
                                "required": "required"}[v.lower()],
    "ssl_check_hostname": lambda v: _BOOL[v.lower()],
}
_TLS_OPTIONS = tuple(name for name in _OPTIONS if name.startswith("ssl_"))
_SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")
_SECRET_QUERY = re.compile(r"((?:^|[?&])(?:sentinel_)?password=)[^&]*")


class RedisUrlError(ValueError):
    """The URL cannot name a Redis; the message says why (without the setting)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed crawl Redis URL."""

    kind: str  # "server", "sentinel" or "cluster"
    url: str  # without the options of this module (wait_replicas)
    hosts: tuple[tuple[str, int], ...] = ()  # sentinels, or cluster startup nodes
    master_name: str | None = None  # Sentinel: the master's name
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: WAIT for this many replicas after the writes a worker acts on (scripts.WAITED)
    wait_replicas: int = 0
    tls: bool = False  # rediss+sentinel://, rediss+cluster:// (rediss:// is redis-py's)


def redact(url: str) -> str:
    """The URL without its passwords (user info and ``sentinel_password``), for logs."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            netloc = f"{user}:***@{hosts}"
    query = _SECRET_QUERY.sub(r"\1***", query)
    return parts._replace(netloc=netloc, query=query).geturl()


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a crawl's Redis URL; raises RedisUrlError."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise RedisUrlError("must be a redis://, rediss:// (TLS), unix://, redis+sentinel:// "
                            "or redis+cluster:// URL (rediss+sentinel://, rediss+cluster:// "
                            "for TLS)")
    url, wait = _pop_wait_replicas(url)
    if scheme in SERVER_SCHEMES:
        return RedisTarget("server", url, wait_replicas=wait)
    tls = scheme in (TLS_SENTINEL_SCHEME, TLS_CLUSTER_SCHEME)
    if tls:
        scheme = scheme.replace("rediss+", "redis+")
    if scheme == CLUSTER_SCHEME and wait:
        raise RedisUrlError("has wait_replicas, which redis+cluster:// URLs do not support")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")  # (its values may hold "/": certificate paths)
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    default_port = SENTINEL_PORT if scheme == SENTINEL_SCHEME else CLUSTER_PORT
    hosts = tuple(_host_port(part, default_port) for part in netloc.split(","))
    options, extra = _query_options(query, sentinel=scheme == SENTINEL_SCHEME)
    ssl = [name for name in options if name in _TLS_OPTIONS]
    if ssl and not tls:
        raise RedisUrlError(f"has {ssl[0]}, a TLS option: use rediss+"
                            f"{scheme.partition('+')[2]}:// for TLS")
    segments = [unquote(s) for s in path.split("/") if s]
    if scheme == SENTINEL_SCHEME:
        if not segments:
            raise RedisUrlError("must name the master after the sentinels: "
                                "redis+sentinel://host:26379[,host:26379...]/mymaster[/db]")
        if len(segments) > 2:
            raise RedisUrlError("has a path with more than a master name and a database "
                                "number: redis+sentinel://hosts/mymaster/0")
        db = _db(segments[1]) if len(segments) == 2 else 0
        return RedisTarget("sentinel", url, hosts, segments[0], db, username, password,
                           extra.get("sentinel_username"), extra.get("sentinel_password"),
                           options, wait, tls)
    if segments and (len(segments) > 1 or _db(segments[0]) != 0):
        raise RedisUrlError("names a database other than 0: Redis Cluster has only "
                            "database 0 (redis+cluster://host:port[,host:port...])")
    return RedisTarget("cluster", url, hosts, None, 0, username, password, options=options,
                       tls=tls)


def _pop_wait_replicas(url: str) -> tuple[str, int]:
    """(the URL without its ``wait_replicas`` option, that option's value or 0)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, 0
    kept, wait = [], 0
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if name != "wait_replicas":
            kept.append(item)
            continue
        if not value.isdigit():
            raise RedisUrlError(f"has wait_replicas={value!r}: a number of replicas, at least 0")
        wait = int(value)
    return (f"{base}?{'&'.join(kept)}" if kept else base), wait


def _host_port(part: str, default_port: int) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [IPv6]:port
        host, _, port = part[1:].partition("]")
        port = port[1:] if port.startswith(":") else ""
    else:
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
    if not host:
        raise RedisUrlError(f"has an empty host in {part!r}: list host[:port] entries "
                            "separated by commas")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError(f"has an invalid port in {part!r}")
    return host, int(port)


def _db(text: str) -> int:
    if not text.isdigit():
        raise RedisUrlError(f"has {text!r} where a database number belongs")
    return int(text)


def _query_options(query: str, sentinel: bool) -> tuple[dict[str, Any], dict[str, str]]:
    options: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        value = values[-1]
        if sentinel and name in _SENTINEL_OPTIONS:
            extra[name] = value
            continue
        parser = _OPTIONS.get(name)
        if parser is None:
            known = sorted(_OPTIONS) + (list(_SENTINEL_OPTIONS) if sentinel else [])
            raise RedisUrlError(f"has an unknown option {name!r} (known: {', '.join(known)})")
        try:
            options[name] = parser(value)
        except (KeyError, TypeError, ValueError):
            raise RedisUrlError(f"has an invalid value for {name!r}") from None
    return options, extra


# --------------------------------------------------------------------------- clients


def build_client(url: str, options: dict[str, Any], sync: bool = False) -> Any:
    """A redis-py client for ``url`` (asyncio unless ``sync``), with the connection
    ``options`` (timeouts, retry policy; the URL's own query options win)."""
    target = parse_redis_url(url)
    client = _build(target, options, sync)
    client.leased_wait_replicas = target.wait_replicas  # read by scripts.register
    return client


#: Connections of one client to one server (redis-py's default). Past it, a command
#: waits for a connection to come free instead of failing ("Too many connections",
#: redis-py's asyncio pools): up to POOL_WAIT_SECONDS, then a ConnectionError (retried).
POOL_SIZE = 100
POOL_WAIT_SECONDS = 30.0


def _build(target: RedisTarget, options: dict[str, Any], sync: bool) -> Any:
    if target.kind == "server":
        if sync:
            return redis.Redis.from_url(target.url, **options)
        pool = BlockingConnectionPool.from_url(
            target.url, **{"max_connections": POOL_SIZE, "timeout": POOL_WAIT_SECONDS,
                           **options})
        return aioredis.Redis.from_pool(pool)
    options = {**options, **target.options}
    if target.tls:
        options["ssl"] = True
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.kind == "sentinel":
        # Each sentinel is asked once per discovery (the next one is asked on failure;
        # the master's connection retries the discovery as a whole). TLS: the same
        # certificates for the sentinels as for the servers.
        sentinel_kwargs = {k: v for k, v in options.items()
                           if k.startswith(("socket_", "ssl"))}
        sentinel_kwargs.update(username=target.sentinel_username,
                               password=target.sentinel_password,
                               retry=(SyncRetry if sync else Retry)(NoBackoff(), 0))
        sentinel_cls = SentinelGroup if sync else AsyncSentinelGroup
        sentinel: Any = sentinel_cls(list(target.hosts), sentinel_kwargs=sentinel_kwargs)
        if sync:
            return sentinel.master_for(target.master_name, redis_class=SentinelMaster,
                                       db=target.db, **auth, **options)
        return sentinel.master_for(target.master_name, redis_class=AsyncSentinelMaster,
                                   connection_pool_class=BlockingSentinelPool,
                                   db=target.db, **auth,
                                   **{"max_connections": POOL_SIZE,
                                      "timeout": POOL_WAIT_SECONDS, **options})
    if sync:
        from redis.cluster import ClusterNode, RedisCluster

        node: Any = ClusterNode  # (untyped)
        return RedisCluster(startup_nodes=[node(h, p) for h, p in target.hosts],
                            **auth, **options)
    return LeasedRedisCluster(startup_nodes=[AsyncClusterNode(h, p) for h, p in target.hosts],
                              **auth, **options)


async def server_info(client: Any, section: str, key: str) -> dict[str, Any]:
    """INFO ``section`` of the server holding ``key`` (on a cluster: its slot's master)."""
    if isinstance(client, AsyncRedisCluster):
        info: dict[str, Any] = await client.info(section,
                                                 target_nodes=client.get_node_from_key(key))
    else:
        info = await client.info(section)
    return info


async def scan_batches(client: Any, match: str, count: int = 1000) -> AsyncIterator[list[Any]]:
    """The keys matching ``match``, one list per SCAN call (of COUNT ``count``), from the
    server or from every master of a cluster (never KEYS)."""
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()
        for node in client.get_primaries():
            cursor = 0
            while True:
                reply: Any = await client.scan(cursor, match=match, count=count,
                                               target_nodes=node)
                cursors, keys = reply
                yield keys
                cursor = cursors[node.name]
                if not cursor:
                    break
        return
    cursor = 0
    while True:
        cursor, keys = await client.scan(cursor, match=match, count=count)
        yield keys
        if not cursor:
            return


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\{}^-" else c for c in text)


async def keys_with_prefix(client: Any, prefix: str) -> list[str]:
    """Every key starting with ``prefix`` (SCAN MATCH on it, escaped; on a cluster, of
    every master: a slot being migrated has keys on two), sorted."""
    return sorted({key.decode() if isinstance(key, bytes) else str(key)
                   async for batch in scan_batches(client, glob_escape(prefix) + "*")
                   for key in batch})


def _where(sentinel: Any) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"{kw.get('host')}:{kw.get('port')}"


def _master_not_found(name: str, errors: list[str]) -> MasterNotFoundError:
    why = f" (sentinels: {'; '.join(errors)})" if errors else \
        " (no sentinel names a master in good state by that name)"
    return MasterNotFoundError(f"No master found for {name!r}{why}")


def _found(manager: Any, name: str, i: int, masters: Any) -> tuple[Any, Any] | None:
    """The master's address if sentinel ``i`` names it in good state (that sentinel is
    then asked first next time), as redis-py's discover_master does."""
    state = masters.get(name)
    if not (state and manager.check_master_state(state, name)):
        return None
    manager.sentinels[0], manager.sentinels[i] = manager.sentinels[i], manager.sentinels[0]
    return state["ip"], state["port"]


_SENTINEL_DOWN = (RedisConnectionError, RedisTimeoutError)


class _Discovery:
    """One discovery of a master: the sentinels are asked in turn (``next``, then
    ``answer`` with its SENTINEL MASTERS reply or the connection error it raised) until
    one names the master in good state; ``result`` is its address, or the error naming
    each sentinel by its address and its error in a line."""

    def __init__(self, manager: Any, name: str) -> None:
        self.manager = manager
        self.name = name
        self.i = -1
        self.errors: list[str] = []
        self.found: tuple[Any, Any] | None = None

    def next(self) -> Any:
        """The next sentinel to ask; None when done."""
        if self.found is not None or self.i + 1 >= len(self.manager.sentinels):
            return None
        self.i += 1
        return self.manager.sentinels[self.i]

    def answer(self, reply: Any) -> None:
        if isinstance(reply, _SENTINEL_DOWN):
            sentinel = self.manager.sentinels[self.i]
            self.errors.append(f"{_where(sentinel)} {type(reply).__name__}: {reply}")
        else:
            self.found = _found(self.manager, self.name, self.i, reply)

    def result(self) -> tuple[Any, Any]:
        if self.found is None:
            raise _master_not_found(self.name, self.errors)
        return self.found


class AsyncSentinelGroup(AsyncSentinel):
    """redis-py's Sentinel manager, whose "no master found" error names each sentinel
    by its address and its error in a line (redis-py's prints every client's repr)."""

    async def discover_master(self, service_name: str) -> tuple[Any, Any]:
        step = _Discovery(self, service_name)
        while (sentinel := step.next()) is not None:
            step.answer(await _masters_or_error(sentinel))
        return step.result()


async def _masters_or_error(sentinel: Any) -> Any:
    try:
        return await sentinel.sentinel_masters()
    except _SENTINEL_DOWN as exc:
        return exc


class SentinelGroup(redis.sentinel.Sentinel):
    """Synchronous ``AsyncSentinelGroup``."""

    def discover_master(self, service_name: str) -> tuple[Any, Any]:
        step = _Discovery(self, service_name)
        while (sentinel := step.next()) is not None:
            try:
                step.answer(sentinel.sentinel_masters())
            except _SENTINEL_DOWN as exc:
                step.answer(exc)
        return step.result()


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool (the master's address from the sentinels), whose
    commands wait for a free connection past ``max_connections`` (BlockingConnectionPool)
    instead of failing."""


class AsyncSentinelMaster(aioredis.Redis):
    """The master a Sentinel group names, followed through failovers (redis-py's
    SentinelConnectionPool asks the sentinels again whenever a connection to the master
    fails or finds a replica). Closing it also closes the sentinel connections."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            pool: Any = self.connection_pool  # a SentinelConnectionPool
            await pool.sentinel_manager.aclose()


class SentinelMaster(redis.Redis):
    """Synchronous ``AsyncSentinelMaster`` (the add-on's start-up check)."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            pool: Any = self.connection_pool  # a SentinelConnectionPool
            for s in pool.sentinel_manager.sentinels:
                s.close()


#: redis-py's RedisClusterException (not a RedisError) for a cluster that cannot serve
#: for now (a shard failing over, no node reachable): raised as a ConnectionError, which
#: the workers retry like any other lost connection.
_UNAVAILABLE = ("cannot be connected", "could not agree on a valid slots cache",
                "All slots are not covered")


def _unavailable(exc: Exception) -> bool:
    return isinstance(exc, SlotNotCoveredError) or (
        isinstance(exc, RedisClusterException) and any(m in str(exc) for m in _UNAVAILABLE))


def _not_run(exc: Exception) -> bool:
    """True for a cluster error meaning that Redis refused the command (it did not run)."""
    return isinstance(exc, TryAgainError) or (
        type(exc) is ClusterError and "TTL exhausted" in str(exc))


#: The node whose next command carries ASKING: set by ``ASKING`` and taken by the very
#: next command, which redis-py sends right after it with no await in between (no
#: other task can run there, whatever the number of clients).
_asking_next: Any = None


class _AskingNode(AsyncClusterNode):
    """A cluster node that sends ASKING on the same connection as the command after it.

    redis-py sends an ASK redirection as two commands, ASKING then the command, each on
    a connection taken from the node's pool in turn: with several pooled connections
    they land on different ones, the importing node answers MOVED (back to the old
    owner, which answers ASK again) and the command ping-pongs until redis-py gives up,
    for as long as the migration lasts. Here ASKING only marks the node, and the next
    command goes out as ASKING + command in one write on one connection."""

    __slots__ = ()

    async def execute_command(self, *args: Any, asking: bool = False, **kwargs: Any) -> Any:
        try:
            return await self._execute(*args, asking=asking, **kwargs)
        except AskError as exc:
            _ask_targets[f"{exc.host}:{exc.port}"] = (exc.host, int(exc.port))
            raise

    async def _execute(self, *args: Any, asking: bool = False, **kwargs: Any) -> Any:
        global _asking_next
        if args == ("ASKING",):
            _asking_next = self
            return True
        if _asking_next is not self:
            _asking_next = None
            return await super().execute_command(*args, asking=asking, **kwargs)
        _asking_next = None
        connection = self.acquire_connection()
        try:
            await self.disconnect_if_needed(connection)
            await connection.send_packed_command(
                connection.pack_commands([("ASKING",), args]))
            await self.parse_response(connection, "ASKING")
            return await self.parse_response(connection, args[0], **kwargs)
        except BaseException:
            await connection.disconnect()  # a reply may be left unread on it
            raise
        finally:
            self.release(connection)


#: The nodes (name -> host, port) that answered an ASK redirection: cluster nodes, but
#: maybe not in a client's node cache yet (a master that owns no slot, such as one just
#: added to receive a slot being resharded, is not in CLUSTER SLOTS), where redis-py
#: looks the ASK target up (``get_node``) and would send ASKING to None.
_ask_targets: dict[str, tuple[str, int]] = {}


def _lost_connection(exc: AttributeError) -> Exception:
    """redis-py's asyncio cluster client, when a node's connection is torn down while a
    command is being sent to it (a node killed in a failover), can fail inside its own
    connection code with ``'NoneType' object has no attribute 'writelines'`` (the
    connection's writer is gone): that is a lost connection, and is retried as one
    (a RedisConnectionError). An AttributeError raised anywhere else, redis-py's cluster
    code included, is a bug: it is returned as it is."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    if any(f"{os.sep}redis{os.sep}{part}" in where for part in _CONNECTION_CODE):
        return RedisConnectionError(f"Redis Cluster connection lost: {exc}")
    return exc


#: redis-py's modules that hold a connection's reader and writer
_CONNECTION_CODE = (f"asyncio{os.sep}connection.py", "connection.py", f"_parsers{os.sep}")


class LeasedRedisCluster(AsyncRedisCluster):
    """redis-py's asyncio cluster client, which also waits out a migration of the slot:
    while a slot migrates, a script whose keys are split between the two nodes (or
    not all present on one) is refused with TRYAGAIN, and redis-py gives up after 16
    redirections; such a command did not run, so it is sent again with backoff for up
    to MIGRATION_RETRY_SECONDS. Its nodes send ASK redirections correctly
    (``_AskingNode``), also to a node not in its cache yet (``get_node``); MOVED and
    failovers are redis-py's own handling. Past ``max_connections`` commands at a time,
    the next ones wait (``free_connections``) instead of failing. A lost connection that
    redis-py does not retry (learning the layout from one startup node; a read aimed at
    one node: INFO of the crawl's master, SCAN of each master) is tried again
    (LOST_RETRIES)."""

    #: commands refused by a slot migration and sent again (for logs and tests)
    migration_retries = 0
    _migrating_since: float | None = None
    _pool_size = POOL_SIZE
    _free: asyncio.Semaphore | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool_size = int(kwargs.get("max_connections") or POOL_SIZE)

    @property
    def free_connections(self) -> asyncio.Semaphore:
        """At most ``max_connections`` commands and pipelines of this client run at a
        time; the others wait here. Each holds at most one connection of a node at a
        time, so no node's pool runs out (redis-py's ClusterNode raises
        MaxConnectionsError past it: it has no waiting pool)."""
        if self._free is None:
            self._free = asyncio.Semaphore(self._pool_size)
        return self._free

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> AsyncClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py's error
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        started: float | None = None
        delay = 0.01
        lost = 0  # attempts failed by a lost connection that redis-py does not retry
        node_read = "target_nodes" in kwargs and bool(args) \
            and str(args[0]).split(" ")[0].upper() in NODE_READS
        while True:
            self._adopt_nodes()
            try:
                async with _permit(self):
                    result = await super().execute_command(*args, **kwargs)
            except AttributeError as exc:
                gone = _lost_connection(exc)
                if gone is exc:
                    raise
                raise gone from exc
            except RedisClusterException as exc:
                if not _unavailable(exc):
                    raise
                # the layout could not be learnt: the command was not sent
                if lost >= LOST_RETRIES:
                    raise RedisConnectionError(f"Redis Cluster unavailable: {exc}") from exc
                lost += 1
                await asyncio.sleep(min(LOST_BACKOFF_SECONDS * 2 ** lost, 1.0))
                continue
            except (RedisConnectionError, RedisTimeoutError):
                if not node_read or lost >= LOST_RETRIES:
                    raise
                lost += 1
                await asyncio.sleep(min(LOST_BACKOFF_SECONDS * 2 ** lost, 1.0))
                continue
            except (TryAgainError, ClusterError) as exc:
                if not _not_run(exc):
                    raise
                now = time.monotonic()
                if started is None:
                    started = now
                elif now - started > MIGRATION_RETRY_SECONDS:
                    raise
                self.migration_retries += 1
                if self._migrating_since is None:  # logged once per migration
                    self._migrating_since = now
                    logger.info("Redis Cluster refuses commands while a slot migrates "
                                "(%(why)s): sending them again until the migration ends",
                                {"why": "TRYAGAIN" if isinstance(exc, TryAgainError) else
                                 "redis-py gave up after 16 MOVED/ASK/TRYAGAIN replies"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, MIGRATION_BACKOFF_CAP_SECONDS)
                continue
            if started is not None and self._migrating_since is not None:
                logger.info("Redis Cluster runs commands again after %(s).1f s of slot "
                            "migration (%(n)d commands sent again)",
                            {"s": time.monotonic() - self._migrating_since,
                             "n": self.migration_retries})
                self._migrating_since = None
            return result

    def get_node(self, host: str | None = None, port: int | None = None,
                 node_name: str | None = None) -> AsyncClusterNode | None:
        """redis-py's lookup, which also knows the target of an ASK redirection not in
        the node cache yet (``_ask_targets``): it is added as a primary, as redis-py
        adds the target of a MOVED redirection (the slot's owner after the migration)."""
        node: AsyncClusterNode | None = super().get_node(host, port, node_name)
        # redis-py 8.1 looks the target up by name, 8.2 by host and port
        name = node_name if node_name is not None else f"{host}:{port}"
        if node is None and name in _ask_targets:
            manager = self.nodes_manager
            ask_host, ask_port = _ask_targets[name]
            node = _AskingNode(ask_host, ask_port, PRIMARY, **manager.connection_kwargs)
            manager.set_nodes(manager.nodes_cache, {node.name: node})
            logger.info("Redis Cluster: ASK to %(node)s, a node not in the slots map "
                        "(a master without slots yet): added to the node cache",
                        {"node": node.name})
        return node

    def _adopt_nodes(self) -> None:
        """Make every known node an ``_AskingNode`` (redis-py creates plain ones when it
        learns the topology; the classes share their layout)."""
        for node in self.nodes_manager.nodes_cache.values():
            if type(node) is AsyncClusterNode:
                node.__class__ = _AskingNode


#: Whether this task holds a permit of ``free_connections`` already: a pipeline that
#: sends its redirected commands again through execute_command does not wait for a
#: second one (with every permit held so, that would never end).
_holds_permit: contextvars.ContextVar[bool] = contextvars.ContextVar("_holds_permit",
                                                                     default=False)


@contextlib.asynccontextmanager
async def _permit(client: Any) -> AsyncIterator[None]:
    if _holds_permit.get():
        yield
        return
    async with client.free_connections:
        token = _holds_permit.set(True)
        try:
            yield
        finally:
            _holds_permit.reset(token)


class _WaitingPipeline(AsyncClusterPipeline):
    """A cluster pipeline that waits for ``LeasedRedisCluster.free_connections``."""

    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        async with _permit(self.cluster_client):
            try:
                result: list[Any] = await super().execute(raise_on_error, allow_redirections)
            except AttributeError as exc:
                lost = _lost_connection(exc)
                if lost is exc:
                    raise
                raise lost from exc
        return result
