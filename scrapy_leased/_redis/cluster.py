"""redis-py's asyncio Redis Cluster client, hardened: commands refused while a slot
migrates are sent again, ASK redirections keep ASKING on the command's own connection,
a cluster that cannot serve for now is a ConnectionError (retried like a lost
connection), node-targeted reads are retried. The workarounds hold for the redis-py
versions pyproject.toml allows (the pin is there)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
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

from .url import POOL_SIZE

logger = logging.getLogger(__name__)

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
