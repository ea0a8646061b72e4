"""Prometheus metrics of one or all crawls in a Redis (``scrapy leased metrics``).

Built with ``prometheus-client`` from the same snapshot as ``scrapy leased status``
(reader.py), read from Redis at each scrape. Every metric has a ``crawl`` label;
per-host gauges only for the hosts held back most (``status``'s host table, at most
``admin.LANES_SHOWN``), so labels stay bounded. The metrics are data, in metrics.json
(name, type, help, labels, source); the list for users: docs/metrics.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..fleet import Snapshot
from .reader import Reading

try:
    from prometheus_client.core import (
        CollectorRegistry,
        CounterMetricFamily,
        GaugeMetricFamily,
        Metric,
    )
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
except ImportError as exc:  # pragma: no cover - the "observe" extra
    raise ImportError("scrapy leased metrics needs prometheus-client: "
                      "pip install 'scrapy-leased[observe]'") from exc

__all__ = ["CONTENT_TYPE_LATEST", "METRICS", "families", "render"]

STATUS_PREFIX = "downloader/response_status_count/"
LOG_PREFIX = "log_count/"
#: admin.diagnose's codes and status's "memory": a series each, 0 or 1
WARNING_CODES = frozenset({"no_workers", "orphaned", "stuck", "dead_climbing", "memory",
                           "dropped"})

#: Where a metric's value comes from (one key of each entry of metrics.json): ``value``
#: a Snapshot attribute (None counts 0) or one of ``_DERIVED``; ``stat`` a fleet-wide
#: Scrapy stat; ``total`` a crawl counter; ``lane`` a per-host field of LaneState;
#: ``series`` one sample per label value (``_series``).
_DERIVED: dict[str, Callable[[Snapshot], float]] = {
    "pages_per_s": lambda s: s.pages_per_min / 60,
    "now_s": lambda s: s.now_ms / 1000,
}
_SERIES_PREFIX = {"status": STATUS_PREFIX, "level": LOG_PREFIX}


@dataclass(frozen=True)
class MetricDef:
    """One metric of ``metrics.json`` (name without ``_total``)."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    value: str | None = None
    stat: str | None = None
    total: str | None = None
    lane: str | None = None
    series: str | None = None

    def one(self, snap: Snapshot) -> float:
        """The value of a metric without extra labels."""
        if self.stat is not None:
            return float(snap.stats.get(self.stat, 0))
        if self.total is not None:
            return float(snap.totals.get(self.total, 0))
        assert self.value is not None, self.name
        derived = _DERIVED.get(self.value)
        return float(derived(snap) if derived else getattr(snap, self.value) or 0)


def _load() -> list[MetricDef]:
    text = resources.files(__package__).joinpath("metrics.json").read_text(encoding="utf-8")
    return [MetricDef(**{**d, "labels": tuple(d.get("labels", ()))}) for d in json.loads(text)]


METRICS: list[MetricDef] = _load()


def _series(kind: str, snap: Snapshot,
            doc: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], float]]:
    """(extra label values, value) of a ``series`` metric."""
    if kind == "warning":
        active = {w["code"] for w in doc["warnings"]}
        for code in sorted(WARNING_CODES | active):
            yield (code,), 1 if code in active else 0
        return
    prefix = _SERIES_PREFIX[kind]
    for stat, value in snap.stats.items():
        if stat.startswith(prefix):
            yield (stat[len(prefix):],), value


def families(readings: Sequence[Reading]) -> list[Metric]:
    out: list[Metric] = []
    for m in METRICS:
        cls = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
        family = cls(m.name, m.help, labels=("crawl", *m.labels))
        for r in readings:
            snap, crawl = r.snapshot, r.snapshot.crawl
            if m.lane is not None:
                for lane in snap.lanes:
                    family.add_metric([crawl, lane.lane], float(getattr(lane, m.lane)))
            elif m.series is not None:
                for labels, value in _series(m.series, snap, r.doc):
                    family.add_metric([crawl, *labels], float(value))
            else:
                family.add_metric([crawl], m.one(snap))
        out.append(family)
    return out


class _Fixed:
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(readings: Sequence[Reading]) -> bytes:
    """The text exposition format of these readings."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families(readings)))
    return generate_latest(registry)
