"""The crawl's run: which worker seeds it (runs the spider's ``start()``).

Under Scrapy's scheduler every ``scrapy crawl`` runs ``start()``; with N workers that
would queue every start request N times, and a start request keeps its
``dont_filter=True``. So one worker per *run* of the crawl seeds it and the others skip
``start()`` (``seeding.LeasedStartMiddleware``). A run lasts while workers are alive:
the first worker to open starts it (``lua/run_join.lua``), every live worker's heartbeat
keeps it (``run_refresh.lua``), and it ends when the last worker closes
(``run_leave.lua``) or, when workers died, once no heartbeat refreshed it for the
worker TTL. With a grace (``LEASED_RUN_GRACE``, by default 30 s inside a Scrapyd job and
0 elsewhere) a run that ended stays joinable that long: a worker that opens within it
joins the run as workers of one run do (skips ``start()``, crawls what is left), so that
workers started seconds apart (Scrapyd jobs polled one after the other, short crawls)
make one run and send the start requests once. A fleet started again after all its
workers stopped (and the grace) is a new run and sends its start requests again, as a
Scrapy crawl resumed from its ``JOBDIR`` does (those without ``dont_filter`` are
deduplicated fleet-wide, as there). The other workers wait
until the seeder has exhausted ``start()`` (and written its requests to Redis) before
they skip it, so none of them takes the crawl for finished before it began; when the
seeder dies first, one of them seeds the run again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._redis.scan import keys_with_prefix
from .keys import CrawlKeys
from .scripts import as_str, register

#: run_join.lua's answers
SEEDED, SEED, WAIT = 0, 1, 2
#: What ``Fresh.alive`` holds when the run ended within its grace (run_leave.lua)
ENDED_MARKER = "run marker 'ended'"


@dataclass(frozen=True)
class Fresh:
    """What ``RunMarker.fresh_run`` did: ``deleted`` keys (None: nothing flushed, because
    a run is on, ``alive`` naming its workers, or because the crawl has work ``left``)."""

    deleted: int | None
    alive: list[str] = field(default_factory=list)
    left: dict[str, int | str] = field(default_factory=dict)
    done_before: int = 0  # requests done by the runs flushed


@dataclass(eq=False)
class RunMarker:
    client: Any
    keys: CrawlKeys
    worker_id: str
    ttl_ms: int
    worker_ttl_ms: int
    #: LEASED_RUN_GRACE: how long an ended run stays joinable (lua/run_leave.lua)
    grace_ms: int = 0

    def __post_init__(self) -> None:
        self._s = register(self.client, "run_join", "run_seeded", "run_refresh", "run_leave",
                           "run_flush")

    async def join(self) -> int:
        """Join the current run (or start one): SEEDED (skip start()), SEED (this
        worker seeds it) or WAIT (another live worker is seeding it: ask again)."""
        k = self.keys
        return int(await self._s["run_join"](keys=[k.run, k.workers], args=[
            self.worker_id, self.ttl_ms, self.worker_ttl_ms]))

    async def flush(self, records_prefix: str) -> tuple[int | None, list[str]]:
        """LEASED_FLUSH_ON_START: start a fresh run, deleting the crawl's frontier state
        (every key but those ``CrawlKeys.kept_by_flush`` keeps; the feed's batches taken
        and not queued go back to the feed), unless a run is on (lua/run_flush.lua).
        Returns (keys deleted, []) when flushed: this worker seeds the new run; else
        (None, the live workers' ids, or the run marker when none)."""
        out = await self.fresh_run(records_prefix, only_if_finished=False)
        return out.deleted, out.alive

    async def fresh_run(self, records_prefix: str, *, only_if_finished: bool) -> Fresh:
        """Start a fresh run as ``flush`` does; with ``only_if_finished`` only when the
        crawl finished (nothing queued, leased, in the feed or waiting to be revisited,
        neither paused nor stopping): a new ``scrapy crawl`` of a finished crawl starts
        afresh, as under Scrapy, unless LEASED_RESUME."""
        k = self.keys
        fixed = [k.run, k.workers, k.control, k.feed, k.feed_taken, k.feed_deadlines,
                 k.todo, k.leases, k.revisit, k.stats]
        doomed = [key for key in await keys_with_prefix(self.client, k.prefix)
                  if not k.kept_by_flush(key, records_prefix) and key not in fixed]
        out = await self._s["run_flush"](keys=[*fixed, *doomed],
                                         args=[self.worker_id, self.ttl_ms,
                                               self.worker_ttl_ms,
                                               1 if only_if_finished else 0])
        if int(out[0]) == 1:
            return Fresh(int(out[1]), done_before=int(out[3]))
        if int(out[0]) == 2:
            names = ("queued", "leased", "feed", "feed_batches", "revisits")
            left: dict[str, int | str] = {n: int(v) for n, v in zip(names, out[1:6])}
            left["control"] = as_str(out[6])
            return Fresh(None, left=left)
        others = [as_str(w) for w in out[2:]]
        return Fresh(None, alive=others or [f"run marker {as_str(out[1])!r}"])

    async def seeded(self) -> bool:
        """start() is exhausted: later joiners skip it."""
        return bool(await self._s["run_seeded"](keys=[self.keys.run],
                                                 args=[self.worker_id, self.ttl_ms]))

    async def refresh(self) -> bool:
        return bool(await self._s["run_refresh"](keys=[self.keys.run], args=[self.ttl_ms]))

    async def leave(self) -> bool:
        """This worker closes; True when it was the last one (the run ended; it stays
        joinable for ``grace_ms``)."""
        k = self.keys
        return bool(await self._s["run_leave"](keys=[k.run, k.workers],
                                                args=[self.worker_id, self.worker_ttl_ms,
                                                      self.grace_ms]))
