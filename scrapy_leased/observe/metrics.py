"""Prometheus metrics of one or all crawls in a Redis (``scrapy leased metrics``).

Built with ``prometheus-client`` from the same snapshot as ``scrapy leased status``
(reader.py), read from Redis at each scrape. Every metric has a ``crawl`` label;
per-host gauges only for the hosts held back most (``status``'s host table, at most
``admin.LANES_SHOWN``), so labels stay bounded. The list: docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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
WARNING_CODES = frozenset({"no_workers", "orphaned", "stuck", "dead_climbing", "memory"})

# name (without _total), kind, help, extra labels, value(snapshot, doc) for one-sample metrics
_Getter = Any
METRICS: list[tuple[str, str, str, tuple[str, ...], _Getter]] = [
    ("leased_queued_requests", "gauge", "Requests queued (todo), all hosts together.", (),
     lambda s, d: s.todo),
    ("leased_in_flight_requests", "gauge",
     "Requests claimed by a worker and not settled yet (live leases).", (),
     lambda s, d: s.processing),
    ("leased_done_requests", "counter", "Requests fully processed (acked).", (),
     lambda s, d: s.done),
    ("leased_dead_letters", "gauge", "Dead letters waiting (requeue or purge them).", (),
     lambda s, d: s.dead),
    ("leased_dead_lettered", "counter",
     "Requests ever parked in the dead letters (grows even when requeued).", (),
     lambda s, d: s.dead_total),
    ("leased_recovered_requests", "counter",
     "Expired leases (of dead or stuck workers) put back in the queue.", (),
     lambda s, d: s.totals.get("recovered", 0)),
    ("leased_workers_alive", "gauge", "Workers whose heartbeat is younger than the worker TTL.",
     (), lambda s, d: s.workers_alive),
    ("leased_throughput_requests_per_second", "gauge",
     "Requests newly done per second over the last 50-60 s (status: pages/min / 60).", (),
     lambda s, d: s.pages_per_min / 60),
    ("leased_responses_received", "counter",
     "Responses received by the whole fleet (Scrapy's response_received_count).", (),
     lambda s, d: s.stats.get("response_received_count", 0)),
    ("leased_requests_sent", "counter",
     "Requests sent by the whole fleet (downloader/request_count).", (),
     lambda s, d: s.stats.get("downloader/request_count", 0)),
    ("leased_responses", "counter",
     "Responses by HTTP status, whole fleet (downloader/response_status_count/*).",
     ("status",), None),
    ("leased_download_errors", "counter",
     "Download exceptions, whole fleet (downloader/exception_count).", (),
     lambda s, d: s.stats.get("downloader/exception_count", 0)),
    ("leased_items_scraped", "counter", "Items scraped by the whole fleet (item_scraped_count).",
     (), lambda s, d: s.stats.get("item_scraped_count", 0)),
    ("leased_items_dropped", "counter", "Items dropped by a pipeline (item_dropped_count).", (),
     lambda s, d: s.stats.get("item_dropped_count", 0)),
    ("leased_log_messages", "counter", "Log messages by level, whole fleet (log_count/*).",
     ("level",), None),
    ("leased_budget_waits", "counter",
     "Requests that waited for their host's shared rate budget (leased/budget_waits).", (),
     lambda s, d: s.stats.get("leased/budget_waits", 0)),
    ("leased_budget_penalties", "counter",
     "429/503 answers that blocked or slowed a host (leased/budget_penalties).", (),
     lambda s, d: s.stats.get("leased/budget_penalties", 0)),
    ("leased_hosts_queued", "gauge", "Hosts (lanes) with queued requests.", (),
     lambda s, d: s.lanes_total),
    ("leased_host_queued_requests", "gauge",
     "Requests queued for a host; only the hosts held back most.", ("host",), "queued"),
    ("leased_host_budget_booked_seconds", "gauge",
     "How far a host's rate budget is booked ahead of now (budget in use).", ("host",),
     "ahead_s"),
    ("leased_host_ready_in_seconds", "gauge", "Seconds until a host may be served again.",
     ("host",), "ready_in_s"),
    ("leased_host_blocked_seconds", "gauge",
     "Seconds left of a block set by a 429/503 answer (Retry-After).", ("host",), "blocked_s"),
    ("leased_host_slowdown_ratio", "gauge",
     "Factor on a host's request interval after 429/503 answers (1: none).", ("host",),
     "slowdown"),
    ("leased_warning", "gauge",
     "1 while scrapy leased status shows the warning of this code, else 0.", ("code",), None),
    ("leased_redis_used_memory_bytes", "gauge", "Memory used by the Redis holding the crawl.",
     (), lambda s, d: s.used_memory or 0),
    ("leased_redis_maxmemory_bytes", "gauge", "maxmemory of that Redis (0: no limit).", (),
     lambda s, d: s.maxmemory or 0),
    ("leased_snapshot_timestamp_seconds", "gauge",
     "Redis server time of the snapshot these values come from.", (),
     lambda s, d: s.now_ms / 1000),
]


def _samples(name: str, snap: Snapshot,
             doc: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], float]]:
    """(extra label values, value) of a metric with extra labels."""
    if name == "leased_responses":
        for stat, value in snap.stats.items():
            if stat.startswith(STATUS_PREFIX):
                yield (stat[len(STATUS_PREFIX):],), value
    elif name == "leased_log_messages":
        for stat, value in snap.stats.items():
            if stat.startswith(LOG_PREFIX):
                yield (stat[len(LOG_PREFIX):],), value
    elif name == "leased_warning":
        active = {w["code"] for w in doc["warnings"]}
        for code in sorted(WARNING_CODES | active):
            yield (code,), 1 if code in active else 0


def families(readings: Sequence[Reading]) -> list[Metric]:
    out: list[Metric] = []
    for name, kind, help_text, extra, get in METRICS:
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = cls(name, help_text, labels=("crawl", *extra))
        for r in readings:
            snap, crawl = r.snapshot, r.snapshot.crawl
            if not extra:
                family.add_metric([crawl], float(get(snap, r.doc)))
            elif isinstance(get, str):  # a per-host field of LaneState
                for lane in snap.lanes:
                    family.add_metric([crawl, lane.lane], float(getattr(lane, get)))
            else:
                for labels, value in _samples(name, snap, r.doc):
                    family.add_metric([crawl, *labels], float(value))
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
