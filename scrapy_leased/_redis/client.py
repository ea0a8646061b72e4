"""The redis-py client for a parsed URL (``url.py``): one server, a Sentinel group's
master (``sentinel.py``) or a Redis Cluster (``cluster.py``), with pools that wait for a
connection instead of failing. ``connection.make_client`` is the one entry point."""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.cluster
import redis.sentinel
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry

from .cluster import LeasedRedisCluster
from .sentinel import (
    AsyncSentinelGroup,
    AsyncSentinelMaster,
    BlockingSentinelPool,
    SentinelGroup,
    SentinelMaster,
)
from .url import POOL_SIZE, POOL_WAIT_SECONDS, RedisTarget, parse_redis_url

logger = logging.getLogger(__name__)

def build_client(url: str, options: dict[str, Any], sync: bool = False) -> Any:
    """A redis-py client for ``url`` (asyncio unless ``sync``), with the connection
    ``options`` (timeouts, retry policy; the URL's own query options win)."""
    target = parse_redis_url(url)
    client = _build(target, options, sync)
    client.leased_wait_replicas = target.wait_replicas  # read by scripts.register
    return client


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
