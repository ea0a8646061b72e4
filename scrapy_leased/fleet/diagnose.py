"""The warning signs of a fleet, read from two snapshots (README, "Watching the fleet")."""

from __future__ import annotations

from dataclasses import dataclass

from .snapshot import Snapshot

#: Diagnoses (see ``diagnose`` and the README's "Watching the fleet").
MIN_TREND_SECONDS = 0.5  # two samples closer than this give no trend
ORPHAN_FACTOR = 2.0  # processing above this many times the fleet's capacity ...
ORPHAN_MIN = 10  # ... and above it by at least this many requests
IDLE_SHARE = 0.5  # below this share of their capacity in use, live workers are idle
DEAD_MIN = 2  # dead letters added within the window before "climbing" is said ...
DEAD_SHARE = 0.05  # ... and at least this share of the requests settled meanwhile
HOLD_WARN_S = 10.0  # a worker's claim not started after this many seconds: "holding"


@dataclass(frozen=True)
class Diagnosis:
    code: str  # "no_workers", "orphaned", "stuck", "dead_climbing", "holding" ("memory",
    # "dropped": the command)
    message: str


def diagnose(cur: Snapshot, prev: Snapshot | None = None,
             default_capacity: int | None = None) -> list[Diagnosis]:
    """The fleet's warning signs, from the current snapshot and an earlier one.

    - ``no_workers``: work is queued or leased, and no worker is alive.
    - ``orphaned``: processing (live leases) is much larger than the live workers'
      capacity: leases of dead workers, waiting to expire. Needs ``cur.workers``.
    - ``stuck`` (needs ``prev``): done did not move while todo grew, or while todo
      waits and the live workers are idle (nothing processing, or less than half of
      their capacity: with every slot busy, a flat done only means slow pages); not
      while the fleet is paused.
    - ``dead_climbing`` (needs ``prev``): dead letters are being added fast.
    - ``holding``: a live worker holds claims it has not started for ``HOLD_WARN_S``
      or longer (its download slot's delay, or the engine not taking them; not
      while the fleet is paused): no other worker can take them. Needs ``cur.workers``.
    """
    capacity = cur.capacity(default_capacity)
    out = _now(cur, capacity) + _holding(cur)
    if prev is None or (cur.now_ms - prev.now_ms) / 1000 < MIN_TREND_SECONDS:
        return out
    return out + _trends(cur, prev, capacity)


def _now(cur: Snapshot, capacity: int | None) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    if cur.workers_alive == 0 and (cur.todo or cur.processing):
        out.append(Diagnosis("no_workers", (
            f"no worker is alive, with {cur.todo:,} requests to do and {cur.processing:,} "
            f"leased: start workers (leases of dead workers return to todo when they expire)")))
    if cur.workers_alive and capacity is not None and cur.processing > ORPHAN_FACTOR * capacity \
            and cur.processing - capacity >= ORPHAN_MIN:
        out.append(Diagnosis("orphaned", (
            f"processing {cur.processing:,} is much larger than the capacity of the "
            f"{cur.workers_alive} live workers ({capacity:,}): workers are dying without "
            f"finishing, and recovery is carrying the load")))
    return out


def _holding(cur: Snapshot) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    if cur.control.state == "paused":
        return out
    for w in cur.workers:
        if w.alive and w.unstarted and (w.unstarted_s or 0) >= HOLD_WARN_S:
            why = (f"its download slot starts one request every {w.slot_delay:g} s "
                   f"(DOWNLOAD_DELAY, AutoThrottle)" if w.slot_delay
                   else "its downloader does not take them")
            out.append(Diagnosis("holding", (
                f"worker {w.id} holds {w.unstarted:,} claims it has not started, one "
                f"for {w.unstarted_s:.0f} s: {why}; no other worker can take them "
                f"(for politeness across the fleet use LEASED_RATE, not a delay per "
                f"worker)")))
    return out


def _trends(cur: Snapshot, prev: Snapshot, capacity: int | None) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    seconds = (cur.now_ms - prev.now_ms) / 1000
    done_delta = cur.done - prev.done
    todo_delta = cur.todo - prev.todo
    # Free slots while work waits: the workers do not take it (when every slot is busy,
    # a flat done only means slow pages).
    idle = cur.processing == 0 or (capacity is not None and cur.processing < IDLE_SHARE * capacity)
    # (a paused fleet is meant to wait: scrapy leased pause)
    if cur.workers_alive and done_delta == 0 and cur.todo > 0 and (todo_delta > 0 or idle) \
            and cur.control.state != "paused":
        if todo_delta > 0:
            what = f"todo grew {prev.todo:,} -> {cur.todo:,}"
        else:
            what = f"todo waits at {cur.todo:,} with {cur.processing:,} processing" + (
                f" (capacity {capacity:,})" if capacity is not None else "")
        out.append(Diagnosis("stuck", (
            f"{what} while done stayed at {cur.done:,} for {seconds:.1f} s: workers are "
            f"stuck (rate budget too tight, or all blocked)")))
    dead_delta = cur.dead_total - prev.dead_total
    settled = max(done_delta, 0) + max(dead_delta, 0)
    if dead_delta >= DEAD_MIN and dead_delta >= DEAD_SHARE * settled:
        out.append(Diagnosis("dead_climbing", (
            f"dead letters climbing: +{dead_delta:,} in {seconds:.1f} s "
            f"({100 * dead_delta / settled:.0f}% of the requests settled): a parser bug or "
            f"a new block page? Look at them (scrapy leased dead) before burning through "
            f"the queue")))
    return out
