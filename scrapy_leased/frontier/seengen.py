"""The seen set's generations (lua/lib_enqueue.lua): with an expiry of seen entries
(LEASED_SEEN_TTL), the seen buckets of each period of ``ttl_ms`` are keys of their own,
and a script that queues requests is passed the keys of the generation the caller knows.
When that is not the current one any more, the script changes nothing and names the
current one; the call is built again with its keys and sent again (the same call id)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

#: The error a script that queues requests answers with when the seen set's generation
#: the caller built its keys for is not the current one (lua/lib_enqueue.lua).
SEEN_GEN_RE = re.compile(r"^SEEN_GENERATION (\d+)")
GEN_ATTEMPTS = 4

#: Builds a call's KEYS and ARGV for a generation (None: seen entries never expire)
Build = Callable[[int | None], tuple[list[str], list[Any]]]
#: Sends a call's KEYS and ARGV, returns its reply
Send = Callable[[list[str], list[Any]], Awaitable[Sequence[Any]]]


class SeenGenerations:
    """The expiry of seen entries (``ttl_ms``, 0: never; set by the layout check) and
    the generation this caller last knew (``gen``). ``on_change(old, new)`` is called
    when it changed: entries a caller remembers as seen may have expired."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.ttl_ms = 0
        self.gen: int | None = None
        self.on_change: Callable[[int, int], None] | None = None

    async def current(self) -> int | None:
        """The seen set's current generation as this caller knows it (None: seen entries
        never expire): first read from Redis TIME, then corrected by the scripts."""
        if not self.ttl_ms:
            return None
        if self.gen is None:
            sec, usec = await self.client.time()
            self.set((int(sec) * 1000 + int(usec) // 1000) // self.ttl_ms)
        return self.gen

    def set(self, gen: int) -> None:
        old, self.gen = self.gen, gen
        if old is not None and old != gen and self.on_change is not None:
            self.on_change(old, gen)

    async def run(self, build: Build, send: Send) -> Sequence[Any]:
        """Send the call ``build`` makes for the current generation; when the script
        names another, build it again for that one and send it again."""
        for attempt in range(GEN_ATTEMPTS):
            keys, args = build(await self.current())
            try:
                return await send(keys, args)
            except ResponseError as exc:
                found = SEEN_GEN_RE.match(str(exc))
                if found is None or attempt == GEN_ATTEMPTS - 1:
                    raise
                self.set(int(found.group(1)))
        raise AssertionError("unreachable")
