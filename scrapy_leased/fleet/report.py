"""What ``scrapy leased status`` and ``dead`` show of a fleet, as text and as the
document ``status --json`` prints (also served by the dashboard): the warnings of a
snapshot, its rendering, the dead letters' listing. No Redis, no Scrapy: it reads
``Snapshot`` and ``DeadLetter`` values."""

from __future__ import annotations

import time
from typing import Any

from ..settings import Budgets
from .admin import DeadLetter
from .diagnose import Diagnosis, diagnose
from .snapshot import Snapshot
from .stats import headline_stats

MEMORY_WARN_SHARE = 0.8  # warn when Redis uses this share of its maxmemory


def status_warnings(cur: Snapshot, prev: Snapshot | None,
                    default_cap: int) -> list[Diagnosis]:
    """The warnings ``status`` shows (the fleet's, and Redis memory)."""
    out = diagnose(cur, prev, default_cap)
    dropped = cur.totals.get("dropped", 0)
    if dropped:
        out.append(Diagnosis("dropped", (
            f"{n_of(dropped, 'request')} dropped: the spider yielded "
            f"{'it' if dropped == 1 else 'them'} but {'it' if dropped == 1 else 'they'} "
            f"could not be stored (an object in meta or cb_kwargs, ...); each is a dead "
            f"letter with the reason and the fix: scrapy leased dead")))
    if cur.maxmemory and cur.used_memory and cur.used_memory > MEMORY_WARN_SHARE * cur.maxmemory:
        out.append(Diagnosis("memory", (
            f"Redis uses {cur.used_memory / cur.maxmemory:.0%} of its maxmemory: the crawl "
            f"stops when it is full")))
    return out


def _budget_text(budgets: Budgets, lane: str) -> str:
    b = budgets.for_lane(lane)
    if not b.interval_ms:
        return "none"
    per_s = 1000 / b.interval_ms
    rate = f"{per_s:,.4g}/s" if per_s >= 1 else f"{per_s * 60:,.4g}/min"
    return f"{rate} burst {b.burst}"


def status_doc(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis], where: str,
               budgets: Budgets) -> dict[str, Any]:
    """What ``status --json`` prints (also served by ``dashboard``)."""
    doc = cur.to_dict()
    doc["redis"] = where
    doc["sample_s"] = round(_dt(prev, cur), 3) if prev else 0
    doc["throughput"]["sample_pages_per_min"] = round(_rate(prev, cur), 1) if prev else None
    doc["budget"] = {"lanes_total": cur.lanes_total, "lanes": [
        {**lane.to_dict(), "budget": _budget_text(budgets, lane.lane)} for lane in cur.lanes]}
    doc["warnings"] = [{"code": d.code, "message": d.message} for d in warnings]
    return doc


