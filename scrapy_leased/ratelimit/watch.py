"""The fleet's penalties as they happen: lua/penalize.lua publishes the lane it penalized
(a 429/503 block, a slowdown, a Crawl-delay) on the crawl's channel
(``CrawlKeys.penalties``), and every worker listens on one pub/sub connection.

A request claimed from a lane with nothing to enforce may start without a download-time
check (``LEASED_RATE_FREE_GRACE``) only if this worker was listening from before the
claim was sent and heard no penalty of the lane since: a block set by another worker
after the claim then reaches it before its download (within the delivery of one
message), not only when the grace runs out. While the subscription is down (Redis
unreachable, a failover, a reconnection), ``listening_since`` is None or later than the
claims held, so those are checked at download time. One gap is left: messages published
between the loss of the connection and the moment it is noticed (an error here, or
redis-py reconnecting and subscribing again, which resets ``listening_since``) are
lost, and claims sent before that moment still start unchecked within the grace, as
every free claim did before this watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from .._cancel import cancel_requested
from ..frontier.scripts import as_str

logger = logging.getLogger(__name__)

RETRY_CAP_SECONDS = 5.0


class PenaltyWatch:
    """Listens on ``channel`` with ``client``; calls ``on_penalty(lane)`` for each lane
    penalized by any worker."""

    def __init__(self, client: Any, channel: str, on_penalty: Callable[[str], None],
                 on_skipped: Callable[[], None] | None = None) -> None:
        self.client = client
        self.channel = channel
        self.on_penalty = on_penalty
        #: called for each message skipped as no lane name (the stat
        #: leased/penalty_skipped)
        self.on_skipped = on_skipped
        self.skipped = 0
        #: time.monotonic() from which every penalty published reaches this worker; None
        #: while not subscribed
        self.listening_since: float | None = None
        self._skipped = False  # a message that is not a lane name was logged

    def heard_all_since(self, since: float) -> bool:
        """Whether every penalty published after ``since`` (time.monotonic()) has been
        (or is about to be) delivered to this worker."""
        return self.listening_since is not None and self.listening_since <= since

    async def run(self) -> None:
        """Listen until cancelled. Redis trouble (of any kind: unreachable, a failover,
        a cluster's topology) is retried; a message that is not a lane name is skipped;
        an exception from ``on_penalty`` is a bug and ends the watch (supervised by the
        scheduler: _supervise.py)."""
        delay = 0.1
        while True:
            pubsub = None
            try:
                # a Cluster client learns its slots on its first command; its pub/sub
                # needs them (a plain client: no-op)
                await self.client.initialize()
                pubsub = self.client.pubsub()
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if cancel_requested():  # a cancellation swallowed on the way
                        raise asyncio.CancelledError
                    if message is None:
                        continue
                    kind = as_str(message.get("type"))
                    if kind == "subscribe":
                        # (again after redis-py reconnected by itself: what was published
                        # meanwhile is lost, so only claims sent from now on are covered)
                        self.listening_since = time.monotonic()
                        delay = 0.1
                    elif kind == "message":
                        self._deliver(message.get("data"))
                    else:
                        self.listening_since = None
            except asyncio.CancelledError:
                raise
            except _HandlerFailed as failed:
                raise failed.error from None  # a bug: the supervisor stops the worker
            except Exception as exc:  # Redis down, failover, cluster topology...
                self.listening_since = None
                logger.debug("Penalty channel %(channel)s unavailable (%(exc)s): requests "
                             "of lanes without a budget are checked at download time",
                             {"channel": self.channel, "exc": exc})
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_SECONDS)
            finally:
                self.listening_since = None
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    def _deliver(self, data: Any) -> None:
        """One message published on the channel: a lane name. Anyone can publish there:
        a message that cannot be a lane (``lane_name``) is skipped, counted, and logged
        once (shortened)."""
        lane = lane_name(data)
        if lane is None:
            self.skipped += 1
            if self.on_skipped is not None:
                self.on_skipped()
            if not self._skipped:
                self._skipped = True
                shown = repr(data)
                if len(shown) > SHOWN_CHARS:
                    shown = f"{shown[:SHOWN_CHARS]}... ({len(shown)} characters)"
                logger.warning("Skipped a message on the penalty channel %(channel)s that is "
                               "not a lane name: %(data)s (logged once; each one counted in "
                               "leased/penalty_skipped)",
                               {"channel": self.channel, "data": shown})
            return
        try:
            self.on_penalty(lane)
        except Exception as exc:
            raise _HandlerFailed(exc) from exc


#: How much of a skipped message the log line shows
SHOWN_CHARS = 200


def lane_name(data: Any) -> str | None:
    """The lane a penalty message names, or None when it cannot be one: lua/penalize.lua
    publishes a lane as ``Budgets.lane_of`` makes it (UTF-8 text, lower case, no ``|``).
    Any other text that can be a lane (an unknown one, "nan", "1e999") is a lane: a lane
    penalized that no request has only costs a check at download time, within
    LEASED_RATE_FREE_GRACE."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(data, str) or "|" in data or data.lower() != data:
        return None
    return data


class _HandlerFailed(Exception):
    """``on_penalty`` raised ``error``: not a Redis trouble to retry."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error
