"""Test-only Scrapy extension for tests/test_edges_lua.py: a spider's stats set to
values the fleet stats cannot take (nan, inf, beyond 2**63), next to a good counter, on
every response. Enabled in a worker with
``EXTENSIONS={"tests.support.lua_edges.HostileStats": 500}`` (the workers' PYTHONPATH is
the repository root)."""

from __future__ import annotations

from typing import Any

from scrapy import signals

#: The stats HostileStats sets, with their values (a numpy mean of nothing is nan).
HOSTILE = {"edges/nan": float("nan"), "edges/inf": float("inf"),
           "edges/minus_inf": float("-inf"), "edges/huge_int": 10 ** 30,
           "edges/huge_float": 1e300}
GOOD = "edges/good"  # incremented once per response


class HostileStats:
    def __init__(self, stats: Any) -> None:
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> HostileStats:
        o = cls(crawler.stats)
        crawler.signals.connect(o.response_received, signal=signals.response_received)
        return o

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        for name, value in HOSTILE.items():
            self.stats.set_value(name, value)
        self.stats.max_value("edges/max_nan", float("nan"))
        self.stats.inc_value(GOOD)
