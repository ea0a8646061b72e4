"""Records in Redis: one HASH per item type, ``leased:{<crawl>}:<prefix>:<type>``,
field = key, value = ``{"fence":..,"updated":..,"type":..,"item":{..}}`` (lua/upsert.lua)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...connection import connect, redact
from ...keys import CrawlKeys
from ...scripts import register
from ..records import Record
from .base import Store


class RedisStore(Store):
    def __init__(self, url: str, keys: CrawlKeys, prefix: str, setting: str) -> None:
        self.url = url
        self.keys = keys
        self.prefix = prefix
        self.setting = setting
        self.description = f"Redis {redact(url)}"
        self.client: Any = None
        self._upsert: Any = None

    def hash_key(self, table: str) -> str:
        return self.keys.records(table, self.prefix)

    async def open(self) -> None:
        self.client = await connect(self.url, self.setting)
        self._upsert = register(self.client, "upsert")["upsert"]

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
        out = await self._upsert(keys=keys, args=args)
        return [bool(x) for x in out]

    async def count(self, table: str) -> int:
        return int(await self.client.hlen(self.hash_key(table)))

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()
