"""Records in Redis: one HASH per item type, ``leased:{<crawl>}:<prefix>:<type>``,
field = key, value = ``{"fence":..,"updated":..,"type":..,"item":{..}}`` (lua/upsert.lua).

A write that meets a lost connection or CLUSTERDOWN (Redis restarting, a Sentinel or
Cluster failover under way) is sent again with backoff for up to OUTAGE_RETRY_SECONDS
before its items fail: a fenced upsert applied twice leaves what applying it once leaves.
A Redis out of memory (noeviction) refuses the whole write up front; the write then
waits for memory and is tried again, so the items' requests are not charged a failed
attempt for it (their leases are renewed meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ClusterDownError, OutOfMemoryError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..._redis.connection import CONNECT_TIMEOUT_SECONDS, connect, redact
from ...frontier.keys import CrawlKeys
from ...frontier.scripts import Scripts
from ..records import Record
from .base import Store

logger = logging.getLogger(__name__)

#: upsert/lua/upsert.lua, followed by WAIT on a client with wait_replicas: the item is
#: stored when the reply says so
SCRIPTS = Scripts("scrapy_leased.upsert", {"upsert": ()}, waited=frozenset({"upsert"}))

OUTAGE_RETRY_SECONDS = 30.0
OUTAGE_BACKOFF_CAP_SECONDS = 1.0
OOM_RETRY_CAP_SECONDS = 2.0


class RedisStore(Store):
    def __init__(self, url: str, keys: CrawlKeys, prefix: str, setting: str,
                 connect_timeout: float | None = None) -> None:
        self.url = url
        self.connect_timeout = CONNECT_TIMEOUT_SECONDS if connect_timeout is None \
            else connect_timeout
        self.keys = keys
        self.prefix = prefix
        self.setting = setting
        self.description = f"Redis {redact(url)}"
        self.client: Any = None
        self._upsert: Any = None
        self.outage_retry_seconds = OUTAGE_RETRY_SECONDS

    def hash_key(self, table: str) -> str:
        return self.keys.records(table, self.prefix)

    async def open(self) -> None:
        self.client = await connect(self.url, self.setting, self.connect_timeout)
        self._upsert = SCRIPTS.register(self.client, "upsert")["upsert"]

    async def write(self, records: Sequence[Record]) -> list[bool]:
        keys: list[str] = []
        index: dict[str, int] = {}
        args: list[Any] = [len(records)]
        for r in records:
            i = index.get(r.table)
            if i is None:
                keys.append(self.hash_key(r.table))
                i = index[r.table] = len(keys)
            args += [i, r.key, r.fence, json.dumps(r.type_name), r.data]
        started, delay = time.monotonic(), 0.05
        oom_delay, oom = 0.1, False
        while True:
            try:
                out = await self._upsert(keys=keys, args=args)
            except (RedisConnectionError, RedisTimeoutError, ClusterDownError, OSError):
                if time.monotonic() - started > self.outage_retry_seconds:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, OUTAGE_BACKOFF_CAP_SECONDS)
                continue
            except OutOfMemoryError as exc:
                if not oom:
                    logger.warning("%(store)s is out of memory (%(exc)s): item writes wait "
                                   "for memory to be freed", {"store": self.description,
                                                              "exc": exc})
                    oom = True
                await asyncio.sleep(oom_delay)
                oom_delay = min(oom_delay * 2, OOM_RETRY_CAP_SECONDS)
                continue
            if oom:
                logger.info("%(store)s takes item writes again", {"store": self.description})
            return [bool(x) for x in out]

    async def count(self, table: str) -> int:
        return int(await self.client.hlen(self.hash_key(table)))

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()
