"""Test-only fault injector: a bug in one of a worker's background loops.

An extension loaded in a real ``scrapy crawl`` worker (tests/test_edges_loops.py) with
``EXTENSIONS = {"tests.support.bugs.InjectBug": 0}``. ``TEST_BUG`` names the place;
the patched method raises ``InjectedBug`` on its ``TEST_BUG_CALL``-th call (1: the
first), once; everything else is the real code:

- ``claim``: ``ClaimLoop.absorb`` (worker/claimloop.py), on a reply with claims, before
  any of them is taken;
- ``writer_before`` / ``writer_after``: ``Frontier.commit`` (the commit writer), before
  the call is sent / after Redis applied it (its reply lost to the bug);
- ``feed``: ``Frontier.commit_feed`` (the feed drain), before it is sent;
- ``renew``: ``Frontier.renew`` (the lease renewals; call 1 is the one at open);
- ``sweep``: ``Frontier.recover`` (the recovery of expired leases);
- ``stats``: ``StatsFlusher.flush`` (the fleet stats flush loop);
- ``logstats``: ``LeasedLogStats.log`` (the fleet log line);
- ``upsert``: ``UpsertPipeline._on_batch`` (the item writer of UpsertPipeline), after
  the store wrote the batch, before its writes are told;
- ``watch``: ``LeasedRateMiddleware._note_penalty`` (the penalty watch), for the lane
  ``BUG_LANE`` only, every time (the test publishes it on the penalty channel).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from scrapy.exceptions import NotConfigured

BUG_LANE = "inject-bug.example"


class InjectedBug(RuntimeError):
    pass


def _targets() -> dict[str, tuple[Any, str]]:
    from scrapy_leased.fleet.stats import StatsFlusher
    from scrapy_leased.frontier.machine import Frontier
    from scrapy_leased.observe.logstats import LeasedLogStats
    from scrapy_leased.ratelimit.middleware import LeasedRateMiddleware
    from scrapy_leased.upsert.pipeline import UpsertPipeline
    from scrapy_leased.worker.claimloop import ClaimLoop

    return {
        "claim": (ClaimLoop, "absorb"),
        "writer_before": (Frontier, "commit"),
        "writer_after": (Frontier, "commit"),
        "feed": (Frontier, "commit_feed"),
        "renew": (Frontier, "renew"),
        "sweep": (Frontier, "recover"),
        "stats": (StatsFlusher, "flush"),
        "logstats": (LeasedLogStats, "log"),
        "upsert": (UpsertPipeline, "_on_batch"),
        "watch": (LeasedRateMiddleware, "_note_penalty"),
    }


def install(bug: str, nth: int) -> None:
    owner, name = _targets()[bug]
    original = getattr(owner, name)
    calls = 0

    def due(*args: Any) -> bool:
        nonlocal calls
        if bug == "watch":
            return args[1] == BUG_LANE
        if bug == "claim" and not args[1].claims:
            return False  # a reply without claims is not counted
        calls += 1
        return calls == nth

    def boom() -> InjectedBug:
        return InjectedBug(f"injected bug in {owner.__name__}.{name} ({bug})")

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def patched(*args: Any, **kwargs: Any) -> Any:
            if not due(*args):
                return await original(*args, **kwargs)
            if bug == "writer_after":
                await original(*args, **kwargs)
            raise boom()
    else:
        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            if due(*args):
                raise boom()
            return original(*args, **kwargs)

    setattr(owner, name, patched)


class InjectBug:
    @classmethod
    def from_crawler(cls, crawler: Any) -> InjectBug:
        bug = crawler.settings.get("TEST_BUG")
        if not bug:
            raise NotConfigured
        install(bug, crawler.settings.getint("TEST_BUG_CALL", 1))
        return cls()
