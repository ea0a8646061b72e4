"""Marking URLs seen without queueing them (``scrapy leased from-scrapy-redis
--seen-urls``): their fingerprints added to the crawl's seen set, lua/mark_seen.lua."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..frontier.keys import ExtraKeys
from ..frontier.scripts import Scripts
from ..frontier.seengen import GEN_ATTEMPTS, SEEN_GEN_RE
from .admin import BATCH, FleetAdmin

#: fleet/lua/mark_seen.lua (scrapy leased from-scrapy-redis --seen-urls)
SCRIPTS = Scripts("scrapy_leased.fleet", {"mark_seen": ("lib_time",)})


async def mark_seen(admin: FleetAdmin, entries: Sequence[tuple[int, int]],
                    seen_bucket_bits: int, seen_ttl_ms: int = 0) -> list[bool]:
    """Add seen-set entries ((bucket, member) of a fingerprint, ``split_fingerprint``)
    to the crawl's seen set without queueing anything, ``BATCH`` per atomic step
    (lua/mark_seen.lua); True for each entry that was not there. A request with one
    of these fingerprints is skipped when it is sent later (unless ``dont_filter``).
    Records the seen-set layout for a new crawl; refuses a different one."""
    await admin.frontier.check_layout(seen_bucket_bits, seen_ttl_ms)
    script = SCRIPTS.register(admin.client, "mark_seen")["mark_seen"]
    k = admin.keys
    out: list[bool] = []
    for i in range(0, len(entries), BATCH):
        for attempt in range(GEN_ATTEMPTS):
            gen = await admin.frontier.seen_generation()
            keys = [k.stats]
            extra = ExtraKeys(keys)
            args: list[Any] = [seen_ttl_ms, gen or 0]
            for bucket, member in entries[i:i + BATCH]:
                args += [extra.seen(k, bucket, gen), member]
            try:
                added = await script(keys=keys, args=args)
            except ResponseError as exc:
                found = SEEN_GEN_RE.match(str(exc))
                if found is None or attempt == GEN_ATTEMPTS - 1:
                    raise
                admin.frontier.seen_gen = int(found.group(1))
                continue
            out += [bool(int(a)) for a in added]
            break
    return out
