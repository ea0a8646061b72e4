"""The lost-reply and rollback guard of one caller (lua/lib_guard.lua).

Every guarded script gets four more KEYS (epoch, tokens, rids, and the caller's call key
of a stream, or any key) and four more ARGV (call id, and the highest epoch, token and
rid this caller has seen), and its reply starts with the current {epoch, tokens, rids}.
Redis thus notices a server that came back older than what the caller saw, and a call
sent again with the same call id has its effect once: Redis keeps the last reply of each
stream (claims, commits, feed) of a caller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .keys import CrawlKeys

#: The guard's part at the start of a guarded script's reply: {epoch, tokens, rids}
GUARD_REPLY = 3


class Guard:
    """One caller's guard: its call ids and the highest epoch, token and rid seen.
    ``on_epoch(old, new)`` is called when the crawl's epoch changes (Redis restarted,
    failed over or went back in time)."""

    def __init__(self, keys: CrawlKeys, caller: str) -> None:
        self.keys = keys
        self.caller = caller
        self.epoch: int | None = None
        self.seen_token = 0
        self.seen_rid = 0
        self.on_epoch: Callable[[int, int], None] | None = None
        self._calls = 0

    def new_call_id(self) -> str:
        """A call id for a claim or commit (unique for this caller)."""
        self._calls += 1
        return str(self._calls)

    def wrap(self, keys: Sequence[str], args: Sequence[Any], stream: str | None = None,
             call_id: str = "") -> tuple[list[str], list[Any]]:
        """A guarded script's KEYS and ARGV: its own, then the guard's. ``stream``: the
        caller's stream whose last reply Redis keeps for ``call_id`` (None: none)."""
        k = self.keys
        call = k.call(self.caller, stream) if stream else k.epoch
        return ([*keys, k.epoch, k.tokens, k.rids, call],
                [*args, call_id, self.epoch or 0, self.seen_token, self.seen_rid])

    def seen(self, out: Sequence[Any]) -> Sequence[Any]:
        """Take the guard's {epoch, tokens, rids} off a reply; returns the rest."""
        epoch, tokens, rids = (int(x) for x in out[:GUARD_REPLY])
        self.seen_token = max(self.seen_token, tokens)
        self.seen_rid = max(self.seen_rid, rids)
        old, self.epoch = self.epoch, epoch
        if old is not None and old != epoch and self.on_epoch is not None:
            self.on_epoch(old, epoch)
        return out[GUARD_REPLY:]
