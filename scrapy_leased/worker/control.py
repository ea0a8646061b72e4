"""The fleet's control state as this worker sees it (``scrapy leased pause / resume /
stop``, the LEASED_CLOSE_* limits): paused, the worker claims and starts nothing new;
stopping, it finishes what it started, gives back the rest and closes with
``STOP_REASON``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._supervise import close_crawl
from ..frontier import PAUSED, RUNNING, STOPPING

if TYPE_CHECKING:
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)

#: The close reason of a worker closed by the fleet's ``stopping`` state (``scrapy leased
#: stop``, or a LEASED_CLOSE_* limit reached by the fleet).
STOP_REASON = "leased_stopped"


class Control:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker
        # The fleet's control state as this worker last saw it (keys.py: control)
        self.state = RUNNING
        self.paused_idle = False  # paused, and nothing started is left here (logged)
        self.stop_task: asyncio.Future[None] | None = None

    @property
    def stopping(self) -> bool:
        """Whether the fleet is stopping (this worker closes with ``STOP_REASON``)."""
        return self.state == STOPPING

    def on_control(self, state: str) -> None:
        """The control state a claim or heartbeat reported (keys.py: control)."""
        if state not in (PAUSED, STOPPING):
            state = RUNNING
        if state == self.state or self.state == STOPPING:
            return  # stopping is final for this worker
        self.state = state
        crawl = self.w.frontier.keys.crawl_id if self.w.frontier is not None else "?"
        if state == PAUSED:
            self.paused_idle = False
            logger.info("Crawl %(crawl)s paused (scrapy leased pause): this worker claims and "
                        "starts nothing new, finishes what it started and keeps the leases "
                        "of the %(n)d claims it holds", {"crawl": crawl,
                                                         "n": len(self.w.book.claims)})
            self.check_paused_idle()
        elif state == RUNNING:
            logger.info("Crawl %(crawl)s resumed: claiming again", {"crawl": crawl})
            self.w.claims.starved = False
            if self.w.kick is not None:
                self.w.kick.set()
            self.w.engine.wake()
        else:
            logger.info("Crawl %(crawl)s is stopping (scrapy leased stop, or a LEASED_CLOSE_* "
                        "limit reached): this worker finishes what it started, gives back "
                        "the rest and closes (%(reason)s)", {"crawl": crawl,
                                                             "reason": STOP_REASON})
            if self.w.kick is not None:
                self.w.kick.set()
            self.stop_task = asyncio.ensure_future(self.close_engine())

    def check_paused_idle(self) -> None:
        if self.paused_idle or self.w.book.started_busy():
            return
        self.paused_idle = True
        logger.info("Crawl paused: nothing in progress on this worker; %(n)d unstarted claims "
                    "held until resume", {"n": len(self.w.book.claims)})

    async def close_engine(self) -> None:
        """Close the spider through the engine, as Scrapy's CloseSpider does: requests in
        progress finish and are acked, the unstarted claims are released (``close``)."""
        with contextlib.suppress(RedisError, OSError, AttributeError):
            assert self.w.frontier is not None
            by, why = await self.w.frontier.client.hmget(self.w.frontier.keys.control, "by",
                                                         "reason")
            if by or why:
                logger.info("The fleet's stop was set by %(by)s%(why)s",
                            {"by": _text(by), "why": f": {_text(why)}" if why else ""})
        await close_crawl(self.w.crawler, STOP_REASON, lambda: self.w._closing)

    async def set_aside(self) -> bool:
        """A control key of another type than a HASH (a ``SET ...:control paused`` by
        hand) cannot be read by the claims (lua/claim.lua refuses them, changing
        nothing), and the fleet could claim nothing more: move it aside whole
        (Frontier.set_aside), say so once at ERROR with both keys and what to do, count
        it (``leased/control_set_aside``). The fleet then runs as with no control state
        (running). Whether it was moved; raises RedisError like any call."""
        assert self.w.frontier is not None
        moved = await self.w.frontier.set_aside("control")
        if moved is None:
            return False
        kind, aside = moved
        self.w.stats.inc_value("leased/control_set_aside")
        logger.error(
            "Redis key %(key)s, the fleet's control state, was a %(kind)s, not a hash: it "
            "was written by hand, not by `scrapy leased pause|resume|stop`. It was moved, "
            "whole, to %(aside)s, and the fleet runs as with no control state (running); "
            "nothing was deleted. Pause, resume or stop the fleet with `scrapy leased "
            "pause|resume|stop`, then delete %(aside)s.",
            {"key": self.w.frontier.keys.control, "kind": kind, "aside": aside})
        return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
