"""Worker ids: ``host:pid:random``, readable by operators, unique in a fleet.

Containers with host networking share a hostname and often run ``scrapy`` as PID 1, so
the host and pid alone tell nothing apart: the random part does. It has 64 bits (13
lowercase base32 characters: the id rides in every claim's owner entry and in a few key
names, so it is kept short), so that two of 10,000 workers draw the same one with a
probability of about 3e-12. A worker that still finds its id alive in the crawl's worker
registry when it starts draws another one (``enter``, lua/worker_enter.lua): the check
and the registration are one script, and nothing is written under an id in use.
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
from typing import Any

from .keys import CrawlKeys
from .scripts import register

RANDOM_BITS = 64
#: How many ids a starting worker draws before giving up (each one is alive already).
MAX_DRAWS = 8
#: Test hook: a comma-separated list of ids that ``new_worker_id`` hands out first, in
#: order, before drawing random ones (tests/test_edges_env.py makes a worker draw the id
#: of a live one). Not a setting: nothing but the tests sets it.
TEST_IDS_ENV = "SCRAPY_LEASED_TEST_WORKER_IDS"

_planned: list[str] | None = None


def random_part() -> str:
    """RANDOM_BITS random bits, lowercase base32 without padding."""
    raw = secrets.token_bytes(RANDOM_BITS // 8)
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def new_worker_id() -> str:
    """A fresh ``host:pid:random`` id (or the next one of TEST_IDS_ENV)."""
    global _planned
    if _planned is None:
        _planned = [i for i in os.environ.get(TEST_IDS_ENV, "").split(",") if i]
    if _planned:
        return _planned.pop(0)
    return f"{socket.gethostname()}:{os.getpid()}:{random_part()}"


class WorkerIdTaken(RuntimeError):
    """Every id drawn was alive in the worker registry already."""


async def enter(client: Any, keys: CrawlKeys, worker_id: str, worker_ttl_ms: int,
                draws: int = MAX_DRAWS) -> tuple[str, list[str]]:
    """Register a starting worker under ``worker_id``, or under a new id when a live
    worker (a heartbeat younger than ``worker_ttl_ms``) has that one. Returns (the id
    registered, the ids found alive and given up). Raises WorkerIdTaken after ``draws``
    ids in use."""
    script = register(client, "worker_enter")["worker_enter"]
    taken: list[str] = []
    for _ in range(draws):
        if int(await script(keys=[keys.workers], args=[worker_id, worker_ttl_ms])):
            return worker_id, taken
        taken.append(worker_id)
        worker_id = new_worker_id()
    raise WorkerIdTaken(
        f"{draws} worker ids drawn were each alive in the registry of crawl "
        f"{keys.crawl_id} already ({', '.join(taken)})")
