"""The fleet line each worker logs (``scrapy_leased.observe.logstats.LeasedLogStats``):

    Fleet pages: 2,340 pages/min, todo 1,020, in flight 47, done 3,400, dead 0, workers 3
"""

from __future__ import annotations

from typing import Any

from .snapshot import Snapshot

FLEET_LINE = ("Fleet %(crawl)s: %(rate)s pages/min, todo %(todo)s, in flight %(processing)s, "
              "done %(done)s, dead %(dead)s, workers %(workers)d")


def fleet_line_args(snap: Snapshot) -> dict[str, Any]:
    """The arguments of ``FLEET_LINE`` for a snapshot (logging's %-style)."""
    return {"crawl": snap.crawl, "rate": f"{snap.pages_per_min:,.0f}",
            "todo": f"{snap.todo:,}", "processing": f"{snap.processing:,}",
            "done": f"{snap.done:,}", "dead": f"{snap.dead:,}",
            "workers": snap.workers_alive}
