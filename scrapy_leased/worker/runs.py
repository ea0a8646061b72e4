"""The run a worker joins (frontier/run.py): a fresh run of the crawl (its frontier
state deleted: LEASED_FLUSH_ON_START, or a crawl that finished started again), the
crawl continued (work left, LEASED_RESUME), or the run that is on joined (also one that
ended within LEASED_RUN_GRACE); each said once, with how to get the other."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from ..frontier.run import ENDED_MARKER

if TYPE_CHECKING:
    from .scheduler import LeasedScheduler

logger = logging.getLogger(__name__)


class Runs:
    def __init__(self, worker: LeasedScheduler) -> None:
        self.w = worker

    async def fresh_start(self) -> bool:
        """Whether a new run starts afresh: LEASED_FLUSH_ON_START (then the layout checked
        again), else unless LEASED_RESUME a crawl that finished. True when a run of the
        crawl was on (joined, nothing flushed)."""
        w = self.w
        assert w.frontier is not None
        if w.config.flush_on_start:
            # first: a fresh run also ends a stop a LEASED_CLOSE_* limit set (run_flush.lua)
            run_on = await self.flush_on_start()
            await w.frontier.check_layout(w.config.seen_bucket_bits,
                                          w.config.seen_ttl_ms)
            return run_on
        if not w.config.resume:
            return await self.afresh_if_finished()
        return False

    async def flush_on_start(self) -> bool:
        """LEASED_FLUSH_ON_START: begin a fresh run of the crawl (its frontier state
        deleted, UpsertPipeline's records kept) when no run of it is on; else join the
        run on, flushing nothing (True)."""
        assert self.w.run is not None
        crawl = self.w.run.keys.crawl_id
        deleted, alive = await self.w.run.flush(self.w.config.upsert.prefix)
        if deleted is None and alive == [ENDED_MARKER]:
            logger.warning("LEASED_FLUSH_ON_START: not flushing crawl %(crawl)s: its run "
                           "ended less than LEASED_RUN_GRACE (%(grace)gs) ago; joining that "
                           "run instead (start() not run again)",
                           {"crawl": crawl, "grace": self.w.config.run_grace})
            return True
        if deleted is None:
            logger.warning("LEASED_FLUSH_ON_START: not flushing crawl %(crawl)s: a run of it "
                           "is on (%(alive)s); joining that run instead (a crawl is flushed "
                           "only when no worker of it is alive)",
                           {"crawl": crawl, "alive": ", ".join(alive)})
            return True
        self.w.seeds = True
        self.w.joined = True
        self.w.stats.inc_value("leased/flushed_keys", deleted)
        logger.info("LEASED_FLUSH_ON_START: flushed crawl %(crawl)s (%(n)d keys: queue, seen "
                    "set, done, dead letters, counters; the feed and UpsertPipeline's records "
                    "kept): this worker starts a fresh run", {"crawl": crawl, "n": deleted})
        return False

    async def afresh_if_finished(self) -> bool:
        """A new ``scrapy crawl`` of a crawl that finished starts afresh, as a Scrapy
        crawl does (LEASED_RESUME unset, the default): its frontier state is deleted as
        by LEASED_FLUSH_ON_START. A crawl with work left (queued, leased, in the feed,
        revisits waiting), paused or stopping is continued, and a run that is on is
        joined (True). The first WARNING says which, and how to get the other."""
        assert self.w.run is not None
        crawl = self.w.run.keys.crawl_id
        out = await self.w.run.fresh_run(self.w.config.upsert.prefix, only_if_finished=True)
        if out.deleted is not None:
            self.w.seeds = True
            self.w.joined = True
            self.w.stats.inc_value("leased/flushed_keys", out.deleted)
            if out.done_before:
                logger.warning(
                    "Crawl %(crawl)s finished before (%(done)d requests done): starting it "
                    "afresh, as a new Scrapy crawl (its seen set, queue and dead letters "
                    "cleared; UpsertPipeline's records kept). Set LEASED_RESUME = True to "
                    "continue it instead, crawling only what it has not seen.",
                    {"crawl": crawl, "done": out.done_before})
            assert self.w.frontier is not None
            await self.w.frontier.check_layout(self.w.config.seen_bucket_bits,
                                             self.w.config.seen_ttl_ms)
        elif not out.left:  # a run is on: joined, as any worker of a fleet
            if out.alive == [ENDED_MARKER]:  # it ended within LEASED_RUN_GRACE
                logger.info(
                    "Crawl %(crawl)s: joining its run that ended less than LEASED_RUN_GRACE "
                    "(%(grace)gs) ago: start() is not run again, what is left is crawled",
                    {"crawl": crawl, "grace": self.w.config.run_grace})
            elif all(a.startswith("run marker") for a in out.alive):  # but no worker alive
                logger.warning(
                    "Crawl %(crawl)s: continuing the run of workers that ended without "
                    "closing (killed?); its requests left are crawled. To start it "
                    "afresh instead, once no worker is alive: `scrapy leased reset "
                    "%(crawl)s --yes`.", {"crawl": crawl})
            return True
        else:
            left = ", ".join(f"{v} {k}" for k, v in out.left.items()
                             if k != "control" and v) or f"state {out.left['control']}"
            logger.warning(
                "Crawl %(crawl)s has work left from an earlier run (%(left)s): continuing "
                "it. To start it afresh instead: LEASED_FLUSH_ON_START = True (or "
                "`scrapy leased reset %(crawl)s --yes`).", {"crawl": crawl, "left": left})
        return False

    async def say_resumed(self) -> None:
        """LEASED_RESUME, this worker starting a new run: say so when the crawl ran
        before (its seen set still drops what it crawled)."""
        assert self.w.frontier is not None
        keys = self.w.frontier.keys
        with contextlib.suppress(RedisError, OSError, ValueError, TypeError):
            done = int(await self.w.frontier.client.hget(keys.stats, "done") or 0)
            if done:
                logger.warning(
                    "LEASED_RESUME: continuing crawl %(crawl)s (%(done)d requests done "
                    "before): requests seen before are dropped as duplicates. Unset "
                    "LEASED_RESUME for a fresh crawl of it.",
                    {"crawl": keys.crawl_id, "done": done})
