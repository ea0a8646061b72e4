"""Reads across a server or every master of a cluster: INFO of the node holding a key,
SCAN in batches (never KEYS), the keys under a prefix."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

logger = logging.getLogger(__name__)

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