def n_of(count: int, word: str) -> str:
    """``count`` ``word``, plural unless 1: ``1 request``, ``2,000 requests``."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def age_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _dt(prev: Snapshot, cur: Snapshot) -> float:
    return (cur.now_ms - prev.now_ms) / 1000


def _rate(prev: Snapshot, cur: Snapshot) -> float:
    """Pages per minute between two samples (done counter delta)."""
    return (cur.done - prev.done) * 60 / _dt(prev, cur) if _dt(prev, cur) > 0 else 0.0


def _control_line(cur: Snapshot) -> str:
    c = cur.control
    line = f"  state          {cur.state:>12}"
    if cur.state == c.state and c.since_ms:
        why = f"; {c.reason}" if c.reason else ""
        line += f"   (since {age_text(max(0, cur.now_ms - c.since_ms) / 1000)} ago, by {c.by}{why})"
    return line


def render_status(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis],
                  where: str, budgets: Budgets | None = None) -> str:
    """What ``status`` prints: the counters, the hosts held back, the fleet's stats,
    the workers and the warnings."""
    lines = _counter_lines(cur, prev, where) + _lane_lines(cur, budgets) \
        + _stats_lines(cur) + _worker_lines(cur)
    lines.append("")
    if warnings:
        lines += [f"  WARNING: {d.message}" for d in warnings]
    elif prev is None:
        lines.append("  no warnings (one sample: trends not measured)")
    else:
        lines.append(f"  no warnings (trends over {_dt(prev, cur):.1f} s)")
    return "\n".join(lines)


def _counter_lines(cur: Snapshot, prev: Snapshot | None, where: str) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cur.now_ms / 1000))
    gone = len(cur.workers) - sum(1 for w in cur.workers if w.alive)
    capacity = cur.capacity()
    lines = [
        f"crawl {cur.crawl}   redis {where}   {when}",
        "",
        _control_line(cur),
        f"  todo           {cur.todo:>12,}"
        + (f"   (+ {cur.feed:,} in the feed, not queued yet)" if cur.feed else "")
        + (f"   ({cur.feed_batches:,} feed batch{'' if cur.feed_batches == 1 else 'es'} "
           f"being queued)"
           if cur.feed_batches else ""),
        f"  processing     {cur.processing:>12,}"
        + (f"   (capacity of the live workers: {capacity:,})" if capacity is not None else ""),
        f"  done           {cur.done:>12,}",
        f"  dead           {cur.dead:>12,}",
        f"  workers alive  {cur.workers_alive:>12,}"
        + (f"   ({gone} gone: no heartbeat for longer than the worker TTL)" if gone else ""),
        f"  throughput     {cur.pages_per_min:>12,.0f} pages/min   "
        f"({cur.done_last_minute:,} done in the last {cur.window_s:.0f} s"
        + (f"; {_rate(prev, cur):,.0f}/min over the last {_dt(prev, cur):.1f} s)" if prev
           else ")"),
    ]
    if cur.used_memory is not None:
        mem = f"  redis memory   {cur.used_memory_human or cur.used_memory:>12}"
        if cur.maxmemory:
            mem += f"   (maxmemory {cur.maxmemory / 2**20:,.0f}M)"
        lines.append(mem)
    return lines


def _lane_lines(cur: Snapshot, budgets: Budgets | None) -> list[str]:
    if not cur.lanes:
        return []
    lines = ["", f"  {'host (lane)':<26} {'queued':>8} {'budget':>22} {'booked':>8} "
                 f"{'ready in':>9} {'blocked':>8} {'slowdown':>9}"]
    for lane in cur.lanes:
        budget = _budget_text(budgets, lane.lane) if budgets else "?"
        extra = f"   Crawl-delay {lane.crawl_delay_s:g} s" if lane.crawl_delay_s else ""
        lines.append(f"  {lane.lane or '(default)':<26} {lane.queued:>8,} {budget:>22} "
                     f"{lane.ahead_s:>7.1f}s {lane.ready_in_s:>8.1f}s "
                     f"{lane.blocked_s:>7.1f}s {lane.slowdown:>8.2f}x{extra}")
    if cur.lanes_total > len(cur.lanes):
        lines.append(f"  ... {cur.lanes_total - len(cur.lanes):,} more hosts with queued "
                     f"requests")
    return lines


def _stats_lines(cur: Snapshot) -> list[str]:
    if not cur.stats:
        return []
    lines = ["", "  Scrapy stats of the whole fleet (all workers added up; all: --json)"]
    lines += [f"  {name:<44} {value:>14,}" if isinstance(value, int) else
              f"  {name:<44} {value:>14,.1f}" for name, value in headline_stats(cur.stats)]
    return lines


def _worker_lines(cur: Snapshot) -> list[str]:
    lines: list[str] = []
    alive = [w for w in cur.workers if w.alive]
    if alive:
        lines += ["", f"  {'worker':<34} {'heartbeat':>11} {'in flight':>10} {'acked':>10} "
                      f"{'leases':>8}"]
        for w in alive:
            lines.append(f"  {w.id:<34} {age_text(w.heartbeat_age_s) + ' ago':>11} "
                         f"{'?' if w.inflight is None else w.inflight:>10} "
                         f"{'?' if w.acked is None else f'{w.acked:,}':>10} "
                         f"{cur.leases_by_worker.get(w.id, 0):>8,}")
    orphans = cur.leases_of_gone_workers()
    if orphans:
        lines += ["", f"  leases of workers not alive, waiting to expire: "
                      f"{sum(orphans.values()):,}"]
        lines += [f"  {wid:<34} {n:>8,}" for wid, n in orphans.items()]
    return lines


def render_dead(crawl: str, total: int, letters: list[DeadLetter]) -> str:
    if not total:
        return f"crawl {crawl}: no dead letters"
    lines = [f"crawl {crawl}: {n_of(total, 'dead letter')}"
             + (f", the newest {len(letters):,}:" if len(letters) < total else ":")]
    for d in letters:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.t_ms / 1000))
        target = f"{d.method} {d.url}" if d.url else "(unreadable envelope)"
        reason = " ".join(d.reason.split())
        if d.dropped:
            lines.append(f"  {when}  dropped (never queued)  {target}  callback {d.callback}")
        else:
            lines.append(f"  {when}  attempts {d.attempts}  {target}")
        lines.append(f"      {reason[:300]}{'...' if len(reason) > 300 else ''}")
        if d.dropped:
            kept = ("kept without " + ", ".join(d.removed) if d.removed else "kept whole") \
                if d.request is not None else "not kept"
            lines.append(f"      request {kept}; cannot be requeued: fix the spider, seed "
                         f"the URL again, purge the letter")
    return "\n".join(lines)
