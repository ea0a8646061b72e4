"""``scrapy leased status``: one snapshot with its trends, or ``--watch``."""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import deque

from scrapy.settings import Settings

from ..fleet import Diagnosis, FleetAdmin, Snapshot
from ..fleet.report import render_status, status_doc, status_warnings
from ..settings import Budgets, LeasedConfig
from .common import AddParser, _concurrency, add_crawl, connected, number, open_crawl

WATCH_INTERVAL_SECONDS = 2.0  # --watch redraws this often
SAMPLE_SECONDS = 2.0  # one status: two samples this far apart give the trends
WATCH_TREND_SECONDS = 10.0  # --watch: trends against the sample this old
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


def add_parsers(add: AddParser) -> None:
    p = add("status", "[CRAWL] [--watch [--interval S]] [--json] [--sample S]",
            "the crawl's state, numbers, workers and warnings")
    add_crawl(p)
    p.add_argument("--json", action="store_true",
                   help="machine-readable JSON (with --watch, one object per line)")
    p.add_argument("--watch", action="store_true",
                   help="redraw every --interval seconds, like top")
    p.add_argument("--interval", type=number(float, 0, above=True), default=None,
                   metavar="SECONDS", help="refresh period of --watch (default 2)")
    p.add_argument("--sample", type=number(float, 0), default=None, metavar="SECONDS",
                   help="trend window of the warnings, one status taking two samples this "
                        "far apart (default 2; 0 = one sample, no trends); --watch compares "
                        "with the sample this old (default 10)")
    p.set_defaults(run=run)


async def run(opts: argparse.Namespace, settings: Settings, config: LeasedConfig) -> int:
    _concurrency(settings)  # a bad setting: before Redis is reached
    async with connected(opts, config) as (client, where):
        admin = await open_crawl(opts.crawl, settings, config, client, where,
                                 warn_scrapy_redis=True)
        return await _status(admin, opts, settings, where, config.budgets)


async def _status(admin: FleetAdmin, opts: argparse.Namespace, settings: Settings,
                  where: str, budgets: Budgets) -> int:
    default_cap = _concurrency(settings)
    if not opts.watch:
        sample = SAMPLE_SECONDS if opts.sample is None else opts.sample
        prev = None
        if sample > 0:
            prev = await admin.snapshot(workers=False, memory=False)
            await asyncio.sleep(sample)
        cur = await admin.snapshot()
        warnings = status_warnings(cur, prev, default_cap)
        _print_status(cur, prev, warnings, opts.json, where, budgets)
        return 0
    trend = WATCH_TREND_SECONDS if opts.sample is None else opts.sample
    interval = WATCH_INTERVAL_SECONDS if opts.interval is None else opts.interval
    history: deque[Snapshot] = deque()
    # Ctrl-C ends the watch once the redraw in progress is done: handled here rather
    # than by cancelling the task (asyncio.run's way), which a Redis call in flight can
    # lose, leaving the command running after Ctrl-C.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    while not stop.is_set():
        started = time.monotonic()
        try:
            cur = await admin.snapshot()
        except Exception as exc:  # keep watching through a Redis restart
            line = f"cannot read Redis at {where}: {type(exc).__name__}: {exc}"
            print(json.dumps({"error": line}) if opts.json else CLEAR + line, flush=True)
        else:
            while len(history) > 1 and (cur.now_ms - history[1].now_ms) / 1000 >= trend:
                history.popleft()  # keep the newest sample at least `trend` old, if any
            prev = history[0] if history and trend > 0 else None
            history.append(cur)
            warnings = status_warnings(cur, prev, default_cap)
            if not opts.json:
                sys.stdout.write(CLEAR)
            _print_status(cur, prev, warnings, opts.json, where, budgets)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(),
                                   max(0.0, interval - (time.monotonic() - started)))
    return 0


def _print_status(cur: Snapshot, prev: Snapshot | None, warnings: list[Diagnosis],
                  as_json: bool, where: str, budgets: Budgets) -> None:
    if as_json:
        print(json.dumps(status_doc(cur, prev, warnings, where, budgets)), flush=True)
        return
    print(render_status(cur, prev, warnings, where, budgets), flush=True)
